"""codegen, kernel namespace: SymPy's special functions that JAX has no function for, in JAX.

Imports jax, numpy and symkern.errors. Generated code reaches them as `special.<name>` (CALLEE_TABLE).
Each function takes arrays of any broadcastable shapes (a batch of samples, or one value)
and is elementwise. Accuracy and domain, as tested against mpmath at 30 digits
(tests/codegen/test_special.py) on random points of the domain named:

- within 1e-12 relative (float64) and 1e-5 (float32): the gamma family (factorial,
  binomial, uppergamma/lowergamma for s > 0, betainc), the exponential and trigonometric
  integrals (li, Li, Shi, Chi, expint for integer order, Si, Ci through jax.scipy's sici),
  erfi, erfcinv, cosm1, powm1, polygamma with a data order, zeta (Riemann, every real s
  but 1; Hurwitz for s > 1, a > 0), harmonic, bernoulli numbers, LambertW (branches 0
  and -1), elliptic_k and elliptic_e (m < 1), the orthogonal polynomials with a data
  degree (a three-term recurrence up to the largest degree in the batch), besselj and
  besseli of integer order (|x| + |n| < 100), besselk of real order for x > 0.
- outside a function's domain (a non-integer degree, m >= 1 for elliptic_k) the value
  is nan, never a wrong number.

Gradients: JAX differentiates the closed forms and quadratures directly; LambertW,
elliptic_k and elliptic_e carry their derivative formulas (custom_jvp); the recurrences
(orthogonal polynomials) carry a custom_jvp whose derivative with respect to each real
argument is a forward-mode derivative of the recurrence, so `jax.grad` works through them
(to first order; their degree is an integer, with derivative zero).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
from jax import lax

from symkern.errors import UnsupportedFunctionError

Array = Any

#: Euler-Mascheroni constant
EULER_GAMMA = 0.57721566490153286060651209008240243
#: nodes of the periodic trapezoidal rules of besselj and besseli: the rule's error falls
#: like J_{2N-n}(x), below float64 resolution while |x| + n < N (tested up to 60)
BESSEL_NODES = 128
#: nodes of besselk's trapezoidal rule over [0, T] (error about exp(-pi^2 N / T))
BESSELK_NODES = 160


def _float(*values: Array) -> tuple[Array, ...]:
    dtype = jnp.result_type(float, *values)
    return tuple(jnp.asarray(v, dtype) for v in values)


def _is_integer(n: Array) -> Array:
    return jnp.isfinite(n) & (n == jnp.round(n))


# ---- gamma family -------------------------------------------------------------------------

def factorial(x: Array) -> Array:
    """SymPy's factorial(x) = gamma(x + 1) (also for non-integer x)."""
    (x,) = _float(x)
    return jsp.gamma(x + 1)


def binomial(n: Array, k: Array) -> Array:
    """SymPy's binomial(n, k): gamma ratios, 0 where k > n >= 0, and
    (-1)^k binomial(k - n - 1, k) for a negative integer n."""
    n, k = _float(n, k)
    negative = _is_integer(n) & (n < 0) & _is_integer(k) & (k >= 0)
    m = jnp.where(negative, k - n - 1, n)
    value = jnp.exp(jsp.gammaln(m + 1) - jsp.gammaln(k + 1) - jsp.gammaln(m - k + 1))
    sign = jsp.gammasgn(m + 1) * jsp.gammasgn(k + 1) * jsp.gammasgn(m - k + 1)
    value = jnp.where(_is_integer(m - k) & (m - k < 0) & _is_integer(m) & (m >= 0), 0.0,
                      sign * value)
    return jnp.where(negative, jnp.where(jnp.mod(k, 2) == 1, -value, value), value)


def uppergamma(s: Array, x: Array) -> Array:
    """Upper incomplete gamma Γ(s, x) = Γ(s) Q(s, x), for s > 0, x >= 0."""
    s, x = _float(s, x)
    return jnp.where(s > 0, jsp.gamma(s) * jsp.gammaincc(jnp.where(s > 0, s, 1.0), x), jnp.nan)


