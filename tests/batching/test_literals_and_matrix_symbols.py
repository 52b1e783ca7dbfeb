"""Integer literals beyond 32 bits, rank-0 Arrays and MatrixSymbol vectors, against SymPy.

References are SymPy's own values: `evalf` at 30 digits for the literals, `lambdify`
(numpy, float64) for the rest.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import symkern as sk

x, y = sp.symbols("x y")


@settings(max_examples=10, deadline=None)
@given(exponent=st.integers(31, 120), negative=st.booleans(), rational=st.booleans(),
       dtype=st.sampled_from(["float32", "float64"]))
def test_integers_beyond_32_bits_evaluate_as_floats(exponent, negative, rational, dtype):
    big = sp.Integer(2) ** exponent * (-1 if negative else 1) + 1
    number = big / 3 if rational else big
    expr = number * x + sp.Integer(10) ** (exponent // 4) + y  # a product and a sum term
    kernel = sk.build_function(expr, [x, y], dtype=dtype)
    X = np.array([[1.0, 0.5], [-0.25, 2.0], [0.0, 0.0]])
    got = np.asarray(kernel(X), np.float64)
    want = np.array([float(expr.subs({x: sp.Float(a, 30), y: sp.Float(b, 30)}).evalf(30))
                     for a, b in X])
    rtol = 1e-6 if dtype == "float32" else 1e-14
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * float(np.max(np.abs(want))))


def test_an_integer_beyond_float_range_is_infinite_as_float_gives():
    kernel = sk.build_function(x - sp.Integer(10) ** 400, x, dtype="float64")
    assert np.all(np.asarray(kernel(np.array([1.0, 2.0]))) == -np.inf)


def test_a_sum_evaluated_with_doit_matches_lambdify():
    i = sp.Symbol("i", integer=True)
    expr = sp.Sum(i * x ** i, (i, 0, 4)).doit()
    X = np.linspace(-1.5, 1.5, 7)
    np.testing.assert_allclose(sk.build_function(expr, x, dtype="float64")(X),
                               sp.lambdify(x, expr, "numpy")(X), rtol=1e-14)


def test_a_rank_0_array_is_a_scalar_equation():
    kernel = sk.build_function({"a": sp.Array(sp.sin(x) * 2), "m": sp.Array([x, x**2])}, x,
                               dtype="float64")
    X = np.array([0.3, -1.2])
    out = kernel(X)
    assert out["a"].shape == (2,) and out["m"].shape == (2, 2)
    np.testing.assert_allclose(out["a"], 2 * np.sin(X), rtol=1e-14)


@settings(max_examples=12, deadline=None)
@given(rows_cols=st.sampled_from([(1, 1), (1, 3), (3, 1), (2, 3)]),
       batch=st.sampled_from([(), (1,), (4,), (2, 3)]), seed=st.integers(0, 2**16))
def test_a_matrix_symbol_takes_its_declared_shape(rows_cols, batch, seed):
    rows, cols = rows_cols
    M = sp.MatrixSymbol("M", rows, cols)
    entries = [M[i, j] for i in range(rows) for j in range(cols)]
    expr = sp.Matrix([sum(e ** (k + 1) for k, e in enumerate(entries)), sp.cos(entries[-1])])
    kernel = sk.build_function(expr, M, dtype="float64")
    values = np.random.default_rng(seed).normal(size=batch + (rows, cols))
    f = sp.lambdify([entries], list(expr), "numpy")
    flat = values.reshape(batch + (rows * cols,))
    want = np.stack([np.broadcast_to(v, batch) for v in f(np.moveaxis(flat, -1, 0))], axis=-1)
    got = kernel(values)  # (..., rows, cols), as DESIGN.md's contract writes it
    assert got.shape == batch + (2,)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13 * np.max(np.abs(want)))
    # a vector also takes (..., n), as a Matrix of symbols does; (1, 1) given for a 1x1
    # is one sample of its declared shape, not a batch of one
    if (rows == 1 or cols == 1) and flat.shape[-2:] != (rows, cols):
        np.testing.assert_allclose(kernel(flat), want, rtol=1e-13,
                                   atol=1e-13 * np.max(np.abs(want)))


def test_a_column_matrix_symbol_in_both_shapes_on_the_direct_path():
    V = sp.MatrixSymbol("v", 3, 1)
    kernel = sk.build_function(2 * V[2, 0] + V[0, 0], V, dtype="float64")
    X = np.arange(12.0).reshape(4, 3, 1)
    for _ in range(3):  # the second call of each shape takes the direct path
        np.testing.assert_allclose(kernel(X), 2 * X[:, 2, 0] + X[:, 0, 0], rtol=1e-14)
        np.testing.assert_allclose(kernel(X[..., 0]), 2 * X[:, 2, 0] + X[:, 0, 0], rtol=1e-14)
    with pytest.raises(sk.ArgumentError,
                       match=r"x1: expected shape \(\.\.\., 3\) or \(\.\.\., 3, 1\), got \(2, 3, 2\)"):
        kernel(X.reshape(2, 3, 2))


@given(n=st.integers(2, 4), batch=st.sampled_from([(), (1,), (3,), (1, 1), (2, 1)]),
       seed=st.integers(0, 2**16))
@settings(max_examples=30, deadline=None)
def test_a_row_matrix_symbol_beside_a_vector_argument_takes_its_batch(n, batch, seed):
    """A (..., 1, n) array fits a 1×n MatrixSymbol both as a sample and as a batch of
    vectors; beside another data argument, that argument's batch shape decides, so a batch
    of one is a batch of one (lone, the declared reading stands: README)."""
    r = sp.MatrixSymbol("r", 1, n)
    x = sp.symbols(f"x0:{n}")
    k = sk.build_function(sum(x[j] * r[0, j] for j in range(n)), list(x), r)
    rng = np.random.default_rng(seed)
    X, R = rng.normal(size=batch + (n,)), rng.normal(size=batch + (n,))
    got = k(X, R)
    assert got.shape == batch
    np.testing.assert_allclose(got, np.sum(X * R, axis=-1), rtol=1e-5, atol=1e-6)
    declared = k(X, R[..., None, :])  # the declared (..., 1, n) form reads the same
    np.testing.assert_allclose(declared, got, rtol=1e-6)
