"""Every function SymPy's JAX, NumPy and SciPy printers know, and the special functions
symkern writes in JAX (symkern.codegen.special), built and compared with mpmath.

The list of functions is read from the printers' own tables (`known_functions` and their
`_print_<Function>` methods), so a function a new SymPy adds fails
`test_every_printer_function_is_supported_or_refused` until it has a row or a refusal.
Each supported function is evaluated at random points of its domain in float64 and in
float32 against SymPy's evaluation at 30 digits (mpmath), and its derivative in its first
real argument against mpmath's numerical derivative. The default run takes a few points
per function; SYMKERN_SLOW=1 runs many more.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import jax
import mpmath
import numpy as np
import pytest
import sympy as sp
from sympy.codegen import cfunctions, numpy_nodes, scipy_nodes
from sympy.logic.boolalg import BooleanFunction
from sympy.printing.numpy import JaxPrinter, NumPyPrinter, SciPyPrinter

import symkern as sk
from symkern.codegen.callee import REFUSED_SYMPY, SUPPORTED_SYMPY_FUNCTIONS

jax.config.update("jax_enable_x64", True)

x, y, n = sp.symbols("x y n")
SLOW = bool(os.environ.get("SYMKERN_SLOW"))
#: points per function and precision: a bounded profile by default, a sweep when slow
POINTS = 48 if SLOW else 3
GRADIENT_POINTS = 12 if SLOW else 2
RTOL = {"float64": 1e-11, "float32": 2e-4}
ATOL = {"float64": 1e-13, "float32": 1e-5}


def _sympy_class(name: str) -> type | None:
    for module in (sp, cfunctions, numpy_nodes, scipy_nodes):
        found = getattr(module, name, None)
        if isinstance(found, type) and issubclass(found, (sp.Function, BooleanFunction)):
            return found
    return None


def printer_functions() -> list[str]:
    """The SymPy function classes the three printers know, by class name."""
    names: set[str] = set()
    for printer in (JaxPrinter, NumPyPrinter, SciPyPrinter):
        candidates = set(printer().known_functions)
        candidates |= {attribute[len("_print_"):] for attribute in vars(printer)
                       if attribute.startswith("_print_")}
        for candidate in candidates:
            found = _sympy_class(candidate)
            if found is not None:
                names.add(found.__name__)
    return sorted(names)


def test_every_printer_function_is_supported_or_refused():
    missing = [name for name in printer_functions()
               if name not in SUPPORTED_SYMPY_FUNCTIONS and name not in REFUSED_SYMPY]
    assert not missing, f"printer functions neither in CALLEE_TABLE nor REFUSED_SYMPY: {missing}"


def test_printer_functions_are_read_from_the_printers():
    names = printer_functions()
    assert {"sin", "besselj", "fresnels", "isnan", "logaddexp", "LambertW"} <= set(names)
    assert len(names) > 70


# ---- the cases: an expression in x, y, n and where each symbol is drawn --------------------

@dataclass(frozen=True)
class Draw:
    """Where a symbol's values come from: uniform in [low, high], or integers in it."""

    low: float
    high: float
    integer: bool = False

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        if self.integer:
            return rng.integers(int(self.low), int(self.high) + 1, count).astype(np.float64)
        return rng.uniform(self.low, self.high, count)


@dataclass(frozen=True)
class Case:
    build: Callable[[sp.Symbol, sp.Symbol, sp.Symbol], sp.Basic]
    x: Draw = Draw(-3.0, 3.0)
    y: Draw = Draw(0.5, 2.5)
    n: Draw = Draw(0, 6, integer=True)
    #: the derivative in x is checked (not for steps, integer-valued or boolean functions)
    smooth: bool = True
    #: float32 tolerance factor (functions whose float32 condition number is large)
    loose: float = 1.0
    #: the same function as SymPy evaluates it, where SymPy cannot evaluate `build` itself
    reference: Callable[[sp.Symbol, sp.Symbol, sp.Symbol], sp.Basic] | None = None

    def reference_expr(self) -> sp.Basic:
        return (self.reference or self.build)(x, y, n)