def lowergamma(s: Array, x: Array) -> Array:
    """Lower incomplete gamma γ(s, x) = Γ(s) P(s, x), for s > 0, x >= 0."""
    s, x = _float(s, x)
    return jnp.where(s > 0, jsp.gamma(s) * jsp.gammainc(jnp.where(s > 0, s, 1.0), x), jnp.nan)


@jax.custom_jvp
def _regularized_beta(a: Array, b: Array, x: Array) -> Array:
    return jsp.betainc(a, b, x)


@_regularized_beta.defjvp
def _regularized_beta_jvp(primals: tuple, tangents: tuple) -> tuple:
    # JAX has no derivative in a and b: nan where their tangent is not zero (a zero
    # tangent, as lax.cond and broadcasting make for arguments not differentiated, is 0)
    (a, b, x), (da, db, dx) = primals, tangents
    density = jnp.exp((a - 1) * jnp.log(x) + (b - 1) * jnp.log1p(-x) - jsp.betaln(a, b))
    unknown = jnp.where((da == 0) & (db == 0), 0.0, jnp.nan)
    return _regularized_beta(a, b, x), density * dx + unknown


def betainc_regularized(a: Array, b: Array, x1: Array, x2: Array) -> Array:
    """SymPy's betainc_regularized(a, b, x1, x2) = I_x2(a, b) - I_x1(a, b), 0 <= x <= 1;
    differentiable in x1 and x2 (nan in a and b: JAX has no derivative there)."""
    a, b, x1, x2 = _float(a, b, x1, x2)
    a, b, x1, x2 = jnp.broadcast_arrays(a, b, x1, x2)
    return _regularized_beta(a, b, x2) - _regularized_beta(a, b, x1)


def betainc(a: Array, b: Array, x1: Array, x2: Array) -> Array:
    """SymPy's betainc(a, b, x1, x2) = ∫_x1^x2 t^(a-1) (1-t)^(b-1) dt, for a, b > 0."""
    a, b, x1, x2 = _float(a, b, x1, x2)
    return jnp.exp(jsp.betaln(a, b)) * betainc_regularized(a, b, x1, x2)


def polygamma(n: Array, x: Array) -> Array:
    """polygamma(n, x) for an order n given as data (a float): nan unless n is an integer >= 0."""
    if isinstance(n, int):
        return jsp.polygamma(n, x)
    (n,) = _float(n)
    valid = _is_integer(n) & (n >= 0)
    order = jnp.where(valid, n, 0).astype(jnp.int32)
    order, x = jnp.broadcast_arrays(order, jnp.asarray(x, n.dtype))
    return jnp.where(valid, jsp.polygamma(order, x), jnp.nan)


def harmonic(n: Array, m: Array | None = None) -> Array:
    """SymPy's harmonic(n) = digamma(n + 1) + γ; harmonic(n, m) = zeta(m) - zeta(m, n + 1)
    for m > 1 (m = 1: harmonic(n))."""
    (n,) = _float(n)
    first = jsp.digamma(n + 1) + EULER_GAMMA
    if m is None:
        return first
    n, m = _float(n, m)
    safe = jnp.where(m > 1, m, 2.0)
    general = jsp.zeta(safe, 1.0) - jsp.zeta(safe, n + 1)
    return jnp.where(m == 1, first, jnp.where(m > 1, general, jnp.nan))


# ---- zeta and Bernoulli numbers -----------------------------------------------------------

#: Borwein's coefficients for the alternating (eta) series of zeta, 0 <= s <= 1 (n = 40:
#: error about 3^-40 relative)
_BORWEIN_N = 40


def _borwein_weights() -> np.ndarray:
    """w_k = (-1)^k (d_k - d_n) / d_n with d_k = n sum_{i<=k} (n+i-1)! 4^i / ((n-i)! (2i)!),
    in exact rationals."""
    n = _BORWEIN_N
    d, running = [], Fraction(0)
    for k in range(n + 1):
        running += Fraction(n * math.factorial(n + k - 1) * 4**k,
                            math.factorial(n - k) * math.factorial(2 * k))
        d.append(running)
    return np.asarray([float((-1) ** k * (d[k] - d[n]) / d[n]) for k in range(n)])


