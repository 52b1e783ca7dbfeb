"""Tests of symkern.codegen.linearize: correctness, depth bounds, scale without recursion,
determinism across hash seeds, opaque Piecewise, atoms."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from sympy.printing.numpy import JaxPrinter
from sympy.utilities.lambdify import _EvaluatorPrinter

from symkern.codegen.linearize import count_operations, expression_depth, linearize

X = sp.symbols("x0:4")


def _lin(exprs, *, cse, max_depth=50, prefix="c"):
    return linearize(exprs, cse=cse, max_depth=max_depth, symbols=sp.numbered_symbols(prefix))


def _max_rhs_depth(repl, reduced):
    return max(expression_depth(e) for e in [r for _, r in repl] + list(reduced))


def _evaluate(args, exprs, point, *, cse=None):
    """Evaluate through lambdify(numpy); ``cse`` is a callable as lambdify accepts it."""
    f = sp.lambdify(args, list(exprs), modules="numpy", cse=cse or False)
    with np.errstate(all="ignore"):
        return np.array(f(*point), dtype=float)


def _assert_same_values(args, exprs, *, cse, max_depth, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(3):
        point = rng.uniform(-1.5, 1.5, size=len(args))
        want = _evaluate(args, exprs, point)
        got = _evaluate(
            args, exprs, point, cse=lambda es: _lin(es, cse=cse, max_depth=max_depth)
        )
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12, equal_nan=True)


def _print_and_compile(args, repl, reduced):
    printer = JaxPrinter(
        {"fully_qualified_modules": False, "inline": True, "allow_unknown_functions": True}
    )
    src = _EvaluatorPrinter(printer, False).doprint("_f", args, reduced, cses=repl)
    compile(ast.parse(src), "<linearized>", "exec")
    return src


def _ast_depth(tree: ast.AST) -> int:
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((c, d + 1) for c in ast.iter_child_nodes(node))
    return deepest


# --- correctness ------------------------------------------------------------------------


def _sample_exprs():
    x0, x1, x2, x3 = X
    shared = sp.sin(x0 + x1) * sp.exp(-(x2**2))
    return [
        shared + shared**2 - x3 * shared,
        sp.cos(x0 + x1) / (1 + x2**2) - sp.sqrt(1 + x3**2) * shared,
        -x0 * x1 + sp.tanh(x0 - 2 * x1 * x2) ** 3 - sp.Rational(3, 7) * x3,
        sp.Add(*[sp.sin(k * x0 + x1) * x2**k for k in range(1, 40)]),
        sp.Mul(*[1 + x0**2 / k for k in range(1, 30)]),
    ]


@pytest.mark.parametrize("cse", [False, True])
@pytest.mark.parametrize("max_depth", [4, 7, 50])
def test_values_match_input(cse, max_depth):
    exprs = _sample_exprs()
    _assert_same_values(X, exprs, cse=cse, max_depth=max_depth)
    repl, reduced = _lin(exprs, cse=cse, max_depth=max_depth)
    assert _max_rhs_depth(repl, reduced) <= max_depth


def test_output_convention_matches_sympy_cse():
    x0, x1 = X[:2]
    exprs = [sp.sin(x0 + x1) ** 2 + sp.sin(x0 + x1), sp.cos(x0 + x1)]
    repl, reduced = _lin(exprs, cse=True)
    want_repl, want_reduced = sp.cse(exprs, symbols=sp.numbered_symbols("c"), list=True)
    assert repl == want_repl
    assert reduced == want_reduced


def test_replacements_in_dependency_order():
    exprs = _sample_exprs()
    repl, _ = _lin(exprs, cse=True, max_depth=5)
    defined = set(X)
    for sym, rhs in repl:
        assert rhs.free_symbols <= defined, sym
        defined.add(sym)


def test_cse_hoists_every_repeated_subexpression():
    x0, x1, x2 = X[:3]
    s = sp.sin(x0 + x1)
    exprs = [s * x2, s + x2, sp.exp(s)]
    repl, reduced = _lin(exprs, cse=True)
    assert [r for _, r in repl] == [x0 + x1, s] or [r for _, r in repl][-1:] == [s]
    assert count_operations([r for _, r in repl] + reduced) == count_operations(exprs, dag=True)


def test_opt_shares_sub_products_and_sub_sums():
    a, b, c, d = X
    exprs = [a * b * c, a * b * d, a + b + c + d, sp.sin(a + b + d)]
    repl, reduced = _lin(exprs, cse=True)
    assert count_operations([r for _, r in repl] + reduced) == 7
    assert a * b in [r for _, r in repl]
    plain = linearize(exprs, cse=True, opt=False, symbols=sp.numbered_symbols("c"))
    assert count_operations([r for _, r in plain[0]] + plain[1]) == 10
    _assert_same_values(X, exprs, cse=True, max_depth=50)



def test_share_above_searches_pairs_only_in_larger_bodies():
    a, b, c, d = X
    exprs = [a * b * c, a * b * d, a + b + c + d, sp.sin(a + b + d)]
    assert count_operations(exprs, dag=True) == 10
    for share_above, shared in ((0, True), (9, True), (10, False), (2000, False)):
        repl, reduced = linearize(exprs, cse=True, share_above=share_above,
                                  symbols=sp.numbered_symbols("c"))
        assert (a * b in [r for _, r in repl]) is shared, share_above
        assert count_operations([r for _, r in repl] + reduced) == (7 if shared else 10)


@pytest.mark.parametrize("share_above", [400, pytest.param(None, marks=pytest.mark.slow)])
def test_emit_keeps_small_bodies_as_written_and_shares_pairs_in_large_ones(monkeypatch,
                                                                          share_above):
    from symkern.codegen import emit as emit_module
    from symkern.symbolic.arguments import data_argument, equation_set

    a, b, c, d = X
    small = [a * b * c, a * b * d]
    source = emit_module.emit(equation_set(sp.Matrix(small)), [data_argument(list(X), 1)]).source
    assert "_c0" not in source  # a*b is not hoisted: nothing else repeats
    # the same two products repeated with enough distinct terms to pass the threshold: the
    # default emit.SHARE_PAIRS_ABOVE_OPERATIONS (a minute to print) or a lower one
    if share_above is not None:
        monkeypatch.setattr(emit_module, "SHARE_PAIRS_ABOVE_OPERATIONS", share_above)
    terms = [sp.sin(k * a) for k in range(1, emit_module.SHARE_PAIRS_ABOVE_OPERATIONS // 2)]
    large = [a * b * c + sum(terms), a * b * d + sum(terms)]
    assert count_operations(large, dag=True) > emit_module.SHARE_PAIRS_ABOVE_OPERATIONS
    source = emit_module.emit(equation_set(sp.Matrix(large)), [data_argument(list(X), 1)]).source
    assert re.search(r"^\s*_c\d+ = _a0\[0\]\*_a0\[1\]$", source, re.M), source[:400]


def test_pendulum_mass_matrix_jacobian():
    from sympy.physics.mechanics import models

    kane = models.n_link_pendulum_on_cart(3, cart_force=True, joint_torques=False)
    q = sp.symbols("q0:4")
    m = kane.mass_matrix_full.xreplace(dict(zip(kane.q, q, strict=True)))
    exprs = list(m.reshape(64, 1).jacobian(q))
    args = sorted(set().union(*(e.free_symbols for e in exprs)), key=str)
    repl, reduced = _lin(exprs, cse=True, max_depth=8)
    sym_repl, sym_reduced = sp.cse(exprs, list=True)
    ours = count_operations([r for _, r in repl] + reduced)
    theirs = count_operations([r for _, r in sym_repl] + sym_reduced)
    assert ours <= 1.2 * theirs  # measured 57 vs 48 (n=3); 632 vs 578 (n=8)
    _assert_same_values(args, exprs, cse=True, max_depth=8)


def test_no_cse_leaves_small_expressions_alone():
    exprs = _sample_exprs()[:3]
    repl, reduced = _lin(exprs, cse=False)
    assert repl == []
    assert reduced == exprs


def test_fresh_symbols_skip_names_in_use():
    c0, c1 = sp.symbols("c0 c1")
    e = sp.sin(c0 + c1) + sp.sin(c0 + c1) ** 2
    repl, reduced = _lin([e], cse=True)
    assert repl[0][0] == sp.Symbol("c2")
    assert reduced[0].subs(repl[0][0], repl[0][1]) == e


def test_count_operations():
    x0, x1 = X[:2]
    e = sp.sin(x0) * x1 + sp.sin(x0)
    assert count_operations([e]) == sp.count_ops(e) == 4
    assert count_operations([e], dag=True) == 3
    assert expression_depth(x0) == 0
    assert expression_depth(sp.sin(x0 + x1 + 1)) == 3


# --- depth and width bounds, scale ------------------------------------------------------


def test_wide_sum_is_chunked_and_compiles():
    c = sp.IndexedBase("c")
    n = 10_000
    terms = [sp.Mul(c[i], sp.sin(X[i % 4]), X[(i + 1) % 4], evaluate=False) for i in range(n)]
    e = sp.Add(*terms, evaluate=False)
    for cse in (False, True):
        repl, reduced = _lin([e], cse=cse)
        assert _max_rhs_depth(repl, reduced) <= 50
        # No bare index read is ever hoisted.
        assert not any(isinstance(rhs, sp.Indexed) for _, rhs in repl)
    # SymPy's printer costs ~0.3 ms per term here: print one of the two.
    tree = ast.parse(_print_and_compile([c, *X], repl, reduced))
    assert _ast_depth(tree) < 200


def test_flat_sum_of_many_terms_would_not_compile_unchunked():
    # Why chunking is needed at all: Python parses a + b + ... as a left-nested BinOp chain.
    src = "y = " + " + ".join(["a"] * 5000)
    with pytest.raises(RecursionError):
        compile(ast.parse(src), "<flat>", "exec")


@pytest.mark.parametrize("cse", [False, True])
def test_deep_function_nest(cse):
    e = X[0]
    for _ in range(10_000):
        e = sp.sin(e, evaluate=False)
    repl, reduced = _lin([e], cse=cse)
    assert len(repl) >= 10_000 // 50 - 1
    assert _max_rhs_depth(repl, reduced) <= 50
    _print_and_compile(list(X), repl, reduced)


@pytest.mark.parametrize("cse", [False, True])
def test_deep_alternating_nest(cse):
    # x0*(x1 + (x2*(x3 + ...))), built unevaluated: SymPy's own constructors recurse.
    e = X[0]
    for i in range(10_000):
        e = sp.Add(X[i % 4], e, evaluate=False) if i % 2 else sp.Mul(X[i % 4], e, evaluate=False)
    repl, reduced = _lin([e], cse=cse, max_depth=20)
    assert _max_rhs_depth(repl, reduced) <= 20
    if cse:  # printing is the slow part (SymPy's printer); once is enough
        _print_and_compile(list(X), repl, reduced)


def test_deep_nest_values():
    # Reference value computed alongside: lambdify of the nest itself would recurse.
    rng = np.random.default_rng(1)
    point = rng.uniform(-1, 1, size=4)
    e, want = X[0], point[0]
    for i in range(2_000):
        e = sp.sin(e + X[i % 4] / 7, evaluate=False)
        want = np.sin(want + point[i % 4] / 7)
    # lambdify walks its input recursively (_imp_namespace): hand it the reduced form.
    repl, reduced = _lin([e], cse=True, max_depth=6)
    f = sp.lambdify(X, reduced, modules="numpy", cse=lambda _: (repl, reduced))
    np.testing.assert_allclose(f(*point)[0], want, rtol=1e-12)


def test_a_kernel_of_an_entry_deeper_than_the_recursion_limit():
    # build_function's own checks walk the entry without recursion too (codegen.arrays)
    import symkern as sk

    point = np.random.default_rng(2).uniform(-1, 1, size=(3, 4))
    e, want = X[0], point[:, 0]
    for i in range(3 * sys.getrecursionlimit()):
        e = sp.Add(sp.Mul(sp.Float(0.5), e, evaluate=False), X[i % 4], evaluate=False)
        want = 0.5 * want + point[:, i % 4]
    kernel = sk.build_function(e, list(X), dtype="float32")
    np.testing.assert_allclose(np.asarray(kernel(point.astype(np.float32))), want, rtol=1e-5)


# --- units that must stay whole ---------------------------------------------------------


def test_piecewise_is_opaque_but_hoistable_whole():
    x0, x1, x2 = X[:3]
    inner = sp.sin(x0 + x1)
    pw = sp.Piecewise((inner**2 + inner, x0 > x1), (sp.cos(x0 + x1), True))
    exprs = [pw * x2 + inner, pw - inner**2, (x0 + x1) * pw]
    repl, reduced = _lin(exprs, cse=True)
    pieces = [rhs for _, rhs in repl if rhs.has(sp.Piecewise)]
    assert pieces == [pw]  # hoisted once, as a whole, untouched
    repl_syms = {s for s, _ in repl}
    assert not (pw.free_symbols & repl_syms)
    _assert_same_values(X, exprs, cse=True, max_depth=4)


def test_relationals_and_booleans_stay_whole():
    x0, x1 = X[:2]
    e = sp.Piecewise((x0, sp.And(x0 + x1 > 0, x0 + x1 < 1)), (x1, True)) + (x0 + x1) ** 2
    repl, reduced = _lin([e], cse=True)
    for _, rhs in repl:
        assert not isinstance(rhs, (sp.core.relational.Relational, sp.logic.boolalg.Boolean))


def test_indexed_and_matrix_elements_are_atoms():
    a = sp.IndexedBase("_a0")
    m = sp.MatrixSymbol("M", 2, 2)
    e1 = a[0] * a[1] + sp.sin(a[0]) + m[0, 1] * a[0]
    e2 = a[0] ** 2 + m[0, 1] + sp.sin(a[0])
    repl, reduced = _lin([e1, e2], cse=True)
    for _, rhs in repl:
        assert not isinstance(rhs, (sp.Indexed, sp.matrices.expressions.matexpr.MatrixElement))
    assert [r for _, r in repl] == [sp.sin(a[0])]


def test_negations_print_and_evaluate():
    x0, x1, x2 = X[:3]
    neg = -x0 * x1
    exprs = [neg + x2, neg * x2, -(x0 + x1) * neg, sp.Integer(-3) * x0, sp.Integer(-5)]
    repl, reduced = _lin(exprs, cse=True, max_depth=4)
    _print_and_compile(list(X), repl, reduced)
    _assert_same_values(X, exprs, cse=True, max_depth=4)


def test_max_depth_validated():
    with pytest.raises(ValueError, match="max_depth"):
        _lin([X[0]], cse=False, max_depth=2)


# --- determinism ------------------------------------------------------------------------

_DETERMINISM_SCRIPT = textwrap.dedent(
    """
    import importlib.util, sys
    import sympy as sp
    # Load the module by path: it imports sympy only, and the package imports jax.
    spec = importlib.util.spec_from_file_location("linearize", sys.argv[1])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    linearize = mod.linearize
    x = sp.symbols("x0:6")
    a = sp.IndexedBase("a")
    exprs = []
    for k in range(12):
        s = sp.sin(x[k % 6] + x[(k + 1) % 6]) * a[k % 3]
        exprs.append(s + sp.Max(x[k % 6], s, x[(k + 2) % 6]) + s**2 * sp.exp(-x[k % 5]))
    exprs.append(sp.Add(*[x[i % 6] ** (i % 4 + 1) * a[i] for i in range(200)]))
    for cse in (False, True):
        repl, red = linearize(exprs, cse=cse, max_depth=6, symbols=sp.numbered_symbols("c"))
        print(sp.srepr(repl))
        print(sp.srepr(red))
    """
)


def test_deterministic_across_hash_seeds():
    import symkern.codegen.linearize as mod

    outputs = []
    for seed in ("1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        done = subprocess.run(
            [sys.executable, "-c", _DETERMINISM_SCRIPT, mod.__file__],
            env=env, capture_output=True, text=True, timeout=120, check=True,
        )
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    assert outputs[0].count("\n") == 4


# --- random trees -----------------------------------------------------------------------

_LEAVES = st.sampled_from([*X, sp.Integer(2), sp.Integer(-1), sp.Rational(1, 3), sp.Float(0.5)])


def _extend(children):
    unary = st.sampled_from([sp.sin, sp.cos, sp.tanh, lambda e: 1 / (1 + e**2), lambda e: -e])
    return st.one_of(
        st.builds(lambda f, e: f(e), unary, children),
        st.builds(lambda es: sp.Add(*es), st.lists(children, min_size=2, max_size=6)),
        st.builds(lambda es: sp.Mul(*es), st.lists(children, min_size=2, max_size=6)),
        st.builds(lambda e, k: e**k, children, st.integers(2, 3)),
    )


_TREES = st.recursive(_LEAVES, _extend, max_leaves=40)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(_TREES, min_size=1, max_size=3),
    st.booleans(),
    st.booleans(),
    st.sampled_from([4, 5, 9]),
)
def test_random_trees(exprs, cse, opt, max_depth):
    repl, reduced = linearize(
        exprs, cse=cse, opt=opt, max_depth=max_depth, symbols=sp.numbered_symbols("c")
    )
    assert _max_rhs_depth(repl, reduced) <= max_depth
    if opt:
        _assert_same_values(X, exprs, cse=cse, max_depth=max_depth)
    if cse:
        assert count_operations([r for _, r in repl] + reduced) <= count_operations(exprs)


@pytest.mark.slow
def test_wide_sum_1e5_and_deep_nest_1e5():
    c = sp.IndexedBase("c")
    n = 100_000
    terms = [sp.Mul(c[i], sp.sin(X[i % 4]), X[(i + 1) % 4], evaluate=False) for i in range(n)]
    e = X[0]
    for i in range(n):
        e = sp.sin(sp.Add(X[i % 4], e, evaluate=False), evaluate=False)
    repl, reduced = _lin([sp.Add(*terms, evaluate=False), e], cse=True)
    assert _max_rhs_depth(repl, reduced) <= 50
    _print_and_compile([c, *X], repl, reduced)