def _boolean(condition: sp.Basic) -> sp.Basic:
    return sp.Piecewise((x + 2, condition), (x - 2, True))


POSITIVE = Draw(0.2, 5.0)
UNIT = Draw(-0.95, 0.95)
DEGREE = Draw(0, 9, integer=True)

CASES: dict[str, Case] = {
    "Abs": Case(lambda x, y, n: sp.Abs(x), smooth=False),
    "And": Case(lambda x, y, n: _boolean(sp.And(x > 0, y > 1)), smooth=False),
    "Or": Case(lambda x, y, n: _boolean(sp.Or(x > 0, y > 1)), smooth=False),
    "Not": Case(lambda x, y, n: _boolean(sp.Not(cfunctions.isnan(x))), smooth=False),
    "Xor": Case(lambda x, y, n: _boolean(sp.Xor(x > 0, y > 1)), smooth=False),
    "isinf": Case(lambda x, y, n: _boolean(cfunctions.isinf(x)), smooth=False),
    "isnan": Case(lambda x, y, n: _boolean(cfunctions.isnan(x)), smooth=False),
    "Piecewise": Case(lambda x, y, n: sp.Piecewise((x**2, x < 0.5), (sp.sin(x), True))),
    "Heaviside": Case(lambda x, y, n: sp.Heaviside(x), smooth=False),
    "Max": Case(lambda x, y, n: sp.Max(x, y, 1 - x), smooth=False),
    "Min": Case(lambda x, y, n: sp.Min(x, y, 1 - x), smooth=False),
    "maximum": Case(lambda x, y, n: numpy_nodes.maximum(x, y), smooth=False,
                    reference=lambda x, y, n: sp.Max(x, y)),
    "minimum": Case(lambda x, y, n: numpy_nodes.minimum(x, y), smooth=False,
                    reference=lambda x, y, n: sp.Min(x, y)),
    "Mod": Case(lambda x, y, n: sp.Mod(x, y), smooth=False),
    "frac": Case(lambda x, y, n: sp.frac(x), smooth=False),
    "floor": Case(lambda x, y, n: sp.floor(x), smooth=False),
    "ceiling": Case(lambda x, y, n: sp.ceiling(x), smooth=False),
    "sign": Case(lambda x, y, n: sp.sign(x), smooth=False),
    "Sqrt": Case(lambda x, y, n: cfunctions.Sqrt(x), POSITIVE,
                 reference=lambda x, y, n: sp.sqrt(x)),
    "sqrt": Case(lambda x, y, n: sp.sqrt(x), POSITIVE),
    "cbrt": Case(lambda x, y, n: sp.cbrt(x), POSITIVE),
    "root": Case(lambda x, y, n: sp.root(x, 5), POSITIVE),
    "Pow": Case(lambda x, y, n: x**y, POSITIVE),
    "sin": Case(lambda x, y, n: sp.sin(x)),
    "cos": Case(lambda x, y, n: sp.cos(x)),
    "tan": Case(lambda x, y, n: sp.tan(x), Draw(-1.4, 1.4)),
    "cot": Case(lambda x, y, n: sp.cot(x), Draw(0.2, 2.9)),
    "sec": Case(lambda x, y, n: sp.sec(x), Draw(-1.4, 1.4)),
    "csc": Case(lambda x, y, n: sp.csc(x), Draw(0.2, 2.9)),
    "asin": Case(lambda x, y, n: sp.asin(x), UNIT),
    "acos": Case(lambda x, y, n: sp.acos(x), UNIT),
    "atan": Case(lambda x, y, n: sp.atan(x)),
    "acot": Case(lambda x, y, n: sp.acot(x), POSITIVE),
    "asec": Case(lambda x, y, n: sp.asec(x), Draw(1.2, 5.0)),
    "acsc": Case(lambda x, y, n: sp.acsc(x), Draw(1.2, 5.0)),
    "atan2": Case(lambda x, y, n: sp.atan2(x, y)),
    "sinh": Case(lambda x, y, n: sp.sinh(x)),
    "cosh": Case(lambda x, y, n: sp.cosh(x)),
    "tanh": Case(lambda x, y, n: sp.tanh(x)),
    "coth": Case(lambda x, y, n: sp.coth(x), POSITIVE),
    "sech": Case(lambda x, y, n: sp.sech(x)),
    "csch": Case(lambda x, y, n: sp.csch(x), POSITIVE),
    "asinh": Case(lambda x, y, n: sp.asinh(x)),
    "acosh": Case(lambda x, y, n: sp.acosh(x), Draw(1.2, 5.0)),
    "atanh": Case(lambda x, y, n: sp.atanh(x), UNIT, loose=10),
    "acoth": Case(lambda x, y, n: sp.acoth(x), Draw(1.2, 5.0)),
    "exp": Case(lambda x, y, n: sp.exp(x)),
    "exp2": Case(lambda x, y, n: cfunctions.exp2(x)),
    "expm1": Case(lambda x, y, n: cfunctions.expm1(x)),
    "log": Case(lambda x, y, n: sp.log(x), POSITIVE),
    "log2": Case(lambda x, y, n: cfunctions.log2(x), POSITIVE),
    "log10": Case(lambda x, y, n: cfunctions.log10(x), POSITIVE),
    "log1p": Case(lambda x, y, n: cfunctions.log1p(x), POSITIVE),
    "hypot": Case(lambda x, y, n: cfunctions.hypot(x, y)),
    "logaddexp": Case(lambda x, y, n: numpy_nodes.logaddexp(x, y)),
    "logaddexp2": Case(lambda x, y, n: numpy_nodes.logaddexp2(x, y)),
    "cosm1": Case(lambda x, y, n: scipy_nodes.cosm1(x)),
    "powm1": Case(lambda x, y, n: scipy_nodes.powm1(y, x)),
    "sinc": Case(lambda x, y, n: sp.sinc(x), Draw(0.1, 3.0)),
    "re": Case(lambda x, y, n: sp.re(x)),
    "im": Case(lambda x, y, n: sp.im(x) + x, smooth=False),
    "arg": Case(lambda x, y, n: sp.arg(x), smooth=False),
    "conjugate": Case(lambda x, y, n: sp.conjugate(x)),
    "erf": Case(lambda x, y, n: sp.erf(x)),
    "erf2": Case(lambda x, y, n: sp.erf2(x, y), reference=lambda x, y, n: sp.erf(y) - sp.erf(x)),
    "erfc": Case(lambda x, y, n: sp.erfc(x)),
    "erfinv": Case(lambda x, y, n: sp.erfinv(x), UNIT, loose=10),
    "erfi": Case(lambda x, y, n: sp.erfi(x)),
    "erfcinv": Case(lambda x, y, n: sp.erfcinv(x), Draw(0.05, 1.95), loose=10,
                    reference=lambda x, y, n: sp.erfinv(1 - x)),
    "gamma": Case(lambda x, y, n: sp.gamma(x), Draw(0.2, 6.0)),
    "loggamma": Case(lambda x, y, n: sp.loggamma(x), POSITIVE),
    "beta": Case(lambda x, y, n: sp.beta(x, y), POSITIVE),
    "polygamma": Case(lambda x, y, n: sp.polygamma(n, x), POSITIVE, n=Draw(0, 3, integer=True)),
    "digamma": Case(lambda x, y, n: sp.digamma(x), POSITIVE),
    "factorial": Case(lambda x, y, n: sp.factorial(x), Draw(0.2, 6.0)),
    "factorial2": Case(lambda x, y, n: sp.factorial2(n), n=Draw(0, 12, integer=True),
                       smooth=False),
    "RisingFactorial": Case(lambda x, y, n: sp.RisingFactorial(x, n), POSITIVE),
    "FallingFactorial": Case(lambda x, y, n: sp.FallingFactorial(x, n), Draw(6.5, 9.0)),
    "binomial": Case(lambda x, y, n: sp.binomial(x, n), Draw(0.5, 9.0)),
    "uppergamma": Case(lambda x, y, n: sp.uppergamma(y, x), POSITIVE),
    "lowergamma": Case(lambda x, y, n: sp.lowergamma(y, x), POSITIVE),
    "betainc": Case(lambda x, y, n: sp.betainc(y, 1 + y / 2, x / 4, sp.Rational(9, 10)),
                    Draw(0.05, 3.5)),
    "betainc_regularized": Case(lambda x, y, n: sp.betainc_regularized(
        y, 1 + y / 2, x / 4, sp.Rational(9, 10)), Draw(0.05, 3.5)),
    "Ei": Case(lambda x, y, n: sp.Ei(x), POSITIVE),
    "expint": Case(lambda x, y, n: sp.expint(n, x), POSITIVE),
    "E1": Case(lambda x, y, n: sp.E1(x), POSITIVE),
    "Si": Case(lambda x, y, n: sp.Si(x), Draw(-8, 8)),
    "Ci": Case(lambda x, y, n: sp.Ci(x), Draw(0.2, 8)),
    "Shi": Case(lambda x, y, n: sp.Shi(x), Draw(-4, 4)),
    "Chi": Case(lambda x, y, n: sp.Chi(x), Draw(0.2, 4)),
    "li": Case(lambda x, y, n: sp.li(x), Draw(1.5, 9)),
    "Li": Case(lambda x, y, n: sp.Li(x), Draw(2.5, 9)),
    "fresnels": Case(lambda x, y, n: sp.fresnels(x), loose=10),
    "fresnelc": Case(lambda x, y, n: sp.fresnelc(x), loose=10),
    "zeta": Case(lambda x, y, n: sp.zeta(x), Draw(-6, 6), loose=20),
    "harmonic": Case(lambda x, y, n: sp.harmonic(x) + sp.harmonic(x, y + 1), POSITIVE),
    "bernoulli": Case(lambda x, y, n: sp.bernoulli(n), n=Draw(0, 14, integer=True),
                      smooth=False, loose=10),
    "LambertW": Case(lambda x, y, n: sp.LambertW(x), Draw(-0.3, 6)),
    "elliptic_k": Case(lambda x, y, n: sp.elliptic_k(x), Draw(-3, 0.95)),
    "elliptic_e": Case(lambda x, y, n: sp.elliptic_e(x), Draw(-3, 0.95)),
    "besselj": Case(lambda x, y, n: sp.besselj(n, x), Draw(-12, 12), loose=10),
    "besseli": Case(lambda x, y, n: sp.besseli(n, x), Draw(-12, 12)),
    "besselk": Case(lambda x, y, n: sp.besselk(y + n, x), Draw(0.05, 12)),
    "legendre": Case(lambda x, y, n: sp.legendre(n, x), UNIT, n=DEGREE, loose=10),
    "assoc_legendre": Case(lambda x, y, n: sp.assoc_legendre(n + 2, 2, x), UNIT, n=DEGREE,
                           loose=10),
    "chebyshevt": Case(lambda x, y, n: sp.chebyshevt(n, x), UNIT, n=DEGREE, loose=10),
    "chebyshevu": Case(lambda x, y, n: sp.chebyshevu(n, x), UNIT, n=DEGREE, loose=10),
    "hermite": Case(lambda x, y, n: sp.hermite(n, x), n=DEGREE, loose=10),
    "laguerre": Case(lambda x, y, n: sp.laguerre(n, x), POSITIVE, n=DEGREE, loose=10),
    "assoc_laguerre": Case(lambda x, y, n: sp.assoc_laguerre(n, y, x), POSITIVE, n=DEGREE,
                           loose=10),
    "gegenbauer": Case(lambda x, y, n: sp.gegenbauer(n, y, x), UNIT, n=DEGREE, loose=10),
    "jacobi": Case(lambda x, y, n: sp.jacobi(n, y, y / 2 + sp.Rational(1, 3), x), UNIT,
                   n=DEGREE, loose=10),
}