_BORWEIN = _borwein_weights()


def _zeta_borwein(s: Array) -> Array:
    """Riemann zeta for 0 <= s < 1 (and near 1) through Borwein's eta acceleration."""
    k = jnp.arange(_BORWEIN_N, dtype=s.dtype)
    weights = jnp.asarray(_BORWEIN, s.dtype)
    eta = -jnp.sum(weights * jnp.exp(-s[..., None] * jnp.log1p(k)), axis=-1)
    return eta / (1 - jnp.exp2(1 - s))


def zeta(s: Array, a: Array | None = None) -> Array:
    """Riemann zeta(s) for every real s but the pole at 1 (reflection below 0, Borwein's
    series on [0, 1)); Hurwitz zeta(s, a) for s > 1, a > 0."""
    (s,) = _float(s)
    if a is not None:
        s, a = _float(s, a)
        return jnp.where(s > 1, jsp.zeta(jnp.where(s > 1, s, 2.0), a), jnp.nan)
    above = jsp.zeta(jnp.where(s > 1, s, 2.0), 1.0)
    reflected_s = jnp.where(s < 0, 1 - s, 2.0)
    reflected = (jnp.exp2(s) * jnp.pi ** (s - 1) * jnp.sin(jnp.pi * s / 2)
                 * jsp.gamma(reflected_s) * jsp.zeta(reflected_s, 1.0))
    middle = _zeta_borwein(jnp.where((s >= 0) & (s < 1), s, 0.5))
    value = jnp.where(s > 1, above, jnp.where(s < 0, reflected, middle))
    return jnp.where(s == 1, jnp.inf, value)


def bernoulli(n: Array, x: Array | None = None) -> Array:
    """Bernoulli numbers B_n = -n zeta(1 - n) (SymPy's convention, B_1 = +1/2); exact
    zeros at odd n > 1. Bernoulli polynomials (two arguments) are refused at build."""
    if x is not None:
        raise UnsupportedFunctionError("bernoulli(n, x): Bernoulli polynomials have no JAX "
                                       "implementation in symkern")
    (n,) = _float(n)
    value = -n * zeta(jnp.where(n == 0, 0.5, 1 - n))
    odd = _is_integer(n) & (n > 1) & (jnp.mod(n, 2) == 1)
    return jnp.where(n == 0, 1.0, jnp.where(odd, 0.0, value))


# ---- exponential, logarithmic and trigonometric integrals --------------------------------

def li(x: Array) -> Array:
    """The logarithmic integral li(x) = Ei(log x), x > 0."""
    (x,) = _float(x)
    return jsp.expi(jnp.log(x))


def Li(x: Array) -> Array:  # noqa: N802 - SymPy's name
    """The offset logarithmic integral Li(x) = li(x) - li(2), x > 0."""
    (x,) = _float(x)
    return li(x) - jsp.expi(jnp.log(jnp.asarray(2.0, x.dtype)))


@jax.custom_jvp
def _expint(nu: Array, x: Array) -> Array:
    valid = _is_integer(nu) & (nu >= 0)
    order = jnp.where(valid, nu, 1).astype(jnp.int32)
    order, x = jnp.broadcast_arrays(order, x)
    return jnp.where(valid, jsp.expn(order, x), jnp.nan)


@_expint.defjvp
def _expint_jvp(primals: tuple, tangents: tuple) -> tuple:
    # dE_n/dx = -E_{n-1}(x), E_0(x) = exp(-x)/x; the order is an integer
    (nu, x), (_, dx) = primals, tangents
    lower = jnp.where(nu >= 1, _expint(jnp.maximum(nu - 1, 0.0), x), jnp.exp(-x) / x)
    return _expint(nu, x), -lower * dx


def expint(nu: Array, x: Array) -> Array:
    """The generalized exponential integral E_nu(x) for integer nu >= 0, x > 0 (nan for
    other orders)."""
    nu, x = _float(nu, x)
    return _expint(*jnp.broadcast_arrays(nu, x))


def Si(x: Array) -> Array:  # noqa: N802 - SymPy's name
    """The sine integral ∫_0^x sin(t)/t dt."""
    (x,) = _float(x)
    return jsp.sici(x)[0]


