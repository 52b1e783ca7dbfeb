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
N = 4096
DTYPES = [np.float32, np.float64]


def exact(xs: np.ndarray, quarter_turns: int) -> np.ndarray:
    f = mpmath.sin if quarter_turns == 0 else mpmath.cos
    return np.array([float(f(mpmath.mpf(float(v)))) for v in xs])


def ulps(got: np.ndarray, want: np.ndarray, dtype=np.float32) -> np.ndarray:
    """|got - want| in ulps of `want` in `dtype` (the smallest normal's below it)."""
    ulp = np.maximum(np.spacing(np.abs(want).astype(dtype)), np.finfo(dtype).tiny)
    return np.abs(np.asarray(got, np.float64) - want) / ulp.astype(np.float64)


def limit(dtype) -> float:
    return float(trig.REDUCTIONS[np.dtype(dtype)].fast_up_to)


POLYNOMIAL = {q: jax.jit(lambda v, q=q: trig.polynomial(v, q)) for q in (0, 1)}


@pytest.mark.parametrize("dtype, short_bits, max_k", [(np.float32, 12, 2**12), (np.float64, 33, 2**20)])
def test_the_parts_of_pi_over_two(dtype, short_bits, max_k):
    reduction = trig.REDUCTIONS[np.dtype(dtype)]
    parts = [mpmath.mpf(float(p)) for p in reduction.pi_over_two_parts]
    mpmath.mp.prec = 200
    try:
        error = abs(sum(parts) - mpmath.pi / 2)
    finally:
        mpmath.mp.prec = 120
    assert error < mpmath.mpf(2) ** (-62 if dtype == np.float32 else -150)
    assert all(np.asarray(p).dtype == dtype for p in reduction.pi_over_two_parts)
    # k * part is exact for every k in the range: k < max_k and each part's mantissa has
    # short_bits significant bits, together no more than the dtype's
    assert round(limit(dtype) * 2 / np.pi) < max_k
    assert short_bits + int(np.log2(max_k)) <= np.finfo(dtype).nmant + 1
    for part in reduction.pi_over_two_parts[:3]:
        mantissa, _ = np.frexp(np.float64(part))
        assert float(mantissa * 2**short_bits) == int(mantissa * 2**short_bits)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([1e-3, 1.0, 10.0, 500.0, "limit"]),
       quarter_turns=st.sampled_from([0, 1]), dtype=st.sampled_from(DTYPES))
def test_the_polynomial_is_within_two_ulps_in_its_range(seed, scale, quarter_turns, dtype):
    scale = limit(dtype) if scale == "limit" else scale
    xs = np.random.default_rng(seed).uniform(-scale, scale, 400).astype(dtype)
    got = np.asarray(POLYNOMIAL[quarter_turns](jnp.asarray(xs)))
    assert got.dtype == dtype
    assert ulps(got, exact(xs, quarter_turns), dtype).max() <= 2.0


def next_to(ks: np.ndarray, dtype) -> np.ndarray:
    """The dtype's numbers nearest k * pi/2 and their neighbours, within the range."""
    centers = (ks * (np.pi / 2)).astype(dtype)
    xs = np.concatenate([np.nextafter(centers, dtype(np.inf)), centers,
                         np.nextafter(centers, dtype(-np.inf))])
    return xs[np.abs(xs) <= limit(dtype)]


@pytest.mark.parametrize("quarter_turns", [0, 1])
def test_the_float32_polynomial_next_to_every_multiple_of_pi_over_two(quarter_turns):
    xs = next_to(np.arange(-2608, 2609), np.float32)
    got = np.asarray(POLYNOMIAL[quarter_turns](jnp.asarray(xs)))
    assert ulps(got, exact(xs, quarter_turns)).max() <= 2.0


@pytest.mark.parametrize("quarter_turns", [0, 1])
def test_the_float64_polynomial_next_to_multiples_of_pi_over_two(quarter_turns):
    # every multiple up to 2,000 and 2,000 drawn up to the range's end (667,544): where the
    # reduction cancels most, the parts after the first decide the value
    kmax = int(limit(np.float64) * 2 / np.pi)
    ks = np.concatenate([np.arange(-2000, 2001),
                         np.random.default_rng(11).integers(-kmax, kmax + 1, 2000), [-kmax, kmax]])
    xs = next_to(ks, np.float64)
    got = np.asarray(POLYNOMIAL[quarter_turns](jnp.asarray(xs)))
    assert ulps(got, exact(xs, quarter_turns), np.float64).max() <= 2.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_polynomial_keeps_signed_zero_and_propagates_nan(dtype):
    got = np.asarray(POLYNOMIAL[0](jnp.asarray(np.array([-0.0, 0.0, np.nan], dtype))))
    assert np.signbit(got[0]) and not np.signbit(got[1]) and np.isnan(got[2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["sin", "cos"])
@pytest.mark.parametrize("outside", [None, "past", 1e30, np.inf, -np.inf, np.nan])
def test_each_element_outside_the_range_is_the_library_and_the_others_keep_their_value(
        name, outside, dtype):
    xs = np.random.default_rng(7).uniform(-3, 3, N).astype(dtype)
    alone = np.asarray(jax.jit(getattr(trig, name))(jnp.asarray(xs)))
    if outside is not None:
        xs[123] = limit(dtype) * 1.25 if outside == "past" else outside
    got = np.asarray(jax.jit(getattr(trig, name))(jnp.asarray(xs)))
    library = np.asarray(jax.jit(getattr(jnp, name))(jnp.asarray(xs)))
    inside = np.arange(N) != 123
    # the other elements are the polynomial's, bit for bit the same as without the outlier
    np.testing.assert_array_equal(got[inside], alone[inside])
    assert ulps(got[inside], exact(xs[inside], 0 if name == "sin" else 1), dtype).max() <= 2.0
    if outside is not None:  # the element outside: the library's (NaN gives NaN)
        np.testing.assert_array_equal(got[123], library[123])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 63, 64, N - 1, N, N + 1])
