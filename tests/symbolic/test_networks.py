"""Tests of symkern.symbolic.networks: layers, the jax reference, symbolic networks."""

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
from symkern.symbolic import ACTIVATIONS, Chain, Dense, Linear, SymbolicNetwork

FAST = settings(max_examples=10, deadline=None, derandomize=True)
# NumPy has no erf; lambdify would fall back to math.erf, which takes scalars only.
NUMPY = [{"erf": np.vectorize(math.erf)}, "numpy"]


@st.composite
def networks(draw, max_depth: int = 3, max_width: int = 6) -> Chain:
    depth = draw(st.integers(1, max_depth))
    widths = draw(st.lists(st.integers(1, max_width), min_size=depth + 1, max_size=depth + 1))
    # One elu at most: stacked Piecewise layers are slow to build (see networks._elu).
    names = draw(st.lists(st.sampled_from(sorted(ACTIVATIONS)), min_size=depth, max_size=depth)
                 .filter(lambda names: names.count("elu") <= 1))
    return Chain(*(Dense(widths[k], widths[k + 1], names[k]) for k in range(depth)))


def random_params(net: Chain, rng: np.random.Generator) -> dict:
    """Non-zero biases and weights of order one, unlike init_params' zero biases."""
    return {
        name: {"W": rng.normal(0.0, 0.8, (layer.n_out, layer.n_in)),
               "b": rng.normal(0.0, 0.5, layer.n_out)}
        for name, layer in net.named_layers()
    }


def evaluate_numpy(expr: sp.Matrix, snn: SymbolicNetwork, X: np.ndarray, ps: dict) -> np.ndarray:
    """The independent path: lambdify to NumPy, vectorised over the batch of X."""
    symbols = list(snn.input) + [s for a, b in snn.parameter_paths() for s in snn.params[a][b]]
    function = sp.lambdify(symbols, list(expr), modules=NUMPY, cse=True)
    values = [X[:, i] for i in range(X.shape[1])]
    values += [v for path in snn.parameter_paths() for v in np.ravel(ps[path[0]][path[1]])]
    entries = function(*values)
    return np.stack([np.broadcast_to(e, X.shape[:1]) for e in entries], axis=-1)


