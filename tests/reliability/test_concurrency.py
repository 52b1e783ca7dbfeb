"""Kernels are safe to share between threads, to build in parallel, and to compile racily.

Every thread starts at a barrier, so the calls really overlap; each result is compared
with a hand-written jnp function of the same mathematics.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp

import symkern as sk

THREADS = 8
x0, x1, a, b = sp.symbols("x0 x1 a b")
W = sp.Matrix(2, 2, sp.symbols("w0:4"))


def _run_together(task, count=THREADS):
    """Run `task(k)` for k in range(count) on `count` threads released by one barrier."""
    barrier = threading.Barrier(count)

    def started(k):
        barrier.wait(timeout=60)
        return task(k)

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(started, range(count)))


def _reference(X, ps):
    """sin(x0)*a + x1**2 * b, and W @ [x0, x1] — written by hand."""
    scalar = jnp.sin(X[..., 0]) * ps["a"] + X[..., 1] ** 2 * ps["b"]
    vector = jnp.einsum("ij,...j->...i", ps["W"], X)
    return scalar, vector


def _build():
    return sk.build_function([sp.sin(x0) * a + x1**2 * b, W * sp.Matrix([x0, x1])], [x0, x1],
                             params={"a": a, "b": b, "W": W}, dtype="float64")


def _inputs(k):
    rng = np.random.default_rng(k)
    X = rng.normal(size=(16 + k, 2))   # different batch sizes: different shapes too
    ps = {"a": float(k), "b": -0.5 * k, "W": rng.normal(size=(2, 2))}
    return X, ps


def test_one_kernel_called_from_eight_threads_at_once_gives_each_its_own_result():
    kernel = _build()
    kernel(*_inputs(0))  # compile one shape first; the others compile under contention

    def task(k):
        X, ps = _inputs(k)
        results = [kernel(X, ps) for _ in range(5)]
        return X, ps, results

    for X, ps, results in _run_together(task):
        expected_scalar, expected_vector = _reference(X, ps)
        for scalar, vector in results:
            np.testing.assert_allclose(scalar, expected_scalar, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(vector, expected_vector, rtol=1e-12, atol=1e-12)


def test_one_kernel_with_same_shapes_and_different_parameters_from_eight_threads():
    kernel = _build()
    # below PROBE_FROM samples: one executable, no assembly probe (tests/batching/test_assembly.py)
    X = np.random.default_rng(99).normal(size=(32, 2))

    def task(k):
        ps = {"a": float(k), "b": float(k * k), "W": np.full((2, 2), float(k))}
        bound = kernel.bind(ps)
        return ps, [kernel(X, ps) for _ in range(5)], bound(X)

    for ps, results, bound_result in _run_together(task):
        expected_scalar, expected_vector = _reference(X, ps)
        for scalar, vector in [*results, bound_result]:
            np.testing.assert_allclose(scalar, expected_scalar, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(vector, expected_vector, rtol=1e-12, atol=1e-12)
    # eight sets of values, two argument signatures: Python floats (weakly typed) in `ps`,
    # device arrays in the bound form; values never compile
    assert kernel.compilations == 2


EXPRESSIONS = [
    (lambda x, y: sp.sin(x) * y, lambda x, y: jnp.sin(x) * y),
    (lambda x, y: sp.exp(-x**2) + y, lambda x, y: jnp.exp(-x**2) + y),
    (lambda x, y: sp.Piecewise((x, x > y), (y, True)), lambda x, y: jnp.where(x > y, x, y)),
    (lambda x, y: sp.tanh(x * y) / (1 + y**2), lambda x, y: jnp.tanh(x * y) / (1 + y**2)),
    (lambda x, y: sp.sqrt(x**2 + y**2), lambda x, y: jnp.hypot(x, y)),
    (lambda x, y: sp.Max(x, y) - sp.Min(x, y), lambda x, y: jnp.abs(x - y)),
    (lambda x, y: sp.log(1 + x**2) * sp.cos(y), lambda x, y: jnp.log1p(x**2) * jnp.cos(y)),
    (lambda x, y: sp.atan2(y, x), lambda x, y: jnp.arctan2(y, x)),
]


@pytest.mark.parametrize("cse", [True, False])
def test_kernels_built_in_parallel_threads_are_each_correct(cse):
    X = np.random.default_rng(1).normal(size=(32, 2))

    def task(k):
        symbolic, _ = EXPRESSIONS[k]
        # each thread its own symbols *and* shared ones: SymPy's caches see both
        u, v = sp.symbols(f"u{k} v{k}") if k % 2 else (x0, x1)
        kernel = sk.build_function(symbolic(u, v), [u, v], cse=cse, dtype="float64")
        return kernel, kernel(X)

    for (kernel, result), (_, numeric) in zip(_run_together(task), EXPRESSIONS, strict=True):
        np.testing.assert_allclose(result, numeric(X[:, 0], X[:, 1]), rtol=1e-12, atol=1e-12,
                                   err_msg=kernel.source)


def test_first_call_compilation_racing_from_several_threads_compiles_once():
    kernel = _build()
    X, ps = _inputs(3)

    results = _run_together(lambda k: kernel(X, ps))
    expected_scalar, expected_vector = _reference(X, ps)
    for scalar, vector in results:
        np.testing.assert_allclose(scalar, expected_scalar, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(vector, expected_vector, rtol=1e-12, atol=1e-12)
    assert kernel.compilations == 1


def test_racing_first_calls_of_two_shapes_compile_each_shape_once():
    kernel = _build()
    inputs = [_inputs(0), (_inputs(0)[0][:5], _inputs(0)[1])]

    results = _run_together(lambda k: kernel(*inputs[k % 2]))
    for k, (scalar, _vector) in enumerate(results):
        np.testing.assert_allclose(scalar, _reference(*inputs[k % 2])[0], rtol=1e-12)
    assert kernel.compilations == 2


def test_jax_jit_of_a_kernel_called_from_threads():
    kernel = _build()
    jitted = jax.jit(kernel)

    def task(k):
        X, ps = _inputs(k % 2)
        return X, ps, jitted(X, ps)

    for X, ps, (scalar, vector) in _run_together(task):
        expected_scalar, expected_vector = _reference(X, ps)
        np.testing.assert_allclose(scalar, expected_scalar, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(vector, expected_vector, rtol=1e-12, atol=1e-12)
