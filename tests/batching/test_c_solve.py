"""`BuildOptions(cpu_loop="c")` in a kernel of matrix expressions: each sample's linear
system solved by a C loop (symkern.codegen.c_solve, symkern.kernels.c_loop.solve).

Against NumPy's float64 solve on random systems of every size up to SOLVE_UP_TO and on both
sides of it, a sample's bits at every batch size and position (the threads' split
included), pivoting and singular systems, and the kernel's call paths against the default
kernel of the same expression and against `jax.jacfwd`. Skipped where there is no C++
compiler, except the refusals that come before the compiler is looked for.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import symkern as sk
from symkern.codegen import c_solve
from symkern.codegen.c_solve import UNROLLED_UP_TO
from symkern.errors import BuildError
from symkern.kernels import c_loop as loops

C = sk.BuildOptions(cpu_loop="c")
needs_compiler = pytest.mark.skipif(loops.compiler() is None,
                                    reason="cpu_loop='c' needs a C++ compiler")


def _systems(rng: np.random.Generator, batch: int, n: int, k: int,
             dtype: str = "float64") -> tuple[np.ndarray, np.ndarray]:
    """Random systems whose matrices are far from singular (the diagonal shifted by n), with
    the rows shuffled so that pivoting has to find them."""
    a = rng.standard_normal((batch, n, n)) + n * np.eye(n)
    a = a[:, rng.permutation(n)]
    return a.astype(dtype), rng.standard_normal((batch, n, k)).astype(dtype)


def _runs_the_c_solve(a: np.ndarray, b: np.ndarray) -> bool:
    return "ffi_call" in str(jax.make_jaxpr(loops.solve)(a, b))


@needs_compiler
@settings(max_examples=100 if os.environ.get("SYMKERN_SLOW") else 12)
@given(n=st.integers(1, UNROLLED_UP_TO + 4), k=st.integers(1, 3), batch=st.integers(1, 40),
       seed=st.integers(0, 2**31 - 1))
def test_random_systems_match_numpy(n, k, batch, seed):
    a, b = _systems(np.random.default_rng(seed), batch, n, k)
    got = np.asarray(jax.jit(loops.solve)(a, b))
    np.testing.assert_allclose(got, np.linalg.solve(a, b), rtol=1e-10, atol=1e-12)
    got32 = np.asarray(loops.solve(a.astype(np.float32), b.astype(np.float32)))
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, np.linalg.solve(a, b), rtol=2e-4, atol=2e-4)


@needs_compiler
@pytest.mark.parametrize("n", [loops.SOLVE_UP_TO, loops.SOLVE_UP_TO + 1])
def test_systems_on_both_sides_of_the_largest_c_solve(n):
    a, b = _systems(np.random.default_rng(n), 3, n, 1)
    assert _runs_the_c_solve(a, b) == (n <= loops.SOLVE_UP_TO)
    np.testing.assert_allclose(np.asarray(loops.solve(a, b)), np.linalg.solve(a, b),
                               rtol=1e-9, atol=1e-11)


@needs_compiler
@pytest.mark.parametrize("n", [UNROLLED_UP_TO, UNROLLED_UP_TO + 1])
def test_the_unrolled_copies_and_the_general_loop_give_the_same_bits(n, monkeypatch):
    a, b = _systems(np.random.default_rng(n), 33, n, 1)
    unrolled = np.asarray(loops.solve(a, b))
    monkeypatch.setattr(c_solve, "UNROLLED_UP_TO", 0)  # the library without the copies
    np.testing.assert_array_equal(np.asarray(loops.solve(a, b)), unrolled)
    np.testing.assert_allclose(unrolled, np.linalg.solve(a, b), rtol=1e-10, atol=1e-12)


@needs_compiler
def test_a_vector_right_hand_side_and_broadcast_batches():
    rng = np.random.default_rng(1)
    a, b = _systems(rng, 6, 4, 1)
    vectors = b[..., 0]
    # a vector per sample is (..., n, 1) with the axis dropped, as b[..., None] would give
    np.testing.assert_allclose(np.asarray(loops.solve(a, b)[..., 0]),
                               np.linalg.solve(a, b)[..., 0], rtol=1e-12)
    one = rng.standard_normal(4)  # one right-hand side for every matrix
    np.testing.assert_allclose(np.asarray(loops.solve(a, one)),
                               np.linalg.solve(a, np.broadcast_to(one[:, None], (6, 4, 1)))[..., 0],
                               rtol=1e-12)
    grid = a.reshape(2, 3, 4, 4)  # two batch axes, a right-hand side broadcast along one
    np.testing.assert_allclose(np.asarray(loops.solve(grid, b.reshape(2, 3, 4, 1)[:1])),
                               np.linalg.solve(grid, b.reshape(2, 3, 4, 1)[:1]), rtol=1e-12)
    assert not _runs_the_c_solve(a[0], b[0])  # one matrix: jnp.linalg.solve's factorization
    assert _runs_the_c_solve(a, vectors[:, :, None])


@needs_compiler
def test_pivoting_and_singular_systems():
    # a zero where the first pivot would be: solved only with the rows exchanged
    a = np.array([[[0.0, 1.0], [2.0, 3.0]], [[1e-300, 1.0], [1.0, 1.0]]])
    b = np.array([[[1.0], [5.0]], [[1.0], [2.0]]])
    np.testing.assert_allclose(np.asarray(loops.solve(a, b)), np.linalg.solve(a, b), rtol=1e-14)
    singular = np.array([[[1.0, 2.0], [2.0, 4.0]]])
    assert not np.all(np.isfinite(np.asarray(loops.solve(singular, np.ones((1, 2, 1))))))
    nan = np.array([[[np.nan, 1.0], [1.0, 1.0]]])
    assert np.all(np.isnan(np.asarray(loops.solve(nan, np.ones((1, 2, 1))))))


@needs_compiler
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_sample_gets_the_same_bits_in_every_batch(dtype):
    # sizes on both sides of the second thread's share (2 * GRAIN), at two offsets
    a, b = _systems(np.random.default_rng(2), 2 * loops.GRAIN + 9, 6, 2, dtype)
    whole = np.asarray(loops.solve(a, b))
    for start, size in [(0, 1), (7, 1), (3, 17), (0, 2 * loops.GRAIN + 1), (8, 2 * loops.GRAIN)]:
        part = np.asarray(loops.solve(a[start:start + size], b[start:start + size]))
        np.testing.assert_array_equal(part, whole[start:start + size])


def _pendulum() -> tuple[sp.MatrixExpr, list[sp.Symbol], dict]:
    """A damped double pendulum's M(q)^-1 f(q, u): a 4×4 mass matrix of the states' cosines."""
    q1, q2, u1, u2 = sp.symbols("q1 q2 u1 u2")
    m, g, c = sp.symbols("m g c")
    mass = sp.Matrix([[1, 0, 0, 0], [0, 1, 0, 0],
                      [0, 0, 2 * m, m * sp.cos(q1 - q2)], [0, 0, m * sp.cos(q1 - q2), m]])
    forcing = sp.Matrix([u1, u2, -m * sp.sin(q1 - q2) * u2**2 - 2 * m * g * sp.sin(q1) - c * u1,
                         m * sp.sin(q1 - q2) * u1**2 - m * g * sp.sin(q2)])
    expr = sp.MatMul(sp.Inverse(sp.ImmutableMatrix(mass)), sp.ImmutableMatrix(forcing))
    return expr, [q1, q2, u1, u2], {"m": m, "g": g, "c": c}


@needs_compiler
def test_a_matrix_expressions_solve_runs_in_c_on_every_call_path():
    expr, states, params = _pendulum()
    kernel = sk.build_function(expr, states, params=params, dtype="float64", options=C)
    default = sk.build_function(expr, states, params=params, dtype="float64")
    assert "clinalg.solve(" in kernel.source and "jnp.linalg.solve(" not in kernel.source
    assert "jnp.linalg.solve(" in kernel.program.portable.source
    ps = {"m": np.float64(1.3), "g": np.float64(9.81), "c": np.float64(0.4)}
    rng = np.random.default_rng(3)
    for shape in [(1,), (65,), (3, 5)]:
        X = rng.uniform(-2, 2, shape + (4,))
        np.testing.assert_allclose(np.asarray(kernel(X, ps)), np.asarray(default(X, ps)),
                                   rtol=1e-12, atol=1e-12)
    X = rng.uniform(-2, 2, (65, 4))
    want = np.asarray(default(X, ps))
    assert "ffi_call" in str(jax.make_jaxpr(lambda X: kernel(X, ps))(X))
    np.testing.assert_allclose(np.asarray(jax.jit(kernel)(X, ps)), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(jax.vmap(kernel, in_axes=(0, None))(X.reshape(5, 13, 4), ps)),
                               want.reshape(5, 13, 4), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(kernel.bind(ps)(X)), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(kernel.flat()(X, kernel.flatten(ps))), want,
                               rtol=1e-12, atol=1e-12)
    streamed = kernel.stream(X, ps, chunk=16, out=np.zeros_like(want), progress=False)
    np.testing.assert_allclose(streamed, want, rtol=1e-12, atol=1e-12)
    loaded = sk.load(kernel.export(X, ps), kernel.const_args)
    np.testing.assert_allclose(np.asarray(loaded(X, ps)), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(kernel.shard()(X, ps)), want, rtol=1e-12, atol=1e-12)


@needs_compiler
def test_derivatives_through_the_c_solve_match_jacfwd():
    expr, states, params = _pendulum()
    kernel = sk.build_function(expr, states, params=params, dtype="float64", options=C)
    default = sk.build_function(expr, states, params=params, dtype="float64")
    ps = {"m": np.float64(1.3), "g": np.float64(9.81), "c": np.float64(0.4)}
    X = np.random.default_rng(4).uniform(-2, 2, (9, 4))

    def loss(kernel, ps):
        return jnp.sum(kernel(X, ps) ** 2)

    got = jax.grad(lambda p: loss(kernel, p))(ps)
    want = jax.grad(lambda p: loss(default, p))(ps)
    for name in ps:
        assert abs(float(want[name])) > 1e-3
        np.testing.assert_allclose(float(got[name]), float(want[name]), rtol=1e-10)
    states_jac = jax.jacfwd(lambda x: kernel(x, ps))(X[0])
    np.testing.assert_allclose(np.asarray(states_jac),
                               np.asarray(jax.jacfwd(lambda x: default(x, ps))(X[0])),
                               rtol=1e-10, atol=1e-12)
    hessian = jax.hessian(lambda p: loss(kernel, p))(ps)
    np.testing.assert_allclose(float(hessian["m"]["c"]),
                               float(jax.hessian(lambda p: loss(default, p))(ps)["m"]["c"]),
                               rtol=1e-8)


def test_an_array_kernel_without_a_solve_refuses_the_c_loop():
    W, x = sp.MatrixSymbol("W", 3, 3), sp.MatrixSymbol("x", 3, 1)
    with pytest.raises(BuildError, match="linear solves of matrix expressions"):
        sk.build_function(W * x, x, params={"W": W}, options=C)


def test_a_complex_kernel_refuses_the_c_solve():
    A, b = sp.MatrixSymbol("A", 2, 2), sp.MatrixSymbol("b", 2, 1)
    with pytest.raises(BuildError, match="float32 or float64.*complex128"):
        sk.build_function(sp.MatMul(sp.Inverse(A), b), A, b, dtype="complex128", options=C)
