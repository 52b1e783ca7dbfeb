"""The flat-parameter form gives the same results as the tree form, and checks its buffer."""

import jax
import numpy as np
import pytest
import sympy as sp

import symkern as sk
from symkern.batching.flat import unflatten_parameters

x0, x1 = sp.symbols("x0 x1")
W = sp.Matrix(2, 2, sp.symbols("w0:4"))
b = sp.Matrix(sp.symbols("b0:2"))
c = sp.Symbol("c")


@pytest.fixture(scope="module")
def kernel():
    eq = (W * sp.Matrix([x0, x1]) + b).applyfunc(sp.tanh) * c
    return sk.build_function(eq, [x0, x1], params={"L": {"W": W, "b": b}, "c": c},
                             dtype="float64")


PS = {"L": {"W": np.array([[1.0, 2.0], [3.0, 4.0]]), "b": np.array([0.1, -0.2])}, "c": 1.5}


@pytest.mark.parametrize("batch", [(), (3,), (2000,)])
def test_flat_form_equals_tree_form(kernel, batch):
    X = np.random.default_rng(0).normal(size=batch + (2,))
    theta = kernel.flatten(PS)
    assert theta.shape == (7,) and isinstance(theta, jax.Array)
    np.testing.assert_allclose(kernel.flat()(X, theta), kernel(X, PS), rtol=1e-14)


def test_flatten_then_unflatten_round_trips(kernel):
    back = unflatten_parameters(kernel, kernel.flatten(PS))
    np.testing.assert_array_equal(back["L"]["W"], PS["L"]["W"])
    np.testing.assert_array_equal(back["c"], PS["c"])


def test_a_buffer_of_the_wrong_size_is_rejected(kernel):
    with pytest.raises(sk.ArgumentError, match=r"theta: expected a float64 buffer of shape \(7,\)"):
        kernel.flat()(np.zeros(2), np.zeros(6))


def test_grad_through_the_flat_form(kernel):
    X = np.random.default_rng(1).normal(size=(4, 2))
    flat = kernel.flat()
    theta = kernel.flatten(PS)
    grad_flat = jax.grad(lambda t: flat(X, t).sum())(theta)
    grad_tree = jax.grad(lambda p: kernel(X, p).sum())(jax.tree_util.tree_map(np.asarray, PS))
    np.testing.assert_allclose(grad_flat[:4], np.ravel(grad_tree["L"]["W"]), rtol=1e-12)
    np.testing.assert_allclose(grad_flat[6], grad_tree["c"], rtol=1e-12)
