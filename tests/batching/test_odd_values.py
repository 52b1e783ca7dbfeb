"""Odd values a caller may pass: longdouble arrays, Python integers beyond float64, SymPy
numbers such as pi, E and sqrt(2) as parameter values. Each is the right answer or an
ArgumentError naming the argument. Reference: numpy."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

import symkern as sk

x0, x1, a = sp.symbols("x0 x1 a")
X = np.linspace(-1, 1, 8).reshape(4, 2)


@pytest.fixture(scope="module")
def kernel():
    return sk.build_function(sp.sin(x0) * a + x1**2, [x0, x1], params={"a": a})


def reference(value: float, data=X) -> np.ndarray:
    return np.sin(data[..., 0]) * value + data[..., 1] ** 2


def test_longdouble_data_is_cast_like_any_float(kernel):
    for _ in range(2):  # the first call and the direct path after it
        np.testing.assert_allclose(kernel(X.astype(np.longdouble), {"a": 2.0}), reference(2.0),
                                   rtol=1e-6)
    np.testing.assert_allclose(kernel(X, {"a": np.longdouble(2.5)}), reference(2.5), rtol=1e-6)


@pytest.mark.parametrize(("value", "number"), [
    (sp.pi, np.pi), (sp.E, np.e), (sp.sqrt(2), np.sqrt(2)), (sp.Rational(1, 3), 1 / 3),
    (sp.Float(0.25), 0.25), (-sp.pi / 2, -np.pi / 2), (2**60, 2.0**60),
])
def test_sympy_numbers_and_large_ints_are_parameter_values(kernel, value, number):
    np.testing.assert_allclose(kernel(X, {"a": value}), reference(number), rtol=1e-6)


def test_a_matrix_parameter_of_sympy_numbers():
    W = sp.MatrixSymbol("W", 1, 2)
    k = sk.build_function(W * sp.Matrix([x0, x1]), [x0, x1], params={"W": W})
    got = k(X, {"W": [[sp.pi, sp.sqrt(2)]]})
    np.testing.assert_allclose(got[..., 0], X @ np.array([np.pi, np.sqrt(2)]), rtol=1e-6)


@pytest.mark.parametrize(("value", "pattern"), [
    (2**2000, r'ps\["a"\]: expected numbers within float64\'s range, got an integer of 2001 bits'),
    (-(2**1100), r"an integer of 1101 bits"),
    (sp.Integer(2) ** 2000, r"an integer of 2001 bits"),
    (sp.I, r'ps\["a"\]: expected real numbers, got I'),
    (1 + 2 * sp.I, r"expected real numbers, got 1 \+ 2\*I"),
    (x0 + 1, r'ps\["a"\]: expected numbers, got the SymPy expression x0 \+ 1, which has free'),
    (sp.zoo, r"expected real numbers, got zoo"),
    ("2", r'ps\["a"\]: expected real numbers, got dtype str32'),
    (None, r"got NoneType None"),
    (1j, r"expected real numbers, got dtype complex128"),
])
def test_values_without_a_real_float_are_argument_errors(kernel, value, pattern):
    with pytest.raises(sk.ArgumentError, match=pattern):
        kernel(X, {"a": value})


def test_data_with_a_huge_python_int_is_an_argument_error(kernel):
    with pytest.raises(sk.ArgumentError, match=r"x1: expected numbers within float64's range"):
        kernel([[2**2000, 1.0]], {"a": 1.0})
    np.testing.assert_allclose(kernel([[2**70, 1.0]], {"a": 1.0}),
                               reference(1.0, np.array([[2.0**70, 1.0]])), rtol=1e-6)
