"""Structured networks beyond the output's own gradient: derivative entries of any order, and
per-sample parameter gradients of losses that read them or the weights, against JAX's own
autodiff of the same network in float64."""

from __future__ import annotations

import ast

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import symkern as sk
from symkern.batching.structured import build_structured_function
from symkern.codegen.structured import share_weight_transposes
from symkern.errors import BuildError
from symkern.symbolic import Chain, Dense
from symkern.symbolic.structured import ActivationForms, StructuredNetwork, partitions

ACTIVATIONS = ["tanh", "sigmoid", "softplus", "sin"]
# each example compiles a kernel: few examples, no shrinking (a loaded 2-core box)
FAST = settings(max_examples=3, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
NU = 0.01


def random_params(net: Chain, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {name: {"W": rng.normal(0.0, 0.8, (layer.n_out, layer.n_in)),
                   "b": rng.normal(0.0, 0.5, layer.n_out)}
            for name, layer in net.named_layers()}


def assert_tree_close(got: dict, want: dict, rtol: float = 1e-10) -> None:
    """Per-sample gradients: `got` leaves batch + shape, `want` the same tree from JAX."""
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got),
                            jax.tree_util.tree_leaves(want), strict=True):
        a, b = np.asarray(a), np.reshape(np.asarray(b), np.shape(a))
        scale = max(float(np.max(np.abs(b), initial=0.0)), 1e-300)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale,
                                   err_msg=jax.tree_util.keystr(path))


def hnn_loss(snn: StructuredNetwork) -> tuple[sp.Expr, sp.Matrix]:
    """Σ_k (J∇H − t)_k² of a one-output network H(q, p), and its target symbols."""
    field = sk.hamiltonian_vector_field(snn.output[0], list(snn.input))
    targets = sp.Matrix(sp.symbols("t_q t_p"))
    return sum((field - targets).applyfunc(lambda e: e ** 2)), targets


def hnn_reference(net: Chain):
    def loss(ps, x, t):
        g = jax.grad(lambda z: net.apply(z, ps)[0])(x)
        return jnp.sum((jnp.stack([g[1], -g[0]]) - t) ** 2)
    return jax.vmap(jax.grad(loss), (None, 0, 0))


@FAST
@given(width=st.integers(1, 5), depth=st.integers(1, 2),
       activation=st.sampled_from(ACTIVATIONS), seed=st.integers(0, 99))
def test_field_loss_parameter_gradient_matches_jax(width: int, depth: int, activation: str,
                                                   seed: int) -> None:
    widths = [2] + [width] * depth
    layers = [Dense(widths[k], widths[k + 1], activation) for k in range(depth)]
    net = Chain(*layers, Dense(widths[-1], 1))
    snn = StructuredNetwork(net)
    loss, targets = hnn_loss(snn)
    kernel = build_structured_function(snn.parameter_gradient(loss), snn, targets)
    rng = np.random.default_rng(seed)
    ps, X, T = random_params(net, seed), rng.normal(size=(5, 2)), rng.normal(size=(5, 2))
    want = jax.jit(hnn_reference(net))(ps, X, T)
    assert_tree_close(kernel(X, T, ps), want)
    # the field does not depend on the last bias: its gradient is zero, broadcast to the batch
    last = list(net.named_layers())[-1][0]
    assert np.all(np.asarray(kernel(X, T, ps)[last]["b"]) == 0)


def burgers(snn: StructuredNetwork) -> sp.Expr:
    u = snn.output[0]
    gradient = sk.gradient(u, snn.input)
    return gradient[0] + u * gradient[1] - NU * sk.hessian(u, snn.input)[1, 1]


def burgers_reference(net: Chain):
    def u(ps, z):
        return net.apply(z, ps)[0]

    def residual(ps, z):
        g, H = jax.grad(u, 1)(ps, z), jax.hessian(u, 1)(ps, z)
        return g[0] + u(ps, z) * g[1] - NU * H[1, 1]
    return residual


@pytest.fixture(scope="module")
def pinn() -> dict:
    net = Chain(Dense(2, 4, "tanh"), Dense(4, 3, "sigmoid"), Dense(3, 1))
    snn = StructuredNetwork(net)
    residual = burgers(snn)
    reference = burgers_reference(net)
    ps, X = random_params(net, 3), np.random.default_rng(3).normal(size=(6, 2))
    return {"residual": build_structured_function(residual, snn),
            "gradient": build_structured_function(snn.parameter_gradient(residual ** 2), snn),
            "ps": ps, "X": X, "reference": reference,
            "per_sample": jax.jit(jax.vmap(jax.grad(lambda p, z: reference(p, z) ** 2),
                                           (None, 0)))(ps, X)}


def test_residual_loss_gradient_matches_jax_eager_jit_and_vmap(pinn: dict) -> None:
    ps, X, want, kernel = pinn["ps"], pinn["X"], pinn["per_sample"], pinn["gradient"]
    assert_tree_close(kernel(X, ps), want)
    assert_tree_close(jax.jit(kernel)(X, ps), want)
    assert_tree_close(jax.vmap(lambda x: kernel(x, ps))(X), want)


