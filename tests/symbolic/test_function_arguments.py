"""Functions of time as arguments: `q(t)` and its derivatives (sympy.physics.mechanics'
dynamicsymbols) are bound by position like symbols, as data and as parameters."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest
import sympy as sp

import symkern as sk

jax.config.update("jax_enable_x64", True)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from sympy.physics.mechanics import dynamicsymbols

q, u = dynamicsymbols("q u")
t = dynamicsymbols._t
qd = q.diff(t)
g, L = sp.symbols("g L")
PENDULUM = -g / L * sp.sin(q) + qd**2 * u


def _reference(values: np.ndarray, ps: dict) -> np.ndarray:
    return -ps["g"] / ps["L"] * np.sin(values[..., 0]) + values[..., 1] ** 2 * values[..., 2]


@pytest.mark.parametrize("cse", [True, False], ids=["cse", "nocse"])
def test_functions_of_time_and_their_derivatives_are_data_entries(cse):
    kernel = sk.build_function(PENDULUM, [q, qd, u], params={"g": g, "L": L}, cse=cse,
                               dtype="float64")
    values = np.random.default_rng(0).normal(size=(7, 3))
    ps = {"g": 9.81, "L": 1.5}
    np.testing.assert_allclose(kernel(values, ps), _reference(values, ps), rtol=1e-14)
    assert "q(t)" not in kernel.source  # bound by position, never named in code


def test_a_function_of_time_as_a_scalar_data_argument_and_as_a_parameter():
    kernel = sk.build_function(sp.Matrix([qd, q * u]), q, [qd, u], dtype="float64")
    got = kernel(np.array([0.5, 2.0]), np.array([[1.0, 3.0], [2.0, 4.0]]))
    np.testing.assert_allclose(got, [[1.0, 1.5], [2.0, 8.0]], rtol=0)
    second = q.diff(t, 2)
    kernel = sk.build_function(second * q + u, [q, u], params={"acceleration": second},
                               dtype="float64")
    np.testing.assert_allclose(kernel(np.array([2.0, 1.0]), {"acceleration": 3.0}), 7.0, rtol=0)


def test_function_arguments_go_through_jit_vmap_grad_and_export():
    kernel = sk.build_function(PENDULUM, [q, qd, u], params={"g": g, "L": L}, dtype="float64")
    ps = {"g": 9.81, "L": 1.5}
    values = np.array([[0.3, -0.2, 1.1], [1.2, 0.4, -0.5]])
    expected = _reference(values, ps)
    np.testing.assert_allclose(jax.jit(kernel)(values, ps), expected, rtol=1e-14)
    np.testing.assert_allclose(jax.vmap(kernel, in_axes=(0, None))(values, ps), expected,
                               rtol=1e-14)
    gradient = jax.grad(lambda v: kernel(v, ps))(values[0])
    q0, qd0, u0 = values[0]
    np.testing.assert_allclose(gradient, [-ps["g"] / ps["L"] * np.cos(q0), 2 * qd0 * u0, qd0**2],
                               rtol=1e-14)
    loaded = sk.load(kernel.export(values, ps), kernel.const_args)
    np.testing.assert_allclose(loaded(values, ps), expected, rtol=1e-14)


def test_derivative_of_a_declared_function_that_is_not_declared_is_refused():
    # the placeholder for q(t) would differentiate to zero: refused, never a silent 0
    with pytest.raises(sk.BuildError, match=r"Derivative\(q\(t\), t\) differentiates q\(t\)"):
        sk.build_function(qd + q, [q], dtype="float64")


def test_an_expression_of_a_function_is_not_an_argument():
    with pytest.raises(sk.BuildError, match=r"x1\[0\]: expected a SymPy Symbol"):
        sk.build_function(q, [q + 1], dtype="float64")