#: the functions whose float32 values are checked by default: those whose kernel calls
#: symkern.codegen.special (tested: test_float32_default_covers_symkern_implementations)
FLOAT32_BY_DEFAULT = frozenset({
    "Chi", "Ci", "E1", "LambertW", "Li", "Shi", "Si", "assoc_laguerre", "assoc_legendre",
    "bernoulli", "besseli", "besselj", "besselk", "betainc", "betainc_regularized",
    "binomial", "chebyshevt", "chebyshevu", "cosm1", "elliptic_e", "elliptic_k", "erfcinv",
    "erfi", "expint", "factorial", "fresnelc", "fresnels", "gegenbauer", "harmonic",
    "hermite", "jacobi", "laguerre", "legendre", "li", "lowergamma", "polygamma", "powm1",
    "uppergamma", "zeta", "digamma",
})

#: functions the issue names beyond the printers' tables
EXTRA = ("FallingFactorial", "binomial", "expint", "E1", "li", "Li", "Shi", "Chi", "zeta",
         "elliptic_k", "elliptic_e", "erfi", "erfcinv", "harmonic", "Heaviside", "Xor")


def test_every_supported_printer_function_has_a_case():
    names = [name for name in printer_functions() if name in SUPPORTED_SYMPY_FUNCTIONS]
    missing = [name for name in names + list(EXTRA) if name not in CASES]
    assert not missing, f"no case in CASES for {missing}"


