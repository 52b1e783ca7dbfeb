"""Every SymPy construct the core promises, evaluated in float64 against SymPy at 30 digits.

Each construct is built into a kernel over the data argument `[x, y]`, evaluated on a batch
of points inside its domain, and compared with SymPy's own evaluation (mpmath, 30 digits)
at the exact binary value of each float64 input. Both `cse=True` and `cse=False`.
"""

from __future__ import annotations

import ast
import math
import subprocess
import sys
import textwrap

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import sympy as sp  # noqa: E402

import symkern as sk  # noqa: E402

x, y, z = sp.symbols("x y z")
a, b = sp.symbols("a b")

RTOL = 1e-10
#: absolute tolerance for references at or near zero
ATOL = 1e-12

CSE = pytest.mark.parametrize("cse", [True, False], ids=["cse", "nocse"])

# point sets (x values; y defaults to 0.5 where a construct reads it)
GENERAL = [-2.3, -1.1, -0.4, 0.0, 0.3, 0.9, 1.7, 3.2]
NONZERO = [-2.3, -1.1, -0.4, 0.3, 0.9, 1.7, 3.2]
POSITIVE = [0.05, 0.3, 0.9, 1.0, 1.7, 3.2, 7.5]
UNIT = [-0.95, -0.5, -0.1, 0.0, 0.2, 0.6, 0.99]
OPEN_UNIT = [-0.95, -0.5, -0.1, 0.2, 0.6, 0.99]
ABOVE_ONE = [1.0, 1.2, 2.5, 10.0]
OUTSIDE_UNIT = [-3.0, -1.5, 1.2, 2.5, 10.0]
TRIG_SAFE = [-2.3, -1.1, -0.4, 0.3, 0.9, 1.4, 2.0]  # away from multiples of pi/2
INTEGERISH = [-2.0, -1.5, -1.0, -0.3, 0.0, 0.4, 1.0, 2.5]
GAMMA_POINTS = [-2.5, -0.5, 0.3, 1.0, 1.5, 4.2, 9.7]
POLYGAMMA_POINTS = [0.3, 1.0, 1.5, 4.2, 9.7]


def _exact(value: float) -> sp.Rational:
    """The exact binary value of a float64, so the reference sees what the kernel sees."""
    return sp.Rational(float(value))


def reference(expr: sp.Expr, values: dict[sp.Symbol, float]) -> complex:
    """`expr` at `values`, evaluated by SymPy/mpmath at 30 digits (nan if undefined)."""
    substituted = expr.xreplace({s: _exact(v) for s, v in values.items()})
    result = sp.N(substituted, 30)
    if result is sp.nan or result.has(sp.nan, sp.zoo, sp.oo, -sp.oo):
        return complex(math.nan, 0.0)
    return complex(result)


def assert_close(got: float, expected: complex, where: str) -> None:
    if math.isnan(expected.real):
        assert math.isnan(got), f"{where}: expected nan, got {got!r}"
        return
    assert abs(expected.imag) <= ATOL, f"{where}: reference {expected} is not real"
    want = expected.real
    assert math.isfinite(got), f"{where}: got {got!r}, expected {want!r}"
    assert abs(got - want) <= RTOL * abs(want) + ATOL, (
        f"{where}: got {got!r}, expected {want!r} (rel err {abs(got - want) / max(abs(want), 1e-300):.3g})"
    )


def check_against_sympy(expr: sp.Expr, xs, ys=None, *, cse: bool) -> sk.Kernel:
    """Build `expr` over `[x, y]`, evaluate the whole batch once, compare every sample."""
    xs = np.asarray(xs, dtype=np.float64)
    ys = np.full_like(xs, 0.5) if ys is None else np.asarray(ys, dtype=np.float64)
    kernel = sk.build_function(expr, [x, y], cse=cse, dtype="float64")
    got = np.asarray(kernel(np.stack([xs, ys], axis=-1)))
    assert got.shape == xs.shape
    assert got.dtype == np.float64
    for k, (xv, yv) in enumerate(zip(xs, ys, strict=True)):
        expected = reference(expr, {x: xv, y: yv})
        assert_close(float(got[k]), expected, f"{expr} at x={xv!r}, y={yv!r} (cse={cse})")
    return kernel


