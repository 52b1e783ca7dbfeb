"""The shape matrix: every kind of equation, data argument and batch shape, cse on and off."""

import itertools

import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st

import symkern as sk

x0, x1, x2, y0, y1, a, b = sp.symbols("x0 x1 x2 y0 y1 a b")

EQUATIONS = {
    "scalar": lambda two: sp.sin(x0) * a + x1**2 + (y0 * b if two else 0),
    "vector": lambda two: sp.Matrix([x0 * a, sp.cos(x1) + (y1 if two else 0), x2]),
    "matrix": lambda two: sp.Matrix([[x0, x1 * b], [a, x2 * (y0 if two else 1)]]),
}
BATCHES = [(), (5,), (2, 3)]


def reference(eq, data_symbols, values, params):
    """Per-sample evaluation with SymPy in float64 (substitution, no kernels)."""
    substitution = {s: float(v) for s, v in zip(data_symbols, values, strict=True)}
    substitution.update(params)
    if isinstance(eq, sp.MatrixBase):
        return np.array(eq.subs(substitution).evalf(), dtype=float)
    return float(eq.subs(substitution).evalf())


@pytest.mark.parametrize(("kind", "two", "batch", "cse"),
                         list(itertools.product(EQUATIONS, [False, True], BATCHES, [True, False])))
def test_result_shapes_and_values_match_per_sample_evaluation(kind, two, batch, cse):
    eq = EQUATIONS[kind](two)
    data = [[x0, x1, x2]] + ([[y0, y1]] if two else [])
    kernel = sk.build_function(eq, *data, params={"a": a, "b": b}, cse=cse, dtype="float64")
    rng = np.random.default_rng(len(batch))
    arrays = [rng.uniform(-1, 1, size=batch + (len(d),)) for d in data]
    params = {"a": 0.5, "b": -1.5}
    result = np.asarray(kernel(*arrays, params))
    shape = {"scalar": (), "vector": (3,), "matrix": (2, 2)}[kind]
    assert result.shape == batch + shape
    flat_inputs = np.concatenate([arr.reshape(-1, arr.shape[-1]) for arr in arrays], axis=-1)
    symbols = [s for d in data for s in d]
    expected = np.array([reference(eq, symbols, row, {a: 0.5, b: -1.5}) for row in flat_inputs])
    np.testing.assert_allclose(result.reshape(expected.shape), expected, rtol=1e-12, atol=1e-12)


def test_matrix_symbol_data_argument_takes_batch_plus_matrix_shape():
    X = sp.MatrixSymbol("X", 2, 3)
    kernel = sk.build_function(X * X.T, X, dtype="float64")
    arrays = np.random.default_rng(0).normal(size=(4, 2, 3))
    np.testing.assert_allclose(kernel(arrays), arrays @ np.swapaxes(arrays, -1, -2), rtol=1e-12)


def test_scalar_symbol_data_argument_takes_the_batch_shape():
    kernel = sk.build_function(sp.Matrix([sp.exp(x0), x0 * a]), x0, params={"a": a},
                               dtype="float64")
    values = np.linspace(-1, 1, 6).reshape(2, 3)
    result = kernel(values, {"a": 3.0})
    assert result.shape == (2, 3, 2)
    np.testing.assert_allclose(result[..., 0], np.exp(values), rtol=1e-12)


def test_equation_pytrees_come_back_with_their_structure():
    eqs = {"value": x0 * x1, "parts": [sp.Matrix([x0, x1]), (x1,)]}
    kernel = sk.build_function(eqs, [x0, x1], dtype="float64")
    out = kernel(np.array([[2.0, 3.0]]))
    assert set(out) == {"value", "parts"}
    assert out["value"].shape == (1,) and out["parts"][0].shape == (1, 2)
    assert isinstance(out["parts"], list) and isinstance(out["parts"][1], tuple)
    np.testing.assert_allclose(out["parts"][1][0], [3.0])


def test_constant_outputs_are_broadcast_to_the_batch():
    kernel = sk.build_function(sp.Matrix([x0 / x0, a, sp.Integer(2)]), [x0], params={"a": a},
                               dtype="float64")
    out = kernel(np.ones((4, 1)), {"a": 7.0})
    np.testing.assert_array_equal(out, np.tile([1.0, 7.0, 2.0], (4, 1)))
    assert out.dtype == np.float64


def test_parameter_trees_of_lists_tuples_and_matrices():
    W = sp.Matrix(2, 2, sp.symbols("w0:4"))
    c = sp.Matrix(sp.symbols("c0:2"))
    params = {"layers": [{"W": W}, (c,)], "s": a}
    eq = W * sp.Matrix([x0, x1]) + c * a
    kernel = sk.build_function(eq, [x0, x1], params=params, dtype="float64")
    ps = {"layers": [{"W": np.array([[1.0, 2.0], [3.0, 4.0]])}, (np.array([0.5, -0.5]),)],
          "s": 2.0}
    out = kernel(np.array([1.0, 1.0]), ps)
    np.testing.assert_allclose(out, [3.0 + 1.0, 7.0 - 1.0])


@given(batch=st.lists(st.integers(1, 3), max_size=3), cse=st.booleans())
def test_any_number_of_leading_batch_dimensions(batch, cse):
    kernel = _vector_kernel(cse)
    values = np.arange(np.prod(batch, dtype=int) * 2, dtype=float).reshape(tuple(batch) + (2,))
    out = kernel(values, {"a": 2.0})
    assert out.shape == tuple(batch) + (2,)
    np.testing.assert_allclose(out[..., 0], values[..., 0] * 2.0 + values[..., 1])
    np.testing.assert_allclose(out[..., 1], np.sin(values[..., 1]), rtol=1e-12)


_KERNELS = {}


def _vector_kernel(cse):
    if cse not in _KERNELS:
        _KERNELS[cse] = sk.build_function(sp.Matrix([x0 * a + x1, sp.sin(x1)]), [x0, x1],
                                          params={"a": a}, cse=cse, dtype="float64")
    return _KERNELS[cse]


def test_float32_is_the_default_without_x64_and_inputs_are_cast():
    kernel = sk.build_function(x0 * 2, [x0], dtype="float32")
    out = kernel(np.array([[1], [2]], dtype=np.int64))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [2.0, 4.0])
