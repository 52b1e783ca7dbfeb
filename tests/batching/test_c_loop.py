"""`BuildOptions(cpu_loop="c")`: the kernel's batch as one C++ loop, called through XLA's FFI.

The combination matrix (test_combinations.py, forms `c-loop*`) runs every call path at every
batch shape; here: random expression trees against SymPy at 30 digits, the printer's
special cases (powers, Piecewise, constants in float32, symbol names that are C names), the
threads' split at the real GRAIN, what is shown, and every refusal. Skipped where there is
no C++ compiler, except the refusals that come before the compiler is looked for.
"""

from __future__ import annotations

import ctypes
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import pytest
import sympy as sp
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st
from test_random_expressions import (
    EXAMPLES,
    SETTINGS,
    SYMBOLS,
    A,
    B,
    X,
    _share_parameters,
    expressions,
    float64_evaluation,
    reference,
    samples,
    within,
)

import symkern as sk
from symkern.codegen import c_loop as printing
from symkern.codegen import c_math
from symkern.errors import BuildError
from symkern.kernels import c_loop as loops
from symkern.kernels import memory

C = sk.BuildOptions(cpu_loop="c")
needs_compiler = pytest.mark.skipif(loops.compiler() is None,
                                    reason="cpu_loop='c' needs a C++ compiler")
x, y, p = sp.symbols("x y p")


@needs_compiler
# each example compiles one loop (about 4 s): three examples of six trees in the bounded
# profile, EXAMPLES // 3 under SYMKERN_SLOW
@settings(SETTINGS, max_examples=EXAMPLES // 3 if EXAMPLES > 25 else 3)
@given(trees=st.lists(expressions(), min_size=6, max_size=6), rows=samples)
def test_random_trees_in_one_c_loop_match_sympy_at_30_digits(trees, rows):
    # Min and Max are refused (test_what_the_loop_cannot_compute_is_refused_by_name)
    trees = [t for t in trees if not t.has(sp.Min, sp.Max, sp.zoo, sp.nan, sp.oo, -sp.oo)]
    assume(trees)
    values = _share_parameters(rows)
    note(f"trees = {trees}")
    kernel = sk.build_function(sp.Matrix(trees), list(X), params={"a": A, "b": B},
                               dtype="float64", options=C)
    ps = {"a": values[0, 3], "b": values[0, 4]}
    got = np.asarray(kernel(values[:, :3], ps))
    assert got.shape == (len(values), len(trees))
    # a sample gets the same bits alone and in a batch of another size at another position
    # (docs/design/output-assembly.md, "Determinism")
    np.testing.assert_array_equal(np.asarray(kernel(values[:1, :3], ps)), got[:1])
    np.testing.assert_array_equal(np.asarray(kernel(values[1:, :3], ps)), got[1:])
    for column, tree in enumerate(trees):
        naive = float64_evaluation(tree, values)
        for k, row in enumerate(values):
            want = reference(tree, tuple(row))
            if want is None or not within(float(naive[k]), want):
                continue  # not finite and real, or ill-conditioned at float64 (as there)
            assert within(float(got[k, column]), want), (
                f"{tree} at {dict(zip(map(str, SYMBOLS), row, strict=True))}: "
                f"loop {got[k, column]!r}, SymPy {want!r}")


@needs_compiler
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_powers_piecewise_and_constants_print_as_their_values(dtype):
    eqs = [x ** 2, x ** -3, x ** 70, y ** sp.Rational(1, 3), y ** sp.Rational(-1, 2),
           y ** sp.Rational(2, 3), x ** y, sp.pi * x + sp.E, sp.Piecewise((x, x > 0)),
           sp.Piecewise((x, x > 0.5), (-y, sp.And(x < 0, y > 1)), (p, True)),
           sp.Abs(x) + sp.floor(x) + sp.ceiling(y) + sp.atan2(x, y) + sp.erf(x) + sp.gamma(y)]
    kernel = sk.build_function(sp.Matrix(eqs), [x, y], params={"p": p}, dtype=dtype, options=C)
    reference_kernel = sk.build_function(sp.Matrix(eqs), [x, y], params={"p": p}, dtype=dtype)
    rng = np.random.default_rng(0)
    data = np.stack([rng.uniform(-1.01, 1.01, 64), rng.uniform(0.5, 2.0, 64)], -1).astype(dtype)
    got, want = kernel(data, {"p": 0.25}), reference_kernel(data, {"p": 0.25})
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want),
                               rtol=2e-6 if dtype == "float32" else 1e-13, atol=1e-30)
    assert np.isnan(np.asarray(got)[data[:, 0] <= 0, 8]).all()  # Piecewise with no default