def _case(name, expr, xs, ys=None, marks=()):
    return pytest.param(expr, xs, ys, id=name, marks=marks)


ELEMENTARY = [
    _case("sin", sp.sin(x), GENERAL),
    _case("cos", sp.cos(x), GENERAL),
    _case("tan", sp.tan(x), TRIG_SAFE),
    _case("cot", sp.cot(x), [v for v in TRIG_SAFE if v != 0.0]),
    _case("sec", sp.sec(x), TRIG_SAFE),
    _case("csc", sp.csc(x), TRIG_SAFE),
    _case("asin", sp.asin(x), UNIT + [1.0, -1.0]),
    _case("acos", sp.acos(x), UNIT + [1.0, -1.0]),
    _case("atan", sp.atan(x), GENERAL),
    _case("acot", sp.acot(x), NONZERO),
    _case("atan2", sp.atan2(y, x), [1.0, -1.0, 0.5, -2.0, 0.0, 3.0],
          [0.5, 0.5, -1.5, -0.25, 1.0, 0.0]),
    _case("sinh", sp.sinh(x), GENERAL),
    _case("cosh", sp.cosh(x), GENERAL),
    _case("tanh", sp.tanh(x), GENERAL),
    _case("coth", sp.coth(x), NONZERO),
    _case("sech", sp.sech(x), GENERAL),
    _case("csch", sp.csch(x), NONZERO),
    _case("asinh", sp.asinh(x), GENERAL),
    _case("acosh", sp.acosh(x), ABOVE_ONE),
    _case("atanh", sp.atanh(x), OPEN_UNIT),
    _case("exp", sp.exp(x), GENERAL),
    _case("log", sp.log(x), POSITIVE),
    _case("log_base_2", sp.log(x, 2), POSITIVE),
    _case("log_base_10", sp.log(x, 10), POSITIVE),
    _case("sqrt", sp.sqrt(x), [0.0] + POSITIVE),
    _case("cbrt_positive", sp.cbrt(x), POSITIVE),
    _case("rational_power_3_2", x ** sp.Rational(3, 2), [0.0] + POSITIVE),
    _case("rational_power_minus_1_3", x ** sp.Rational(-1, 3), POSITIVE),
    _case("rational_power_5_4", x ** sp.Rational(5, 4), POSITIVE),
]

POWERS = [
    _case("square", x**2, GENERAL),
    _case("cube", x**3, GENERAL),
    _case("power_7", x**7, GENERAL),
    _case("reciprocal", x**-1, NONZERO),
    _case("inverse_square", x**-2, NONZERO),
    _case("inverse_cube", x**-3, NONZERO),
    _case("power_of_sum", (x + y) ** 3, GENERAL),
    _case("inverse_power_of_sum", (x + 2 * y + 3) ** -2, GENERAL),
    _case("quotient", (x + 1) / (y + 2), GENERAL, [0.5, -0.5, 1.5, 3.0, -1.25, 0.0, 2.0, 9.0]),
    _case("symbolic_exponent", x**y, POSITIVE, [0.5, -1.5, 2.25, 3.0, -0.75, 1.0, 0.0]),
]

