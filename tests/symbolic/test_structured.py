"""Structured networks: the array programs against JAX's own AD and the scalarized kernels."""

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
from symkern.codegen.structured import index_by_batch_structured
from symkern.errors import CodegenDriftError
from symkern.symbolic import Chain, Dense, SymbolicNetwork, gradient
from symkern.symbolic.structured import (
    StructuredNetwork,
    hamiltonian_vector_field,
    prefer_structured,
)

ACTIVATIONS = ["tanh", "sigmoid", "softplus", "sin", "gelu"]
# each example compiles a kernel: few examples, and no shrinking (minutes on a loaded 2-core box)
FAST = settings(max_examples=4, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])


@st.composite
def networks(draw, max_depth: int = 3, max_width: int = 6) -> Chain:
    depth = draw(st.integers(1, max_depth))
    widths = draw(st.lists(st.integers(1, max_width), min_size=depth + 1, max_size=depth + 1))
    names = draw(st.lists(st.sampled_from(ACTIVATIONS), min_size=depth, max_size=depth))
    return Chain(*(Dense(widths[k], widths[k + 1], names[k]) for k in range(depth)))


def random_params(net: Chain, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {name: {"W": rng.normal(0.0, 0.8, (layer.n_out, layer.n_in)),
                   "b": rng.normal(0.0, 0.5, layer.n_out)}
            for name, layer in net.named_layers()}


def assert_close(got, want, rtol: float = 1e-12) -> None:
    """Relative to the array's scale: entries near zero are compared at rtol · max|want|."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-300)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


def matrix_shape(rows: int, cols: int) -> tuple[int, ...]:
    """symkern's result shape of a rows×cols Matrix: a column is a vector."""
    return (rows,) if cols == 1 else (rows, cols)


def squared_loss(snn, y: sp.Matrix) -> sp.Expr:
    return sum((snn.output[k] - y[k]) ** 2 for k in range(snn.net.output_dim))


@FAST
@given(net=networks(), seed=st.integers(0, 2**16))
def test_output_jacobian_hessian_gradient_match_jax(net: Chain, seed: int) -> None:
    snn = StructuredNetwork(net)
    m = net.output_dim
    y = sp.Matrix(m, 1, lambda i, _: sp.Dummy(f"y{i}"))
    eqs = {
        "y": snn.output,
        "J": snn.output.jacobian(snn.input),
        "H": sp.hessian(snn.output[m - 1], snn.input),
        "g": snn.parameter_gradient(squared_loss(snn, y)),
    }
    kernel = build_structured_function(eqs, snn, y)
    ps = random_params(net, seed)
    rng = np.random.default_rng(seed)
    X, Y = rng.normal(size=(5, net.input_dim)), rng.normal(size=(5, m))
    got = kernel(X, Y, ps)

    def f(x):
        return net.apply(x, ps)

    def loss(p, x, t):
        return jnp.sum((net.apply(x, p) - t) ** 2)

    n = net.input_dim
    assert_close(got["y"], f(X))
    # the references as jitted programs (their operations one by one compile each)
    assert_close(got["J"], jax.jit(jax.vmap(jax.jacfwd(f)))(X).reshape((5, *matrix_shape(m, n))))
    assert_close(got["H"], jax.jit(jax.vmap(jax.hessian(lambda x: f(x)[m - 1])))(X).reshape(
        (5, *matrix_shape(n, n))))
    want = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))(ps, X, Y)
    for name in ps:
        for leaf in ("W", "b"):
            assert_close(got["g"][name][leaf], want[name][leaf])


def test_same_values_as_the_scalarized_kernels_2_3_2() -> None:
    check_against_scalarized(Chain(Dense(2, 3, "softplus"), Dense(3, 2, "gelu")), 7)


@pytest.mark.slow
@settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(net=networks(max_depth=3, max_width=6), seed=st.integers(0, 2**16))
def test_same_values_as_the_scalarized_kernels(net: Chain, seed: int) -> None:
    # n_in ≥ 2: the scalarized path takes an (out, 1) weight as shape (out,) (a column
    # Matrix leaf), which Dense(1, k) params do not match — a separate issue
    if any(layer.n_in == 1 for layer in net.layers):
        return
    check_against_scalarized(net, seed)