@needs_compiler
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_other_powers_are_exp_of_y_log_x_within_their_ulps_and_pow_outside(dtype):
    # x**y, x**(1/3), x**-0.214 and x**100 call pow, which keeps a block from being
    # vectorized: exp(y log x) inline where |y log x| <= POW_INLINE_UP_TO, pow elsewhere
    from symkern.codegen.c_math import POW_INLINE_UP_TO

    eqs = [x ** y, x ** sp.Rational(1, 3), x ** sp.Float(-0.214), x ** 100]
    kernel = sk.build_function(sp.Matrix(eqs), [x, y], dtype=dtype, options=C)
    assert kernel.source.count("sk_pow_core(") >= len(eqs)
    rng = np.random.default_rng(4)
    n = 4000
    data = np.stack([np.exp(rng.uniform(-3, 3, n)), rng.uniform(-2, 2, n)], -1)
    data[:40, 0] = -data[:40, 0]  # pow's NaN, and its value at integer exponents
    data[40:80, 1] = rng.integers(-3, 4, 40)
    data[80:84] = [(0.0, 2.0), (0.0, -1.5), (np.inf, 0.5), (2.0, np.nan)]
    data = data.astype(dtype)
    got = np.asarray(kernel(data))
    bound = 0.5 if dtype == "float32" else 2.5
    # the exponents as the dtype's numbers, as the loop reads them
    exponents = [None, mpmath.mpf(float(np.asarray(1, dtype) / np.asarray(3, dtype))),
                 mpmath.mpf(float(np.asarray(-0.214, dtype))), 100]
    inline = 0
    with mpmath.workdps(40):
        for k, (a, b) in enumerate(data.astype(np.float64)):
            for column, e in enumerate(exponents):
                e = mpmath.mpf(b) if e is None else e
                if not (np.isfinite(a) and np.isfinite(float(e))) or a <= 0:
                    want = np.power(np.asarray(a, dtype), np.asarray(float(e), dtype))
                    if column == 0:  # the C library's pow, as the sample-by-sample loop calls it
                        np.testing.assert_array_equal(got[k, column], want, err_msg=f"{a} ** {e}")
                    continue
                want = mpmath.power(mpmath.mpf(a), e)
                if not np.finfo(dtype).tiny <= want <= np.finfo(dtype).max:
                    continue
                inline += abs(float(e) * np.log(a)) <= POW_INLINE_UP_TO[dtype]
                ulp = float(np.spacing(np.asarray(float(want), dtype)))
                assert abs(float(got[k, column]) - float(want)) <= bound * ulp, (a, e, column)
    assert inline > n  # most of the samples took the inline form


@needs_compiler
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_block_holds_no_branch_of_conditions_or_of_log(dtype):
    # g++ vectorizes no block with a `&&` or `||` in it (log's condition or a Piecewise's And
    # and Or): every block of a body calling log ran one sample at a time
    eqs = [sp.log(x) + sp.Piecewise((x, sp.And(x > 0.5, y < 1)), (y, sp.Or(x < -1, y > 2)),
                                     (2 * x, True))]
    kernel = sk.build_function(sp.Matrix(eqs), [x, y], dtype=dtype, options=C)
    assert "sk_log_core" in kernel.source
    assert not re.search(r"&&|\|\|", kernel.source.split("sk_log_within")[1])
    rng = np.random.default_rng(2)
    data = np.stack([rng.uniform(-2, 2, 300), rng.uniform(0, 3, 300)], -1).astype(dtype)
    want = np.asarray(sk.build_function(sp.Matrix(eqs), [x, y], dtype=dtype)(data))
    np.testing.assert_allclose(np.asarray(kernel(data)), want, equal_nan=True,
                               rtol=2e-6 if dtype == "float32" else 1e-13)


@needs_compiler
def test_symbol_names_that_are_names_of_the_loop_are_only_symbols():
    names = (*sp.symbols("x1_0 p_0 s_0 O0 P X1 i loop"), sp.Dummy("sk_powi"))
    entries = sp.Matrix([names[0] * names[1] + names[2], sp.sin(names[3]) * names[4],
                         names[5] - names[6] + names[7] * names[8]])
    data, params = list(names[:1] + names[2:4] + names[5:9]), {"p": names[1], "P": names[4]}
    kernel = sk.build_function(entries, data, params=params, dtype="float64", options=C)
    reference_kernel = sk.build_function(entries, data, params=params, dtype="float64")
    values = np.random.default_rng(1).normal(size=(5, len(data)))
    ps = {"p": 0.5, "P": -2.0}
    np.testing.assert_allclose(kernel(values, ps), reference_kernel(values, ps), rtol=1e-14)
    assert "sk_powi_" not in kernel.source  # the Dummy's name and index print nowhere


