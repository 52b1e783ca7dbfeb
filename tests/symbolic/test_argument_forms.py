"""Argument forms lambdify users write: IndexedBase and its entries, nested lists of symbols."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import sympy as sp

import symkern as sk

jax.config.update("jax_enable_x64", True)

X = sp.IndexedBase("x", shape=(3,))
A = sp.IndexedBase("A", shape=(2, 2))
i = sp.Symbol("i", integer=True)


@pytest.mark.parametrize("cse", [True, False], ids=["cse", "nocse"])
def test_indexed_bases_are_vector_and_matrix_data_arguments(cse):
    expr = sp.Sum(X[i] ** 2, (i, 0, 2)) + A[0, 1] * A[1, 0] + sp.sin(X[1])
    kernel = sk.build_function(expr, X, A, cse=cse, dtype="float64")
    xs = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 0.0]])
    matrices = np.array([[[0.0, 2.0], [3.0, 0.0]], [[1.0, -1.0], [4.0, 1.0]]])
    expected = (xs**2).sum(-1) + matrices[:, 0, 1] * matrices[:, 1, 0] + np.sin(xs[:, 1])
    np.testing.assert_allclose(kernel(xs, matrices), expected, rtol=1e-14)
    gradient = jax.grad(lambda v: kernel(v, matrices[0]))(xs[0])
    np.testing.assert_allclose(gradient, 2 * xs[0] + np.array([0.0, np.cos(2.0), 0.0]),
                               rtol=1e-14)


def test_indexed_entries_in_a_list_and_an_indexed_base_as_parameter():
    w = sp.IndexedBase("w", shape=(2,))
    kernel = sk.build_function(w[0] * X[0] + w[1] * X[2], [X[0], X[2]], params={"w": w},
                               dtype="float64")
    np.testing.assert_allclose(kernel(np.array([1.0, 2.0]), {"w": np.array([3.0, 4.0])}), 11.0,
                               rtol=0)


def test_an_indexed_base_without_an_integer_shape_is_refused():
    with pytest.raises(sk.BuildError, match=r"x1: expected an IndexedBase of one or two integer"):
        sk.build_function(sp.IndexedBase("y")[0], sp.IndexedBase("y"), dtype="float64")


def test_nested_lists_of_symbols_are_a_matrix_argument():
    a, b, c, d = sp.symbols("a b c d")
    kernel = sk.build_function(a * d - b * c, [[a, b], [c, d]], dtype="float64")
    np.testing.assert_allclose(kernel(np.array([[[1.0, 2.0], [3.0, 4.0]]] * 3)), [-2.0] * 3,
                               rtol=0)
    with pytest.raises(sk.BuildError, match=r"x1: expected rows of symbols of one length"):
        sk.build_function(a, [[a, b], [c]], dtype="float64")


def test_argument_form_errors_are_documented():
    from pathlib import Path

    errors = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()
    assert '<a id="builderror-argument-forms"></a>' in errors
    for message in ("expected an IndexedBase of one or two integer dimensions",
                    "expected rows of symbols of one length", "but is not an argument itself"):
        assert message in errors


def test_each_argument_form_matches_lambdify_numpy():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sympy.physics.mechanics import dynamicsymbols
    q = dynamicsymbols("q")
    qd = q.diff(dynamicsymbols._t)
    z = sp.Symbol("z")
    cases = [
        (sp.sin(q) * qd**2, [q, qd]),                            # functions of time
        (sp.Sum(z**i / sp.factorial(i), (i, 0, 6)), [z]),         # Sum over integer bounds
        (X[0] * X[2] - sp.exp(X[1]), [X[0], X[1], X[2]]),       # Indexed entries
    ]
    values = np.random.default_rng(3).normal(size=(5, 3))
    for expr, arguments in cases:
        kernel = sk.build_function(expr, arguments, dtype="float64")
        columns = values[:, :len(arguments)]
        reference = sp.lambdify(arguments, expr, modules="numpy")
        np.testing.assert_allclose(kernel(columns), reference(*columns.T), rtol=1e-13,
                                   err_msg=str(expr))