def check_against_scalarized(net: Chain, seed: int) -> None:
    structured, scalar = StructuredNetwork(net), SymbolicNetwork(net)
    m = net.output_dim
    y = sp.Matrix(m, 1, lambda i, _: sp.Dummy(f"y{i}"))
    ps = random_params(net, seed)
    rng = np.random.default_rng(seed)
    X, Y = rng.normal(size=(4, net.input_dim)), rng.normal(size=(4, m))

    def eqs(snn, grads):
        return {"y": snn.output, "J": snn.output.jacobian(snn.input),
                "H": sp.hessian(snn.output[0], snn.input), "g": grads}

    ours = build_structured_function(
        eqs(structured, structured.parameter_gradient(squared_loss(structured, y))), structured, y)
    theirs = sk.build_function(
        eqs(scalar, gradient(squared_loss(scalar, y), scalar.params)), scalar.input, y,
        params=scalar.params)
    got, want = ours(X, Y, ps), theirs(X, Y, ps)
    want["g"] = jax.tree_util.tree_map(lambda a: a.reshape(a.shape[:1] + (-1,)) if a.ndim == 3
                                       and a.shape[-1] == 1 else a, want["g"])
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got),
                            jax.tree_util.tree_leaves(want), strict=True):
        assert_close(a, np.reshape(b, np.shape(a))), jax.tree_util.keystr(path)


def test_hamiltonian_vector_field_with_a_potential() -> None:
    net = Chain(Dense(4, 6, "tanh"), Dense(6, 1, "softplus"))
    snn = StructuredNetwork(net)
    x = list(snn.input)
    H = snn.output[0] + x[0] ** 2 / 2 + sp.cos(x[1])  # H = net(q, p)[0] + V(q)
    kernel = build_structured_function({"F": hamiltonian_vector_field(H, x), "H": H}, snn)
    ps = random_params(net, 1)
    X = np.random.default_rng(1).normal(size=(7, 4))

    def h(z):
        return net.apply(z, ps)[0] + z[0] ** 2 / 2 + jnp.cos(z[1])

    grad = jax.vmap(jax.grad(h))(X)
    got = kernel(X, ps)
    assert_close(got["F"], np.concatenate([grad[:, 2:], -grad[:, :2]], axis=1))
    assert_close(got["H"], jax.vmap(h)(X))
    # ∇H is one backprop of the scalar (reverse rows: a_l), not a forward Jacobian
    assert "a0" in kernel.source and "t1" not in kernel.source


def test_network_applied_to_expressions_of_two_data_arguments() -> None:
    net = Chain(Dense(2, 3, "sin"), Dense(3, 2, "tanh"))
    snn = StructuredNetwork(net)
    q, p = sp.symbols("q p")
    out = snn([2 * q, p ** 2])
    kernel = build_structured_function({"v": out[1] * q, "dq": sp.diff(out[0], q)}, snn, [q, p])
    ps = random_params(net, 2)
    X = np.random.default_rng(2).normal(size=(3, 2))
    Q = np.random.default_rng(3).normal(size=(3, 2))

    def f(qp):
        return net.apply(jnp.stack([2 * qp[0], qp[1] ** 2]), ps)

    got = kernel(X, Q, ps)
    assert_close(got["v"], jax.vmap(f)(Q)[:, 1] * Q[:, 0])
    assert_close(got["dq"], jax.vmap(jax.grad(lambda qp: f(qp)[0]))(Q)[:, 0])


def test_source_is_a_line_per_layer_of_matrix_products() -> None:
    snn = StructuredNetwork(Chain(Dense(8, 256, "tanh"), Dense(256, 256, "tanh"), Dense(256, 8, "tanh")))
    kernel = build_structured_function(snn.output, snn)
    body = kernel.source.strip().splitlines()[1:]
    assert body == [
        "    h1 = jnp.tanh(x1 @ ps['L1']['W'].T + ps['L1']['b'])",
        "    h2 = jnp.tanh(h1 @ ps['L2']['W'].T + ps['L2']['b'])",
        "    h3 = jnp.tanh(h2 @ ps['L3']['W'].T + ps['L3']['b'])",
        "    return h3,",
    ]


