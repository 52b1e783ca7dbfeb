"""The scalar_factors pass (symkern.codegen.factors): in a product, the factors that read no
per-sample value are multiplied first, a leading minus sign goes to the first of them, and
the kernel's values do not change."""

from __future__ import annotations

import ast

import numpy as np
import sympy as sp

import symkern as sk
from symkern.codegen.factors import scalar_factors_first


def _reordered(source: str) -> tuple[str, int]:
    module = ast.parse(source)
    changed = scalar_factors_first(module, ["x1"])
    return ast.unparse(module), changed


def test_scalar_factors_move_to_the_front_in_their_order():
    text, changed = _reordered("def kernel(x1, ps):\n    _d0 = x1[..., 0]\n"
                               "    _c1 = jnp.cos(_d0)\n"
                               "    return 2 * _c1 * _d0 * ps['l1'] * ps['m'],")
    assert changed == 1
    assert "2 * ps['l1'] * ps['m'] * _c1 * _d0" in text


def test_a_leading_minus_goes_to_the_first_scalar_and_pure_chains_stay():
    text, changed = _reordered("def kernel(x1, ps):\n    _d0 = x1[..., 0]\n"
                               "    _c0 = ps['a'] * ps['b']\n"
                               "    return -_d0 * _c0 * ps['c'], _d0 * _d0, _c0 * 3")
    assert changed == 1
    assert "-_c0 * ps['c'] * _d0" in text
    assert "_d0 * _d0" in text and "_c0 * 3" in text


def test_kernels_keep_their_values():
    x, y, a, b = sp.symbols("x y a b")
    eqs = sp.Matrix([-2 * sp.cos(x) * y * a * b, sp.sin(y) * x * a ** 2])
    kernel = sk.build_function(eqs, [x, y], params=[a, b], dtype="float64")
    assert "-2 * ps[0] * ps[1] * _d1 * " in kernel.source
    assert "lax.integer_pow(ps[0], 2) * _d0 * " in kernel.source
    data = np.random.default_rng(0).uniform(-1, 1, (8, 2))
    want = np.stack([-2 * np.cos(data[:, 0]) * data[:, 1] * 0.7 * 1.3,
                     np.sin(data[:, 1]) * data[:, 0] * 0.49], axis=-1)
    np.testing.assert_allclose(kernel(data, [0.7, 1.3]), want, rtol=1e-14)
