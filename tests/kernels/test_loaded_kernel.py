"""A loaded kernel (`symkern.load(kernel.export(...), kernel.const_args)`) behaves like the
kernel it came from: gradients through it, an empty batch, checked parameters. References:
the kernel itself and hand-written jax.numpy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import symkern as sk

x0, x1, a = sp.symbols("x0 x1 a")
W = sp.MatrixSymbol("W", 2, 2)


@pytest.fixture(scope="module")
def pair():
    eqs = [sp.sin(x0) * a + x1**2, W * sp.Matrix([x0, x1])]
    kernel = sk.build_function(eqs, [x0, x1], params={"a": a, "W": W})
    ps = {"a": np.float32(2.0), "W": np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)}
    X = np.random.default_rng(0).normal(size=(6, 2)).astype(np.float32)
    return kernel, sk.load(kernel.export(X, ps), kernel.const_args), ps, X


def _hand(X, ps):
    return [jnp.sin(X[..., 0]) * ps["a"] + X[..., 1] ** 2, X @ ps["W"].T]


def test_gradients_through_a_loaded_kernel(pair) -> None:
    kernel, loaded, ps, X = pair

    def loss(f):
        return lambda X, ps: sum(jnp.sum(leaf**2) for leaf in f(X, ps))

    for argnums in (0, 1):
        expected = jax.grad(loss(_hand), argnums)(X, ps)
        for f in (kernel, loaded, jax.jit(loaded)):
            got = jax.grad(loss(f), argnums)(X, ps)
            for e, g in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(got),
                            strict=True):
                np.testing.assert_allclose(g, e, rtol=2e-5, atol=1e-5)


@given(batch=st.lists(st.integers(0, 3), min_size=1, max_size=3))
@settings(max_examples=15, deadline=None)
def test_loaded_kernel_takes_every_batch_of_its_rank(pair, batch) -> None:
    """The batch sizes are symbolic (`b0 >= 1` for jax.export); an empty batch still comes
    back empty, in the kernel's shapes."""
    kernel, _, ps, X = pair
    example = np.zeros(tuple(batch) + (2,), np.float32)
    loaded = sk.load(kernel.export(example, ps), kernel.const_args)
    data = np.random.default_rng(len(batch)).normal(size=tuple(batch) + (2,)).astype(np.float32)
    expected, got = kernel(data, ps), loaded(data, ps)
    for e, g in zip(expected, got, strict=True):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)


def test_loaded_kernel_checks_its_parameters(pair) -> None:
    _, loaded, ps, X = pair
    with pytest.raises(sk.ArgumentError, match=r"ps: expected a tree of the structure"):
        loaded(X, {"a": 1.0})
    with pytest.raises(sk.ArgumentError, match=r'ps\["W"\]: expected shape \(2, 2\), got \(3,\)'):
        loaded(X, {"a": 1.0, "W": np.ones(3)})
    with pytest.raises(sk.ArgumentError, match=r'ps\["a"\]: expected shape \(\), got \(1,\)'):
        loaded(X, {"a": [1.0], "W": ps["W"]})
    np.testing.assert_allclose(loaded(X, {"a": 2, "W": ps["W"].tolist()})[0],
                               loaded(X, ps)[0], rtol=1e-6)