@needs_compiler
def test_a_sample_gets_the_same_bits_on_both_sides_of_two_threads():
    eqs = sp.Matrix([sp.sin(x) * p + y ** 2, sp.exp(-x * y) / (1 + x ** 2)])
    kernel = sk.build_function(eqs, [x, y], params={"p": p}, dtype="float64", options=C)
    data = np.random.default_rng(2).normal(size=(2 * loops.GRAIN + 1, 2))
    heads = [np.asarray(kernel(data[:n], {"p": 0.3}))[[0, n // 2, n - 1]]
             for n in (2 * loops.GRAIN - 1, 2 * loops.GRAIN, 2 * loops.GRAIN + 1)]
    whole = np.asarray(kernel(data, {"p": 0.3}))
    for n, head in zip((2 * loops.GRAIN - 1, 2 * loops.GRAIN, 2 * loops.GRAIN + 1), heads,
                       strict=True):
        np.testing.assert_array_equal(head, whole[[0, n // 2, n - 1]])


@needs_compiler
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_entries_no_data_reaches_are_computed_once_and_copied_into_every_row(dtype):
    # five data numbers a sample and rows of 7, 3 and 2 entries (lengths g++ vectorizes only
    # when it may not assume them); entries no data reaches: literals, functions of
    # parameters -- exp(800) and sin(1e7) outside their inline forms' conditions, so the
    # C library's values -- a Piecewise on a parameter, and an equation of them alone
    d = sp.symbols("d0:5")
    q, r = sp.symbols("q r")
    first = [d[0] * d[1], 0, sp.exp(q), d[2] + p, 1, sp.sin(r * 1e7) * p, sp.cos(d[4]) * d[3]]
    second = [sp.Piecewise((p, p > 0), (-p, True)), d[1] ** 2, sp.Rational(1, 3)]
    third = [p + q, 2]
    eqs = {"first": sp.Matrix(first), "second": sp.Matrix(second), "third": sp.Matrix(third)}
    kernel = sk.build_function(eqs, list(d), params={"p": p, "q": q, "r": r}, dtype=dtype,
                               options=C)
    reference = sk.build_function(eqs, list(d), params={"p": p, "q": q, "r": r},
                                  dtype="float64" if jax.config.jax_enable_x64 else dtype)
    assert "std::memcpy(" in kernel.source and "sk_opaque(5)" in kernel.source
    ps = {"p": -0.75, "q": 800.0 if dtype == "float64" else 80.0, "r": 1.0}
    data = np.random.default_rng(3).uniform(-2, 2, (2 * loops.GRAIN + 5, 5)).astype(dtype)
    whole = kernel(data, ps)
    expected = reference(data, ps)
    for name in eqs:
        np.testing.assert_allclose(np.asarray(whole[name], np.float64),
                                   np.asarray(expected[name], np.float64),
                                   rtol=1e-13 if dtype == "float64" else 1e-6, atol=1e-30)
    # each batch size puts a sample in a block or in the samples after the last block
    for n in (1, 7, 8, 9, 17, 2 * loops.GRAIN + 5):
        part = kernel(data[:n], ps)
        for name in eqs:
            np.testing.assert_array_equal(np.asarray(part[name]), np.asarray(whole[name])[:n])


def test_outputs_stream_from_the_last_level_cache_size_at_most_stream_from_at_most(monkeypatch):
    # a cache below the cap is the threshold; a larger one (a virtual machine's view of its
    # host's whole cache) is the cap, on both sides of it
    cap = memory.STREAM_FROM_AT_MOST
    for cache, threshold in ((8 * 2**20, 8 * 2**20), (cap - 1, cap - 1), (cap, cap),
                             (cap + 1, cap), (480 * 2**20, cap)):
        monkeypatch.setattr(memory, "last_level_cache_bytes", lambda cache=cache: cache)
        assert memory.stream_from_bytes() == threshold
    if loops.compiler() is not None:  # the kernel takes the threshold when it is built
        kernel = sk.build_function(sp.Matrix([x * y]), [x, y], options=C)
        assert kernel.program.stream_from == cap


def test_outputs_stream_from_the_last_level_cache_size():
    cache = memory.last_level_cache_bytes()
    below = [jax.ShapeDtypeStruct((cache // 16 - 1, 2), np.float64)]  # 16 bytes a row
    at = [jax.ShapeDtypeStruct((cache // 16, 1), np.float64),
          jax.ShapeDtypeStruct((cache // 16, 1), np.float64)]
    assert not loops.streams(below, cache) and loops.streams(at, cache)


@needs_compiler
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_outputs_past_the_caches_have_the_bits_of_outputs_through_them(dtype, monkeypatch):
    # rows of 7, 3 and 2 entries with entries no data reaches (copied into the stage once a
    # call), and samples whose exp is outside its inline form's condition (their block is
    # computed sample by sample, straight into the result)
    d = sp.symbols("d0:3")
    eqs = {"first": sp.Matrix([d[0] * p, 0, sp.exp(d[1]), 1, d[2] ** 2, p, sp.cos(d[0])]),
           "second": sp.Matrix([sp.Rational(1, 3), d[1] - d[2], p ** 2]),
           "third": sp.Matrix([2, d[0]])}
    data = np.random.default_rng(5).uniform(-2, 2, (2 * loops.GRAIN + 5, 3)).astype(dtype)
    data[::37, 1] = 1e3  # exp(1000) is outside the condition: its block runs `each`
    ps, sizes = {"p": 0.625}, (1, 8, 9, 17, 2 * loops.GRAIN + 5)
    through = sk.build_function(eqs, list(d), params={"p": p}, dtype=dtype, options=C)
    assert "stream = 0 : i64" in through.hlo(data[:9], ps)
    wanted = [through(data[:n], ps) for n in sizes]
    monkeypatch.setattr(memory, "last_level_cache_bytes", lambda: 1)  # every output streams
    past = sk.build_function(eqs, list(d), params={"p": p}, dtype=dtype, options=C)
    assert "stream = 1 : i64" in past.hlo(data[:9], ps)
    for n, want in zip(sizes, wanted, strict=True):
        got = past(data[:n], ps)
        for name in eqs:
            np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]))
    assert np.isinf(np.asarray(got["first"])[::37, 2]).all()


HUGE_PAGES = r"""
import json, sys
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np, sympy as sp, symkern as sk
from symkern.kernels.memory import huge_page_bytes

x, y = sp.symbols("x y")
kernel = sk.build_function(sp.Matrix([x * y, sp.sin(x), x + 1, y]), [x, y], dtype="float64",
                           options=sk.BuildOptions(cpu_loop="c"))


def regions():
    found, start = [], None
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            start = [int(v, 16) for v in head[0].split("-")]
        elif head[0] == "VmFlags:":
            found.append((*start, "hg" in head[1:]))
    return found


result = {"huge": huge_page_bytes()}
for label, rows in (("large", int(sys.argv[1])), ("small", int(sys.argv[2]))):
    data = np.random.default_rng(0).standard_normal((rows, 2))
    # the call returns before its loop has run (JAX dispatches asynchronously): read the
    # mappings once it has
    out = jax.block_until_ready(kernel(data))
    begin = out.unsafe_buffer_pointer()
    end = begin + out.nbytes
    advised = [(max(lo, begin), min(hi, end)) for lo, hi, hg in regions()
               if hg and lo < end and hi > begin]
    result[label] = {"begin": begin, "end": end, "advised": advised,
                     "error": float(np.max(np.abs(np.asarray(out)[:, 1] - np.sin(data[:, 0]))))}
print(json.dumps(result))
"""


@needs_compiler
@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc")
def test_the_whole_huge_pages_of_an_output_are_advised_and_nothing_else():
    # large: 200,000 samples of 4 float64 entries, 6.4 MB, which hold at least one whole
    # 2 MiB huge page; small: 2,000 samples, 64 KB, which hold none
    done = subprocess.run([sys.executable, "-c", HUGE_PAGES, "200000", "2000"],
                          capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    huge = result["huge"]
    if not huge:
        pytest.skip("transparent huge pages are off on this machine")
    for label in ("large", "small"):
        assert result[label]["error"] < 1e-15, result[label]
        begin, end = result[label]["begin"], result[label]["end"]
        inside = [-(-begin // huge) * huge, end // huge * huge]
        expected = [inside] if inside[1] > inside[0] else []
        assert result[label]["advised"] == expected, (label, result, expected)
    assert result["large"]["advised"] and not result["small"]["advised"]


@needs_compiler
def test_the_loop_is_what_is_shown_and_what_runs():
    kernel = sk.build_function(sp.Matrix([sp.sin(x) * p, y]), [x, y], params={"p": p},
                               dtype="float64", options=C)
    data = np.ones((4, 2))
    assert "for (int64_t i = lo; i < hi; ++i)" in kernel.source
    assert "def kernel(" in kernel.program.portable.source
    assert kernel.program.printed.symbol in kernel.hlo(data, {"p": 1.0})
    assert "custom_call" in kernel.hlo(data, {"p": 1.0})
    assert "cpu_loop='c'" in repr(kernel)
    assert kernel.tune(data, {"p": 1.0})["rounds"] == 0  # each equation is written whole
    # the exported program is the XLA one: it holds no custom call of this process
    loaded = sk.load(kernel.export(data, {"p": 1.0}), kernel.const_args)
    np.testing.assert_allclose(loaded(data, {"p": 1.0}), kernel(data, {"p": 1.0}), rtol=1e-15)
    assert kernel.program.printed.symbol not in str(jax.make_jaxpr(
        lambda d: loaded(d, {"p": 1.0}))(data))


@needs_compiler
def test_derivatives_are_the_xla_programs():
    eqs = sp.Matrix([sp.sin(x) * p + y ** 3, sp.tanh(x * y)])
    kernel = sk.build_function(eqs, [x, y], params={"p": p}, dtype="float64", options=C)
    xla = sk.build_function(eqs, [x, y], params={"p": p}, dtype="float64")
    data = np.random.default_rng(3).normal(size=(7, 2))
    for f in (jax.jacfwd, jax.jacrev, jax.hessian):
        np.testing.assert_allclose(f(lambda d: kernel(d, {"p": 0.7}).sum(0))(data),
                                   f(lambda d: xla(d, {"p": 0.7}).sum(0))(data), rtol=1e-13)
    np.testing.assert_allclose(jax.grad(lambda q: kernel(data, {"p": q}).sum())(0.7),
                               jnp.sum(jnp.sin(data[:, 0])), rtol=1e-13)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: sk.build_function(sp.besselj(0, x), [x], dtype="float64", options=C), "besselj"),
    (lambda: sk.build_function(sp.Max(x, y), [x, y], dtype="float64", options=C), "Max"),
    (lambda: sk.build_function(x > 0, [x], dtype="float64", options=C), "condition"),
    (lambda: sk.build_function(x * sp.I, [x], options=C), "complex"),
    (lambda: sk.build_function(sp.MatrixSymbol("M", 2, 2)[0, 0] * x, sp.MatrixSymbol("M", 2, 2),
                               x, dtype="float64", options=C), "MatrixSymbol"),
    (lambda: sk.build_function(sp.Function("f")(x), [x], dtype="float64", options=C,
                               functions={"f": jnp.sin}), "functions"),
    (lambda: sk.build_function({"v": x, "w": p}, [x], params={"p": p}, dtype="float64",
                               options=sk.BuildOptions(cpu_loop="c",
                                                       constant_outputs="unbatched")),
     "unbatched"),
    (lambda: sk.build_function(p ** 2, params={"p": p}, dtype="float64", options=C),
     "no data argument"),
    (lambda: sk.build_function(sp.MatrixSymbol("W", 2, 2) * sp.MatrixSymbol("v", 2, 1),
                               sp.MatrixSymbol("v", 2, 1), params={"W": sp.MatrixSymbol("W", 2, 2)},
                               dtype="float64", options=C),
     "whole arrays without one"),
    (lambda: sk.BuildOptions(cpu_loop="C"), "cpu_loop: expected one of"),
])
def test_what_the_loop_cannot_compute_is_refused_by_name(make, message):
    with pytest.raises(BuildError, match=message):
        make()


def test_without_a_compiler_the_build_says_so(monkeypatch):
    monkeypatch.setenv(loops.COMPILER_ENV, "no-such-compiler-of-symkern")
    with pytest.raises(BuildError, match="no C\\+\\+ compiler"):
        sk.build_function(sp.sin(x) * y + 0.125, [x, y], dtype="float64", options=C)


@needs_compiler
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_block_with_an_angle_outside_the_polynomials_range_takes_the_library(dtype):
    eqs = sp.Matrix([sp.sin(x) * p + sp.cos(y), sp.sin(x + y)])
    kernel = sk.build_function(eqs, [x, y], params={"p": p}, dtype=dtype, options=C)
    xla = sk.build_function(eqs, [x, y], params={"p": p}, dtype=dtype)
    data = np.random.default_rng(4).uniform(-3, 3, size=(40, 2)).astype(dtype)
    data[3, 0], data[17, 1], data[25, 0], data[33, 1] = 3e7, np.inf, np.nan, -5e6
    got, want = np.asarray(kernel(data, {"p": 2.0})), np.asarray(xla(data, {"p": 2.0}))
    np.testing.assert_allclose(got, want, rtol=2e-6 if dtype == "float32" else 1e-13,
                               atol=1e-6 if dtype == "float32" else 1e-14)
    assert np.isnan(got[[17, 25]]).all() and np.isfinite(got[[3, 33]]).all()
    # the samples of a block computed again one by one keep the bits a clean block gives them
    clean = data.copy()
    clean[[3, 17, 25, 33]] = 0.5
    again = np.asarray(kernel(clean, {"p": 2.0}))
    untouched = [k for k in range(40) if k not in (3, 17, 25, 33)]
    np.testing.assert_array_equal(got[untouched], again[untouched])


def _ulps(got: np.ndarray, points: np.ndarray, exact, dtype: str) -> np.ndarray:
    """|got - exact| in units of the last place of the exact value in `dtype`."""
    want = [exact(mpmath.mpf(float(v))) for v in points]
    spacing = np.spacing(np.abs(np.array([float(w) for w in want], dtype=dtype)))
    return np.array([float(abs(mpmath.mpf(float(g)) - w)) for g, w in zip(got, want, strict=True)]
                    ) / spacing


#: the inline functions' points: across each condition's range, around each branch's edge
_INLINE_POINTS = {
    "exp": lambda r: np.concatenate([r.uniform(-708, 708, 300), r.uniform(-1, 1, 300),
                                     [-708.0, 708.0, 0.0, 1e-300, -0.34657359027997264]]),
    "log": lambda r: np.concatenate([np.exp(r.uniform(-700, 700, 300)), r.uniform(0.6, 1.6, 300),
                                     [1.0, np.sqrt(2.0), np.nextafter(np.sqrt(2.0), 2.0),
                                      2.2250738585072014e-308, 1.7976931348623157e308]]),
    "tanh": lambda r: np.concatenate([r.uniform(-25, 25, 300), r.uniform(-0.6, 0.6, 300),
                                      [0.5, np.nextafter(0.5, 0.0), -354.0, 19.1, 1e-300]]),
    "atan": lambda r: np.concatenate([r.uniform(-3, 3, 300),
                                      np.exp(r.uniform(-40, 40, 300)) * r.choice([-1, 1], 300),
                                      [1.0, np.nextafter(1.0, 2.0), 0.41421356237309503,
                                       1.7976931348623157e308, -1e-300]]),
}
#: float64 ulps of the inline forms at worst (measured on 10^4 points each: exp 0.75, log 0.75,
#: tanh 1.76, atan 2.13); float32 rounds the float64 form: half an ulp
_INLINE_ULPS = {"exp": 1.0, "log": 1.0, "tanh": 2.5, "atan": 2.5}


@needs_compiler
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_inline_functions_are_within_their_ulps_of_mpmath(dtype):
    # one loop of every inline function, each on a data column of its own points
    names = sorted(_INLINE_POINTS)
    columns = []
    for name in names:
        points = _INLINE_POINTS[name](np.random.default_rng(7))
        if dtype == "float32":  # within float32's normal numbers (XLA flushes subnormals)
            finfo = np.finfo(np.float32)
            keep = {"exp": np.abs(points) < 87.0,
                    "log": (points > finfo.tiny) & (points < finfo.max),
                    "tanh": np.abs(points) > finfo.tiny,
                    "atan": (np.abs(points) > finfo.tiny) & (np.abs(points) < finfo.max)}[name]
            points = points[keep]
        columns.append(points.astype(dtype))
    rows = max(len(points) for points in columns)
    data = np.stack([np.resize(points, rows) for points in columns], axis=-1)
    symbols = sp.symbols(f"z0:{len(names)}")
    entries = [getattr(sp, name)(z) for name, z in zip(names, symbols, strict=True)]
    kernel = sk.build_function(sp.Matrix(entries), list(symbols), dtype=dtype, options=C)
    got = np.asarray(kernel(data))
    for column, name in enumerate(names):
        assert f"sk_{name}_core" in kernel.source  # inline, not the C library's call
        points = columns[column]
        with mpmath.workdps(40):
            ulps = _ulps(got[:len(points), column], points, getattr(mpmath, name), dtype)
        bound = 0.5 if dtype == "float32" else _INLINE_ULPS[name]
        assert ulps.max() <= bound, f"{name} at {points[ulps.argmax()]!r}: {ulps.max():.2f} ulps"


def _inline_forms(dtype: str, tmp_path: Path) -> Any:
    """c_math's inline forms of `dtype` alone in a library, each function's condition and core
    exported as `within_F` and `core_F` (ctypes, one value)."""
    c_type = c_math.C_TYPES[dtype]
    names = [f.__name__ for f in c_math.INLINE_FUNCTIONS]
    exported = "".join(f'extern "C" bool within_{n}({c_type} x) {{ return sk_{n}_within(x); }}\n'
                       f'extern "C" {c_type} core_{n}({c_type} x) {{ return sk_{n}_core(x); }}\n'
                       for n in names)
    source = tmp_path / "forms.cc"
    source.write_text("#include <cmath>\n#include <cstdint>\n" + c_math.ATTRIBUTES
                      + c_math.inline_source(set(c_math.INLINE_FUNCTIONS), dtype) + exported)
    flags = [f for f in loops.FLAGS if f != "-w"]
    subprocess.run([loops.compiler(), *flags, str(source), "-o", str(tmp_path / "forms.so")],
                   check=True, capture_output=True)
    library = ctypes.CDLL(str(tmp_path / "forms.so"))
    c_value = ctypes.c_float if dtype == "float32" else ctypes.c_double
    for n in names:
        getattr(library, f"within_{n}").restype = ctypes.c_bool
        getattr(library, f"within_{n}").argtypes = [c_value]
        getattr(library, f"core_{n}").restype = c_value
        getattr(library, f"core_{n}").argtypes = [c_value]
    return library


@needs_compiler
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_saturated_tanh_and_infinite_atan_are_inline_with_the_librarys_bits(dtype, tmp_path):
    # tanh past TANH_SATURATES and atan at any magnitude are the inline forms' (a saturated
    # tanh does not send its block sample by sample), with the C library's bits; only NaN is
    # outside their conditions. -0 keeps its sign.
    forms = _inline_forms(dtype, tmp_path)
    big = float(np.finfo(dtype).max)
    points = [0.0, -0.0, 0.3, -0.49, 0.5, 19.0, 19.1, 20.0, -20.0, 20.5, 354.0, -355.0, 1e4, 1e30,
              big, -big, np.inf, -np.inf]
    for name, library in (("tanh", np.tanh), ("atan", np.arctan)):
        within, core = getattr(forms, f"within_{name}"), getattr(forms, f"core_{name}")
        assert not within(np.nan)
        for point in points:
            value = np.asarray(point, dtype)
            assert within(float(value)), (name, point)
            got = np.asarray(core(float(value)), dtype)
            assert np.signbit(got) == np.signbit(value), (name, point)
            if abs(point) >= (c_math.TANH_SATURATES if name == "tanh" else 1e17):
                # past where the value is 1 (tanh) or pi/2 (atan) in both dtypes
                assert got.tobytes() == library(value).tobytes(), (name, point, got)
            else:
                with mpmath.workdps(40):
                    ulps = _ulps(got[None], value[None], getattr(mpmath, name), dtype)
                assert ulps.max() <= (0.5 if dtype == "float32" else _INLINE_ULPS[name]), (name, point)
    # the block's checks: saturated tanh and infinite atan are within, NaN is not
    table = c_math._table(dtype)
    assert table[sp.tanh].within("x") == table[sp.atan].within("x") == "x == x"


@needs_compiler
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_powers_of_half_odd_integers_are_square_roots_times_integer_powers(dtype):
    # pow keeps a block from being vectorized; x**(n/2) is sqrt(x) times x**(n // 2)
    exponents = [sp.Rational(n, 2) for n in (-7, -5, -3, 3, 5, 9, 129)]
    eqs = [x ** e for e in exponents] + [(1 + x ** 2) ** sp.Rational(3, 2) + y ** sp.Rational(-3, 2)]
    kernel = sk.build_function(sp.Matrix(eqs), [x, y], dtype=dtype, options=C)
    assert not re.search(r"\bpowf?\(", kernel.source.split("static void each")[1])
    rng = np.random.default_rng(3)
    data = np.stack([rng.uniform(-1.5, 1.5, 100), rng.uniform(0.5, 1.5, 100)], -1).astype(dtype)
    data[:2, 0] = (-0.0, 0.0)
    got = np.asarray(kernel(data))
    with mpmath.workdps(40):
        for column, e in enumerate(exponents):
            for k, a in enumerate(data[:, 0].astype(np.float64)):
                if a <= 0:  # NaN for a negative base, 0 or inf at either zero, as pow gives
                    assert got[k, column] == (0 if e > 0 else np.inf) or a < 0, (e, a)
                    assert not np.isnan(got[k, column]) or a < 0, (e, a)
                    assert np.isnan(got[k, column]) or a == 0, (e, a)
                    continue
                want = mpmath.power(mpmath.mpf(a), mpmath.mpf(e.p) / e.q)
                if not np.finfo(dtype).tiny <= want <= np.finfo(dtype).max:
                    continue  # past the dtype's normal numbers, as its squarings are
                ulp = np.spacing(np.abs(np.asarray(float(want), dtype)))
                # sqrt and the product half an ulp each, and x**w by repeated squaring as
                # integer powers are (XLA's integer_pow too): up to (w - 1) half ulps
                whole = abs(e.p) // 2
                assert abs(float(got[k, column]) - float(want)) <= 0.5 * (whole + 2) * ulp, (e, a)
    # a compound base, beside the XLA program's pow
    want = np.asarray(sk.build_function(sp.Matrix(eqs), [x, y], dtype=dtype)(data))
    np.testing.assert_allclose(got[:, -1], want[:, -1], rtol=8 * np.finfo(dtype).eps)


@needs_compiler
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_block_with_an_argument_outside_a_condition_takes_the_library(dtype):
    eqs = sp.Matrix([sp.exp(x) + sp.log(y), sp.tanh(x * y) + sp.atan(x / y)])
    kernel = sk.build_function(eqs, [x, y], dtype=dtype, options=C)
    xla = sk.build_function(eqs, [x, y], dtype=dtype)
    data = np.random.default_rng(5).uniform(0.5, 3, size=(40, 2)).astype(dtype)
    # exp's 708, log's zero, a NaN; a saturated tanh and an infinite atan, within theirs
    data[3, 0], data[17, 1], data[25, 0], data[33, 1] = 800.0, 0.0, -400.0, np.nan
    data[38] = (np.inf, 2.0)
    got, want = np.asarray(kernel(data)), np.asarray(xla(data))
    np.testing.assert_allclose(got, want, rtol=2e-6 if dtype == "float32" else 1e-14)
    clean = data.copy()
    clean[[3, 17, 25, 33, 38]] = 0.5
    again = np.asarray(kernel(clean))
    untouched = [k for k in range(40) if k not in (3, 17, 25, 33, 38)]
    np.testing.assert_array_equal(got[untouched], again[untouched])


def test_a_block_is_split_where_its_statements_pass_section_operations(monkeypatch):
    # x + y + p: 2 operations; exp(x*y): 1 + 1 + INLINE_OPERATIONS; the block is one section
    # up to exactly their sum, and its sections hold them together up to their sum
    first, second = x + y + p, sp.exp(x * y)
    items = [printing._Statement([], printing._walk(value, {x, y}), None)
             for value in (first, second)]
    total = 4 + printing.INLINE_OPERATIONS
    # one section up to SECTIONS_ABOVE_OPERATIONS whatever SECTION_OPERATIONS is
    monkeypatch.setattr(printing, "SECTION_OPERATIONS", 1)
    for above, groups in ((total, [2]), (total - 1, [1, 1])):
        monkeypatch.setattr(printing, "SECTIONS_ABOVE_OPERATIONS", above)
        assert [len(group) for group in printing._sections(items)] == groups
    # past it, sections of at most SECTION_OPERATIONS
    monkeypatch.setattr(printing, "SECTIONS_ABOVE_OPERATIONS", 0)
    for budget, groups in ((total, [2]), (total - 1, [1, 1]), (1, [1, 1])):
        monkeypatch.setattr(printing, "SECTION_OPERATIONS", budget)
        assert [len(group) for group in printing._sections(items)] == groups


@needs_compiler
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_long_block_in_sections_gives_the_bits_of_one_block(dtype, monkeypatch):
    # values shared between entries of several equations (they pass from section to section
    # through V), parameters and a function of them computed once a call (read from H),
    # entries no data reaches, inline functions and pow, and samples outside exp's condition
    # (the whole block again sample by sample)
    d = sp.symbols("d0:4")
    q, r = sp.symbols("q r")
    shared = sp.sin(d[0] * d[1]) + sp.exp(q)
    other = sp.log(1 + d[2] ** 2) * sp.tanh(r * d[3])
    eqs = {"first": sp.Matrix([shared * other, sp.exp(d[0]) + q, 2, (2 + d[1] ** 2) ** r]),
           "second": sp.Matrix([sp.atan(shared) - other, sp.cos(d[3]) * shared ** 3, q * r]),
           "third": other + sp.exp(r) * d[2]}
    params = {"q": q, "r": r}
    builds = {}
    for label, budget in (("whole", 10**9), ("sections", 40)):
        monkeypatch.setattr(printing, "SECTIONS_ABOVE_OPERATIONS", budget)
        monkeypatch.setattr(printing, "SECTION_OPERATIONS", budget)
        builds[label] = sk.build_function(eqs, list(d), params=params, dtype=dtype, options=C)
    assert "sk_section_" not in builds["whole"].source
    assert "sk_section_3(" in builds["sections"].source and "V[" in builds["sections"].source
    for build in builds.values():
        # exp(r) inside an entry data reaches is computed once a call (`h_K`): no block
        # checks or computes a function of parameters alone
        assert re.search(r"const \w+ h_\d+ = sk_exp\(p_1\);", build.source)
        assert not re.search(r"(_within|_core)\(p_\d+\)", build.source)
    reference = sk.build_function(eqs, list(d), params=params,
                                  dtype="float64" if jax.config.jax_enable_x64 else dtype)
    data = np.random.default_rng(8).uniform(-2, 2, (2 * loops.GRAIN + 21, 4)).astype(dtype)
    data[[5, 40, 41]] = 800.0  # exp(d0) out of its inline form's range
    ps = {"q": 0.3, "r": -0.6}
    want = reference(data, ps)
    for n in (1, 8, 9, 17, 64, 2 * loops.GRAIN + 21):
        whole, sections = builds["whole"](data[:n], ps), builds["sections"](data[:n], ps)
        for name in eqs:
            np.testing.assert_array_equal(np.asarray(sections[name]), np.asarray(whole[name]))
            np.testing.assert_allclose(np.asarray(sections[name], np.float64),
                                       np.asarray(want[name], np.float64)[:n],
                                       rtol=1e-12 if dtype == "float64" else 2e-5,
                                       atol=1e-14 if dtype == "float64" else 1e-6)


@needs_compiler
def test_an_entry_deeper_than_the_recursion_limit_is_one_loop():
    # SymPy's walks, its cse and its printer recurse on depth; the loop prints assignments of
    # bounded depth (symkern.codegen.linearize), and the XLA program beside it is built
    # without a recursive walk too
    deep = x
    for k in range(1000):
        inner = sp.sin(deep, evaluate=False) if k % 20 == 0 else deep
        deep = sp.Add(sp.Mul(sp.Float(0.5 + k % 7 / 16), inner, evaluate=False), y,
                      evaluate=False)
    kernel = sk.build_function(deep, [x, y], dtype="float64", options=C)
    xla = sk.build_function(deep, [x, y], dtype="float64")
    data = np.random.default_rng(6).normal(size=(19, 2))
    np.testing.assert_allclose(kernel(data), xla(data), rtol=1e-12)