def Ci(x: Array) -> Array:  # noqa: N802 - SymPy's name
    """The cosine integral γ + log x + ∫_0^x (cos t - 1)/t dt, x > 0."""
    (x,) = _float(x)
    return jsp.sici(x)[1]


def Shi(x: Array) -> Array:  # noqa: N802 - SymPy's name
    """The hyperbolic sine integral (Ei(x) - Ei(-x)) / 2."""
    (x,) = _float(x)
    return (jsp.expi(x) - jsp.expi(-x)) / 2


def Chi(x: Array) -> Array:  # noqa: N802 - SymPy's name
    """The hyperbolic cosine integral (Ei(x) + Ei(-x)) / 2, x > 0."""
    (x,) = _float(x)
    return jnp.where(x > 0, (jsp.expi(x) + jsp.expi(-x)) / 2, jnp.nan)


def fresnels(x: Array) -> Array:
    """The Fresnel integral S(x) = ∫_0^x sin(π t²/2) dt."""
    (x,) = _float(x)
    return jsp.fresnel(x)[0]


def fresnelc(x: Array) -> Array:
    """The Fresnel integral C(x) = ∫_0^x cos(π t²/2) dt."""
    (x,) = _float(x)
    return jsp.fresnel(x)[1]


def erfi(x: Array) -> Array:
    """The imaginary error function -i erf(ix) = 2/sqrt(π) exp(x²) D(x) (Dawson's D)."""
    (x,) = _float(x)
    return 2 / jnp.sqrt(jnp.pi) * jnp.exp(x * x) * jsp.dawsn(x)


def erfcinv(x: Array) -> Array:
    """The inverse complementary error function, 0 < x < 2 (through ndtri)."""
    (x,) = _float(x)
    return -jsp.ndtri(x / 2) / jnp.sqrt(2.0).astype(x.dtype)


def cosm1(x: Array) -> Array:
    """cos(x) - 1 without cancellation near 0: -2 sin²(x/2)."""
    (x,) = _float(x)
    half = jnp.sin(x / 2)
    return -2 * half * half


def powm1(x: Array, y: Array) -> Array:
    """x**y - 1 without cancellation: expm1(y log x) for x > 0."""
    x, y = _float(x, y)
    positive = x > 0
    return jnp.where(positive, jnp.expm1(y * jnp.log(jnp.where(positive, x, 1.0))), x**y - 1)


# ---- LambertW -----------------------------------------------------------------------------

#: Halley steps from the initial guesses below (cubic convergence: 3 already reach float64
#: resolution away from the branch point; 8 leave margin there)
LAMBERTW_STEPS = 8


def _lambertw_value(x: Array, branch: int) -> Array:
    e = jnp.e
    p = jnp.sqrt(jnp.maximum(2 * (e * x + 1), 0.0))
    if branch == 0:
        near = -1 + p - p * p / 3 + 11 / 72 * p**3
        large = jnp.log(jnp.maximum(x, 3.0)) - jnp.log(jnp.log(jnp.maximum(x, 3.0)))
        w = jnp.where(x < -0.25, near, jnp.where(x < 3.0, jnp.log1p(jnp.maximum(x, -0.25)),
                                                   large))
        valid = x >= -1 / e
    else:
        near = -1 - p - p * p / 3 - 11 / 72 * p**3
        safe = jnp.minimum(x, -1e-300)
        far = jnp.log(-safe) - jnp.log(-jnp.log(-safe))
        w = jnp.where(x < -0.25, near, far)
        valid = (x >= -1 / e) & (x < 0)
    for _ in range(LAMBERTW_STEPS):
        ew = jnp.exp(w)
        f = w * ew - x
        wp1 = w + 1
        denominator = ew * wp1 - (w + 2) * f / (2 * jnp.where(wp1 == 0, 1.0, wp1))
        step = f / jnp.where(denominator == 0, 1.0, denominator)
        w = jnp.where(denominator == 0, w, w - step)
    w = jnp.where(x == -1 / e, -1.0, w)
    return jnp.where(valid, w, jnp.nan)


