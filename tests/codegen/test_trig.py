"""symkern.codegen.trig: the polynomial sin and cos against mpmath, and where kernels use them.

The polynomial is checked against mpmath at 120 bits: random float32 arguments (hypothesis),
and every float32 next to a multiple of pi/2 in its range, where the reduction is hardest.
Each element's value is its own: the polynomial's within the range, the library's beyond,
whatever else the call holds. Kernels are checked against float64 NumPy references and
jax.jacfwd, with `trig.sin` present or absent in their source as the pass's gate says.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import symkern as sk
from symkern.codegen import trig
from symkern.codegen.passes import VECTORIZED_TRIG_ENV

mpmath.mp.prec = 120
LIMIT = float(trig.FAST_UP_TO)
N = 4096


def exact(xs: np.ndarray, quarter_turns: int) -> np.ndarray:
    f = mpmath.sin if quarter_turns == 0 else mpmath.cos
    return np.array([float(f(mpmath.mpf(float(v)))) for v in xs])


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in float32 ulps of `want` (the smallest normal's below it)."""
    ulp = np.maximum(np.spacing(np.abs(want).astype(np.float32)), np.finfo(np.float32).tiny)
    return np.abs(np.asarray(got, np.float64) - want) / ulp.astype(np.float64)


POLYNOMIAL = {q: jax.jit(lambda v, q=q: trig.polynomial(v, q)) for q in (0, 1)}


def test_the_parts_of_pi_over_two():
    parts = [mpmath.mpf(float(p)) for p in trig.PI_OVER_TWO_PARTS]
    assert abs(sum(parts) - mpmath.pi / 2) < mpmath.mpf(2) ** -62
    for part in trig.PI_OVER_TWO_PARTS[:3]:  # k * part exact for k < 2^12
        mantissa, _ = np.frexp(part)
        assert float(mantissa * 2**12) == int(mantissa * 2**12)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([1e-3, 1.0, 10.0, 500.0, LIMIT]),
       quarter_turns=st.sampled_from([0, 1]))
def test_the_polynomial_is_within_two_ulps_in_its_range(seed, scale, quarter_turns):
    xs = np.random.default_rng(seed).uniform(-scale, scale, 400).astype(np.float32)
    got = np.asarray(POLYNOMIAL[quarter_turns](jnp.asarray(xs)))
    assert ulps(got, exact(xs, quarter_turns)).max() <= 2.0


@pytest.mark.parametrize("quarter_turns", [0, 1])
def test_the_polynomial_next_to_every_multiple_of_pi_over_two(quarter_turns):
    centers = (np.arange(-2608, 2609) * (np.pi / 2)).astype(np.float32)
    xs = np.concatenate([np.nextafter(centers, np.float32(np.inf)), centers,
                         np.nextafter(centers, np.float32(-np.inf))])
    xs = xs[np.abs(xs) <= LIMIT]
    got = np.asarray(POLYNOMIAL[quarter_turns](jnp.asarray(xs)))
    assert ulps(got, exact(xs, quarter_turns)).max() <= 2.0


def test_the_polynomial_keeps_signed_zero_and_propagates_nan():
    got = np.asarray(POLYNOMIAL[0](jnp.asarray(np.array([-0.0, 0.0, np.nan], np.float32))))
    assert np.signbit(got[0]) and not np.signbit(got[1]) and np.isnan(got[2])


@pytest.mark.parametrize("name", ["sin", "cos"])
@pytest.mark.parametrize("outside", [None, 5000.0, 1e30, np.inf, -np.inf, np.nan])
def test_each_element_outside_the_range_is_the_library_and_the_others_keep_their_value(
        name, outside):
    xs = np.random.default_rng(7).uniform(-3, 3, N).astype(np.float32)
    alone = np.asarray(jax.jit(getattr(trig, name))(jnp.asarray(xs)))
    if outside is not None:
        xs[123] = outside
    got = np.asarray(jax.jit(getattr(trig, name))(jnp.asarray(xs)))
    library = np.asarray(jax.jit(getattr(jnp, name))(jnp.asarray(xs)))
    inside = np.arange(N) != 123
    # the other elements are the polynomial's, bit for bit the same as without the outlier
    np.testing.assert_array_equal(got[inside], alone[inside])
    assert ulps(got[inside], exact(xs[inside], 0 if name == "sin" else 1)).max() <= 2.0
    if outside is not None:  # the element outside: the library's (NaN gives NaN)
        np.testing.assert_array_equal(got[123], library[123])


