"""`jax.vmap` of a kernel folds the mapped axis into the kernel's own batch.

The folded program is the kernel's own batched program (ScalarProgram.vmappable): its values
are bitwise the kernel's on the same samples, and it composes with jit and grad. Parameters
mapped per sample (ensembles) fold where they are scalars of a scalar body; other mapped
arguments take JAX's own batching. Each case is checked against hand-written JAX.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp

import symkern as sk

x0, x1, a, c = sp.symbols("x0 x1 a c")
EQS = {"v": sp.Matrix([sp.sin(x0) * a + x1 ** 2, sp.tanh(x0 * x1) * c]), "s": sp.cos(x1) * a}


@jax.jit  # one program a shape (its operations one by one compile each at each shape)
def hand(X, ps):
    X = jnp.asarray(X, jnp.float64)
    q, r = X[..., 0], X[..., 1]
    return {"v": jnp.stack([jnp.sin(q) * ps["a"] + r ** 2, jnp.tanh(q * r) * ps["c"]], axis=-1),
            "s": jnp.cos(r) * ps["a"]}


KERNEL = sk.build_function(EQS, [x0, x1], params={"a": a, "c": c}, dtype="float64")
PS = {"a": 0.7, "c": -1.2}


def close(got, want, rtol=1e-12):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=rtol)


def data(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1.5, 1.5, shape + (2,))


@pytest.mark.parametrize("shape", [(5,), (4, 3), (1,)])
def test_vmap_equals_the_kernels_own_batch_bitwise(shape):
    X = data(*shape)
    folded = jax.vmap(lambda x: KERNEL(x, PS))(X)
    own = KERNEL(X, PS)
    for f, o in zip(jax.tree_util.tree_leaves(folded), jax.tree_util.tree_leaves(own), strict=True):
        np.testing.assert_array_equal(np.asarray(f), np.asarray(o))
    close(folded, hand(X, PS))


def test_the_folded_program_is_the_kernels_batched_program():
    jaxpr = str(jax.make_jaxpr(jax.vmap(lambda x: KERNEL(x, PS)))(data(6, 3)))
    # the generated code runs once over the (6, 3) batch: no per-operation batching rule
    # moved an axis, and the folded call shows its whole batch
    assert "f64[6,3]" in jaxpr and "custom_jvp_call" in jaxpr


def test_nested_vmap_and_in_axes_other_than_zero():
    X = data(3, 4, 5)
    nested = jax.vmap(jax.vmap(lambda x: KERNEL(x, PS)))(X)
    close(nested, hand(X, PS))
    moved = jax.vmap(lambda x: KERNEL(x, PS), in_axes=1)(X)  # maps axis 1: (4, 3, 5, ...)
    close(moved, hand(np.moveaxis(X, 1, 0), PS))


def test_jit_of_vmap_and_vmap_of_jit():
    X = data(7)
    close(jax.jit(jax.vmap(lambda x: KERNEL(x, PS)))(X), hand(X, PS))
    close(jax.vmap(jax.jit(lambda x: KERNEL(x, PS)))(X), hand(X, PS))


def _total(tree):
    return sum(jnp.sum(leaf) for leaf in jax.tree_util.tree_leaves(tree))


def test_grad_of_vmap_and_vmap_of_grad():
    X = data(6)
    want = jax.grad(lambda X: _total(hand(X, PS)))(jnp.asarray(X))
    close(jax.grad(lambda X: _total(jax.vmap(lambda x: KERNEL(x, PS))(X)))(X), want)
    close(jax.vmap(jax.grad(lambda x: _total(KERNEL(x, PS))))(X), want)
    # parameter gradients through vmap, and per-sample parameter gradients
    want_p = jax.grad(lambda p: _total(hand(X, p)))(PS)
    close(jax.grad(lambda p: _total(jax.vmap(lambda x: KERNEL(x, p))(X)))(PS), want_p)
    per_sample = jax.vmap(lambda x: jax.grad(lambda p: _total(KERNEL(x, p)))(PS))(X)
    close(per_sample, jax.vmap(lambda x: jax.grad(lambda p: _total(hand(x, p)))(PS))(X))
    close(jax.jacfwd(lambda X: jax.vmap(lambda x: KERNEL(x, PS))(X)["s"])(X),
          jax.jacfwd(lambda X: hand(X, PS)["s"])(jnp.asarray(X)))


def test_ensembles_of_scalar_parameters_fold_and_agree():
    X = data(5, 3)
    ensemble = {"a": np.linspace(0.1, 0.9, 5), "c": np.linspace(-1, 1, 5)}
    got = jax.vmap(lambda x, p: KERNEL(x, p))(X, ensemble)
    want = jax.vmap(hand)(X, ensemble)
    close(got, want)
    # parameters mapped with the data unmapped: one data batch for every ensemble member
    shared = jax.vmap(lambda p: KERNEL(X[0], p))(ensemble)
    close(shared, jax.vmap(lambda p: hand(X[0], p))(ensemble))
    grads = jax.grad(lambda e: _total(jax.vmap(lambda x, p: KERNEL(x, p))(X, e)))(ensemble)
    close(grads, jax.grad(lambda e: _total(jax.vmap(hand)(X, e)))(ensemble))


def test_matrix_parameters_mapped_per_sample_take_jaxs_batching():
    W = sp.Matrix(2, 2, sp.symbols("w0:4"))
    kernel = sk.build_function(W * sp.Matrix([x0, x1]), [x0, x1], params={"W": W},
                               dtype="float64")
    X = data(4)
    Ws = np.random.default_rng(1).normal(size=(4, 2, 2))
    got = jax.vmap(lambda x, w: kernel(x, {"W": w}))(X, Ws)
    np.testing.assert_allclose(np.asarray(got), np.einsum("bij,bj->bi", Ws, X), rtol=1e-12)


def test_vmap_of_a_structured_network_kernel():
    net = sk.Chain(sk.Dense(2, 40, "tanh"), sk.Linear(40, 1))
    snn = sk.SymbolicNetwork(net)
    g = sk.gradient(snn.output[0], snn.input)
    kernel = sk.build_nn_function(sp.Matrix([g[1], -g[0]]), snn, dtype="float64")
    ps = net.init_params(seed=3)
    X = data(3, 70)
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda x: kernel(x, ps))(X)),
                               np.asarray(kernel(X, ps)), rtol=1e-12, atol=1e-12)


def test_vmap_of_a_kernel_with_two_data_arguments_one_unmapped():
    y = sp.Symbol("y")
    kernel = sk.build_function(sp.sin(x0) * y + x1, [x0, x1], y, dtype="float64")
    X, Y = data(5), np.float64(0.3)
    got = jax.vmap(lambda x: kernel(x, Y))(X)
    np.testing.assert_allclose(np.asarray(got), np.sin(X[:, 0]) * 0.3 + X[:, 1], rtol=1e-12)
    Ys = np.linspace(-1, 1, 5)
    got = jax.vmap(lambda yy: kernel(X[0], yy))(Ys)
    np.testing.assert_allclose(np.asarray(got), np.sin(X[0, 0]) * Ys + X[0, 1], rtol=1e-12)


# ---- loaded kernels ----------------------------------------------------------------------

LOADED = sk.load(KERNEL.export(data(5), PS), KERNEL.const_args)
LOADED_ONE = sk.load(KERNEL.export(data(), PS), KERNEL.const_args)  # a batch of rank 0


def test_vmap_of_a_loaded_kernel_folds_into_its_batch():
    X = data(4, 5)
    close(jax.vmap(lambda x: LOADED(x, PS))(X), KERNEL(X, PS))
    close(jax.jit(jax.vmap(lambda x: LOADED(x, PS)))(X), KERNEL(X, PS))
    # the exported program runs once over the merged batch: no loop
    assert "while" not in str(jax.make_jaxpr(jax.vmap(lambda x: LOADED(x, PS)))(X))


def test_vmap_of_a_loaded_kernel_loops_where_it_cannot_fold():
    X = data(6)
    close(jax.vmap(lambda x: LOADED_ONE(x, PS))(X), KERNEL(X, PS))  # no batch axis to fold into
    ensemble = {"a": np.linspace(0.1, 0.9, 4), "c": np.linspace(-1, 1, 4)}
    Xs = data(4, 5)
    close(jax.vmap(lambda x, p: LOADED(x, p))(Xs, ensemble), jax.vmap(hand)(Xs, ensemble))


def test_grad_through_vmap_of_a_loaded_kernel():
    X = data(3, 5)
    want = jax.grad(lambda X: _total(hand(X, PS)))(jnp.asarray(X))
    close(jax.grad(lambda X: _total(jax.vmap(lambda x: LOADED(x, PS))(X)))(X), want)
    close(jax.vmap(jax.grad(lambda x: _total(LOADED(x, PS))))(X), want)
    want_p = jax.grad(lambda p: _total(hand(X, p)))(PS)
    close(jax.grad(lambda p: _total(jax.vmap(lambda x: LOADED(x, p))(X)))(PS), want_p)