@jax.custom_jvp
def _lambertw0(x: Array) -> Array:
    return _lambertw_value(x, 0)


@jax.custom_jvp
def _lambertw_minus1(x: Array) -> Array:
    return _lambertw_value(x, -1)


def _lambertw_jvp(function: Callable) -> Callable:
    def jvp(primals: tuple, tangents: tuple) -> tuple:
        (x,), (dx,) = primals, tangents
        w = function(x)
        slope = jnp.where(x == 0, 1.0, w / jnp.where(x == 0, 1.0, x * (1 + w)))
        return w, slope * dx
    return jvp


_lambertw0.defjvp(_lambertw_jvp(_lambertw0))
_lambertw_minus1.defjvp(_lambertw_jvp(_lambertw_minus1))


def LambertW(x: Array, k: Any = 0) -> Array:  # noqa: N802 - SymPy's name
    """The Lambert W function, branch k = 0 (x >= -1/e) or k = -1 (-1/e <= x < 0), real
    values; other branches are complex and refused."""
    (x,) = _float(x)
    if k == 0:
        return _lambertw0(x)
    if k == -1:
        return _lambertw_minus1(x)
    raise UnsupportedFunctionError(f"LambertW branch {k!r}: real on branches 0 and -1 only")


# ---- complete elliptic integrals ----------------------------------------------------------

#: arithmetic-geometric mean steps (quadratic convergence from m < 1: 10 reach float64
#: resolution for m >= -1e6 and 1 - m >= 1e-12)
AGM_STEPS = 10


def _agm(m: Array) -> tuple[Array, Array]:
    """(K(m), E(m)) through the arithmetic-geometric mean, m < 1."""
    safe = jnp.where(m < 1, m, 0.0)
    a, g = jnp.ones_like(safe), jnp.sqrt(1 - safe)
    c2_sum = safe / 2
    power = 0.5
    for _ in range(AGM_STEPS):
        c = (a - g) / 2
        a, g = (a + g) / 2, jnp.sqrt(a * g)
        power *= 2
        c2_sum = c2_sum + power * c * c
    k = jnp.pi / (2 * a)
    return k, k * (1 - c2_sum)


def _complete_derivatives(m: Array) -> tuple[Array, Array, Array, Array]:
    k, e = _agm(m)
    small = jnp.abs(m) < 1e-8
    safe = jnp.where(small, 0.5, m)
    dk = jnp.where(small, jnp.pi / 8 + 9 * jnp.pi / 64 * m, (e - (1 - m) * k) / (2 * safe * (1 - m)))
    de = jnp.where(small, -jnp.pi / 8 - 3 * jnp.pi / 64 * m, (e - k) / (2 * safe))
    return k, e, dk, de


@jax.custom_jvp
def _elliptic_k(m: Array) -> Array:
    k, _ = _agm(m)
    return jnp.where(m < 1, k, jnp.where(m == 1, jnp.inf, jnp.nan))


@jax.custom_jvp
def _elliptic_e(m: Array) -> Array:
    _, e = _agm(m)
    return jnp.where(m <= 1, jnp.where(m == 1, 1.0, e), jnp.nan)


@_elliptic_k.defjvp
def _elliptic_k_jvp(primals: tuple, tangents: tuple) -> tuple:
    (m,), (dm,) = primals, tangents
    _, _, dk, _ = _complete_derivatives(m)
    return _elliptic_k(m), dk * dm


@_elliptic_e.defjvp
def _elliptic_e_jvp(primals: tuple, tangents: tuple) -> tuple:
    (m,), (dm,) = primals, tangents
    _, _, _, de = _complete_derivatives(m)
    return _elliptic_e(m), de * dm


def elliptic_k(m: Array) -> Array:
    """The complete elliptic integral of the first kind K(m), m < 1 (inf at 1)."""
    (m,) = _float(m)
    return _elliptic_k(m)


def elliptic_e(*arguments: Array) -> Array:
    """The complete elliptic integral of the second kind E(m), m <= 1; the incomplete
    E(phi, m) (two arguments) is refused at build."""
    if len(arguments) != 1:
        raise UnsupportedFunctionError("elliptic_e(phi, m): the incomplete integral has no JAX "
                                       "implementation in symkern")
    (m,) = _float(arguments[0])
    return _elliptic_e(m)


