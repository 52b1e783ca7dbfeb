"""Random expression trees over the supported functions, against SymPy at 30 digits.

Hypothesis builds trees (depth ≤ 4) from data symbols x0..x2, parameters a, b and small
constants, with arithmetic, integer powers, elementary functions, Abs/Min/Max and Piecewise
on a leaf. Each tree is built once with `cse=True` and once with `cse=False`, each kernel
evaluated once on a batch of three samples, and every sample compared with SymPy/mpmath at
30 digits. `SYMKERN_SLOW=1` scales the number of examples up.

A sample is compared only where the reference is finite, real, of magnitude < 1e8, and
well-conditioned at float64: SymPy's own float64 evaluation of the same tree (lambdify with
NumPy) must meet the tolerance too, otherwise the sample measures the tree's conditioning
(e.g. `sqrt(abs(u))` of a cancelled `u ≈ 1e-16`), not the kernel.
"""

from __future__ import annotations

import math
import os

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
import sympy as sp  # noqa: E402
from hypothesis import HealthCheck, assume, event, given, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import symkern as sk  # noqa: E402

X = sp.symbols("x0 x1 x2")
A, B = sp.symbols("a b")
SYMBOLS = (*X, A, B)

RTOL = 1e-10
ATOL = 1e-12
CSE_AGREEMENT = 1e-12
MAGNITUDE_LIMIT = 1e8
BATCH = 3

EXAMPLES = 300 if os.environ.get("SYMKERN_SLOW") == "1" else 25
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

# ---- the expression strategy ----------------------------------------------------------

constants = st.one_of(
    st.builds(sp.Rational, st.integers(-3, 3), st.integers(1, 4)),
    st.integers(-3, 3).map(sp.Integer),
    st.sampled_from([sp.pi, sp.E]),
)
symbols = st.sampled_from(SYMBOLS)
leaves = st.one_of(symbols, symbols, constants)

#: thresholds of Piecewise conditions: exact in binary, so float64 and SymPy compare alike
thresholds = st.sampled_from([sp.Rational(k, 2) for k in range(-3, 4)])
relations = st.sampled_from([sp.Lt, sp.Le, sp.Gt, sp.Ge, sp.Eq, sp.Ne])
conditions = st.builds(lambda rel, leaf, c: rel(leaf, c), relations, symbols, thresholds)

UNARY = {
    "neg": lambda e: -e,
    "sin": sp.sin,
    "cos": sp.cos,
    "exp": sp.exp,
    "tanh": sp.tanh,
    "log_abs_plus_1": lambda e: sp.log(sp.Abs(e) + 1),
    "sqrt_abs": lambda e: sp.sqrt(sp.Abs(e)),
    "atan": sp.atan,
    "Abs": sp.Abs,
}
BINARY = {
    "+": lambda p, q: p + q,
    "-": lambda p, q: p - q,
    "*": lambda p, q: p * q,
    "/": lambda p, q: p / q,
    "Min": sp.Min,
    "Max": sp.Max,
}


#: drawn by index; the mix keeps a tree of depth 4 at about a dozen nodes on average
OPERATIONS = ["leaf", "leaf", "unary", "power", "binary", "binary", "piecewise"]


def _finite(expr: sp.Expr) -> sp.Expr:
    # SymPy folds e.g. 0**-1 to zoo; Min/Max refuse it, and it is no kernel input anyway
    return sp.Integer(1) if expr.has(sp.zoo, sp.nan, sp.oo, -sp.oo) else expr


@st.composite
def expressions(draw, depth: int = 4) -> sp.Expr:
    """A tree of depth ≤ `depth`; operations are drawn by index, so shrinking goes to leaves."""
    return _finite(draw(_node(depth)))


@st.composite
def _node(draw, depth: int) -> sp.Expr:
    kind = OPERATIONS[draw(st.integers(0, len(OPERATIONS) - 1))] if depth else "leaf"
    if kind == "leaf":
        return draw(leaves)
    if kind == "unary":
        return UNARY[draw(st.sampled_from(sorted(UNARY)))](draw(expressions(depth - 1)))
    if kind == "power":
        return draw(expressions(depth - 1)) ** draw(st.sampled_from([-2, -1, 2, 3]))
    if kind == "binary":
        operation = BINARY[draw(st.sampled_from(sorted(BINARY)))]
        return operation(draw(expressions(depth - 1)), draw(expressions(depth - 1)))
    condition = draw(conditions)
    return sp.Piecewise((draw(expressions(depth - 1)), condition),
                        (draw(expressions(depth - 1)), True))


inputs = st.floats(-2.0, 2.0, allow_nan=False, allow_infinity=False, allow_subnormal=False)
samples = st.lists(st.tuples(*[inputs] * len(SYMBOLS)), min_size=BATCH, max_size=BATCH)