def assert_close(actual, expected, rtol: float = 1e-12) -> None:
    """Relative to the result's scale: entries that cancel to ~0 cannot be compared entrywise."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape
    scale = max(1.0, float(np.max(np.abs(expected))))
    assert float(np.max(np.abs(actual - expected))) <= rtol * scale


@FAST
@given(net=networks(), seed=st.integers(0, 2**32 - 1))
def test_symbolic_output_matches_jax_apply(net: Chain, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ps = random_params(net, rng)
    X = rng.uniform(-1.5, 1.5, (3, net.input_dim))
    snn = SymbolicNetwork(net)
    expected = net.apply(X, ps)
    assert expected.dtype == jnp.float64
    assert_close(evaluate_numpy(snn.output, snn, X, ps), expected)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_every_named_activation_has_matching_sympy_and_jax_forms(name: str) -> None:
    z = sp.Symbol("z")
    points = np.array([-2.5, -0.7, -1e-3, 1e-3, 0.4, 3.0])
    sympy_form, jax_form = ACTIVATIONS[name]
    reference = sp.lambdify(z, sympy_form(z), modules=NUMPY)
    assert_close(np.broadcast_to(reference(points), points.shape), jax_form(jnp.asarray(points)))


def test_activations_table_is_read_only() -> None:
    with pytest.raises(TypeError):
        ACTIVATIONS["swish"] = ACTIVATIONS["sigmoid"]  # type: ignore[index]


def test_callable_activation_is_applied_through_its_sympy_output() -> None:
    def cube_plus_sin(z: sp.Expr) -> sp.Expr:
        return z**3 + sp.sin(z)

    net = Chain(Dense(2, 2, cube_plus_sin))
    ps = random_params(net, np.random.default_rng(0))
    X = np.array([[0.3, -0.2], [1.1, 0.5]])
    z = X @ ps["L1"]["W"].T + ps["L1"]["b"]
    assert_close(net.apply(X, ps), z**3 + np.sin(z))
    snn = SymbolicNetwork(net)
    assert_close(evaluate_numpy(snn.output, snn, X, ps), z**3 + np.sin(z))
    assert repr(net) == "Chain(Dense(2, 2, cube_plus_sin))"


def test_callable_activation_must_return_a_sympy_expression() -> None:
    message = "activation: expected the callable <lambda> to return a SymPy expression"
    with pytest.raises(BuildError, match=message):
        Dense(2, 2, lambda z: [z])


def test_dense_rejects_an_unknown_activation_listing_the_known_names() -> None:
    with pytest.raises(BuildError) as error:
        Dense(2, 3, "swish")
    message = str(error.value)
    assert message.startswith("activation: expected one of identity, tanh, sigmoid")
    assert all(name in message for name in ACTIVATIONS)
    assert "got 'swish'" in message


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "3"])
def test_dense_rejects_sizes_that_are_not_positive_ints(bad) -> None:
    with pytest.raises(BuildError, match=r"n_in: expected a positive int, got"):
        Dense(bad, 3)
    with pytest.raises(BuildError, match=r"n_out: expected a positive int, got"):
        Dense(3, bad)


def test_chain_rejects_mismatched_consecutive_sizes_naming_the_layers() -> None:
    with pytest.raises(BuildError, match=r"layer 3 \(Dense\(4, 1, 'identity'\)\) expects 4 inputs "
                                         r"but layer 2 \(Dense\(3, 5, 'tanh'\)\) gives 5 outputs"):
        Chain(Dense(2, 3), Dense(3, 5, "tanh"), Dense(4, 1))


def test_chain_rejects_no_layers_and_non_layers() -> None:
    with pytest.raises(BuildError, match="layers: expected at least one layer"):
        Chain()
    with pytest.raises(BuildError, match="layer 2: expected a Dense or Linear"):
        Chain(Dense(2, 2), "tanh")


def test_linear_is_an_identity_dense_that_keeps_its_bias() -> None:
    layer = Linear(3, 2)
    assert isinstance(layer, Dense) and layer.activation == "identity"
    assert repr(layer) == "Linear(3, 2)"
    assert set(SymbolicNetwork(Chain(layer)).params["L1"]) == {"W", "b"}


def test_init_params_is_glorot_uniform_float64_and_deterministic_per_seed() -> None:
    net = Chain(Dense(4, 6, "tanh"), Linear(6, 2))
    ps = net.init_params(seed=3)
    for name, layer in net.named_layers():
        W, b = ps[name]["W"], ps[name]["b"]
        assert W.shape == (layer.n_out, layer.n_in) and b.shape == (layer.n_out,)
        assert W.dtype == np.float64 and b.dtype == np.float64
        assert np.all(np.abs(W) <= np.sqrt(6.0 / (layer.n_in + layer.n_out)))
        assert not np.any(b)
    again, other = net.init_params(seed=3), net.init_params(seed=4)
    assert all(np.array_equal(ps[k]["W"], again[k]["W"]) for k in ps)
    assert not np.array_equal(ps["L1"]["W"], other["L1"]["W"])


@pytest.mark.parametrize("batch", [(), (5,), (2, 3)])
def test_apply_accepts_any_leading_batch_shape(batch: tuple[int, ...]) -> None:
    net = Chain(Dense(2, 3, "gelu"), Linear(3, 4))
    ps = net.init_params(seed=0)
    X = np.random.default_rng(0).normal(size=(*batch, 2))
    result = net.apply(X, ps)
    assert result.shape == (*batch, 4)
    assert_close(result.reshape(-1, 4), net.apply(X.reshape(-1, 2), ps))


def test_apply_rejects_wrong_input_width_and_parameter_shapes() -> None:
    net = Chain(Dense(2, 3, "tanh"), Linear(3, 2))
    ps = net.init_params(seed=0)
    with pytest.raises(BuildError, match=r"X: expected shape \(\.\.\., 2\), got \(5, 3\)"):
        net.apply(np.zeros((5, 3)), ps)
    ps["L1"]["W"] = ps["L1"]["W"].T
    message = r'ps\["L1"\]\["W"\]: expected shape \(3, 2\), got \(2, 3\)'
    with pytest.raises(BuildError, match=message):
        net.apply(np.zeros((5, 2)), ps)
    with pytest.raises(BuildError, match=r"ps: expected keys \['L1', 'L2'\], got \['L1'\]"):
        net.apply(np.zeros((5, 2)), {"L1": ps["L1"]})


def test_symbolic_network_exposes_input_params_output_and_paths() -> None:
    net = Chain(Dense(2, 3, "tanh"), Dense(3, 2, "tanh"))
    snn = SymbolicNetwork(net)
    assert snn.net is net
    assert snn.input.shape == (2, 1)
    assert snn.params["L1"]["W"].shape == (3, 2) and snn.params["L1"]["b"].shape == (3, 1)
    assert snn.params["L2"]["W"].shape == (2, 3) and snn.params["L2"]["b"].shape == (2, 1)
    assert snn.output.shape == (2, 1)
    assert snn.parameter_paths() == (("L1", "W"), ("L1", "b"), ("L2", "W"), ("L2", "b"))
    assert all(isinstance(s, sp.Symbol) for s in snn.params["L2"]["W"])
    assert str(snn.params["L1"]["W"][1, 0]) == "_L1_W_2_1"
    assert repr(snn) == "SymbolicNetwork(Chain(Dense(2, 3, 'tanh'), Dense(3, 2, 'tanh')))"


def test_parameter_paths_follow_jax_pytree_order_past_nine_layers() -> None:
    snn = SymbolicNetwork(Chain(*(Linear(1, 1) for _ in range(11))))
    leaves_with_paths, _ = jax.tree_util.tree_flatten_with_path(
        snn.net.init_params(seed=0))
    jax_paths = tuple(tuple(key.key for key in path) for path, _ in leaves_with_paths)
    assert snn.parameter_paths() == jax_paths
    assert snn.parameter_paths()[2] == ("L10", "W")


def test_two_symbolic_networks_never_share_symbols() -> None:
    net = Chain(Dense(2, 2, "tanh"))
    first, second = SymbolicNetwork(net), SymbolicNetwork(net)

    def symbols(snn: SymbolicNetwork) -> set[sp.Symbol]:
        params = snn.params.values()
        return set(snn.input) | {s for layer in params for m in layer.values() for s in m}

    assert not symbols(first) & symbols(second)
    assert str(first.output) == str(second.output)
    assert first.output != second.output


def test_calling_a_symbolic_network_evaluates_it_on_other_expressions() -> None:
    snn = SymbolicNetwork(Chain(Dense(2, 2, "tanh"), Linear(2, 1)))
    q, p = sp.symbols("q p")
    H = snn([q, p])[0] + q**2 / 2
    assert H.free_symbols >= {q, p}
    assert not H.free_symbols & set(snn.input)
    assert snn(sp.Matrix([q, p])) == snn([q, p])
    assert snn(snn.input) == snn.output


def test_calling_a_symbolic_network_rejects_the_wrong_input_shape() -> None:
    snn = SymbolicNetwork(Chain(Dense(2, 2, "tanh")))
    with pytest.raises(BuildError, match=r"x: expected a 2×1 Matrix .* got shape \(1, 2\)"):
        snn(sp.Matrix([[1, 2]]))
    with pytest.raises(BuildError, match="net: expected a Chain or a Dense, got str"):
        SymbolicNetwork("tanh")