@pytest.mark.parametrize("n", [1, 3, 63, 64, N - 1, N, N + 1])
def test_a_sample_gets_the_same_value_in_every_batch_size(n):
    xs = np.random.default_rng(9).uniform(-50, 50, N + 1).astype(np.float32)
    whole = np.asarray(jax.jit(trig.sin)(jnp.asarray(xs)))
    np.testing.assert_array_equal(np.asarray(jax.jit(trig.sin)(jnp.asarray(xs[:n]))), whole[:n])
    np.testing.assert_array_equal(np.asarray(trig.sin(xs[0])), whole[0])


def test_float64_call_sites_are_the_library():
    for x in (np.linspace(-2, 2, N), np.float64(0.5)):
        jaxpr = str(jax.make_jaxpr(trig.sin)(x))
        assert "cond" not in jaxpr and "sin" in jaxpr
    for x in (np.zeros(N, np.float32), np.float32(0.5)):
        assert "cond" in str(jax.make_jaxpr(trig.sin)(x))


def test_derivatives_are_the_other_function():
    xs = jnp.asarray(np.random.default_rng(8).uniform(-3, 3, N).astype(np.float32))
    d_sin = jax.grad(lambda v: jnp.sum(trig.sin(v)))(xs)
    d_cos = jax.grad(lambda v: jnp.sum(trig.cos(v)))(xs)
    dd_sin = jax.grad(lambda v: jnp.sum(jax.grad(lambda w: jnp.sum(trig.sin(w)))(v)))(xs)
    np.testing.assert_allclose(d_sin, np.cos(np.asarray(xs, np.float64)), atol=3e-7)
    np.testing.assert_allclose(d_cos, -np.sin(np.asarray(xs, np.float64)), atol=3e-7)
    np.testing.assert_allclose(dd_sin, -np.sin(np.asarray(xs, np.float64)), atol=3e-7)


# ---- in kernels ----------------------------------------------------------------------------

q0, q1, p0, p1 = sp.symbols("q0 q1 p0 p1")
L, g = sp.symbols("L g")
EQS = {"xy": sp.Matrix([L * sp.sin(q0), -L * sp.cos(q0) - sp.cos(q1)]),
       "f": -g * sp.sin(q0 - q1) * p0 + sp.cos(q0 + q1) * p1 ** 2}


def reference(X, Lv, gv):
    X = np.asarray(X, np.float64)
    a, b, c, d = X[..., 0], X[..., 1], X[..., 2], X[..., 3]
    return {"xy": np.stack([Lv * np.sin(a), -Lv * np.cos(a) - np.cos(b)], axis=-1),
            "f": -gv * np.sin(a - b) * c + np.cos(a + b) * d ** 2}


def build(**kwargs):
    return sk.build_function(EQS, [q0, q1, p0, p1], params={"L": L, "g": g},
                             dtype="float32", **kwargs)


def data(n, seed=0, scale=3.0):
    return np.random.default_rng(seed).uniform(-scale, scale, (n, 4)).astype(np.float32)


def assert_reference(out, X, Lv=1.5, gv=9.8):
    want = reference(X, Lv, gv)
    for key in want:
        np.testing.assert_allclose(np.asarray(out[key], np.float64), want[key],
                                   rtol=2e-5, atol=2e-5)


def hand_written_float32(X):
    Lv, gv = np.float32(1.5), np.float32(9.8)
    a, b, c, d = (jnp.asarray(X)[..., i] for i in range(4))
    return {"xy": jnp.stack([Lv * jnp.sin(a), -Lv * jnp.cos(a) - jnp.cos(b)], axis=-1),
            "f": -gv * jnp.sin(a - b) * c + jnp.cos(a + b) * d ** 2}


@settings(max_examples=8, deadline=None)
@given(n=st.sampled_from([3, N - 1, N, 3 * N + 5]), seed=st.integers(0, 1000),
       scale=st.sampled_from([1.0, 100.0, 6000.0]))
def test_kernels_agree_with_jnp_on_both_sides_of_the_thresholds(n, seed, scale):
    # float32 arithmetic on arguments up to 12,000 is ill-conditioned against a float64
    # reference; against the same float32 arithmetic with the library's sin and cos, the
    # difference is the polynomial's (<= 2 ulps of each sin or cos, times its factor)
    X = data(n, seed, scale)
    out, want = KERNEL(X, PS), hand_written_float32(X)
    for key in want:
        w = np.asarray(want[key], np.float64)
        np.testing.assert_allclose(np.asarray(out[key], np.float64), w, rtol=1e-5,
                                   atol=1e-5 * np.abs(w).max())
    if scale == 1.0:
        assert_reference(out, X)