PIECEWISE_LINEAR = [
    _case("Abs", sp.Abs(x), GENERAL),
    _case("Abs_of_expression", sp.Abs(x**2 - 1), GENERAL),
    _case("sign", sp.sign(x), GENERAL),
    _case("Min_2", sp.Min(x, y), GENERAL, [0.5, -2.0, 0.0, 0.0, 1.0, 0.2, 5.0, -1.0]),
    _case("Max_2", sp.Max(x, y), GENERAL, [0.5, -2.0, 0.0, 0.0, 1.0, 0.2, 5.0, -1.0]),
    _case("Min_3", sp.Min(x, y, 1 - x), GENERAL, [0.5, -2.0, 0.0, 0.0, 1.0, 0.2, 5.0, -1.0]),
    _case("Max_3", sp.Max(x, y, x * y), GENERAL, [0.5, -2.0, 0.0, 0.0, 1.0, 0.2, 5.0, -1.0]),
    _case("Min_4", sp.Min(x, y, 2 * x, x - y), GENERAL, [0.5, -2.0, 0.0, 0.0, 1.0, 0.2, 5.0, -1.0]),
    _case("floor", sp.floor(x), INTEGERISH),
    _case("ceiling", sp.ceiling(x), INTEGERISH),
    _case("floor_of_expression", sp.floor(3 * x + y), INTEGERISH),
    _case("Heaviside", sp.Heaviside(x), GENERAL),
    _case("Heaviside_half_at_zero", sp.Heaviside(x, sp.S.Half), GENERAL),
    _case("Heaviside_zero_at_zero", sp.Heaviside(x, 0), GENERAL),
    _case("Mod", sp.Mod(x, sp.Rational(3, 2)), INTEGERISH + [4.1, -4.1]),
    _case("Mod_by_symbol", sp.Mod(x, y), [4.1, -4.1, 2.5, 0.3], [1.5, 1.5, -0.75, 2.0]),
]

SPECIAL = [
    _case("erf", sp.erf(x), GENERAL),
    _case("erfc", sp.erfc(x), GENERAL),
    _case("gamma", sp.gamma(x), GAMMA_POINTS),
    _case("loggamma", sp.loggamma(x), POLYGAMMA_POINTS + [30.0]),
    _case("polygamma_0", sp.polygamma(0, x), POLYGAMMA_POINTS),
    _case("polygamma_1", sp.polygamma(1, x), POLYGAMMA_POINTS),
    _case("polygamma_2", sp.polygamma(2, x), POLYGAMMA_POINTS),
    _case("digamma", sp.digamma(x), POLYGAMMA_POINTS),
]

CONSTANTS = [
    _case("Rational", sp.Rational(2, 3) * x + sp.Rational(-7, 5), GENERAL),
    _case("pi", sp.pi * x + sp.pi, GENERAL),
    _case("E", sp.E * x - sp.E**2, GENERAL),
    _case("exp_1_is_E", sp.exp(1) + x, GENERAL),
    _case("Integer_and_Float", 3 * x - 4 + sp.Float("0.125") * y, GENERAL),
    _case("constant_only_in_a_function", sp.sin(sp.pi / 7) * x + sp.sqrt(2), GENERAL),
]

