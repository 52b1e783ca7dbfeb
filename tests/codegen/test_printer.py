"""codegen.printer.StatementPrinter writes, for every expression, the source SymPy's JAX
printer writes (`emit._print_with_sympy`): random trees by hypothesis and the cases each of
its rules stands for."""

from __future__ import annotations

import contextlib
import os
import re

import pytest
import sympy as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from symkern.codegen import emit
from symkern.codegen.printer import StatementPrinter, float_is_negative
from symkern.symbolic.arguments import data_argument, equation_set

X = sp.symbols("x0 x1 x2")
A = sp.Symbol("a", positive=True)
GENERATED_SPELLING = (sp.Symbol("_a0"), sp.Symbol("_c0"))
SYMBOLS = (*X, A, *GENERATED_SPELLING)

EXAMPLES = 600 if os.environ.get("SYMKERN_SLOW") == "1" else 150
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@contextlib.contextmanager
def _printing_with_sympy():
    printing = emit._print
    emit._print = lambda equations, leaves, *rest: emit._print_with_sympy(equations, *rest)
    try:
        yield
    finally:
        emit._print = printing


def _outcome(eqs, arguments, **options):
    try:
        return emit.emit(equation_set(eqs), arguments, **options).source
    except Exception as error:  # both printers must refuse alike
        return f"{type(error).__name__}: {error}"


def assert_same_source(eqs, arguments=None, **options):
    arguments = arguments or [data_argument(list(SYMBOLS), 1)]
    printed = _outcome(eqs, arguments, **options)
    with _printing_with_sympy():
        reference = _outcome(eqs, arguments, **options)
    assert printed == reference
    return printed


# ---- random trees ---------------------------------------------------------------------

floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1e-300, -1e300, 2.0**40]))
constants = st.one_of(
    st.integers(-4, 4).map(sp.Integer),
    st.sampled_from([2**31, -2**31, 2**31 - 1, 3**40, -(5**30)]).map(sp.Integer),
    st.builds(sp.Rational, st.integers(-5, 5), st.integers(1, 6)),
    st.builds(sp.Rational, st.sampled_from([1, -7, 2**33]), st.sampled_from([3, 2**32 + 1])),
    floats.map(sp.Float),
    st.builds(lambda value, digits: sp.Float(value, digits), st.floats(-1e3, 1e3),
              st.sampled_from([5, 15, 30])),
    st.sampled_from([sp.pi, sp.E, sp.S.Half, -sp.S.Half]),
)
leaves = st.one_of(st.sampled_from(SYMBOLS), st.sampled_from(SYMBOLS), constants)
exponents = st.one_of(
    st.integers(-4, 4).map(sp.Integer),
    st.sampled_from([sp.S.Half, -sp.S.Half, sp.Rational(3, 2), sp.Rational(-3, 2),
                     sp.Rational(1, 3), sp.Rational(-2, 3), sp.Float(0.5), sp.Float(-0.5),
                     sp.Float(-2.0), X[1], -X[2], X[0] + 1]),
)
FUNCTIONS = (sp.sin, sp.cos, sp.exp, sp.tanh, sp.atan, sp.log, sp.sqrt, sp.Abs, sp.sign,
             sp.floor, sp.erf, sp.asinh, sp.gamma, sp.re, sp.cot)


def _or_first(build):
    """`build`, or its first operand where SymPy refuses the combination (Min of zoo)."""
    def built(first, *rest):
        try:
            return build(first, *rest)
        except (ValueError, TypeError, ZeroDivisionError):
            return first[0] if isinstance(first, (tuple, list)) else first
    return built


def _apply(e, f):
    """`f(e)`; gamma of a rational shifted off the numbers, where SymPy would evaluate it as
    a factorial (gamma(3**40) does not finish)."""
    return f(e + X[0]) if f is sp.gamma and e.is_Rational else f(e)


def _extend(children):
    pairs = st.tuples(children, children)
    return st.one_of(
        st.builds(_or_first(lambda p: p[0] + p[1]), pairs),
        st.builds(_or_first(lambda p: p[0] - p[1]), pairs),
        st.builds(_or_first(lambda p: p[0] * p[1]), pairs),
        st.builds(_or_first(lambda p: p[0] / p[1]), pairs),
        st.builds(_or_first(lambda e, c: -c * e), children, constants),
        st.builds(_or_first(sp.Pow), children, exponents),
        st.builds(_or_first(_apply), children, st.sampled_from(FUNCTIONS)),
        st.builds(_or_first(lambda p: sp.Min(*p)), pairs),
        st.builds(_or_first(lambda p: sp.atan2(*p)), pairs),
        st.builds(_or_first(lambda e, c: sp.Piecewise((e, X[0] > c), (-e, True))), children,
                  constants),
        st.lists(children, min_size=3, max_size=40).map(_or_first(lambda terms: sp.Add(*terms))),
        st.lists(children, min_size=3, max_size=12).map(_or_first(lambda factors: sp.Mul(*factors))),
    )


expressions = st.recursive(leaves, _extend, max_leaves=60)


@SETTINGS
@given(st.lists(expressions, min_size=1, max_size=3), st.booleans())
def test_random_trees_print_as_sympy_prints_them(eqs, cse):
    assert_same_source(sp.Matrix(eqs), cse=cse)


# ---- the cases each rule stands for ---------------------------------------------------