# ---- Bessel functions by quadrature -------------------------------------------------------

#: terms of the power series of besselj and besseli, used where |x| <= 2 sqrt(|n| + 1)
#: (and |x| <= 20 for besseli): there the quadrature's absolute error would be large
#: beside a value that falls like x^n
BESSEL_SERIES_TERMS = 40


def _bessel_series(n: Array, x: Array, sign: float) -> Array:
    """sum_k sign^k (x/2)^(2k+n) / (k! (k+n)!) for n = |order| >= 0."""
    half = x / 2
    term = jnp.exp(n * jnp.log(jnp.where(half == 0, 1.0, jnp.abs(half))) - jsp.gammaln(n + 1))
    term = jnp.where(half == 0, jnp.where(n == 0, 1.0, 0.0), term)
    term = jnp.where((half < 0) & (jnp.mod(n, 2) == 1), -term, term)
    quarter = half * half

    def add(k: int, state: tuple) -> tuple:
        term, total = state
        term = term * (sign * quarter / (k * (k + n)))
        return term, total + term

    # a loop of static length (a scan): reverse-differentiable, and one step to compile
    return lax.fori_loop(1, BESSEL_SERIES_TERMS, add, (term, term))[1]


def _periodic_rule(x: Array) -> tuple[Array, Array]:
    tau = jnp.linspace(0.0, jnp.pi, BESSEL_NODES + 1, dtype=x.dtype)
    weights = jnp.ones(BESSEL_NODES + 1, x.dtype).at[0].set(0.5).at[-1].set(0.5) / BESSEL_NODES
    return tau, weights


def besselj(nu: Array, x: Array) -> Array:
    """J_n(x) for integer n: the power series where |x| <= 2 sqrt(|n| + 1), elsewhere
    (1/π)∫_0^π cos(nτ - x sin τ) dτ by the periodic trapezoidal rule (spectrally
    accurate); nan for non-integer n."""
    nu, x = _float(nu, x)
    nu, x = jnp.broadcast_arrays(nu, x)
    order = jnp.abs(jnp.where(_is_integer(nu), nu, 0.0))
    tau, weights = _periodic_rule(x)
    quadrature = jnp.sum(jnp.cos(nu[..., None] * tau - x[..., None] * jnp.sin(tau)) * weights,
                         axis=-1)
    near = jnp.abs(x) <= 2 * jnp.sqrt(order + 1)
    series = _bessel_series(order, jnp.where(near, x, 0.0), -1.0)
    series = jnp.where((nu < 0) & (jnp.mod(order, 2) == 1), -series, series)
    return jnp.where(_is_integer(nu), jnp.where(near, series, quadrature), jnp.nan)


def besseli(nu: Array, x: Array) -> Array:
    """I_n(x) for integer n: the power series (no cancellation) where |x| <= 20 or
    |x| <= 2 sqrt(|n| + 1), elsewhere (1/π)∫_0^π exp(x cos τ) cos(nτ) dτ by the periodic
    trapezoidal rule, scaled by exp(|x|) so that no node overflows before the value does;
    nan for non-integer n."""
    nu, x = _float(nu, x)
    nu, x = jnp.broadcast_arrays(nu, x)
    order = jnp.abs(jnp.where(_is_integer(nu), nu, 0.0))
    tau, weights = _periodic_rule(x)
    scale = jnp.abs(x)
    values = jnp.exp(x[..., None] * jnp.cos(tau) - scale[..., None]) * jnp.cos(nu[..., None] * tau)
    quadrature = jnp.sum(values * weights, axis=-1) * jnp.exp(scale)
    near = (jnp.abs(x) <= 20) | (jnp.abs(x) <= 2 * jnp.sqrt(order + 1))
    series = _bessel_series(order, jnp.where(near, x, 0.0), 1.0)
    return jnp.where(_is_integer(nu), jnp.where(near, series, quadrature), jnp.nan)


