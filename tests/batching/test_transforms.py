"""Kernels are ordinary JAX functions: jit, grad (data and parameters) and vmap go through."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp

import symkern as sk

x0, x1, a, b = sp.symbols("x0 x1 a b")
EXPR = sp.sin(x0) * a + x1**2 * b + sp.exp(a * x1)


def sympy_value(expr, point, params):
    return float(expr.subs({x0: point[0], x1: point[1], **params}).evalf(30))


@pytest.fixture(scope="module", params=[True, False], ids=["cse", "no-cse"])
def kernel(request):
    return sk.build_function(EXPR, [x0, x1], params={"a": a, "b": b}, cse=request.param,
                             dtype="float64")


POINT = np.array([0.3, -0.7])
PARAMS = {"a": 1.3, "b": 0.4}


def test_jit_through_a_kernel(kernel):
    jitted = jax.jit(kernel)
    np.testing.assert_allclose(jitted(POINT, PARAMS), sympy_value(EXPR, POINT, {a: 1.3, b: 0.4}),
                               rtol=1e-13)


def test_grad_with_respect_to_data_matches_sympy_diff(kernel):
    grad = jax.grad(kernel)(POINT, PARAMS)
    subs = {a: 1.3, b: 0.4}
    expected = [sympy_value(EXPR.diff(v), POINT, subs) for v in (x0, x1)]
    np.testing.assert_allclose(grad, expected, rtol=1e-12)


def test_grad_with_respect_to_parameters_matches_sympy_diff(kernel):
    grad = jax.grad(kernel, argnums=1)(POINT, PARAMS)
    subs = {a: 1.3, b: 0.4}
    np.testing.assert_allclose(grad["a"], sympy_value(EXPR.diff(a), POINT, subs), rtol=1e-12)
    np.testing.assert_allclose(grad["b"], sympy_value(EXPR.diff(b), POINT, subs), rtol=1e-12)


def test_vmap_over_samples_and_over_parameters(kernel):
    points = np.random.default_rng(0).normal(size=(5, 2))
    by_sample = jax.vmap(kernel, in_axes=(0, None))(points, PARAMS)
    np.testing.assert_allclose(by_sample, kernel(points, PARAMS), rtol=1e-13)
    many = {"a": jnp.array([1.0, 2.0]), "b": jnp.array([0.0, 1.0])}
    by_param = jax.vmap(kernel, in_axes=(None, {"a": 0, "b": 0}))(POINT, many)
    for k in range(2):
        np.testing.assert_allclose(
            by_param[k], sympy_value(EXPR, POINT, {a: float(many["a"][k]),
                                                    b: float(many["b"][k])}), rtol=1e-12)


def test_grad_of_a_batched_sum_with_a_matrix_output():
    k = sk.build_function(sp.Matrix([[x0 * a, x1], [a * b, x0 * x1]]), [x0, x1],
                          params={"a": a, "b": b}, dtype="float64")
    points = np.random.default_rng(1).normal(size=(4, 2))

    def loss(ps):
        return jnp.sum(k(points, ps) ** 2)

    def reference(ps):
        m = jnp.stack([jnp.stack([points[:, 0] * ps["a"], points[:, 1]], -1),
                       jnp.stack([jnp.broadcast_to(ps["a"] * ps["b"], (4,)),
                                  points[:, 0] * points[:, 1]], -1)], -2)
        return jnp.sum(m ** 2)

    got = jax.grad(loss)(PARAMS)
    expected = jax.grad(reference)(PARAMS)
    np.testing.assert_allclose(got["a"], expected["a"], rtol=1e-12)
    np.testing.assert_allclose(got["b"], expected["b"], rtol=1e-12)


@pytest.mark.parametrize("cse", [True, False])
def test_piecewise_gradient_is_zero_not_nan_from_an_untaken_branch(cse):
    expr = sp.Piecewise((sp.sqrt(x0) + sp.log(x0) * a, x0 > 0), (x1 * a, True)) + sp.sqrt(x0 ** 2)
    k = sk.build_function(expr, [x0, x1], params={"a": a}, cse=cse, dtype="float64")
    grad_x, grad_p = jax.grad(k, argnums=(0, 1))(np.array([-1.0, 2.0]), {"a": 3.0})
    np.testing.assert_allclose(grad_x, [-1.0, 3.0])
    np.testing.assert_allclose(grad_p["a"], 2.0)
    grad_x, _ = jax.grad(k, argnums=(0, 1))(np.array([4.0, 2.0]), {"a": 3.0})
    np.testing.assert_allclose(grad_x, [0.25 + 0.75 + 1.0, 0.0])


def test_bound_kernel_evaluates_with_frozen_parameters(kernel):
    bound = kernel.bind(PARAMS)
    np.testing.assert_allclose(bound(POINT), kernel(POINT, PARAMS), rtol=1e-15)


def test_gradient_of_a_parameter_read_in_a_branch_over_a_batch():
    k = sk.build_function(sp.Piecewise((x0 * b, x0 > 0), (x0, True)), [x0], params={"b": b},
                          dtype="float64")
    X = np.array([[1.0], [-2.0], [3.0], [4.0]])
    grad = jax.grad(lambda p: k(X, p).sum())({"b": 2.0})
    np.testing.assert_allclose(grad["b"], 1.0 + 3.0 + 4.0)
