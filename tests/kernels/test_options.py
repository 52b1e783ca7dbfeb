"""The XLA compiler options kernels compile with (symkern.kernels.options): which CPUs get
512-bit vectors, the environment override, and that the values do not depend on it."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

import symkern as sk
from symkern.kernels import options

AMD = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512dq\n"
AMD_NO_512 = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2\n"
INTEL = "vendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx2 avx512f\n"


@pytest.mark.parametrize(("cpuinfo", "full_clock"), [(AMD, True), (AMD_NO_512, False),
                                                      (INTEL, False), ("", False)])
def test_full_clock_avx512_reads_vendor_and_flags(cpuinfo, full_clock):
    assert options._full_clock_avx512(cpuinfo) is full_clock


@pytest.mark.parametrize(("setting", "width"), [("256", 256), ("512", 512), ("0", None),
                                                ("", None)])
def test_the_environment_overrides_the_vector_width(monkeypatch, setting, width):
    monkeypatch.setenv(options.VECTOR_WIDTH_ENV, setting)
    assert options.vector_width() == width
    expected = None if width is None else {options.VECTOR_WIDTH_OPTION: width}
    assert options.cpu_compiler_options() == expected


@pytest.mark.parametrize("width", ["256", "512", "0"])
def test_kernel_values_do_not_depend_on_the_vector_width(monkeypatch, width):
    """Built under each setting, a network Jacobian's kernel agrees with float64 NumPy."""
    monkeypatch.setenv(options.VECTOR_WIDTH_ENV, width)
    x = sp.symbols("x0:3")
    W = sp.Matrix(3, 3, sp.symbols("w0:9"))
    h = (W * sp.Matrix(x)).applyfunc(sp.tanh)
    J = h.jacobian(sp.Matrix(x))
    k = sk.build_function(J, list(x), params={"W": W})
    rng = np.random.default_rng(3)
    X, Wv = rng.normal(size=(4099, 3)), rng.normal(size=(3, 3))
    d = 1 - np.tanh(X @ Wv.T) ** 2
    np.testing.assert_allclose(k(X, {"W": Wv}), d[:, :, None] * Wv[None], rtol=2e-5, atol=2e-6)