def besselk(nu: Array, x: Array) -> Array:
    """K_nu(x) for real nu and x > 0, as ∫_0^T exp(-x cosh t) cosh(nu t) dt by the
    trapezoidal rule (the integrand is analytic and decays doubly exponentially), T chosen
    per sample where the integrand has fallen below float64 resolution."""
    nu, x = _float(nu, x)
    positive = x > 0
    xs = jnp.where(positive, x, 1.0)
    anu = jnp.abs(nu)
    guess = jnp.arccosh(1 + 50 / xs)
    end = lax.stop_gradient(jnp.arccosh(1 + (50 + anu * guess) / xs) + 1.0)
    s = jnp.linspace(0.0, 1.0, BESSELK_NODES + 1, dtype=x.dtype)
    t = end[..., None] * s
    weights = jnp.ones(BESSELK_NODES + 1, x.dtype).at[0].set(0.5).at[-1].set(0.5)
    # exp(-x (cosh t - 1)) cosh(nu t), the factor exp(-x) applied after the sum
    exponent = -xs[..., None] * (jnp.cosh(t) - 1)
    values = (jnp.exp(exponent + anu[..., None] * t) + jnp.exp(exponent - anu[..., None] * t)) / 2
    value = jnp.sum(values * weights, axis=-1) * (end / BESSELK_NODES) * jnp.exp(-xs)
    return jnp.where(positive, value, jnp.nan)


# ---- orthogonal polynomials of a data degree ----------------------------------------------

def _differentiable_loop(function: Callable, integer_arguments: tuple[int, ...]) -> Callable:
    """`function` with a custom_jvp: the derivative with respect to each real argument is
    the forward-mode derivative of the loop (lax.while_loop has no reverse mode), the
    integer arguments' derivative zero. Good for one order of jax.grad."""
    wrapped = jax.custom_jvp(function)

    def jvp(primals: tuple, tangents: tuple) -> tuple:
        value = function(*primals)
        total = jnp.zeros_like(value)
        for position, (primal, tangent) in enumerate(zip(primals, tangents, strict=True)):
            if position in integer_arguments:
                continue

            def along(v: Array, position: int = position) -> Array:
                arguments = list(primals)
                arguments[position] = v
                return function(*arguments)

            _, slope = jax.jvp(along, (primal,), (jnp.ones_like(primal),))
            total = total + slope * tangent
        return value, total

    wrapped.defjvp(jvp)
    return wrapped


def _recurrence(n: Array, first: Array, second: Array,
                step: Callable[[Array, Array, Array], Array], start: int = 1) -> Array:
    """p_n from p_start = first, p_{start+1} = second and p_{k+1} = step(k, p_{k-1}, p_k),
    each sample up to its own degree n (an integer >= start, else nan)."""
    shape = jnp.broadcast_shapes(jnp.shape(n), jnp.shape(first), jnp.shape(second))
    n = jnp.broadcast_to(n, shape)
    valid = _is_integer(n) & (n >= start)
    degree = jnp.where(valid, n, start)
    first = jnp.broadcast_to(first, shape)
    second = jnp.broadcast_to(second, shape)
    top = jnp.max(degree, initial=start) if degree.size else start

    def condition(state: tuple) -> Array:
        return state[0] < top

    def body(state: tuple) -> tuple:
        k, previous, current = state
        following = step(k.astype(current.dtype), previous, current)
        active = k < degree
        return (k + 1, jnp.where(active, current, previous),
                jnp.where(active, following, current))

    k0 = jnp.asarray(start + 1, jnp.int32)
    _, _, last = lax.while_loop(condition, body, (k0, first, second))
    value = jnp.where(degree == start, first, last)
    return jnp.where(valid, value, jnp.nan)


def _legendre(n: Array, x: Array) -> Array:
    return _recurrence(n, jnp.ones_like(x), x,
                       lambda k, p, q: ((2 * k + 1) * x * q - k * p) / (k + 1), start=0)


def _chebyshevt(n: Array, x: Array) -> Array:
    return _recurrence(n, jnp.ones_like(x), x, lambda k, p, q: 2 * x * q - p, start=0)


def _chebyshevu(n: Array, x: Array) -> Array:
    return _recurrence(n, jnp.ones_like(x), 2 * x, lambda k, p, q: 2 * x * q - p, start=0)