def test_float32_and_jax_grad_through_the_kernel() -> None:
    net = Chain(Dense(3, 4, "gelu"), Dense(4, 2, "sigmoid"))
    snn = StructuredNetwork(net)
    kernel = build_structured_function(snn.output, snn, dtype="float32")
    ps = random_params(net, 4)
    X = np.random.default_rng(4).normal(size=(6, 3))
    assert kernel(X, ps).dtype == np.float32
    k64 = build_structured_function(snn.output, snn)
    g = jax.grad(lambda p: jnp.sum(k64(X, p) ** 2))(ps)
    want = jax.grad(lambda p: jnp.sum(net.apply(X, p) ** 2))(ps)
    assert_close(g["L1"]["W"], want["L1"]["W"])


def test_prefer_structured_by_layer_weights() -> None:
    assert not prefer_structured(Chain(Dense(4, 16, "tanh"), Dense(16, 4)))  # 64 weights
    assert prefer_structured(Chain(Dense(4, 17, "tanh"), Dense(17, 4)))
    assert prefer_structured(Dense(9, 8), max_weights=64)


# ---- the rule ---------------------------------------------------------------------------------


def _module(body: str) -> ast.Module:
    return ast.parse("def kernel(x1, ps):\n" + "".join(f"    {line}\n" for line in body.splitlines()))


@pytest.mark.parametrize("body", [
    "z = x1 @ ps['W'].T + ps['b']\nreturn z,",
    "return x1[..., 0] * 2,",
    "g = x1[..., None, :] * x1[..., :, None]\nreturn g,",
    "h = jnp.tanh(x1)\nreturn h * x1,",
    "return jnp.broadcast_to(1.0, x1.shape[:-1]),",
    "return -2 * x1,",
    "return x1 * ps['c'],",
    "return ps['W'][0, 1] * x1 + ps['b'][2],",
])
def test_index_by_batch_structured_accepts_batch_leading_reads(body: str) -> None:
    module = _module(body)
    assert index_by_batch_structured(module, {"x1": 1}, ["ps['c']"]) is module


@pytest.mark.parametrize("body", [
    "return ps['W'] @ x1,",
    "return x1.T,",
    "return jnp.sum(x1),",
    "return x1[0],",
    "y = x1\nreturn y,",
    "return x1 * ps['b'],",
    "return x1 * ps['W'][:, 0],",
    "return x1 * ps['c'][0:1],",
])
def test_index_by_batch_structured_rejects_reads_that_ignore_the_batch(body: str) -> None:
    with pytest.raises(CodegenDriftError, match="index_by_batch_structured"):
        index_by_batch_structured(_module(body), {"x1": 1}, ["ps['c']"])


# ---- seeds ∂loss/∂y printed once on whole vectors when every entry is one formula ---------------

ELEMENTWISE_LOSSES = {
    # name: (SymPy term for entry k, JAX term, whether every seed entry is one formula)
    "squared": (lambda h, y, c, k: (h - y) ** 2, lambda h, y, c, k: (h - y) ** 2, True),
    "scaled quartic": (lambda h, y, c, k: c * (h - y) ** 4, lambda h, y, c, k: c * (h - y) ** 4, True),
    "log cosh-like": (lambda h, y, c, k: sp.log(1 + (h - y) ** 2),
                      lambda h, y, c, k: jnp.log(1 + (h - y) ** 2), True),
    "product": (lambda h, y, c, k: sp.sin(h) * y * c, lambda h, y, c, k: jnp.sin(h) * y * c, True),
    "weighted per entry": (lambda h, y, c, k: (k + 1) * (h - y) ** 2,
                           lambda h, y, c, k: (k + 1) * (h - y) ** 2, False),
    "piecewise": (lambda h, y, c, k: sp.Piecewise((h - y, h > y), (2 * (y - h), True)),
                  lambda h, y, c, k: jnp.where(h > y, h - y, 2 * (y - h)), False),
}


