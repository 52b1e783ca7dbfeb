"""Bad input gets a clear error naming the argument and what was expected, before compiling."""

import ast

import numpy as np
import pytest
import sympy as sp

import symkern as sk

x0, x1, a, b = sp.symbols("x0 x1 a b")
W = sp.Matrix(3, 2, sp.symbols("w0:6"))


def test_free_symbols_are_reported_by_name_at_build_time():
    with pytest.raises(sk.BuildError, match="free symbols b, c are neither data"):
        sk.build_function(x0 * b + sp.Symbol("c"), [x0], params={"a": a})


def test_a_symbol_declared_twice_is_an_error():
    with pytest.raises(sk.BuildError, match="symbol x0 is declared twice: as x1\\[0\\] and as"):
        sk.build_function(x0, [x0], params={"a": x0})


def test_a_data_argument_of_expressions_is_rejected():
    with pytest.raises(sk.BuildError, match="x1\\[1\\]: expected a SymPy Symbol"):
        sk.build_function(x0, [x0, x0 + 1])


def test_a_parameter_leaf_that_is_not_symbols_is_rejected_with_its_path():
    with pytest.raises(sk.BuildError, match='ps\\["L1"\\]\\["b"\\]: expected a Symbol'):
        sk.build_function(x0, [x0], params={"L1": {"b": 3}})


def test_an_equation_that_is_neither_a_number_nor_a_condition_is_rejected():
    with pytest.raises(sk.BuildError, match="eqs: expected a SymPy expression, a condition"):
        sk.build_function(sp.Interval(0, x0), [x0])


@pytest.fixture
def without_x64():
    import jax

    jax.config.update("jax_enable_x64", False)
    yield
    jax.config.update("jax_enable_x64", True)


def test_float64_without_x64_is_a_build_error(without_x64):
    with pytest.raises(sk.BuildError, match="float64 needs"):
        sk.build_function(x0, [x0], dtype="float64")


def test_an_unsupported_dtype_is_rejected():
    with pytest.raises(sk.BuildError,
                       match="dtype: expected float32, float64, complex64 or complex128, got int32"):
        sk.build_function(x0, [x0], dtype="int32")


@pytest.fixture(scope="module")
def kernel():
    return sk.build_function(W * sp.Matrix([x0, x1]), [x0, x1],
                             params={"L1": {"W": W}}, dtype="float64")


def test_parameter_shape_error_names_the_access_path(kernel):
    with pytest.raises(sk.ArgumentError,
                       match=r'ps\["L1"\]\["W"\]: expected shape \(3, 2\), got \(2, 3\)'):
        kernel(np.zeros(2), {"L1": {"W": np.zeros((2, 3))}})


def test_parameter_structure_error_shows_the_expected_tree(kernel):
    with pytest.raises(sk.ArgumentError, match="ps: expected a tree of the structure"):
        kernel(np.zeros(2), {"L2": {"W": np.zeros((3, 2))}})


def test_data_shape_error_names_the_argument(kernel):
    with pytest.raises(sk.ArgumentError, match=r"x1: expected shape \(..., 2\), got \(4, 3\)"):
        kernel(np.zeros((4, 3)), {"L1": {"W": np.zeros((3, 2))}})


def test_wrong_number_of_arguments(kernel):
    with pytest.raises(sk.ArgumentError, match=r"expected 2 argument\(s\) \(x1, ps\), got 1"):
        kernel(np.zeros(2))


def test_non_numeric_input_is_rejected(kernel):
    with pytest.raises(sk.ArgumentError, match="x1: expected real numbers, got dtype"):
        kernel(np.array(["a", "b"]), {"L1": {"W": np.zeros((3, 2))}})


def test_data_arguments_whose_batch_shapes_do_not_broadcast_are_rejected():
    k = sk.build_function(x0 * x1, [x0], [x1], dtype="float64")
    with pytest.raises(sk.ArgumentError,
                       match="x2: batch shape \\(3,\\) does not broadcast with x1's \\(2,\\)"):
        k(np.zeros((2, 1)), np.zeros((3, 1)))


def test_float64_kernel_called_without_x64_is_a_dtype_mismatch(kernel, without_x64):
    with pytest.raises(sk.DtypeMismatchError, match="needs jax.config.update"):
        kernel(np.zeros(2), {"L1": {"W": np.zeros((3, 2))}})


@pytest.mark.parametrize("name", ["x1", "ps", "jnp", "lambda", "__import__('os').system('true')",
                                  "_a0", "_c0", "gate", "functions", "kernel"])
def test_hostile_symbol_names_are_inert(name):
    hostile = sp.Symbol(name)
    other = sp.Symbol(name + "_")
    k = sk.build_function(sp.Matrix([hostile * 2 + other, sp.sin(hostile)]), [other, hostile],
                          params={"p": sp.Symbol(name + "__")}, dtype="float64")
    out = k(np.array([1.0, 3.0]), {"p": 0.0})
    np.testing.assert_allclose(out, [7.0, np.sin(3.0)])
    printed = {n.id for n in ast.walk(ast.parse(k.upstream_source)) if isinstance(n, ast.Name)}
    assert printed <= {"_a0", "_a1", "_a2", "sin", "array"}


def test_hostile_function_names_are_inert():
    f = sp.Function("__import__")
    k = sk.build_function(f(x0) + 1, [x0], functions={"__import__": lambda v: v * 10},
                          dtype="float64")
    np.testing.assert_allclose(k(np.array([2.0])), 21.0)
    assert "__import__" not in k.upstream_source