PIECEWISE = [
    _case("Piecewise_less", sp.Piecewise((x**2, x < 0.3), (-x, True)), GENERAL),
    _case("Piecewise_less_equal", sp.Piecewise((x**2, x <= 0.3), (-x, True)), GENERAL),
    _case("Piecewise_greater", sp.Piecewise((sp.sin(x), x > 0), (sp.cos(x), True)), GENERAL),
    _case("Piecewise_greater_equal", sp.Piecewise((sp.sin(x), x >= 0), (sp.cos(x), True)),
          GENERAL),
    _case("Piecewise_Eq", sp.Piecewise((1, sp.Eq(x, 0)), (x, True)), GENERAL),
    _case("Piecewise_Ne", sp.Piecewise((sp.sin(x) / x, sp.Ne(x, 0)), (1, True)), GENERAL),
    _case("Piecewise_And", sp.Piecewise((x, sp.And(x > -1, x < 1)), (0, True)), GENERAL),
    _case("Piecewise_Or", sp.Piecewise((x, sp.Or(x < -1, x > 1)), (y, True)), GENERAL),
    _case("Piecewise_Not", sp.Piecewise((x + 1, sp.Not(x > 0.5)), (x - 1, True)), GENERAL),
    _case("Piecewise_mixed_logic",
          sp.Piecewise((1, sp.And(x > 0, sp.Or(y < 0, sp.Not(x > 1)))), (2, sp.Eq(x, 0)),
                       (3, True)),
          GENERAL, [0.5, -2.0, 0.0, 0.0, -1.0, 0.2, 5.0, -1.0]),
    _case("Piecewise_two_symbols", sp.Piecewise((x * y, x > y), (x - y, True)), GENERAL,
          [0.5, -2.0, 0.0, 0.0, 1.0, 0.2, 5.0, -1.0]),
    _case("Piecewise_without_True_branch_is_nan_elsewhere", sp.Piecewise((x, x > 0.5)), GENERAL),
    _case("Piecewise_without_True_branch_two_conditions",
          sp.Piecewise((x, x > 1), (-x, x < -1)), GENERAL),
    _case("Piecewise_nested",
          sp.Piecewise((sp.Piecewise((x, y > 0), (-x, True)), x > 0), (x**2, True)), GENERAL,
          [0.5, -2.0, 0.0, 0.0, -1.0, 0.2, 5.0, -1.0]),
    _case("Piecewise_nested_in_condition_branch_and_arithmetic",
          2 * sp.Piecewise((sp.Piecewise((1, x > 2), (x, True)), x > 0), (0, True))
          + sp.Piecewise((y, x < 0), (1, True)),
          GENERAL, [0.5, -2.0, 0.0, 0.0, -1.0, 0.2, 5.0, -1.0]),
    _case("Piecewise_shares_subexpression_with_outside",
          sp.sin(x) ** 2 + sp.Piecewise((sp.sin(x), x > 0), (sp.cos(x), True)), GENERAL),
]

ALL_CASES = ELEMENTARY + POWERS + PIECEWISE_LINEAR + SPECIAL + CONSTANTS + PIECEWISE


@CSE
@pytest.mark.parametrize(("expr", "xs", "ys"), ALL_CASES)
def test_construct_matches_sympy_at_30_digits(expr, xs, ys, cse):
    check_against_sympy(expr, xs, ys, cse=cse)


@CSE
def test_kernel_of_several_constructs_matches_sympy_as_one_expression(cse):
    expr = (sp.sin(x) * sp.exp(-y**2) + sp.atan2(y, x) - sp.Abs(x - y) ** sp.Rational(3, 2)
            + sp.Piecewise((sp.log(x), x > 0), (sp.erf(y), True)) + sp.Max(x, y, 0) / 3)
    check_against_sympy(expr, GENERAL, [0.5, -2.0, 0.1, -0.7, 1.0, 0.2, 5.0, -1.0], cse=cse)


@CSE
def test_parameters_are_read_in_every_construct_family(cse):
    expr = a * sp.sin(b * x) + sp.Piecewise((a**2, x > b), (sp.gamma(a + 2), True)) + sp.Min(a, x)
    kernel = sk.build_function(expr, [x], params={"a": a, "b": b}, cse=cse, dtype="float64")
    xs = np.array([-1.5, 0.0, 0.7, 2.0])
    ps = {"a": 0.8, "b": 0.25}
    got = np.asarray(kernel(xs[:, None], ps))
    for k, xv in enumerate(xs):
        expected = reference(expr, {x: xv, a: ps["a"], b: ps["b"]})
        assert_close(float(got[k]), expected, f"{expr} at x={xv}")


@CSE
def test_integer_square_is_emitted_as_lax_integer_pow(cse):
    kernel = sk.build_function(x**2 + y, [x, y], cse=cse, dtype="float64")
    assert "lax.integer_pow(" in kernel.source
    assert "**" not in kernel.source
    np.testing.assert_allclose(kernel(np.array([3.0, 1.0])), 10.0, rtol=0, atol=0)