@pytest.mark.parametrize("coupled", [False, True])
@pytest.mark.parametrize("loss_name", sorted(ELEMENTWISE_LOSSES))
@settings(max_examples=2, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(net=networks(max_depth=2, max_width=5), seed=st.integers(0, 2**16))
def test_elementwise_and_coupled_losses_match_jax_grad(net, seed, loss_name, coupled) -> None:
    snn = StructuredNetwork(net)
    m = net.output_dim
    c = sp.Symbol("c")
    y = sp.Matrix(m, 1, lambda i, _: sp.Dummy(f"y{i}"))
    term, jax_term, _ = ELEMENTWISE_LOSSES[loss_name]
    loss = sum(term(snn.output[k], y[k], c, k) for k in range(m))
    if coupled:  # a term reading every output: no seed entry is one formula any more
        loss += (sum(snn.output) - sum(y)) ** 2
    kernel = build_structured_function(snn.parameter_gradient(loss), snn, y, params={"c": c})
    one_line = ELEMENTWISE_LOSSES[loss_name][2] and not coupled and m > 1
    assert ("jnp.stack" not in kernel.source) == one_line, kernel.source
    ps = random_params(net, seed)
    rng = np.random.default_rng(seed)
    X, Y = rng.normal(size=(6, net.input_dim)), rng.normal(size=(6, m))

    def jax_loss(p, x, t):
        h = net.apply(x, p)
        total = sum(jax_term(h[k], t[k], 0.7, k) for k in range(m))
        return total + ((jnp.sum(h) - jnp.sum(t)) ** 2 if coupled else 0.0)

    got = kernel(X, Y, {**ps, "c": 0.7})
    want = jax.jit(jax.vmap(jax.grad(jax_loss), in_axes=(None, 0, 0)))(ps, X, Y)
    for name in ps:
        for leaf in ("W", "b"):
            assert_close(got[name][leaf], want[name][leaf])


def test_a_squared_loss_seed_is_one_array_line() -> None:
    snn = StructuredNetwork(Chain(Dense(3, 4, "tanh"), Dense(4, 3, "tanh")))
    y = sp.Matrix(3, 1, lambda i, _: sp.Symbol(f"y{i}"))
    kernel = build_structured_function(snn.parameter_gradient(squared_loss(snn, y)), snn, y)
    assert "    g = -2 * x2 + 2 * h2\n" in kernel.source
    assert "stack" not in kernel.source


def test_uniform_template_accepts_only_one_formula_per_entry() -> None:
    from symkern.codegen.structured import uniform_template

    h, y = sp.symbols("h:3"), sp.symbols("y:3")
    c = sp.Symbol("c")
    assert uniform_template([2 * (h[k] - y[k]) * c for k in range(3)], [h, y]) == 2 * (h[0] - y[0]) * c
    assert uniform_template([sp.exp(h[k]) for k in range(3)], [h, y]) == sp.exp(h[0])
    assert uniform_template([(k + 1) * h[k] for k in range(3)], [h, y]) is None   # k-dependent
    assert uniform_template([h[0] * h[k] for k in range(3)], [h, y]) is None      # reads entry 0
    assert uniform_template([h[k] + h[(k + 1) % 3] for k in range(3)], [h, y]) is None
    assert uniform_template([c, c, c], [h, y]) is None                           # no vector
    assert uniform_template([sp.Max(h[k], y[k]) for k in range(3)], [h, y]) is None
    assert uniform_template([h[0]], [h[:1]]) is None                              # one entry


@pytest.mark.parametrize("width, transposed", [(5, False), (16, False), (17, True), (40, True)])
def test_both_forward_jacobian_forms_match_jacfwd(width: int, transposed: bool) -> None:
    net = Chain(Dense(3, width, "tanh"), Dense(width, 4, "sigmoid"))
    snn = StructuredNetwork(net)
    kernel = build_structured_function(snn.output.jacobian(snn.input), snn)
    assert ("jnp.swapaxes" in kernel.source) == transposed, kernel.source
    ps = random_params(net, width)
    X = np.random.default_rng(width).normal(size=(7, 3))
    assert_close(kernel(X, ps), jax.vmap(jax.jacfwd(lambda x: net.apply(x, ps)))(X))