def _hermite(n: Array, x: Array) -> Array:
    return _recurrence(n, jnp.ones_like(x), 2 * x, lambda k, p, q: 2 * x * q - 2 * k * p,
                       start=0)


def _laguerre(n: Array, x: Array) -> Array:
    return _recurrence(n, jnp.ones_like(x), 1 - x,
                       lambda k, p, q: ((2 * k + 1 - x) * q - k * p) / (k + 1), start=0)


def _assoc_laguerre(n: Array, a: Array, x: Array) -> Array:
    return _recurrence(n, jnp.ones_like(x * a), 1 + a - x,
                       lambda k, p, q: ((2 * k + 1 + a - x) * q - (k + a) * p) / (k + 1),
                       start=0)


def _gegenbauer(n: Array, a: Array, x: Array) -> Array:
    return _recurrence(n, jnp.ones_like(x * a), 2 * a * x,
                       lambda k, p, q: (2 * (k + a) * x * q - (k + 2 * a - 1) * p) / (k + 1),
                       start=0)


def _jacobi(n: Array, a: Array, b: Array, x: Array) -> Array:
    def step(k: Array, p: Array, q: Array) -> Array:
        m = k + 1  # computing P_m from P_{m-1} = q and P_{m-2} = p
        c = 2 * m + a + b
        numerator = (c - 1) * (c * (c - 2) * x + a * a - b * b) * q \
            - 2 * (m + a - 1) * (m + b - 1) * c * p
        return numerator / (2 * m * (m + a + b) * (c - 2))

    return _recurrence(n, jnp.ones_like(x * a * b), (a + 1) + (a + b + 2) * (x - 1) / 2, step,
                       start=0)


def _assoc_legendre(n: Array, m: Array, x: Array) -> Array:
    """SymPy's assoc_legendre(n, m, x) = (-1)^m (1 - x²)^(m/2) d^m P_n/dx^m, 0 <= m."""
    shape = jnp.broadcast_shapes(jnp.shape(n), jnp.shape(m), jnp.shape(x))
    n, m, x = (jnp.broadcast_to(v, shape) for v in (n, m, x))
    valid_m = _is_integer(m) & (m >= 0)
    order = jnp.where(valid_m, m, 0)
    # P_m^m = (-1)^m (2m - 1)!! (1 - x²)^(m/2)
    double_factorial = jnp.exp(jsp.gammaln(2 * order + 1) - jsp.gammaln(order + 1)
                               - order * jnp.log(2.0))
    sign = jnp.where(jnp.mod(order, 2) == 1, -1.0, 1.0)
    diagonal = sign * double_factorial * (1 - x * x) ** (order / 2)
    following = x * (2 * order + 1) * diagonal

    def step(k: Array, p: Array, q: Array) -> Array:
        return ((2 * k + 1) * x * q - (k + order) * p) / (k - order + 1)

    # the recurrence runs in l from l = m; shift the degree so that it starts at 0
    shifted = jnp.where(valid_m, n - order, jnp.nan)
    value = _shifted_recurrence(shifted, diagonal, following, step, order)
    return jnp.where(valid_m & _is_integer(n) & (n >= 0) & (n < order), 0.0, value)


def _shifted_recurrence(d: Array, first: Array, second: Array, step: Callable, offset: Array
                        ) -> Array:
    """_recurrence over l = offset + j, j from 0 to d (offset varies per sample)."""
    return _recurrence(d, first, second, lambda j, p, q: step(j + offset, p, q), start=0)


legendre = _differentiable_loop(_legendre, (0,))
chebyshevt = _differentiable_loop(_chebyshevt, (0,))
chebyshevu = _differentiable_loop(_chebyshevu, (0,))
hermite = _differentiable_loop(_hermite, (0,))
laguerre = _differentiable_loop(_laguerre, (0,))
assoc_laguerre = _differentiable_loop(_assoc_laguerre, (0,))
gegenbauer = _differentiable_loop(_gegenbauer, (0,))
jacobi = _differentiable_loop(_jacobi, (0,))
assoc_legendre = _differentiable_loop(_assoc_legendre, (0, 1))