x, y, z = X
CASES = {
    "negative coefficients": [-x, -2 * x, -2 * x * y, -(x + y), -2 * (x + y), -x * y * z,
                              x - 3 * y, -sp.Rational(3, 2) * x, -sp.Rational(3, 2) * x * y,
                              sp.Float(-2.5) * x, sp.Float(-2.5) * (x + y), -sp.oo * x + y],
    "rationals": [sp.Rational(1, 3) * x, x / 3 + sp.Rational(-5, 7), (x + 1) / 2,
                  sp.Rational(2**40, 3) * x],
    "large integers": [2**31 * x, -2**31 * x + 1, 2**31 - 1 + x, x**(2**33), 3**700 * x,
                       -(3**700) * x],
    "floats": [sp.Float(1.5) * x, sp.Float(1.5), sp.Float(-1.5) + x, sp.Float(1e-300) * x,
               sp.Float(1.0, 30) * x + sp.Float(1.0, 5) * y, sp.Float("nan") * x,
               sp.Float("inf") + x, sp.Float(-0.0) + x, sp.Float(2.0**70) * x],
    "powers": [sp.sqrt(x), 1 / sp.sqrt(x), x**sp.Rational(3, 2), x**sp.Rational(-3, 2),
               1 / x, x**-2, x**-(2**32), y / x**2, y / (x * z), 1 / (x * y), (x * y)**-1 * z,
               x**sp.Float(0.5), x**sp.Float(-2.0), x**y, x**(y + 1), (x + y)**2,
               (-x)**sp.Rational(1, 3), sp.Rational(1, 2)**x, (-2)**x, sp.E**x, 2**x,
               sp.Pow(x, -1, evaluate=False) * y, (x + 1)**-3 * (y + 1)**-1],
    "nested functions": [sp.exp(sp.sin(x + y**2)), sp.atan(sp.tanh(sp.cos(x) * 3)),
                         sp.Abs(x) + sp.Max(x, y, z), sp.log(1 + sp.sqrt(sp.Abs(x)))],
    "piecewise inside add": [sp.Piecewise((x, x > 0), (y, True)) + z,
                             2 * sp.Piecewise((x**2, sp.And(x > 0, y < 1)), (-y, True)) - x],
    "generated spellings": [GENERATED_SPELLING[0] * x - GENERATED_SPELLING[1],
                            -GENERATED_SPELLING[0]],
    "number symbols": [sp.pi * x + sp.E, sp.pi, sp.EulerGamma * x],
    "real part": [sp.re(x) + y, sp.im(x) * 2],
}


@pytest.mark.parametrize("cse", [True, False])
@pytest.mark.parametrize("kind", sorted(CASES))
def test_each_case_prints_as_sympy_prints_it(kind, cse):
    for expr in CASES[kind]:
        assert_same_source(expr, cse=cse)


def test_complex_literals_print_as_sympy_prints_them():
    for expr in [sp.I * x, (2 + 3 * sp.I) * x + sp.I, sp.exp(sp.I * x) - 1, sp.Float(1.5) * sp.I]:
        assert_same_source(expr, complex_values=True)


def test_matrix_element_arguments_print_as_their_entries():
    M = sp.MatrixSymbol("M", 2, 2)
    arguments = [data_argument(M, 1), data_argument([x], 2)]
    printed = assert_same_source(sp.Matrix([M[0, 0] * x - 2 * M[1, 1], sp.sin(M[0, 1]) ** 2]),
                                 arguments)
    assert "_a0[0, 0]" in printed


def test_a_wide_body_splits_into_statements_printed_alike():
    terms = [sp.Float(k / 7) * sp.sin(k * x) * y ** (k % 3 + 1) for k in range(1, 400)]
    assert assert_same_source(sp.Add(*terms), cse=False).count("\n") > 10


def test_a_returned_subs_is_printed_by_sympys_function_printer():
    arguments = [data_argument(list(SYMBOLS), 1)]
    printed = _outcome(sp.Subs(x**2 + y, x, z) + 1, arguments)
    with _printing_with_sympy():
        reference = _outcome(sp.Subs(x**2 + y, x, z) + 1, arguments)
    # the function printer numbers the Subs' variable with SymPy's global Dummy counter
    assert re.sub(r"_Dummy_\d+", "_Dummy", printed) == re.sub(r"_Dummy_\d+", "_Dummy", reference)
    assert "_Dummy" in printed


def test_statements_print_without_the_function_printer_on_a_typical_body():
    printer = StatementPrinter(emit.jax_printer({}, {}))
    source = printer.function("f", [sp.Symbol("_a0")], [(sp.Symbol("_c0"), x + 2 * y)],
                              [-sp.Symbol("_c0") ** 2])
    assert source == "def f(_a0):\n    _c0 = x0 + 2*x1\n    return (-_c0**2,)\n"


@pytest.mark.parametrize("value", ["0.0", "-0.0", "1.5", "-1.5", "-5e-324", "1e-400",
                                   "-1e-400", "-1e300"])
def test_float_is_negative_reads_what_sympy_deduces(value):
    number = sp.Float(value)
    assert float_is_negative(number) == bool(number < 0) == bool(number.is_extended_negative)


def test_a_returned_subs_leaves_the_whole_function_to_sympy():
    printer = StatementPrinter(emit.jax_printer({}, {}))
    assert printer.function("f", [sp.Symbol("_a0")], [],
                            [sp.Subs(x**2 + y, x, z) + 1]) is None
