"""Activations through Max, Abs and Piecewise, in scalarized and array-program networks.

References: the same network in hand-written JAX (`net.apply`), `jax.jacfwd` and
`jax.hessian`, at random inputs and at an input where every pre-activation is exactly 0
(zero biases, zero input), where |z|' and relu' take their value at 0 (the Hessian, which
jumps there, is compared off it).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import sympy as sp

import symkern as sk

x, y = sp.symbols("x y")


def softsign(z):
    return z / (1 + sp.Abs(z))


NETWORKS = {
    "relu, scalarized": lambda: sk.Chain(sk.Dense(2, 4, "relu"), sk.Linear(4, 1)),
    "relu, array program": lambda: sk.Chain(sk.Dense(2, 40, "relu"), sk.Linear(40, 1)),
    "softsign, scalarized": lambda: sk.Chain(sk.Dense(3, 4, softsign), sk.Linear(4, 1)),
    "softsign, array program": lambda: sk.Chain(sk.Dense(3, 24, softsign), sk.Linear(24, 1)),
    "elu, scalarized": lambda: sk.Chain(sk.Dense(2, 3, "elu"), sk.Dense(3, 1, "elu")),
}


@pytest.mark.parametrize("name", list(NETWORKS))
def test_output_jacobian_and_hessian_match_jax(name):
    net = NETWORKS[name]()
    snn = sk.SymbolicNetwork(net)
    assert getattr(snn, "structured", False) == name.endswith("array program")
    ps = net.init_params(seed=3)  # zero biases: the zero input hits every kink
    X = np.random.default_rng(0).normal(size=(9, net.input_dim))
    X[0] = 0.0

    def f(z):
        return net.apply(z, ps)[0]

    out = sk.build_nn_function(snn.output, snn, dtype="float64")(X, ps)
    J = sk.build_nn_function(sk.jacobian(snn.output, snn.input), snn, dtype="float64")(X, ps)
    H = sk.build_nn_function(sk.hessian(snn.output[0], snn.input), snn, dtype="float64")(X, ps)
    # the references as jitted programs (their operations one by one compile each)
    np.testing.assert_allclose(out[:, 0], jax.jit(jax.vmap(f))(X), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(J.reshape(9, -1), jax.jit(jax.vmap(jax.grad(f)))(X), rtol=1e-13,
                               atol=1e-15)
    # at the kink the second derivative jumps (softsign's from -2 to 2): the two sides'
    # conventions differ there (SymPy's sign(0) = 0), so the Hessian is compared off it
    np.testing.assert_allclose(H[1:], jax.jit(jax.vmap(jax.hessian(f)))(X[1:]), rtol=1e-12,
                               atol=1e-14)


def test_derivatives_of_abs_are_taken_over_the_reals():
    J = sk.jacobian(sp.Matrix([sp.Abs(x * y), sp.sign(x) * y]), [x, y])
    assert not J.has(sp.Derivative, sp.re, sp.im)
    assert J.free_symbols == {x, y}  # the user's symbols again, not the real stand-ins
    assert J[0, 0] == y * sp.sign(x * y)
    assert sk.gradient(sp.Abs(x), wrt=[x])[0] == sp.sign(x)  # keywords still bind


def test_dirac_delta_evaluates_as_zero():
    kernel = sk.build_function(sp.DiracDelta(x) * y + sp.Heaviside(x) * y + x, [x, y],
                               dtype="float64")
    X = np.array([[-1.0, 2.0], [0.5, 3.0]])
    np.testing.assert_allclose(kernel(X), [-1.0, 3.5], rtol=1e-15)


def test_a_piecewise_of_a_piecewise_prints_without_simplifying_its_logic(monkeypatch):
    # SymPy's NumPy printer runs simplify_logic on such conditions: exponential in size
    def refuse(*args, **kwargs):
        raise AssertionError("simplify_logic called")

    monkeypatch.setattr("sympy.logic.boolalg.simplify_logic", refuse)
    elu = lambda z: sp.Piecewise((z, z > 0), (sp.exp(z) - 1, True))  # noqa: E731
    expr = elu(2 * elu(x) - y + 0.5)
    assert any(arg.cond.has(sp.ITE) for arg in expr.args)
    kernel = sk.build_function(expr, [x, y], dtype="float64")
    X = np.random.default_rng(1).normal(size=(64, 2))

    def elu_np(z):
        return np.where(z > 0, z, np.expm1(np.minimum(z, 0)))

    np.testing.assert_allclose(kernel(X), elu_np(2 * elu_np(X[:, 0]) - X[:, 1] + 0.5),
                               rtol=1e-14, atol=1e-15)


def test_an_array_program_network_in_build_function_names_the_remedy():
    net = sk.Chain(sk.Dense(2, 40, "tanh"), sk.Linear(40, 1))
    snn = sk.SymbolicNetwork(net)
    with pytest.raises(sk.BuildError, match=r"eqs: holds net\d+, a network compiled as an array "
                                             r"program .* build_nn_function\(eqs, snn\)"):
        sk.build_function(snn.output, snn.input, params=snn.params)


def test_build_nn_function_names_a_layer_given_as_the_network():
    with pytest.raises(sk.BuildError, match="snn: expected a SymbolicNetwork, got Dense"):
        sk.build_nn_function(x, sk.Dense(2, 3))


@pytest.mark.parametrize("width", [3, 40])  # scalarized, array program
def test_a_bias_as_a_column_is_accepted_by_either_form(width):
    net = sk.Chain(sk.Dense(2, width, "tanh"), sk.Linear(width, 1))
    snn = sk.SymbolicNetwork(net)
    kernel = sk.build_nn_function(snn.output, snn, dtype="float64")
    ps = net.init_params(seed=1)
    column = {k: {"W": v["W"], "b": v["b"][:, None] + 0.1} for k, v in ps.items()}
    flat = {k: {"W": v["W"], "b": v["b"] + 0.1} for k, v in ps.items()}
    X = np.random.default_rng(2).normal(size=(5, 2))
    np.testing.assert_allclose(kernel(X, column), net.apply(X, flat), rtol=1e-13)


def test_a_dense_layer_draws_its_parameters_from_a_seed_or_a_generator():
    layer = sk.Dense(2, 3, "tanh")
    by_seed = layer.init_params(seed=4)
    np.testing.assert_array_equal(by_seed["W"], layer.init_params(4)["W"])
    np.testing.assert_array_equal(by_seed["W"],
                                  layer.init_params(np.random.default_rng(4))["W"])
    assert by_seed["W"].shape == (3, 2) and by_seed["b"].shape == (3,)
    with pytest.raises(sk.BuildError, match="init_params: expected a numpy Generator or an int"):
        layer.init_params("4")