def _draws(case: Case, rng: np.random.Generator, count: int) -> np.ndarray:
    return np.stack([case.x.sample(rng, count), case.y.sample(rng, count),
                     case.n.sample(rng, count)], axis=-1)


def _exact(value: float) -> sp.Basic:
    """A float's exact value as SymPy evaluates it numerically: an Integer where it is one,
    else a 30-digit Float (exact for a float64; an exact Rational would send SymPy into
    exact arithmetic on 2^52 denominators, x**y among them, for minutes)."""
    value = float(value)
    return sp.Integer(int(value)) if value.is_integer() else sp.Float(value, 30)


def _reference(expr: sp.Basic, sample: np.ndarray) -> float:
    values = {symbol: _exact(v) for symbol, v in zip((x, y, n), sample, strict=True)}
    result = sp.N(expr.xreplace(values), 30)
    if result.has(sp.nan, sp.zoo) or not result.is_number:
        return math.nan
    value = complex(result)
    return value.real if abs(value.imag) <= 1e-25 * max(1.0, abs(value.real)) else math.nan


def _check_values(name: str, dtype: str, seed: int) -> None:
    case = CASES[name]
    expr, reference = case.build(x, y, n), case.reference_expr()
    rng = np.random.default_rng(seed)
    samples = _draws(case, rng, POINTS)
    if dtype == "float32":  # the reference sees the float32 inputs the kernel sees
        samples = samples.astype(np.float32).astype(np.float64)
    kernel = sk.build_function(expr, [x, y, n], dtype=dtype)
    got = np.asarray(kernel(samples.astype(dtype)), dtype=np.float64)
    assert got.shape == (POINTS,)
    factor = case.loose if dtype == "float32" else 1.0
    for sample, value in zip(samples, got, strict=True):
        want = _reference(reference, sample)
        where = f"{name} = {expr} at (x, y, n) = {tuple(sample)} in {dtype}"
        if math.isnan(want):
            continue  # outside the real domain at this point
        tolerance = factor * (RTOL[dtype] * abs(want) + ATOL[dtype])
        assert abs(value - want) <= tolerance, f"{where}: got {value!r}, expected {want!r}"