def test_jax_grad_through_the_residual_kernel_matches_jax(pinn: dict) -> None:
    reference, ps, X = pinn["reference"], pinn["ps"], pinn["X"]
    np.testing.assert_allclose(pinn["residual"](X, ps),
                               jax.jit(jax.vmap(reference, (None, 0)))(ps, X), rtol=1e-12)
    got = jax.grad(lambda p: jnp.mean(pinn["residual"](X, p) ** 2))(ps)
    want = jax.tree_util.tree_map(lambda g: np.mean(g, axis=0), pinn["per_sample"])
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    # the symbolic per-sample gradient averages to the same
    averaged = jax.tree_util.tree_map(lambda g: np.mean(g, axis=0), pinn["gradient"](X, ps))
    assert_tree_close(averaged, want)


def _partial(f, direction: int):
    return lambda x: jax.grad(f)(x)[direction]


def _nested_derivative(f, directions: tuple[int, ...]):
    """∂_S f(x) by nested jax.grad, one direction at a time."""
    for direction in directions:
        f = _partial(f, direction)
    return f


@settings(FAST, max_examples=2)
@given(directions=st.lists(st.integers(0, 2), min_size=3, max_size=4),
       activation=st.sampled_from(ACTIVATIONS), seed=st.integers(0, 99))
def test_derivatives_of_order_three_and_four_match_nested_jax_grad(
        directions: list[int], activation: str, seed: int) -> None:
    net = Chain(Dense(3, 4, activation), Dense(4, 2, "tanh"))
    snn = StructuredNetwork(net)
    x = snn.input
    entries = sp.Matrix([sp.diff(snn.output[k], *[x[d] for d in directions]) for k in range(2)])
    kernel = build_structured_function(entries, snn)
    ps, X = random_params(net, seed), np.random.default_rng(seed).normal(size=(4, 3))
    ordered = tuple(sorted(directions))
    for k in range(2):
        want = jax.jit(jax.vmap(_nested_derivative(lambda z, k=k: net.apply(z, ps)[k], ordered)))(X)
        np.testing.assert_allclose(kernel(X, ps)[:, k], want, rtol=1e-10, atol=1e-12)


def test_parameter_gradient_of_a_third_derivative_matches_jax() -> None:
    net = Chain(Dense(2, 4, "softplus"), Dense(4, 1))
    snn = StructuredNetwork(net)
    x = snn.input
    third = sp.diff(snn.output[0], x[1], 3) + x[0] * sp.diff(snn.output[0], x[0], x[1], x[1])
    kernel = build_structured_function(snn.parameter_gradient(third ** 2), snn)
    ps, X = random_params(net, 5), np.random.default_rng(5).normal(size=(5, 2))

    def loss(p, z):
        u = lambda z: net.apply(z, p)[0]  # noqa: E731
        return (_nested_derivative(u, (1, 1, 1))(z) + z[0] * _nested_derivative(u, (0, 1, 1))(z)) ** 2

    assert_tree_close(kernel(X, ps), jax.jit(jax.vmap(jax.grad(loss), (None, 0)))(ps, X), rtol=1e-9)
    assert "s1_4" in kernel.source  # σ'''' for the reverse pass through σ'''


def test_a_weight_penalty_is_one_formula_on_the_whole_weight() -> None:
    net = Chain(Dense(2, 5, "tanh"), Dense(5, 1))
    snn = StructuredNetwork(net)
    loss, targets = hnn_loss(snn)
    lam = sp.Symbol("lam")
    W = snn.params["L1"]["W"]
    penalty = lam * sum(e ** 2 for e in sp.Matrix(W))
    kernel = build_structured_function(snn.parameter_gradient(loss + penalty), snn, targets,
                                       params={"lam": lam})
    assert "2 * ps['lam'] * ps['L1']['W']" in kernel.source
    ps, rng = random_params(net, 7), np.random.default_rng(7)
    X, T = rng.normal(size=(4, 2)), rng.normal(size=(4, 2))
    want = hnn_reference(net)(ps, X, T)
    want["L1"]["W"] = want["L1"]["W"] + 2 * 0.25 * ps["L1"]["W"]
    got = kernel(X, T, {**ps, "lam": 0.25})
    assert_tree_close({k: v for k, v in got.items() if k != "lam"}, want)