@CSE
def test_negative_integer_power_is_emitted_as_lax_integer_pow(cse):
    kernel = sk.build_function(x**-2, [x], cse=cse, dtype="float64")
    assert "lax.integer_pow(" in kernel.source
    np.testing.assert_allclose(kernel(np.array([4.0])), 1 / 16, rtol=0, atol=0)


# ---- functions symkern cannot evaluate ----------------------------------------------------

@pytest.mark.parametrize(
    ("expr", "name"),
    [
        pytest.param(sp.bessely(0, x), "bessely", id="bessely"),
        pytest.param(sp.polylog(2, x), "polylog", id="polylog"),
        pytest.param(sp.LambertW(x, 1), "LambertW", id="LambertW_complex_branch"),
        pytest.param(sp.bernoulli(y, x), "bernoulli", id="bernoulli_polynomial"),
        pytest.param(sp.sin(x) + sp.airyai(x), "airyai", id="airyai_inside_a_sum"),
    ],
)
@CSE
def test_unknown_sympy_function_raises_unsupported_function_error_naming_it(expr, name, cse):
    with pytest.raises(sk.UnsupportedFunctionError, match=name):
        sk.build_function(expr, [x], cse=cse, dtype="float64")


def test_unsupported_function_error_is_a_build_error():
    with pytest.raises(sk.BuildError):
        sk.build_function(sp.bessely(1, x), [x], dtype="float64")


def test_unknown_function_message_names_the_nearest_supported_function():
    class besselz(sp.Function):  # noqa: N801 - a SymPy-style name
        pass

    with pytest.raises(sk.UnsupportedFunctionError, match="besselz.*nearest supported: bessel"):
        sk.build_function(besselz(x), [x], dtype="float64")


@pytest.mark.parametrize("condition", ["isinf", "isnan"])
def test_isinf_and_isnan_evaluate_instead_of_reporting_drift(condition):
    from sympy.codegen import cfunctions

    test = getattr(cfunctions, condition)
    kernel = sk.build_function(sp.Piecewise((1, test(x)), (0, True)), x, dtype="float64")
    got = np.asarray(kernel(np.array([1.0, np.inf, -np.inf, np.nan])))
    expected = {"isinf": [0, 1, 1, 0], "isnan": [0, 0, 0, 1]}[condition]
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("cse", [True, False], ids=["cse", "nocse"])
def test_unevaluated_power_of_an_integer_literal_evaluates(cse):
    half = sp.Pow(2, -1, evaluate=False)
    alone = sk.build_function(half, x, cse=cse, dtype="float64")
    np.testing.assert_allclose(alone(np.array([1.0, 2.0])), [0.5, 0.5], rtol=0)
    inside = sk.build_function(sp.sin(half) * x, x, cse=cse, dtype="float64")
    np.testing.assert_allclose(inside(np.array([2.0])), [2 * math.sin(0.5)], rtol=1e-15)
    cube = sk.build_function(sp.Pow(-3, 3, evaluate=False) + x, x, cse=cse, dtype="float64")
    np.testing.assert_allclose(cube(np.array([1.0])), [-26.0], rtol=0)


def test_matrix_solve_is_a_batched_solve():
    from sympy.codegen.matrix_nodes import MatrixSolve

    M, v = sp.MatrixSymbol("M", 2, 2), sp.MatrixSymbol("v", 2, 1)
    kernel = sk.build_function(MatrixSolve(M, v), M, v, dtype="float64")
    Ms = np.array([[[2.0, 1.0], [0.5, 3.0]], [[1.0, -1.0], [2.0, 4.0]]])
    vs = np.array([[1.0, 2.0], [-1.0, 0.5]])
    np.testing.assert_allclose(kernel(Ms, vs), np.linalg.solve(Ms, vs[..., None])[..., 0],
                               rtol=1e-12)


