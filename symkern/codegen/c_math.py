"""codegen: the C loop's exp, log, tanh, atan, sin, cos and pow as inline C++ the compiler vectorizes.

Imports mpmath, numpy, sympy and symkern.codegen.trig. A call of the C library's exp inside
the C loop's `#pragma omp simd` block (symkern.codegen.c_loop) is a call per sample: the
compiler cannot vectorize it, so it keeps the whole block scalar. Each function here is
instead a few lines of arithmetic, selects and 64-bit integer operations, which the compiler
vectorizes with the rest of the block, and a condition (`sk_F_within`) on the argument:

- **within the condition**, `sk_F_core`, the inline form:
  - exp (|x| <= 708): fdlibm's e_exp.c — x = k ln2 + r with ln2 in two parts (k ln2_hi exact),
    its Remez polynomial in r^2 and `1 - ((lo - r c / (2 - c)) - hi)`, times 2^k built from
    its bits (the biased exponent is the low bits of k + 1.5 * 2^52's significand);
  - log (positive, normal, finite): fdlibm's e_log.c — x = 2^k m, sqrt(2)/2 <= m < sqrt(2),
    taken apart from its bits, log(1 + f) from s = f / (2 + f) and its Remez polynomial;
  - tanh (not NaN): tanh's Taylor series (18 terms, Bernoulli numbers) for |x| < 0.5,
    `1 - 2 / (exp(2|x|) + 1)` above it with |x| taken at most `TANH_SATURATES` (where it is 1),
    with the sign of x;
  - atan (not NaN; at infinity pi/2, from 1/|x| = 0): 1/|x| above 1 (pi/2 minus),
    (t - 1)/(t + 1) above tan(pi/8) (pi/4 plus), then atan's Taylor series to u^43
    (|u| <= tan(pi/8));
  - sin and cos (|x| <= the dtype's `fast_up_to`): symkern.codegen.trig's reduction and
    Cephes' polynomials, as in the XLA program;
  - pow(x, y) (x positive and normal, |y log x| <= `POW_INLINE_UP_TO`: 1 in float64, where
    exp amplifies the error of y log x by |y log x|, 2.0 ulps at worst on 2 * 10^4 points;
    708 in float32): exp(y log x) of the forms above;
- **outside it** (larger, infinite, NaN, ...): the C library's function (`sk_F`).

float32 loops compute exp, log, tanh and atan in float64 and round the result (one
implementation, well within float32's half ulp plus the rounding); sin and cos keep
trig's float32 polynomial. Every operation is IEEE arithmetic with FMA contraction off
(symkern.kernels.c_loop.FLAGS), so a vectorized lane and the sample-by-sample loop give an
argument the same bits. tests/batching/test_c_loop.py measures each against mpmath in ulps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mpmath
import numpy as np
import sympy as sp

from symkern.codegen.trig import REDUCTIONS, Reduction

#: the C type of each dtype the loop computes in
C_TYPES = {"float32": "float", "float64": "double"}
#: the attributes the inline forms are declared with (`inline_source` needs them before it)
ATTRIBUTES = """// the inline forms are inlined wherever a block calls them, however often: the compiler's
// own limits leave a long body's calls out of line, and a call keeps its block from being
// vectorized (a network's 32 tanh calls ran 3.2x slower); the sample-by-sample loop calls
// one copy of each function (SK_CALLED), which keeps a large body's compile shorter
#define SK_INLINE static inline __attribute__((always_inline))
#define SK_CALLED static __attribute__((noinline))
"""


def _hex(value: float) -> str:
    """An exact C literal of `value` as a double (hexadecimal)."""
    return float(value).hex()


def _literal(value: float, dtype: str) -> str:
    """An exact C literal of `value` in `dtype` (hexadecimal, `f` suffix for float)."""
    return f"{_hex(value)}f" if dtype == "float32" else _hex(value)


def _horner(coefficients: Sequence[float], variable: str,
            literal: Callable[[float], str] = _hex) -> str:
    """c0 + v (c1 + v (c2 + ...)) for `coefficients` lowest power first."""
    value = literal(coefficients[-1])
    for c in reversed(coefficients[:-1]):
        value = f"{literal(c)} + {variable} * ({value})"
    return value


def _trig_source(reduction: Reduction, dtype: str) -> str:
    """`sk_turned`: symkern.codegen.trig's polynomial, sin(x + quarter_turns pi/2) for |x|
    within its range."""
    c_type = C_TYPES[dtype]
    literal = lambda v: _literal(v, dtype)  # noqa: E731
    parts = "\n".join(f"  r = r - k * {literal(part)};" for part in reduction.pi_over_two_parts)
    sine = _horner(reduction.sine[::-1], "z", literal)
    cosine = _horner(reduction.cosine[::-1], "z", literal)

    return f"""// sin(x + quarter_turns * pi/2) for |x| <= {float(reduction.fast_up_to):g}: Cody-Waite by pi/2
