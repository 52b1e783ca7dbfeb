"""Tests of symkern.symbolic.derivatives against JAX's autodiff of the reference apply."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from symkern.errors import BuildError
from symkern.symbolic import (
    ACTIVATIONS,
    Chain,
    Dense,
    Linear,
    SymbolicNetwork,
    gradient,
    hessian,
    jacobian,
    parameter_gradient,
)

FAST = settings(max_examples=6, deadline=None, derandomize=True)
NUMPY = [{"erf": np.vectorize(math.erf)}, "numpy"]
ALL = tuple(sorted(ACTIVATIONS))
# relu and elu have no second derivative at their kink; SymPy's is a DiracDelta there.
SMOOTH = tuple(sorted(set(ACTIVATIONS) - {"relu", "elu"}))


@st.composite
def networks(draw, names=ALL, max_depth: int = 2) -> Chain:
    depth = draw(st.integers(1, max_depth))
    widths = draw(st.lists(st.integers(1, 3), min_size=depth + 1, max_size=depth + 1))
    chosen = draw(st.lists(st.sampled_from(names), min_size=depth, max_size=depth)
                  .filter(lambda chosen: chosen.count("elu") <= 1))
    return Chain(*(Dense(widths[k], widths[k + 1], chosen[k]) for k in range(depth)))


def sample(net: Chain, seed: int) -> tuple[np.ndarray, dict]:
    """One input and parameters of order one, away from relu/elu kinks with probability 1."""
    rng = np.random.default_rng(seed)
    ps = {name: {"W": rng.normal(0.0, 0.8, (layer.n_out, layer.n_in)),
                 "b": rng.normal(0.0, 0.5, layer.n_out)}
          for name, layer in net.named_layers()}
    return rng.uniform(-1.5, 1.5, net.input_dim), ps


def evaluate(entries, snn: SymbolicNetwork, x: np.ndarray, ps: dict, extra=()) -> np.ndarray:
    """Lambdify to NumPy and evaluate: the path independent of JAX."""
    symbols = list(snn.input) + [s for a, b in snn.parameter_paths() for s in snn.params[a][b]]
    values = list(x) + [v for a, b in snn.parameter_paths() for v in np.ravel(ps[a][b])]
    symbols += [s for s, _ in extra]
    values += [v for _, v in extra]
    function = sp.lambdify(symbols, list(entries), modules=NUMPY, cse=True)
    return np.array([float(e) for e in function(*values)])


def assert_close(actual, expected, rtol: float = 1e-11) -> None:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    assert float(np.max(np.abs(actual - expected), initial=0.0)) <= rtol * scale


def array_entries(array: sp.Array) -> list[sp.Expr]:
    return list(sp.flatten(array.tolist())) if array.shape else [array[()]]


@FAST
@given(net=networks(), seed=st.integers(0, 2**32 - 1))
def test_jacobian_wrt_input_matches_jacfwd(net: Chain, seed: int) -> None:
    x, ps = sample(net, seed)
    snn = SymbolicNetwork(net)
    J = jacobian(snn.output, snn.input)
    assert J.shape == (net.output_dim, net.input_dim)
    expected = jax.jacfwd(lambda v: net.apply(v, ps))(jnp.asarray(x))
    assert_close(evaluate(J, snn, x, ps).reshape(J.shape), expected)


@FAST
@given(net=networks(), seed=st.integers(0, 2**32 - 1))
def test_jacobian_wrt_parameters_matches_jacfwd(net: Chain, seed: int) -> None:
    x, ps = sample(net, seed)
    snn = SymbolicNetwork(net)
    J = jacobian(snn.output, snn.params)
    expected = jax.jacfwd(lambda p: net.apply(jnp.asarray(x), p))(ps)
    for name, leaf in snn.parameter_paths():
        rows, cols = snn.params[name][leaf].shape
        # The design's leaf rule: an m×1 Matrix leaf has shape (m,), even W of Dense(1, m).
        leaf_shape = (rows,) if cols == 1 else (rows, cols)
        assert J[name][leaf].shape == (net.output_dim, *leaf_shape)
        actual = evaluate(array_entries(J[name][leaf]), snn, x, ps)
        assert_close(actual, np.ravel(expected[name][leaf]))


@FAST
@given(net=networks(), seed=st.integers(0, 2**32 - 1))
def test_parameter_gradient_of_squared_loss_matches_grad(net: Chain, seed: int) -> None:
    x, ps = sample(net, seed)
    snn = SymbolicNetwork(net)
    target = sp.Matrix([sp.Dummy(f"y_{i}") for i in range(net.output_dim)])
    loss = sum((snn.output - target).applyfunc(lambda e: e**2))
    y = np.linspace(-0.5, 0.5, net.output_dim)
    grads = parameter_gradient(loss, snn)
    expected = jax.grad(lambda p: jnp.sum((net.apply(jnp.asarray(x), p) - y) ** 2))(ps)
    for name, leaf in snn.parameter_paths():
        assert grads[name][leaf].shape == snn.params[name][leaf].shape
        actual = evaluate(grads[name][leaf], snn, x, ps, extra=list(zip(target, y, strict=True)))
        assert_close(actual, np.ravel(expected[name][leaf]))


@FAST
@given(net=networks(names=SMOOTH), seed=st.integers(0, 2**32 - 1))
def test_hessian_wrt_input_matches_jax_hessian(net: Chain, seed: int) -> None:
    x, ps = sample(net, seed)
    snn = SymbolicNetwork(net)
    H = hessian(snn.output[0], snn.input)
    assert H.shape == (net.input_dim, net.input_dim)
    expected = jax.hessian(lambda v: net.apply(v, ps)[0])(jnp.asarray(x))
    assert_close(evaluate(H, snn, x, ps).reshape(H.shape), expected)


def test_hessian_wrt_parameters_flattens_leaves_in_parameter_paths_order() -> None:
    net = Chain(Dense(2, 2, "tanh"), Linear(2, 1))
    snn = SymbolicNetwork(net)
    x, ps = sample(net, 7)
    H = hessian(snn.output, snn.params)
    paths = snn.parameter_paths()
    sizes = [ps[a][b].size for a, b in paths]
    assert H.shape == (sum(sizes), sum(sizes))

    def unflatten(flat):
        pieces = jnp.split(flat, np.cumsum(sizes)[:-1])
        tree = {name: {} for name, _ in paths}
        for (a, b), piece in zip(paths, pieces, strict=True):
            tree[a][b] = piece.reshape(ps[a][b].shape)
        return tree

    flat = jnp.concatenate([jnp.ravel(ps[a][b]) for a, b in paths])
    expected = jax.hessian(lambda f: net.apply(jnp.asarray(x), unflatten(f))[0])(flat)
    assert_close(evaluate(H, snn, x, ps).reshape(H.shape), expected)


def test_jacobian_shapes_follow_the_equation_then_the_leaf() -> None:
    snn = SymbolicNetwork(Chain(Dense(2, 3, "tanh"), Dense(3, 4, "sin")))
    J = jacobian(snn.output, snn.params)
    assert J["L1"]["W"].shape == (4, 3, 2) and J["L1"]["b"].shape == (4, 3)
    assert jacobian(snn.output, snn.params["L2"]["W"]).shape == (4, 4, 3)
    assert jacobian(snn.output[0], snn.params["L1"])["W"].shape == (3, 2)
    assert jacobian(snn.output[0], snn.input).shape == (1, 2)
    assert jacobian(snn.output, snn.input[0]).shape == (4, 1)
    assert jacobian(snn.output, list(snn.input)).shape == (4, 2)
    a = sp.Symbol("a")
    assert jacobian(a**2, {"a": a})["a"] == sp.Array([2 * a], ())


def test_gradient_leaves_have_the_kind_and_shape_of_the_wrt_leaves() -> None:
    a, b = sp.symbols("a b")
    M = sp.MatrixSymbol("M", 2, 2)
    scalar = a**2 * b + M[0, 1] * a
    result = gradient(scalar, {"a": a, "pair": [b, sp.Matrix([[a, b]])], "M": M})
    assert result["a"] == 2 * a * b + M[0, 1]
    assert result["pair"][0] == a**2
    assert result["pair"][1] == sp.Matrix([[2 * a * b + M[0, 1], a**2]])
    assert result["M"] == sp.Matrix([[0, a], [0, 0]])
    assert gradient(scalar, [a, b]).shape == (2, 1)
    assert gradient(sp.Matrix([[a * b]]), a) == sp.Matrix([b])


def test_hessian_wrt_data_is_sympys_hessian() -> None:
    a, b = sp.symbols("a b")
    assert hessian(a**3 * b, (a, b)) == sp.hessian(a**3 * b, (a, b))
    assert hessian(a**3 * b, {"v": sp.Matrix([[a, b]])}) == sp.hessian(a**3 * b, (a, b))


def test_gradient_and_hessian_reject_a_non_scalar() -> None:
    snn = SymbolicNetwork(Chain(Dense(2, 2, "tanh")))
    message = r"scalar: expected a scalar expression or a 1×1 Matrix, got a 2×1 Matrix"
    with pytest.raises(BuildError, match=message):
        gradient(snn.output, snn.input)
    with pytest.raises(BuildError, match=message):
        hessian(snn.output, snn.params)
    with pytest.raises(BuildError, match=message):
        parameter_gradient(snn.output, snn)


def test_jacobian_rejects_a_matrix_equation_for_a_data_argument() -> None:
    a, b = sp.symbols("a b")
    with pytest.raises(BuildError, match=r"eqs: expected an Expr or an m×1 Matrix, got a 2×2"):
        jacobian(sp.Matrix([[a, b], [b, a]]), [a, b])
    assert jacobian(sp.Matrix([[a, b], [b, a]]), {"a": a})["a"].shape == (2, 2)


def test_wrt_entries_must_be_symbols() -> None:
    a = sp.Symbol("a")
    with pytest.raises(BuildError, match=r"wrt\['W'\]\[1\]: expected a Symbol, got Pow a\*\*2"):
        gradient(a, {"W": sp.Matrix([[a, a**2]])})
    with pytest.raises(BuildError, match=r"wrt\[0\]: expected a Symbol, got Mul 2\*a"):
        jacobian(a, sp.Matrix([2 * a]))
    with pytest.raises(BuildError, match="wrt: expected at least one symbol"):
        gradient(a, {})
    with pytest.raises(BuildError, match="snn: expected a SymbolicNetwork, got dict"):
        parameter_gradient(a, {"L1": {}})


def test_derivatives_of_one_network_ignore_another_networks_symbols() -> None:
    net = Chain(Dense(1, 2, "tanh"), Linear(2, 1))
    first, second = SymbolicNetwork(net), SymbolicNetwork(net)
    q = sp.Symbol("q")
    H = first([q])[0] + second([q])[0]
    assert gradient(H, first.params) == gradient(first([q])[0], first.params)