def test_float32_default_covers_symkern_implementations():
    written = {name for name in CASES if _written_in_jax_by_symkern(name)}
    assert written == FLOAT32_BY_DEFAULT


@pytest.mark.parametrize("name", sorted(CASES))
def test_function_matches_mpmath_in_float64(name):
    _check_values(name, "float64", seed=sorted(CASES).index(name))


def _written_in_jax_by_symkern(name: str) -> bool:
    """Whether `name`'s kernel code calls symkern.codegen.special (float32 checked by
    default; JAX's own functions' float32 in the slow run)."""
    expr = CASES[name].build(x, y, n)
    return "special." in sk.build_function(expr, [x, y, n], dtype="float64").source


@pytest.mark.parametrize("name", [
    name if name in FLOAT32_BY_DEFAULT else pytest.param(name, marks=pytest.mark.slow)
    for name in sorted(CASES)])
def test_function_matches_mpmath_in_float32(name):
    _check_values(name, "float32", seed=1000 + sorted(CASES).index(name))


SMOOTH = sorted(name for name, case in CASES.items() if case.smooth)
#: derivatives checked by default: symkern's own implementations (JAX's are JAX's); the
#: slow run checks every smooth function
DEFAULT_DERIVATIVES = ("LambertW", "elliptic_k", "elliptic_e", "legendre", "jacobi",
                       "besselk", "expint", "polygamma", "betainc")