// in {len(reduction.pi_over_two_parts)} parts, Cephes' minimax polynomials (symkern.codegen.trig)
SK_INLINE {c_type} sk_turned({c_type} x, int quarter_turns) {{
  const {c_type} k = __builtin_rint(x * {literal(np.dtype(dtype).type(2 / np.pi))});
  {c_type} r = x;
{parts}
  r = (k == 0) ? x : r;
  const {c_type} z = r * r;
  {c_type} s = r + r * z * ({sine});
  s = (r == 0) ? r : s;
  const {c_type} c = {literal(1)} - {literal(0.5)} * z + z * z * ({cosine});
  const int quadrant = ((int)k + quarter_turns) & 3;
  const {c_type} v = (quadrant & 1) == 0 ? s : c;
  return quadrant >= 2 ? -v : v;
}}
"""


#: tanh x = x + x z (c1 + z (c2 + ...)), z = x^2: 2^(2n) (2^(2n) - 1) B_2n / (2n)! for
#: x^(2n-1), n = 2..19; at |x| = 0.5 the first term left out is below 2^-56 of tanh x
_TANH_SERIES = [float(sp.Integer(2) ** (2 * n) * (2 ** (2 * n) - 1) * sp.bernoulli(2 * n)
                      / sp.factorial(2 * n)) for n in range(2, 20)]
#: tanh x rounds to 1 in float64 from |x| = 55 ln 2 / 2 = 19.06 on (1 - tanh x < 2^-54, half an
#: ulp below 1), and 1 - 2 / (exp(2 * 20) + 1) is 1: the inline tanh takes |x| at most this,
#: so it gives 1 with the sign of x however large x is (infinite too), as the C library does,
#: and a saturated tanh (a network's, a squashed large value) keeps its block vectorized
TANH_SATURATES = 20.0
#: atan u = u + u z (-1/3 + z (1/5 - ...)), z = u^2, up to u^43: at |u| = tan(pi/8) the first
#: term left out is below 2^-57 of atan u
_ATAN_SERIES = [(-1) ** k / (2 * k + 1) for k in range(1, 22)]


def _split(value: mpmath.mpf) -> tuple[float, float]:
    """`value` as a float64 and the float64 nearest what it leaves out."""
    high = float(value)
    return high, float(value - mpmath.mpf(high))


with mpmath.workdps(50):
    _PI_2 = _split(mpmath.pi / 2)
    _PI_4 = _split(mpmath.pi / 4)
    _TAN_PI_8 = float(mpmath.tan(mpmath.pi / 8))
    _SQRT2 = float(mpmath.sqrt(2))

#: the float64 forms, in the order they may use each other
_F64 = {
    "bits": """// a double's bits as an unsigned integer and back (register moves once vectorized)
SK_INLINE uint64_t sk_bits(double x) { uint64_t b; __builtin_memcpy(&b, &x, 8); return b; }
SK_INLINE double sk_from_bits(uint64_t b) { double x; __builtin_memcpy(&x, &b, 8); return x; }
""",
    "exp": f"""// exp(x) for |x| <= 708: fdlibm's e_exp.c, 2^k from its bits
SK_INLINE double sk_exp_f64(double x) {{
  const double k = __builtin_rint(x * {_hex(1.44269504088896338700e+00)});
  const double hi = x - k * {_hex(6.93147180369123816490e-01)};
  const double lo = k * {_hex(1.90821492927058770002e-10)};
  const double r = hi - lo;
  const double t = r * r;
  const double c = r - t * ({_horner([1.66666666666666019037e-01, -2.77777777770155933842e-03,
                                      6.61375632143793436117e-05, -1.65339022054652515390e-06,
                                      4.13813679705723846039e-08], "t")});
  const double y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi);
  return y * sk_from_bits(sk_bits(k + {_hex(2.0 ** 52 + 2.0 ** 51 + 1023)}) << 52);
}}
""",
    "log": f"""// log(x) for a positive normal finite x: fdlibm's e_log.c, x taken apart from its bits