def test_polygamma_with_the_order_as_data_evaluates():
    n = sp.Symbol("n")
    kernel = sk.build_function(sp.polygamma(n, x), [n, x], dtype="float64")
    got = np.asarray(kernel(np.array([[0.0, 2.0], [1.0, 2.0], [3.0, 0.5], [1.5, 2.0]])))
    expected = [float(sp.polygamma(k, v).evalf(20)) for k, v in ((0, 2), (1, 2), (3, sp.S.Half))]
    np.testing.assert_allclose(got[:3], expected, rtol=1e-13)
    assert math.isnan(got[3])  # a non-integer order: no real polygamma
    grad = jax.grad(lambda v: kernel(jnp.stack([1.0, v])))(2.0)
    np.testing.assert_allclose(grad, float(sp.polygamma(2, 2).evalf(20)), rtol=1e-13)


def test_dict_equation_keyed_by_an_expression_is_refused_like_params():
    with pytest.raises(sk.BuildError, match=r"eqs: key x\*\*2 .* is a Pow"):
        sk.build_function({x**2: x}, x, dtype="float64")
    kernel = sk.build_function({"x2": x**2, "x": x}, x, dtype="float64")
    assert float(kernel(np.array(2.0))["x2"]) == 4.0


@CSE
def test_undefined_function_without_implementation_raises_naming_it(cse):
    f = sp.Function("f")
    with pytest.raises(sk.UnsupportedFunctionError, match=r"\bf\b"):
        sk.build_function(f(x) + 1, [x], cse=cse, dtype="float64")


@CSE
def test_undefined_function_with_implementation_evaluates_it(cse):
    f = sp.Function("f")
    kernel = sk.build_function(f(x) * y + f(2 * x), [x, y], functions={"f": jnp.sinc}, cse=cse,
                               dtype="float64")
    data = np.array([[0.3, 2.0], [-1.7, 0.5], [0.0, 1.0], [2.5, -3.0]])
    got = np.asarray(kernel(data))
    expected = np.sinc(data[:, 0]) * data[:, 1] + np.sinc(2 * data[:, 0])
    np.testing.assert_allclose(got, expected, rtol=1e-14, atol=1e-15)


def test_undefined_function_name_never_becomes_code():
    f = sp.Function("__import__")
    kernel = sk.build_function(f(x), [x], functions={"__import__": jnp.cos}, dtype="float64")
    names = {node.id for node in ast.walk(ast.parse(kernel.source)) if isinstance(node, ast.Name)}
    assert "__import__" not in names  # only a string key of `functions`, never a name
    np.testing.assert_allclose(kernel(np.array([0.4])), np.cos(0.4), rtol=1e-15)


@pytest.mark.parametrize("expr", [sp.zoo, sp.Piecewise((x, x > 0), (sp.zoo, True))],
                         ids=["zoo", "zoo_in_a_branch"])
def test_complex_infinity_gives_a_build_error_naming_zoo(expr):
    # SymPy folds e.g. 1/(a - a) or 0**-1 to zoo
    with pytest.raises(sk.BuildError, match="complex infinity \\(zoo"):
        sk.build_function(expr, [x], dtype="float64")


