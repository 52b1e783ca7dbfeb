"""Structured kernels run a chunk of samples at a time (`tile_chunk`): same values, any batch.

`StructuredKernel._compute` maps the array program over chunks of the flattened batch
(`lax.map`), padding the last chunk with the last sample. The references are hand-written
JAX (`net.apply`, `jax.jacfwd`, `jax.grad`), at every batch shape and chunk size.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st
from test_structured import assert_close, random_params

import symkern as sk
from symkern.batching.structured import TILE_CHUNK, TILE_FROM_VALUES, build_structured_function
from symkern.symbolic import Chain, Dense
from symkern.symbolic.structured import StructuredNetwork

ACTIVATIONS = ["tanh", "sigmoid", "softplus", "sin", "gelu"]
# each example compiles a kernel: few examples, no shrinking
FAST = settings(max_examples=5, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
#: the explicit examples only in the bounded profile; drawn ones too under SYMKERN_SLOW
EXPLICIT = FAST if os.environ.get("SYMKERN_SLOW") else settings(FAST, phases=[Phase.explicit])
BATCHES = [(), (0,), (1,), (3,), (7,), (2, 5), (4, 3)]


@st.composite
def networks(draw) -> Chain:
    depth = draw(st.integers(1, 3))
    widths = draw(st.lists(st.integers(1, 5), min_size=depth + 1, max_size=depth + 1))
    names = draw(st.lists(st.sampled_from(ACTIVATIONS), min_size=depth, max_size=depth))
    return Chain(*(Dense(widths[k], widths[k + 1], names[k]) for k in range(depth)))


def pieces_of_every_kind(net: Chain):
    """Output and Jacobian (whole arrays), a parameter gradient with a target data argument,
    and a formula around the network (scalar entries, stacked by the assembly)."""
    snn = StructuredNetwork(net)
    m = net.output_dim
    y = sp.Matrix(m, 1, lambda i, _: sp.Dummy(f"y{i}"))
    loss = sum((snn.output[k] - y[k]) ** 2 for k in range(m))
    x = list(snn.input)
    eqs = {"out": snn.output, "J": snn.output.jacobian(snn.input),
           "g": snn.parameter_gradient(loss),
           "F": sp.Matrix([snn.output[0] * x[0], sp.cos(x[-1]) + snn.output[m - 1]])}
    return snn, y, eqs


def references(net: Chain, ps: dict, X: np.ndarray, Y: np.ndarray) -> dict:
    batch = X.shape[:-1]
    n, m = net.input_dim, net.output_dim
    flat_x, flat_y = X.reshape(-1, n), Y.reshape(-1, m)

    def f(x):
        return net.apply(x, ps)

    def loss(p, x, t):
        return jnp.sum((net.apply(x, p) - t) ** 2)

    jac = jax.vmap(jax.jacfwd(f))(flat_x)
    out = jax.vmap(f)(flat_x)
    grads = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(ps, flat_x, flat_y)
    F = jnp.stack([out[:, 0] * flat_x[:, 0], jnp.cos(flat_x[:, -1]) + out[:, m - 1]], axis=-1)
    return {"out": out.reshape(batch + (m,)),
            "J": jac.reshape(batch + ((m, n) if n > 1 else (m,))),
            "g": jax.tree_util.tree_map(lambda g: g.reshape(batch + g.shape[1:]), grads),
            "F": F.reshape(batch + (2,))}


@EXPLICIT
@given(net=networks(), seed=st.integers(0, 2**16), batch=st.sampled_from(BATCHES),
       chunk=st.sampled_from([1, 2, 4]))
@example(net=Chain(Dense(2, 3, "tanh"), Dense(3, 2, "sin")), seed=0, batch=(2, 5), chunk=4)
def test_tiled_pieces_of_every_kind_match_jax(net, seed, batch, chunk) -> None:
    snn, y, eqs = pieces_of_every_kind(net)
    kernel = build_structured_function(eqs, snn, y)
    kernel.tile_chunk = chunk
    ps = random_params(net, seed)
    rng = np.random.default_rng(seed)
    X = rng.normal(size=batch + (net.input_dim,))
    Y = rng.normal(size=batch + (net.output_dim,))
    got = kernel(X, Y, ps)
    want = references(net, ps, X, Y)
    assert_close(got["out"], want["out"])
    assert_close(got["J"], want["J"])
    assert_close(got["F"], want["F"])
    for name in ps:
        for leaf in ("W", "b"):
            assert_close(got["g"][name][leaf], want["g"][name][leaf])


def test_the_default_tiles_from_the_largest_per_sample_intermediate() -> None:
    snn = StructuredNetwork(Chain(Dense(4, 16, "tanh"), Dense(16, 16, "tanh"), Dense(16, 4, "tanh")))
    forward = build_structured_function(snn.output, snn)
    jacobian = build_structured_function(snn.output.jacobian(snn.input), snn)
    gradient = build_structured_function(snn.parameter_gradient(sum(snn.output)), snn)
    # h1, h2: 16 values per sample; the Jacobian's 16x4 products: 64 (the weights, 256 each,
    # do not count: they are the same for every sample), four times its 16 outputs
    assert forward.largest_intermediate() == 16 < TILE_FROM_VALUES
    assert forward.tile_chunk is None
    assert jacobian.largest_intermediate() == 64 >= TILE_FROM_VALUES
    assert jacobian.tile_chunk == TILE_CHUNK
    # per-sample gradients: the largest arrays (dW2, 256 values) are outputs themselves
    assert gradient.largest_intermediate() >= TILE_FROM_VALUES
    assert gradient.tile_chunk is None


@pytest.fixture(scope="module")
def tiled():
    net = Chain(Dense(3, 5, "tanh"), Dense(5, 2, "softplus"))
    snn = StructuredNetwork(net)
    kernel = build_structured_function(snn.output.jacobian(snn.input), snn)
    kernel.tile_chunk = 4
    return net, kernel, random_params(net, 11)


def test_grad_through_a_tiled_kernel(tiled) -> None:
    net, kernel, ps = tiled
    X = np.random.default_rng(5).normal(size=(10, 3))

    def jac(p, x):
        return jax.vmap(jax.jacfwd(lambda z: net.apply(z, p)))(x)

    g = jax.grad(lambda p: jnp.sum(kernel(X, p) ** 2))(ps)
    want = jax.grad(lambda p: jnp.sum(jac(p, X) ** 2))(ps)
    for name in ps:
        assert_close(g[name]["W"], want[name]["W"], rtol=1e-10)
    gx = jax.grad(lambda x: jnp.sum(jnp.sin(kernel(x, ps))))(X)
    assert_close(gx, jax.grad(lambda x: jnp.sum(jnp.sin(jac(ps, x))))(X), rtol=1e-10)


def test_jit_vmap_bind_and_export_of_a_tiled_kernel(tiled) -> None:
    net, kernel, ps = tiled
    X = np.random.default_rng(6).normal(size=(3, 9, 3))
    want = jax.vmap(jax.jacfwd(lambda z: net.apply(z, ps)))(X.reshape(-1, 3)).reshape(3, 9, 2, 3)
    assert_close(jax.jit(kernel)(X, ps), want)
    assert_close(jax.vmap(kernel, in_axes=(1, None), out_axes=1)(X, ps), want)
    assert_close(kernel.bind(ps)(X), want)
    loaded = sk.load(kernel.export(X[0], ps), kernel.const_args)  # a symbolic batch: whole
    assert_close(loaded(X[1], ps), want[1])
