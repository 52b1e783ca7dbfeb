"""Findings of the fuzz campaign (tools/fuzz.py) and of the reliability probes, each kept as
an explicit test. Tests marked xfail(strict=True) are bugs not fixed yet: the reason names
the fix; the lead removes the mark with the fix.
"""

from __future__ import annotations

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp

import symkern as sk

x, y, a, b = sp.symbols("x y a b")


# ---- errors that escape as raw exceptions -------------------------------------------------

def test_parameter_dict_with_mixed_key_types_is_a_build_error():
    with pytest.raises(sk.BuildError, match="params"):
        sk.build_function(x * a + b, x, params={1: a, "z": b})


def test_equation_dict_with_mixed_key_types_is_a_build_error():
    with pytest.raises(sk.BuildError, match="eqs"):
        sk.build_function({1: x, "a": 2 * x}, x)


def test_integer_parameter_keys_work():
    kernel = sk.build_function(x * a + b, x, params={1: a, 2: b}, dtype="float64")
    assert float(kernel(1.0, {1: 2.0, 2: 3.0})) == 5.0


# ---- functions SymPy's own evaluation introduces ---------------------------------------------

def test_im_introduced_by_sympy_evaluation_builds():
    expr = sp.Abs(sp.exp(sp.sin(x)))
    assert expr.has(sp.im)
    kernel = sk.build_function(expr, x, dtype="float64")
    values = np.array([0.5, -1.0, 3.0])
    np.testing.assert_allclose(kernel(values), np.exp(np.sin(values)), rtol=1e-12)


@pytest.mark.parametrize("function", [sp.im, sp.conjugate])
def test_im_and_conjugate_of_real_inputs(function):
    kernel = sk.build_function(function(x) + x, x, dtype="float64")
    values = np.array([0.5, -1.0])
    expected = values if function is sp.im else 2 * values
    np.testing.assert_allclose(kernel(values), expected)


# ---- messages -----------------------------------------------------------------------------

def test_parameter_label_with_a_quote_in_its_key():
    kernel = sk.build_function(x * a, x, params={"it's": a}, dtype="float64")
    with pytest.raises(sk.ArgumentError) as caught:
        kernel(1.0, {"it's": np.zeros(2)})
    assert str(caught.value).startswith('ps["it\'s"]: expected shape (), got (2,)')


# ---- an empty parameter tree ----------------------------------------------------------------

def test_an_empty_parameter_tree_is_passed_as_given():
    kernel = sk.build_function(2 * x, x, params={}, dtype="float64")
    assert float(kernel(2.0, {})) == 4.0


# ---- a dropped kernel is freed by reference counting ------------------------------------------

def _table_kernel(size):
    lookup = sp.Function("lookup")
    table = np.linspace(0.0, 1.0, size)
    return sk.build_function(
        lookup(x) + y, [x, y], dtype="float64",
        functions={"lookup": lambda v: jnp.interp(v, jnp.linspace(0.0, 1.0, table.size), table)})


def test_a_dropped_kernel_is_freed_without_the_cyclic_gc():
    gc.collect()
    live = len(jax.live_arrays())
    gc.disable()
    try:
        kernel = _table_kernel(100_000)
        kernel(np.zeros((2, 2)))
        function = weakref.ref(kernel.program.function)
        ref = weakref.ref(kernel)
        del kernel
        assert ref() is None, "the Kernel is only freed by the cyclic GC"
        assert function() is None, "the generated function is only freed by the cyclic GC"
        assert len(jax.live_arrays()) == live
    finally:
        gc.enable()
        gc.collect()


# ---- hostile names and shapes the campaign covers, kept explicit ---------------------------

@pytest.mark.parametrize("name", ["__import__('os').system('false')", "it's", "a b", "名前",
                                  "new\nline", 'ps["a"]', "_k0", "_w0"])
def test_hostile_names_as_matrix_symbol_dict_keys_and_parameters(name):
    M = sp.MatrixSymbol(name, 2, 2)
    p = sp.Symbol(name + "'")
    W = sp.Matrix(2, 1, [sp.Symbol(f"{name}w0"), sp.Symbol(f"{name}w1")])
    eqs = {name: M * W + sp.Matrix([p, sp.Piecewise((p, M[0, 0] > 0), (-p, True))]),
           name + "2": sp.sin(M[1, 1]) * p}
    kernel = sk.build_function(eqs, M, params={name: {name: p, "W": W}}, dtype="float64")
    X = np.arange(24, dtype=float).reshape(2, 3, 2, 2) - 5
    ps = {name: {name: 0.5, "W": np.array([1.0, -2.0])}}
    out = kernel(X, ps)
    first = X @ np.array([1.0, -2.0]) + np.stack([np.full((2, 3), 0.5),
                                                  np.where(X[..., 0, 0] > 0, 0.5, -0.5)], -1)
    np.testing.assert_allclose(out[name], first, rtol=1e-12)
    np.testing.assert_allclose(out[name + "2"], np.sin(X[..., 1, 1]) * 0.5, rtol=1e-12)


@pytest.mark.parametrize("batch", [(), (1,), (2, 3), (0,)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_row_matrix_data_and_row_matrix_parameter_shapes(batch, dtype):
    row = sp.Matrix([[x, y]])                  # data: (..., 2); parameter: (1, 2)
    w = sp.Matrix([[a, b]])
    kernel = sk.build_function([w * row.T, row * 2], row, params={"w": w}, dtype=dtype)
    X = np.ones(batch + (2,)) * np.array([1.0, 3.0])
    dot, doubled = kernel(X, {"w": np.array([[2.0, -1.0]])})
    assert dot.shape == batch + (1,) and dot.dtype == np.dtype(dtype)
    assert doubled.shape == batch + (1, 2)
    np.testing.assert_allclose(dot, np.full(batch + (1,), -1.0))
    np.testing.assert_allclose(doubled, 2 * X[..., None, :])


def test_symbols_spelled_like_generated_names_print_as_their_own_arguments():
    """A user's `_a0` or `_c0` is printed as its argument's entry, never looked up again as
    a generated name (which recursed forever, or read another argument)."""
    a0, c0, d0 = sp.Symbol("_a0"), sp.Symbol("_c0"), sp.Symbol("_d0")
    negated = sk.build_function(sp.Matrix([[-a0]]), a0, dtype="float64")
    np.testing.assert_allclose(negated(np.array([0.5, 2.0])), [[-0.5], [-2.0]])
    first = sk.build_function(c0, c0, a0, cse=False, dtype="float64")
    assert float(first(0.5, 0.0)) == 0.5
    mixed = sk.build_function(d0 * sp.Symbol("x1") + sp.Symbol("ps"), [sp.Symbol("x1"), d0],
                              params=[sp.Symbol("ps")], dtype="float64")
    assert float(mixed(np.array([2.0, 3.0]), [1.0])) == 7.0