def test_a_penalty_on_some_entries_matches_jax() -> None:
    net = Chain(Dense(2, 3, "sin"), Dense(3, 2, "tanh"))
    snn = StructuredNetwork(net)
    W, b = snn.params["L2"]["W"], snn.params["L1"]["b"]
    loss = (snn.output[0] - 1) ** 2 + W[0, 1] ** 3 * b[2, 0] + sp.cos(W[1, 2])
    kernel = build_structured_function({"g": snn.parameter_gradient(loss), "loss": loss}, snn)
    ps, X = random_params(net, 8), np.random.default_rng(8).normal(size=(4, 2))

    def reference(p, z):
        return ((net.apply(z, p)[0] - 1) ** 2 + p["L2"]["W"][0, 1] ** 3 * p["L1"]["b"][2]
                + jnp.cos(p["L2"]["W"][1, 2]))

    got = kernel(X, ps)
    np.testing.assert_allclose(got["loss"], jax.vmap(reference, (None, 0))(ps, X), rtol=1e-12)
    assert_tree_close(got["g"], jax.vmap(jax.grad(reference), (None, 0))(ps, X))


def test_a_weight_matrix_read_whole_is_refused_naming_it() -> None:
    snn = StructuredNetwork(Chain(Dense(2, 3, "tanh"), Dense(3, 1)))
    W = snn.params["L1"]["W"]
    with pytest.raises(BuildError, match=r"eqs\['L1'\]\['W'\]: .*read as a whole matrix"):
        build_structured_function(snn.parameter_gradient(snn.output[0] + sp.Trace(W * W.T)), snn)


def test_one_output_reverse_rows_are_vectors_and_the_weight_transpose_is_shared() -> None:
    net = Chain(Dense(2, 40, "tanh"), Dense(40, 1))
    snn = StructuredNetwork(net)
    kernel = build_structured_function(sk.hamiltonian_vector_field(snn.output[0], list(snn.input)), snn)
    body = kernel.source.splitlines()
    assert "    WT1 = ps['L1']['W'].T" in body
    assert "    a0 = a1 * d1 @ WT1.T" in body  # (…, 40) @ (40, 2): no (…, 1, 40) rows
    ps, X = random_params(net, 9), np.random.default_rng(9).normal(size=(3, 2))
    g = jax.vmap(jax.grad(lambda z: net.apply(z, ps)[0]))(X)
    np.testing.assert_allclose(kernel(X, ps), np.stack([g[:, 1], -g[:, 0]], -1), rtol=1e-12)


def test_share_weight_transposes_binds_a_weight_read_both_ways_once() -> None:
    module = ast.parse("def kernel(x1, ps):\n"
                       "    h = x1 @ ps['L1']['W'].T + ps['L1']['b']\n"
                       "    r = h @ ps['L1']['W']\n"
                       "    q = x1 @ ps['L2']['W'].T + ps['L1']['W'][0, 1]\n"
                       "    return r, q\n")
    body = ast.unparse(share_weight_transposes(module)).splitlines()
    assert body[1:5] == ["    WT1 = ps['L1']['W'].T", "    h = x1 @ WT1 + ps['L1']['b']",
                         "    r = h @ WT1.T", "    q = x1 @ ps['L2']['W'].T + ps['L1']['W'][0, 1]"]


def test_partitions_are_the_terms_of_faa_di_bruno() -> None:
    assert sorted(map(sorted, partitions((0, 1, 2)))) == sorted(map(sorted, [
        [(0,), (1,), (2,)], [(0, 1), (2,)], [(0, 2), (1,)], [(1, 2), (0,)], [(0, 1, 2)]]))
    assert len(list(partitions((1, 1, 1, 1)))) == 15  # Bell number B4


def test_activation_derivatives_of_any_order() -> None:
    forms = ActivationForms.of(Dense(1, 1, "sin"))
    z = forms.variable
    assert forms.derivative(4) == sp.sin(z) and forms.derivative(3) == -sp.cos(z)
    with pytest.raises(BuildError, match="order: expected a non-negative integer, got -1"):
        forms.derivative(-1)


def test_two_losses_over_two_applications_of_the_network_match_jax() -> None:
    net = Chain(Dense(2, 4, "tanh"), Dense(4, 2, "sigmoid"))
    snn = StructuredNetwork(net)
    x = snn.input
    other = snn([2 * x[0], x[1] ** 2])
    first = (snn.output[0] - 1) ** 2 + sp.diff(other[1], x[0]) ** 2
    second = sp.diff(snn.output[1], x[0], x[1]) * other[0]
    kernel = build_structured_function({"first": snn.parameter_gradient(first),
                                        "second": snn.parameter_gradient(second)}, snn)
    ps, X = random_params(net, 11), np.random.default_rng(11).normal(size=(5, 2))

    def f(p, z):
        return net.apply(z, p)

    def g(p, z):
        return f(p, jnp.stack([2 * z[0], z[1] ** 2]))

    def first_loss(p, z):
        return (f(p, z)[0] - 1) ** 2 + jax.grad(lambda z: g(p, z)[1])(z)[0] ** 2

    def second_loss(p, z):
        return jax.grad(lambda z: jax.grad(lambda z: f(p, z)[1])(z)[0])(z)[1] * g(p, z)[0]

    got = kernel(X, ps)
    for name, loss in (("first", first_loss), ("second", second_loss)):
        assert_tree_close(got[name], jax.jit(jax.vmap(jax.grad(loss), (None, 0)))(ps, X))