# ---- references -----------------------------------------------------------------------

def reference(expr: sp.Expr, values: tuple[float, ...]) -> float | None:
    """`expr` at `values` (exact binary values) to 30 digits; None if not finite and real."""
    exact = {s: sp.Rational(v) for s, v in zip(SYMBOLS, values, strict=True)}
    try:
        result = sp.N(expr.xreplace(exact), 30)
    except (ValueError, TypeError, ZeroDivisionError, OverflowError):
        return None
    if result.has(sp.nan, sp.zoo, sp.oo, -sp.oo) or not result.is_number:
        return None
    re, im = result.as_real_imag()
    if not (re.is_number and im.is_number) or abs(complex(im)) > 0:
        return None
    value = float(re)
    if not math.isfinite(value) or abs(value) >= MAGNITUDE_LIMIT:
        return None
    return value


def within(got: float, want: float) -> bool:
    return bool(abs(got - want) <= RTOL * abs(want) + ATOL)


def float64_evaluation(expr: sp.Expr, values: np.ndarray) -> np.ndarray:
    """SymPy's own float64 evaluation (lambdify, NumPy), sample by sample."""
    function = sp.lambdify(SYMBOLS, expr, modules="numpy")
    with np.errstate(all="ignore"):
        return np.array([np.float64(function(*(np.float64(v) for v in row))) for row in values])


def build(expr: sp.Expr, cse: bool) -> sk.Kernel:
    return sk.build_function(expr, list(X), params={"a": A, "b": B}, cse=cse, dtype="float64")


def evaluate(kernel: sk.Kernel, values: np.ndarray) -> np.ndarray:
    got = np.asarray(kernel(values[:, :3], {"a": values[0, 3], "b": values[0, 4]}))
    assert got.shape == (BATCH,), f"result shape {got.shape}, expected {(BATCH,)}"
    assert got.dtype == np.float64
    return got


def _share_parameters(rows: list[tuple[float, ...]]) -> np.ndarray:
    """Parameters are one value per call: every sample gets the first sample's a, b."""
    values = np.array(rows, dtype=np.float64)
    values[:, 3:] = values[0, 3:]
    return values


# ---- properties -----------------------------------------------------------------------

@SETTINGS
@given(expr=expressions(), rows=samples)
def test_random_expression_kernel_matches_sympy_at_30_digits_with_and_without_cse(expr, rows):
    assume(not expr.has(sp.zoo, sp.nan, sp.oo, -sp.oo))  # e.g. 0**-1 folded by SymPy
    values = _share_parameters(rows)
    note(f"expr = {sp.srepr(expr)}")
    note(f"samples (x0, x1, x2, a, b) = {values.tolist()}")
    references = [reference(expr, tuple(row)) for row in values]
    naive = float64_evaluation(expr, values)
    checked = [k for k, want in enumerate(references)
               if want is not None and within(float(naive[k]), want)]
    event(f"samples checked: {len(checked)} of {BATCH}")
    event(f"operations: {min(sp.count_ops(expr), 12) // 4 * 4}+")
    assume(checked)

    got = {cse: evaluate(build(expr, cse), values) for cse in (True, False)}
    for cse, result in got.items():
        for k in checked:
            assert within(float(result[k]), references[k]), (
                f"cse={cse}: {expr} at {dict(zip(map(str, SYMBOLS), values[k], strict=True))}: "
                f"kernel {result[k]!r}, SymPy {references[k]!r}, NumPy {naive[k]!r}"
            )
    for k in checked:
        with_cse, without = float(got[True][k]), float(got[False][k])
        assert abs(with_cse - without) <= CSE_AGREEMENT * max(abs(with_cse), 1.0), (
            f"{expr}: cse=True gives {with_cse!r}, cse=False {without!r}"
        )


@settings(SETTINGS, max_examples=max(EXAMPLES // 2, 10))
@given(expr=expressions(depth=2), rows=samples)
def test_random_expression_kernel_has_the_batch_shape_even_when_constant(expr, rows):
    """Whatever the tree reduces to (a constant, one symbol), one value per sample."""
    values = _share_parameters(rows)
    note(f"expr = {sp.srepr(expr)}")
    kernel = build(expr, cse=True)
    with np.errstate(all="ignore"):
        got = np.asarray(kernel(values[:, :3], {"a": values[0, 3], "b": values[0, 4]}))
        single = np.asarray(kernel(values[0, :3], {"a": values[0, 3], "b": values[0, 4]}))
    assert got.shape == (BATCH,)
    assert single.shape == ()
    np.testing.assert_allclose(single, got[0], rtol=1e-12, atol=1e-300, equal_nan=True)
