"""The XLA compiler options kernels compile with (symkern.kernels.options): which CPUs get
512-bit vectors (none unless asked), the environment override, and that the values do not
depend on it."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

import symkern as sk
from symkern.kernels import options


def test_unset_the_width_is_xlas_default(monkeypatch):
    """512-bit vectors miscompute atan (tests/drift/test_vector_width.py): never the default."""
    monkeypatch.delenv(options.VECTOR_WIDTH_ENV, raising=False)
    assert options.vector_width() is None
    assert options.cpu_compiler_options() is None


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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_atan_is_exact_at_the_default_width(monkeypatch, dtype):
    """`atan` over a batch wider than a 512-bit vector agrees with NumPy sample by sample."""
    import jax

    if dtype == np.float64 and not jax.config.jax_enable_x64:
        pytest.skip("float64 needs jax_enable_x64")
    monkeypatch.delenv(options.VECTOR_WIDTH_ENV, raising=False)
    x = sp.Symbol("x")
    k = sk.build_function(sp.atan(x) + sp.atan(3 * x), [x], dtype=dtype)
    X = np.random.default_rng(0).uniform(-3, 3, (64, 1)).astype(dtype)
    rtol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(k(X), (np.arctan(X) + np.arctan(3 * X))[:, 0], rtol=rtol, atol=rtol)
