"""Inputs as users hand them over: 64-bit integers beyond int32, parameter trees read by
attribute (namedtuple, dataclass), numbers of every float width, calls under
`jax.disable_jit()`. References are NumPy float64 evaluations of the same formulas."""

from __future__ import annotations

import dataclasses
from collections import namedtuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import symkern as sk

x0, x1, a, b = sp.symbols("x0 x1 a b")


def _kernel():
    return sk.build_function(a * x0 + b * x1, [x0, x1], params={"a": a, "b": b})


def _reference(X, a_value, b_value):
    X = np.asarray(X, np.float64)
    return a_value * X[..., 0] + b_value * X[..., 1]


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_wide_integers_are_cast_not_wrapped_on_every_path(dtype) -> None:
    """A 64-bit integer beyond int32's range keeps its value: on a first call, and on a call
    of a shape the direct path already runs (where jit alone would wrap it, jax#18385)."""
    k = _kernel()
    floats = np.ones((3, 2), np.float32)
    wide = np.array([[3_000_000_000, 1], [2**40, 0], [7, 5]], dtype)
    ps = {"a": np.float32(1.0), "b": np.float32(2.0)}
    expected = _reference(wide, 1.0, 2.0)
    np.testing.assert_allclose(k(wide, ps), expected, rtol=1e-6)  # first call of the shape
    k(floats, ps)
    k(floats, ps)  # the direct path runs this shape now
    for _ in range(3):
        np.testing.assert_allclose(k(wide, ps), expected, rtol=1e-6)
        np.testing.assert_allclose(k(floats, ps), _reference(floats, 1.0, 2.0), rtol=1e-6)
    np.testing.assert_allclose(k.bind(ps)(wide), expected, rtol=1e-6)
    flat = k.flat()
    theta = k.flatten(ps)
    flat(floats, theta)
    flat(floats, theta)
    np.testing.assert_allclose(flat(wide, theta), expected, rtol=1e-6)


def test_wide_integer_and_big_python_int_parameters_keep_their_values() -> None:
    k = _kernel()
    X = np.ones((4, 2), np.float32)
    k(X, {"a": 1.0, "b": 1.0})
    k(X, {"a": 1.0, "b": 1.0})  # direct path from here on
    for a_value in (np.int64(3_000_000_000), 3_000_000_000, np.array(2**40, np.uint64)):
        got = k(X, {"a": a_value, "b": np.int32(2)})
        np.testing.assert_allclose(got, _reference(X, float(a_value), 2.0), rtol=1e-6)


def test_integer_calls_do_not_compile_again() -> None:
    """Integer arrays take the checked path, which casts them: repeating such a call reuses
    the float executable instead of tracing every time."""
    k = _kernel()
    X = np.arange(8, dtype=np.int64).reshape(4, 2)
    ps = {"a": np.float32(1.5), "b": np.float32(-1.0)}
    k(X.astype(np.float32), ps)
    k(X, ps)
    compiled = k.compilations
    for _ in range(3):
        np.testing.assert_allclose(k(X, ps), _reference(X, 1.5, -1.0), rtol=1e-6)
    assert k.compilations == compiled


@given(values=st.lists(st.integers(-2**62, 2**62), min_size=2, max_size=12))
@settings(max_examples=25, deadline=None)
def test_int64_data_equal_their_float64_value(values) -> None:
    k = sk.build_function(2 * x0 - x1, [x0, x1])
    X = np.array(values[: len(values) // 2 * 2], np.int64).reshape(-1, 2)
    k(X.astype(np.float32))
    k(X.astype(np.float32))
    expected = 2.0 * X[:, 0].astype(np.float64) - X[:, 1].astype(np.float64)
    np.testing.assert_allclose(k(X), expected.astype(np.float32), rtol=1e-6,
                               atol=1e-6 * np.abs(X).max())


P = namedtuple("P", "q p")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Layer:
    W: object
    bias: object


def test_namedtuple_and_dataclass_parameter_trees() -> None:
    """Trees whose nodes are read by attribute work like dicts: the generated code reads
    nested dicts by the same keys, whatever the fields' order."""
    W = sp.Matrix(2, 2, sp.symbols("w0:4"))
    c = sp.Matrix(sp.symbols("c0:2"))
    eqs = W * sp.Matrix([x0, x1]) + c
    k = sk.build_function([a * x0 + b, eqs], [x0, x1],
                          params={"s": P(b, a), "layer": Layer(W, c)})
    rng = np.random.default_rng(0)
    X = rng.normal(size=(5, 2))
    Wv, cv = rng.normal(size=(2, 2)), rng.normal(size=2)
    ps = {"s": P(q=0.5, p=2.0), "layer": Layer(Wv, cv)}
    first, second = k(X, ps)
    np.testing.assert_allclose(first, 2.0 * X[:, 0] + 0.5, rtol=1e-5)
    np.testing.assert_allclose(second, X @ Wv.T + cv, rtol=1e-5, atol=1e-6)
    grad = jax.grad(lambda ps: k(X, ps)[0].sum())(ps)
    assert isinstance(grad["s"], P)
    np.testing.assert_allclose(grad["s"].p, X[:, 0].sum(), rtol=1e-5)
    np.testing.assert_allclose(grad["s"].q, 5.0, rtol=1e-6)


def test_a_bare_namedtuple_of_symbols_as_params() -> None:
    k = sk.build_function(a * x0 + b, [x0], params=P(a, b))
    np.testing.assert_allclose(k(np.ones((2, 1)), P(3.0, 1.0)), [4.0, 4.0])


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.float16])
def test_narrow_floats_are_accepted_and_cast(dtype) -> None:
    k = _kernel()
    X = np.array([[1.5, -2.0], [0.25, 4.0]], dtype)
    for data in (X, jnp.asarray(X)):
        got = k(data, {"a": np.asarray(2.0, dtype), "b": 1.0})
        np.testing.assert_allclose(got, _reference(X.astype(np.float64), 2.0, 1.0), rtol=1e-6)


def test_sympy_numbers_as_parameter_values() -> None:
    k = _kernel()
    X = np.ones((2, 2))
    np.testing.assert_allclose(k(X, {"a": sp.Float(2.5), "b": sp.Rational(1, 2)}), [3.0, 3.0])


def test_calls_under_disable_jit() -> None:
    """With jit disabled (a debugging setting) every form of call evaluates eagerly."""
    k = _kernel()
    ps = {"a": np.float32(2.0), "b": np.float32(0.5)}
    X = np.random.default_rng(1).normal(size=(7, 2)).astype(np.float32)
    expected = _reference(X, 2.0, 0.5)
    np.testing.assert_allclose(k(X, ps), expected, rtol=1e-6)  # compiled, then direct
    with jax.disable_jit():
        for data in (X, X[0], X.astype(np.int64)):
            np.testing.assert_allclose(k(data, ps), _reference(data, 2.0, 0.5), rtol=1e-6)
        np.testing.assert_allclose(k.bind(ps)(X), expected, rtol=1e-6)
        np.testing.assert_allclose(k.flat()(X, k.flatten(ps)), expected, rtol=1e-6)