SK_INLINE double sk_log_f64(double x) {{
  const uint64_t bits = sk_bits(x);
  double m = sk_from_bits((bits & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL);
  double k = sk_from_bits((bits >> 52) | 0x4330000000000000ULL) - {_hex(2.0 ** 52 + 1023)};
  const bool high = m > {_hex(_SQRT2)};
  m = high ? 0.5 * m : m;
  k = high ? k + 1.0 : k;
  const double f = m - 1.0;
  const double hfsq = 0.5 * f * f;
  const double s = f / (2.0 + f);
  const double z = s * s;
  const double w = z * z;
  const double R = z * ({_horner([6.666666666666735130e-01, 2.857142874366239149e-01,
                                   1.818357216161805012e-01, 1.479819860511658591e-01], "w")})
                 + w * ({_horner([3.999999999940941908e-01, 2.222219843214978396e-01,
                                   1.531383769920937332e-01], "w")});
  return k * {_hex(6.93147180369123816490e-01)}
         - ((hfsq - (s * (hfsq + R) + k * {_hex(1.90821492927058770002e-10)})) - f);
}}
""",
    "tanh": f"""// tanh(x) for x not NaN: its Taylor series below |x| = 0.5, 1 - 2 / (exp(2|x|) + 1) above,
// |x| taken at most {TANH_SATURATES:g}, where that is 1, as tanh is; of |x|, with the sign of x
// (-0 too: -0 + -0 z c1 would be +0)
SK_INLINE double sk_tanh_f64(double x) {{
  const double a = std::fabs(x);
  const double z = a * a;
  const double series = a + a * z * ({_horner(_TANH_SERIES, "z")});
  const double b = a > {_hex(TANH_SATURATES)} ? {_hex(TANH_SATURATES)} : a;
  const double far = 1.0 - 2.0 / (sk_exp_f64(2.0 * b) + 1.0);
  return std::copysign(a < 0.5 ? series : far, x);
}}
""",
    "pow": """// pow(x, y) = exp(y log x) for a positive normal x and |y log x| within the condition
SK_INLINE double sk_pow_f64(double x, double y) { return sk_exp_f64(y * sk_log_f64(x)); }
""",
    "atan": f"""// atan(x) for x not NaN (infinite: 1/|x| is 0): 1/|x| above 1, (t - 1)/(t + 1) above
// tan(pi/8), Taylor series
SK_INLINE double sk_atan_f64(double x) {{
  const double a = std::fabs(x);
  const bool inverted = a > 1.0;
  const double t = inverted ? 1.0 / a : a;
  const bool shifted = t > {_hex(_TAN_PI_8)};
  const double u = shifted ? (t - 1.0) / (t + 1.0) : t;
  const double z = u * u;
  const double p = u + u * z * ({_horner(_ATAN_SERIES, "z")});
  const double q = shifted ? {_hex(_PI_4[0])} + (p + {_hex(_PI_4[1])}) : p;
  const double r = inverted ? {_hex(_PI_2[0])} - (q - {_hex(_PI_2[1])}) : q;
  return std::copysign(r, x);
}}
""",
}
#: the float64 forms each function's form uses
_NEEDS = {"exp": ("bits", "exp"), "log": ("bits", "log"), "tanh": ("bits", "exp", "tanh"),
          "atan": ("atan",), "pow": ("bits", "exp", "log", "pow")}
#: the largest |y log x| at which pow(x, y) is computed inline as exp(y log x), by dtype: the
#: error of y log x is amplified by |y log x| in exp's value, so float64 takes it up to 1
#: (within 2.5 ulps of pow, as tanh and atan are), float32, computed in float64 and rounded,
#: wherever exp is (its own half ulp at most)
POW_INLINE_UP_TO = {"float64": 1.0, "float32": 708.0}


@dataclass(frozen=True)
class Inline:
    """One function the loop computes inline within a condition on its arguments."""

    #: the C library's name (float64; float32 adds `f`), and the inline forms' (`sk_pow`)
    library: str
    #: the condition on the arguments (named `arguments`), in the loop's dtype
    within: Callable[..., str]
    #: the inline form of arguments within it
    core: Callable[..., str]
    arguments: tuple[str, ...] = ("x",)


def _max(dtype: str) -> str:
    return _literal(float(np.finfo(dtype).max), dtype)


def _table(dtype: str) -> dict[type, Inline]:
    c_type = C_TYPES[dtype]
    literal = lambda v: _literal(v, dtype)  # noqa: E731
    fast = literal(REDUCTIONS[np.dtype(dtype)].fast_up_to)

    def through_f64(name: str) -> Callable[..., str]:
        if dtype == "float64":
            return lambda *xs: f"sk_{name}_f64({', '.join(xs)})"
        return lambda *xs: f"({c_type})sk_{name}_f64({', '.join(f'(double){x}' for x in xs)})"

    smallest = "0x1p-1022" if dtype == "float64" else "0.0f"
    # `&`, not `&&`: a branch in a block keeps g++ from vectorizing it (the whole block ran
    # one sample at a time wherever log was called)
    positive = (f"({{x}} >= {smallest}) & ({{x}} <= {_max(dtype)})" if dtype == "float64"
                else f"({{x}} > {smallest}) & ({{x}} <= {_max(dtype)})")
    return {
        sp.sin: Inline("sin", lambda x: f"std::fabs({x}) <= {fast}", lambda x: f"sk_turned({x}, 0)"),
        sp.cos: Inline("cos", lambda x: f"std::fabs({x}) <= {fast}", lambda x: f"sk_turned({x}, 1)"),
        sp.exp: Inline("exp", lambda x: f"std::fabs({x}) <= {literal(708)}", through_f64("exp")),
        sp.log: Inline("log", lambda x: positive.format(x=x), through_f64("log")),
        sp.tanh: Inline("tanh", lambda x: f"{x} == {x}", through_f64("tanh")),
        sp.atan: Inline("atan", lambda x: f"{x} == {x}", through_f64("atan")),
        # pow, for the powers symkern.codegen.c_loop does not write as products and roots
        sp.Pow: Inline("pow", lambda x, y: f"{positive.format(x=x)} & (std::fabs((double){y} * "
                                           f"sk_log_f64((double){x})) <= {_hex(POW_INLINE_UP_TO[dtype])})",
                       through_f64("pow"), ("x", "y")),
    }


#: the functions the loop computes inline (the others are the C library's calls); pow is
#: inline too, for the powers symkern.codegen.c_loop.calls_pow picks (`sp.Pow` in `used`)
INLINE_FUNCTIONS = tuple(f for f in _table("float64") if f is not sp.Pow)


def inline_source(used: set[type], dtype: str) -> str:
    """The C++ of `sk_F_within`, `sk_F_core` and `sk_F` for each function of `used` (some of
    `INLINE_FUNCTIONS`, and `sp.Pow` for pow), after the float64 forms and `sk_turned` they
    call; it goes after `ATTRIBUTES`."""
    c_type = C_TYPES[dtype]
    suffix = "f" if dtype == "float32" else ""
    table = _table(dtype)
    inlines = [table[f] for f in (*INLINE_FUNCTIONS, sp.Pow) if f in used]
    names = [inline.library for inline in inlines]
    parts = list(dict.fromkeys(part for name in names for part in _NEEDS.get(name, ())))
    lines = [_F64[part] for part in parts]
    if {"sin", "cos"} & set(names):
        lines.append(_trig_source(REDUCTIONS[np.dtype(dtype)], dtype))
    for inline in inlines:
        name, xs = inline.library, inline.arguments
        declared, passed = ", ".join(f"{c_type} {x}" for x in xs), ", ".join(xs)
        lines.append(
            f"SK_INLINE bool sk_{name}_within({declared}) {{ return {inline.within(*xs)}; }}\n"
            f"SK_INLINE {c_type} sk_{name}_core({declared}) {{ return {inline.core(*xs)}; }}\n"
            f"SK_CALLED {c_type} sk_{name}({declared}) {{\n"
            f"  return sk_{name}_within({passed}) ? sk_{name}_core({passed}) : "
            f"{name}{suffix}({passed});\n}}\n")
    return "\n".join(lines)


__all__ = ["ATTRIBUTES", "C_TYPES", "INLINE_FUNCTIONS", "POW_INLINE_UP_TO", "TANH_SATURATES", "Inline",
           "inline_source"]