def test_first_kernel_in_a_fresh_process_evaluates():
    """The kernel runs without builtins; the first call into jnp must still work.

    In a fresh interpreter the first jnp function called from the kernel's frame performs
    lazy imports, which look up `__import__` in that frame's (empty) builtins.
    """
    script = textwrap.dedent("""
        import jax
        jax.config.update("jax_enable_x64", True)
        import numpy as np, sympy as sp, symkern as sk
        x = sp.Symbol("x")
        kernel = sk.build_function(sp.sin(x), [x], dtype="float64")
        print(float(kernel(np.array([0.5]))))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert abs(float(run.stdout.split()[-1]) - math.sin(0.5)) < 1e-15


# ---- gradients through Piecewise ----------------------------------------------------------

def _scalar_kernel(expr, cse, params=None):
    return sk.build_function(expr, x, params=params, cse=cse, dtype="float64")


GUARDED = [
    pytest.param(sp.Piecewise((sp.sqrt(x), x > 0), (0, True)), id="sqrt_guarded_by_positive"),
    pytest.param(sp.Piecewise((sp.log(x), x > 0), (0, True)), id="log_guarded_by_positive"),
    pytest.param(sp.Piecewise((1 / x, sp.Ne(x, 0)), (0, True)), id="reciprocal_guarded_by_Ne"),
    pytest.param(sp.Piecewise((x ** sp.Rational(3, 2) + sp.sqrt(x) * sp.log(x), x > 0),
                              (x, True)), id="several_singular_terms_in_one_branch"),
    pytest.param(sp.Piecewise((0, x <= 0), (sp.sqrt(x), True)), id="singular_branch_last"),
    pytest.param(sp.Piecewise((sp.sqrt(x), x > 0)), id="no_True_branch"),
]


@CSE
@pytest.mark.parametrize("expr", GUARDED)
def test_grad_through_untaken_singular_branch_is_exactly_zero(expr, cse):
    kernel = _scalar_kernel(expr, cse)
    grad = jax.grad(lambda v: kernel(v))(-1.0)
    expected = float(sp.diff(expr, x).subs(x, -1))
    if math.isnan(expected):  # the no-True-branch case: the value itself is nan there
        return
    assert float(grad) == expected
    assert not math.isnan(float(grad))


@CSE
@pytest.mark.parametrize("expr", GUARDED)
def test_grad_through_taken_branch_matches_sympy_diff(expr, cse):
    kernel = _scalar_kernel(expr, cse)
    grad = float(jax.grad(lambda v: kernel(v))(4.0))
    expected = reference(sp.diff(expr, x), {x: 4.0})
    assert_close(grad, expected, f"d/dx {expr} at 4")


@CSE
def test_grad_over_a_batch_with_mixed_signs_is_finite_everywhere(cse):
    expr = sp.Piecewise((sp.sqrt(x), x > 0), (0, True)) + sp.Piecewise((sp.log(x), x > 0),
                                                                         (x, True))
    kernel = _scalar_kernel(expr, cse)
    xs = np.array([-2.0, -1.0, 0.0, 0.25, 4.0])
    grads = np.asarray(jax.grad(lambda v: kernel(v).sum())(xs))
    assert np.all(np.isfinite(grads)), grads
    for k, xv in enumerate(xs):
        assert_close(float(grads[k]), reference(sp.diff(expr, x), {x: xv}), f"x={xv}")


def test_grad_is_safe_when_cse_shares_a_singular_subexpression_between_piecewises():
    expr = (sp.Piecewise((sp.sqrt(x), x > 0), (0, True))
            + sp.Piecewise((sp.sqrt(x) + 1, x > 2), (x, True)))
    kernel = _scalar_kernel(expr, cse=True)
    assert float(jax.grad(lambda v: kernel(v))(-1.0)) == 1.0
    assert_close(float(jax.grad(lambda v: kernel(v))(4.0)),
                 reference(sp.diff(expr, x), {x: 4.0}), "at 4")


def test_grad_is_safe_when_the_guarded_subexpression_also_appears_outside():
    # sqrt(x) is both the Piecewise branch and a separate output: CSE would share it
    kernel = sk.build_function([sp.Piecewise((sp.sqrt(x), x > 0), (0, True)), sp.sqrt(x) * 3],
                               x, cse=True, dtype="float64")
    assert float(jax.grad(lambda v: kernel(v)[0])(-1.0)) == 0.0
    assert float(jax.grad(lambda v: kernel(v)[0])(4.0)) == 0.25
    assert float(jax.grad(lambda v: kernel(v)[1])(4.0)) == 0.75


@CSE
def test_grad_is_safe_when_the_guarded_subexpression_also_appears_outside_in_one_equation(cse):
    # sqrt(x) outside the Piecewise too: the taken branch's gradient still matches SymPy
    expr = sp.Piecewise((sp.sqrt(x), x > 0), (0, True)) + sp.sqrt(x) * sp.Rational(1, 2)
    kernel = _scalar_kernel(expr, cse)
    assert_close(float(jax.grad(lambda v: kernel(v))(4.0)),
                 reference(sp.diff(expr, x), {x: 4.0}), "at 4")


@CSE
def test_grad_with_respect_to_parameters_through_piecewise(cse):
    expr = sp.Piecewise((a * sp.sqrt(x) + sp.log(b), x > 0), (b * x, True))
    kernel = _scalar_kernel(expr, cse, params={"a": a, "b": b})
    ps = {"a": 1.5, "b": 2.0}
    for xv in (-1.0, 4.0):
        grads = jax.grad(lambda p, v=xv: kernel(v, p))(ps)
        for sym in (a, b):
            expected = reference(sp.diff(expr, sym), {x: xv, a: ps["a"], b: ps["b"]})
            assert_close(float(grads[str(sym)]), expected, f"d/d{sym} at x={xv}")


@CSE
def test_grad_with_respect_to_a_parameter_in_an_untaken_singular_branch_is_zero(cse):
    expr = sp.Piecewise((sp.sqrt(a) * x, a > 0), (sp.log(b) + x, b > 0), (0, True))
    kernel = _scalar_kernel(expr, cse, params={"a": a, "b": b})
    grads = jax.grad(lambda p: kernel(2.0, p))({"a": -1.0, "b": 4.0})
    assert float(grads["a"]) == 0.0
    assert float(grads["b"]) == 0.25
    grads = jax.grad(lambda p: kernel(2.0, p))({"a": -1.0, "b": -4.0})
    assert float(grads["a"]) == 0.0
    assert float(grads["b"]) == 0.0


# ---- unevaluated sums and products --------------------------------------------------------

_i, _j = sp.symbols("i j", integer=True)


@pytest.mark.parametrize("cse", [True, False], ids=["cse", "nocse"])
def test_sum_and_product_over_integer_bounds_are_written_out(cse):
    expr = (sp.Sum(x**_i / sp.factorial(_i), (_i, 0, 20)) + sp.Product(1 + x / _j, (_j, 1, 3))
            + sp.Sum(sp.Sum(_i * _j * x, (_j, 1, _i)), (_i, 1, 4)))
    kernel = sk.build_function(expr, x, params=None, cse=cse, dtype="float64")
    xs = np.array([-1.5, 0.0, 0.5, 2.0])
    got = np.asarray(kernel(xs))
    for value, xv in zip(got, xs, strict=True):
        assert_close(float(value), reference(expr.doit(), {x: xv}), f"{expr} at {xv}")
    gradient = jax.grad(lambda v: kernel(v))(0.5)
    assert_close(float(gradient), reference(sp.diff(expr.doit(), x), {x: 0.5}), "d/dx at 0.5")


def test_sum_with_a_bound_of_no_known_largest_value_is_refused_with_a_route():
    n = sp.Symbol("n")
    with pytest.raises(sk.UnsupportedFunctionError,
                       match=r"Sum.*no largest value known at build.*Min\(n, 100\).*doit"):
        sk.build_function(sp.Sum(x**_i, (_i, 0, n)), x, params={"n": n}, dtype="float64")


def test_sum_of_too_many_terms_is_refused():
    with pytest.raises(sk.UnsupportedFunctionError, match="more than 10000 terms"):
        sk.build_function(sp.Sum(x**_i, (_i, 0, 10**6)), x, dtype="float64")


def test_integral_stays_refused_with_doit_as_route():
    with pytest.raises(sk.UnsupportedFunctionError, match=r"Integral.*\.doit\(\)"):
        sk.build_function(sp.Integral(sp.exp(-x * _i**2), (_i, 0, 1)), x, dtype="float64")