@pytest.mark.parametrize("name", [
    name if name in DEFAULT_DERIVATIVES else pytest.param(name, marks=pytest.mark.slow)
    for name in SMOOTH])
def test_derivative_matches_mpmath(name):
    case = CASES[name]
    expr, reference = case.build(x, y, n), case.reference_expr()
    # x a data argument of its own: the others' tangents stay symbolic zeros (JAX's
    # betainc has no derivative in a and b)
    kernel = sk.build_function(expr, x, [y, n], dtype="float64")
    rng = np.random.default_rng(2000 + SMOOTH.index(name))
    samples = _draws(case, rng, GRADIENT_POINTS)
    along_x = jax.grad(kernel)
    gradients = np.asarray(jax.vmap(along_x)(samples[:, 0], samples[:, 1:]))
    derivative = sp.diff(reference, x)
    for sample, gradient in zip(samples, gradients, strict=True):
        try:
            want = (math.nan if derivative.has(sp.Derivative, sp.Subs)
                    else _reference(derivative, sample))
        except ValueError:  # SymPy's derivative formula fails at this degree
            want = math.nan
        if math.isnan(want):  # mpmath's numerical derivative instead
            want = _numerical_derivative(reference, sample)
        assert abs(gradient - want) <= 1e-8 * abs(want) + 1e-10, (
            f"d/dx {expr} at {tuple(sample)}: got {gradient!r}, expected {want!r}")


def _numerical_derivative(expr: sp.Basic, sample: np.ndarray) -> float:
    rest = {y: _exact(sample[1]), n: _exact(sample[2])}

    def along_x(t: mpmath.mpf) -> mpmath.mpf:
        return mpmath.mpf(str(sp.N(expr.xreplace({x: sp.Float(str(t), 50), **rest}), 50)))

    with mpmath.workdps(50):
        return float(mpmath.diff(along_x, mpmath.mpf(float(sample[0])), h=mpmath.mpf("1e-15")))


@pytest.mark.parametrize("name", sorted(REFUSED_SYMPY))
def test_refused_function_is_a_build_error_naming_it_and_a_route(name):
    found = _sympy_class(name)
    if found is None:
        pytest.skip(f"{name} is not a SymPy class in this version")
    arity = 1
    try:
        arity = min(found.nargs) if found.nargs.is_finite_set else 1
    except (TypeError, ValueError):
        pass
    arguments = [x, y, n, sp.Symbol("z")][:max(arity, 1)]
    try:
        expr = found(*arguments)
    except (TypeError, ValueError):
        pytest.skip(f"{name} takes no arguments of that shape")
    if not expr.has(found):
        pytest.skip(f"{name}{tuple(arguments)} evaluates to {expr}")
    with pytest.raises(sk.UnsupportedFunctionError, match=name) as error:
        sk.build_function(expr, [x, y, n, sp.Symbol("z")], dtype="float64")
    assert re.search(r"functions=|\bwrite\b|\buse\b|\btry\b", str(error.value)), error.value