def test_a_sample_gets_the_same_value_in_every_batch_size(n, dtype):
    xs = np.random.default_rng(9).uniform(-50, 50, N + 1).astype(dtype)
    whole = np.asarray(jax.jit(trig.sin)(jnp.asarray(xs)))
    np.testing.assert_array_equal(np.asarray(jax.jit(trig.sin)(jnp.asarray(xs[:n]))), whole[:n])
    np.testing.assert_array_equal(np.asarray(trig.sin(xs[0])), whole[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_empty_batch_has_no_values_and_no_error(dtype):
    for name in ("sin", "cos"):
        got = jax.jit(getattr(trig, name))(jnp.zeros((0,), dtype))
        assert got.shape == (0,) and got.dtype == dtype
    kernel = sk.build_function(sp.sin(q0) * sp.cos(q1), [q0, q1], dtype=np.dtype(dtype).name)
    assert "trig.sin(" in kernel.source
    assert kernel(np.zeros((0, 2), dtype)).shape == (0,)


def test_other_dtypes_are_the_library():
    for x in (np.linspace(-2, 2, N, dtype=np.float16), np.complex128(0.5 + 1j),
              np.linspace(-2, 2, N).astype(np.complex64)):
        jaxpr = str(jax.make_jaxpr(trig.sin)(x))
        assert "cond" not in jaxpr and "sin" in jaxpr
    for x in (np.zeros(N, np.float32), np.float32(0.5), np.zeros(N), np.float64(0.5)):
        assert "cond" in str(jax.make_jaxpr(trig.sin)(x))


@pytest.mark.parametrize("dtype, atol", [(np.float32, 3e-7), (np.float64, 1e-15)])
def test_derivatives_are_the_other_function(dtype, atol):
    xs = jnp.asarray(np.random.default_rng(8).uniform(-3, 3, N).astype(dtype))
    d_sin = jax.grad(lambda v: jnp.sum(trig.sin(v)))(xs)
    d_cos = jax.grad(lambda v: jnp.sum(trig.cos(v)))(xs)
    dd_sin = jax.grad(lambda v: jnp.sum(jax.grad(lambda w: jnp.sum(trig.sin(w)))(v)))(xs)
    assert d_sin.dtype == dtype
    np.testing.assert_allclose(d_sin, np.cos(np.asarray(xs, np.float64)), atol=atol)
    np.testing.assert_allclose(d_cos, -np.sin(np.asarray(xs, np.float64)), atol=atol)
    np.testing.assert_allclose(dd_sin, -np.sin(np.asarray(xs, np.float64)), atol=atol)


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


def test_many_calls_keep_the_library():
    xs = sp.symbols(f"x0:{trig.POLYNOMIAL_UP_TO_CALLS + 1}")
    many = sk.build_function(sum(sp.sin(x) for x in xs), list(xs), dtype="float32")
    assert "cond" not in str(many.jaxpr(np.zeros((N, len(xs)), np.float32)))
    fewer = sk.build_function(sum(sp.sin(x) for x in xs[:-1]), list(xs[:-1]), dtype="float32")
    assert "trig.sin(" in fewer.source


def magnitude(values: np.ndarray) -> float:
    """The largest finite |value|, at least 1."""
    finite = np.abs(values[np.isfinite(values)])
    return max(1.0, float(finite.max(initial=0.0)))


DOUBLE = sk.build_function(EQS, [q0, q1, p0, p1], params={"L": L, "g": g}, dtype="float64")


@pytest.mark.parametrize("n", [1, N - 1, N + 1])
@pytest.mark.parametrize("scale, outlier", [(3.0, None), (3.0, 5e6), (1e5, None), (3.0, np.nan)])
def test_float64_kernels_get_the_polynomial_within_the_reference(n, scale, outlier):
    assert "trig.sin(" in DOUBLE.source and "jnp.sin" not in DOUBLE.source
    assert DOUBLE.options.trig == "polynomial"
    X = data(n, seed=n, scale=scale).astype(np.float64)
    if outlier is not None:
        X[0, 1] = outlier
    out = DOUBLE(X, {"L": 1.5, "g": 9.8})
    want = reference(X, 1.5, 9.8)
    for key in want:
        assert out[key].dtype == np.float64
        # a few ulps of each sin or cos, times its factor (the arguments reach 2 * scale)
        np.testing.assert_allclose(out[key], want[key], rtol=1e-14, atol=1e-15 * magnitude(want[key]))
    # the library's kernel: the same values to the polynomial's few ulps, the same NaNs
    library = sk.build_function(EQS, [q0, q1, p0, p1], params={"L": L, "g": g}, dtype="float64",
                                options=sk.BuildOptions(trig="library"))
    assert "trig." not in library.source
    theirs = library(X, {"L": 1.5, "g": 9.8})
    for key in want:
        np.testing.assert_allclose(out[key], theirs[key], rtol=1e-14, atol=1e-15 * magnitude(want[key]))