KERNEL = build()
PS = {"L": np.float32(1.5), "g": np.float32(9.8)}


def test_the_rewrite_is_visible_in_the_source_at_every_batch_size():
    assert "trig.sin(" in KERNEL.source and "trig.cos(" in KERNEL.source
    assert "jnp.sin" not in KERNEL.source and "jnp.cos" not in KERNEL.source
    assert KERNEL.options.trig == "polynomial"
    for n in (1, N - 1, N):
        assert "cond" in str(KERNEL.jaxpr(data(n), PS))


def test_the_option_keeps_the_library():
    kernel = build(options=sk.BuildOptions(trig="library"))
    assert "trig." not in kernel.source and "jnp.sin" in kernel.source
    assert "cond" not in str(kernel.jaxpr(data(N), PS))
    assert_reference(kernel(data(N), PS), data(N))


def test_gradients_through_a_kernel_match_a_hand_written_function():
    X = jnp.asarray(data(N, seed=3))

    def hand(X, Lv, gv):
        a, b, c, d = X[..., 0], X[..., 1], X[..., 2], X[..., 3]
        return jnp.sum(-gv * jnp.sin(a - b) * c + jnp.cos(a + b) * d ** 2
                       + Lv * jnp.sin(a) - Lv * jnp.cos(a) - jnp.cos(b))

    def ours(X, Lv, gv):
        out = KERNEL(X, {"L": Lv, "g": gv})
        return jnp.sum(out["f"]) + jnp.sum(out["xy"])

    # the data gradient by reverse mode (jacfwd would push 16,384 tangents), the
    # parameter's by jacfwd, both of the hand-written function in float64
    for argnum, reference in ((0, jax.grad), (1, jax.jacfwd)):
        got = jax.grad(ours, argnums=argnum)(X, jnp.float32(1.5), jnp.float32(9.8))
        want = reference(hand, argnums=argnum)(X.astype(jnp.float64), 1.5, 9.8)
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want),
                                   rtol=1e-4, atol=1e-3)


def test_vmap_over_a_kernel_with_the_conditional():
    X = data(2 * N, seed=4).reshape(2, N, 4)
    out = jax.vmap(lambda x: KERNEL(x, PS))(X)
    assert_reference(out, X)


def test_an_exported_kernel_computes_the_same_values():
    X = data(N, seed=5)
    loaded = sk.load(KERNEL.export(X, PS), KERNEL.const_args)
    for rows in (7, N):
        got, want = loaded(X[:rows], PS), KERNEL(X[:rows], PS)
        for key in want:
            np.testing.assert_allclose(np.asarray(got[key]), np.asarray(want[key]),
                                       rtol=1e-6, atol=1e-6 * np.abs(np.asarray(want[key])).max())


def test_the_environment_switches_it_off_and_a_bad_value_is_refused(monkeypatch):
    monkeypatch.setenv(VECTORIZED_TRIG_ENV, "0")
    kernel = build()
    assert kernel.options.trig == "library" and "trig." not in kernel.source
    assert "cond" not in str(kernel.jaxpr(data(N), PS))
    assert_reference(kernel(data(N), PS), data(N))
    monkeypatch.setenv(VECTORIZED_TRIG_ENV, "fast")
    with pytest.raises(sk.BuildError, match="SYMKERN_VECTORIZED_TRIG: expected 1 "):
        build()


def test_many_calls_and_float64_kernels_keep_the_library():
    xs = sp.symbols(f"x0:{trig.POLYNOMIAL_UP_TO_CALLS + 1}")
    many = sk.build_function(sum(sp.sin(x) for x in xs), list(xs), dtype="float32")
    assert "cond" not in str(many.jaxpr(np.zeros((N, len(xs)), np.float32)))
    double = sk.build_function(EQS, [q0, q1, p0, p1], params={"L": L, "g": g}, dtype="float64")
    X = data(N).astype(np.float64)
    assert "cond" not in str(double.jaxpr(X, PS))
    out = double(X, {"L": 1.5, "g": 9.8})
    want = reference(X, 1.5, 9.8)
    np.testing.assert_allclose(out["f"], want["f"], rtol=1e-12, atol=1e-12)
