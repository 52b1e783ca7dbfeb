"""Numerical policy: NaN and inf propagate, integer inputs are cast, dtypes, Piecewise edges.

The documented rules (README "dtype"): a kernel computes in float32 by default, float64
when jax_enable_x64 is on (or with `dtype=`); every input — NumPy or JAX, bool, int or
float of any width — is cast to the kernel's dtype before the call; complex and
non-numeric inputs are rejected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp

import symkern as sk

x, y, a = sp.symbols("x y a")
nan, inf = np.nan, np.inf


# ---- NaN and inf propagate ------------------------------------------------------------------

PROPAGATION = [
    # expression, input x, expected (what IEEE arithmetic and the math say)
    (sp.sin(x), nan, nan),
    (sp.sin(x), inf, nan),
    (x + 1, inf, inf),
    (x + 1, -inf, -inf),
    (x - x, inf, nan),        # SymPy folds x - x to 0 symbolically; see below
    (x * 0 + sp.exp(x), inf, inf),
    (sp.exp(x), -inf, 0.0),
    (sp.exp(x), nan, nan),
    (1 / x, 0.0, inf),
    (1 / x, -0.0, -inf),
    (1 / x, inf, 0.0),
    (sp.log(x), 0.0, -inf),
    (sp.log(x), -1.0, nan),
    (sp.sqrt(x), -1.0, nan),
    (sp.tanh(x), inf, 1.0),
    (sp.atan(x), -inf, -np.pi / 2),
    (sp.Abs(x), -inf, inf),
    (sp.Abs(x), nan, nan),
    (x**2, nan, nan),
    (x**2, -inf, inf),
    (sp.Max(x, 1), nan, nan),
    (sp.Min(x, 1), nan, nan),
    (sp.Max(x, 1), inf, inf),
    (sp.floor(x), nan, nan),
    (sp.sign(x), nan, nan),
    (sp.Piecewise((x, x < 0.5), (x**2, True)), nan, nan),     # no branch taken → default, nan
    (sp.Piecewise((x, x < 0.5), (x**2, True)), -inf, -inf),
    (sp.Piecewise((x, x < 0.5), (x**2, True)), inf, inf),
]


@pytest.mark.parametrize("cse", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nan_and_inf_propagate_where_math_says_so(dtype, cse):
    """One kernel holds every expression; sample k is the input of expression k."""
    exprs = [expr for expr, _, _ in PROPAGATION]
    kernel = sk.build_function(exprs, x, cse=cse, dtype=dtype)
    values = np.array([value for _, value, _ in PROPAGATION] + [0.25], dtype=dtype)
    outputs = kernel(values)
    for k, (expr, value, expected) in enumerate(PROPAGATION):
        out = np.asarray(outputs[k])
        assert out.dtype == np.dtype(dtype)
        # x - x is folded to 0 by SymPy before symkern sees it: 0 is the symbolic answer
        want = 0.0 if expr == 0 else expected
        np.testing.assert_array_equal(out[k], np.array(want, dtype=dtype),
                                      err_msg=f"{expr} at x = {value}")
        np.testing.assert_allclose(out[-1], float(expr.subs(x, 0.25).evalf()), rtol=1e-6,
                                   err_msg=f"{expr} at x = 0.25")


def test_nan_in_a_parameter_or_one_sample_stays_in_its_own_outputs():
    kernel = sk.build_function(sp.Matrix([x * a, y + 1]), [x, y], params={"a": a},
                               dtype="float64")
    X = np.array([[1.0, 2.0], [nan, 3.0], [4.0, inf]])
    out = np.asarray(kernel(X, {"a": 2.0}))
    np.testing.assert_array_equal(out, [[2.0, 3.0], [nan, 4.0], [8.0, inf]])
    out = np.asarray(kernel(X, {"a": nan}))
    assert np.isnan(out[:, 0]).all()
    np.testing.assert_array_equal(out[:, 1], [3.0, 4.0, inf])


def test_piecewise_with_a_nan_condition_takes_the_otherwise_branch():
    """Documented behaviour, not an accident: every comparison with NaN is False (IEEE),
    so a NaN input picks the `True` (otherwise) branch — as NumPy's `select` does. A
    branch value that reads the NaN input is NaN itself (above); a constant one is not."""
    kernel = sk.build_function(sp.Piecewise((1.0, x < 0.5), (2.0, True)), x, dtype="float64")
    np.testing.assert_array_equal(kernel(np.array([nan, 0.0])), [2.0, 1.0])
    # and no branch at all: NaN, never a silent zero
    partial = sk.build_function(sp.Piecewise((1.0, x < 0.5)), x, dtype="float64")
    np.testing.assert_array_equal(partial(np.array([nan, 0.0, 1.0])), [nan, 1.0, nan])


def test_inf_and_nan_in_gradients_are_not_replaced():
    kernel = sk.build_function(sp.sqrt(x), x, dtype="float64")
    grad = jax.grad(lambda v: kernel(v))(jnp.float64(0.0))
    assert np.isposinf(grad)
    grad = jax.grad(lambda v: kernel(v))(jnp.float64(nan))
    assert np.isnan(grad)


# ---- integer and other inputs are cast to the kernel's dtype -----------------------------

INPUT_DTYPES = ["int8", "int32", "int64", "uint8", "bool", "float16", "float32", "float64"]


@pytest.mark.parametrize("kernel_dtype", ["float32", "float64"])
def test_inputs_are_cast_to_the_kernel_dtype(kernel_dtype):
    kernel = sk.build_function(sp.Matrix([x * a + 1, x / 2]), x, params={"a": a},
                               dtype=kernel_dtype)
    def sweep():
        for input_dtype in INPUT_DTYPES:
            values = np.array([0, 1, 1], dtype=input_dtype)
            parameter = np.array(3).astype(input_dtype)     # True for bool
            p = float(parameter)
            for data in (values, jnp.asarray(values)):
                out = kernel(data, {"a": parameter})
                assert out.dtype == np.dtype(kernel_dtype), input_dtype
                np.testing.assert_array_equal(
                    np.asarray(out), np.array([[1, 0], [p + 1, 0.5], [p + 1, 0.5]], kernel_dtype),
                    err_msg=input_dtype)

    sweep()
    # the first call casts on the host; repeated calls hand bool and float arguments to jit
    # as they are (the direct path), which casts inside: one program per such input dtype,
    # numpy and jax arrays of one dtype sharing it. Integer arrays are always cast on the
    # host (jit would wrap 64-bit ones, jax#18385), sharing the kernel dtype's program.
    # None more on a second sweep.
    compiled = kernel.compilations
    integers = [d for d in INPUT_DTYPES if np.dtype(d).kind in "iu"]
    assert compiled == len(INPUT_DTYPES) - len(integers)
    sweep()
    assert kernel.compilations == compiled


def test_large_integers_are_rounded_like_the_cast_to_float():
    kernel = sk.build_function(x, x, dtype="float64")
    big = np.array([2**53 + 1, -(2**62)], dtype=np.int64)
    np.testing.assert_array_equal(kernel(big), big.astype(np.float64))
    kernel32 = sk.build_function(x, x, dtype="float32")
    np.testing.assert_array_equal(kernel32(np.array([16777217], np.int32)),
                                  np.array([16777217], np.int32).astype(np.float32))


def test_python_scalars_and_lists_are_accepted_and_cast():
    kernel = sk.build_function(x * a, x, params={"a": a}, dtype="float64")
    assert kernel(3, {"a": 2}).dtype == np.float64
    assert float(kernel(3, {"a": True})) == 3.0
    np.testing.assert_array_equal(kernel([1, 2], {"a": 2}), [2.0, 4.0])


@pytest.mark.parametrize("bad", [np.array([1 + 2j]), np.array(["1.0"]), np.array([None])])
def test_complex_and_non_numeric_inputs_are_rejected(bad):
    kernel = sk.build_function(x + 1, x, dtype="float64")
    with pytest.raises(sk.ArgumentError, match="x1: expected (an array of )?real numbers"):
        kernel(bad)


def test_float64_input_into_a_float32_kernel_is_cast():
    kernel = sk.build_function(x + 1, x, dtype="float32")
    with np.errstate(over="ignore"):
        out = kernel(np.array([0.1, 1e300, -1e-300], np.float64))
        expected = np.array([0.1, 1e300, -1e-300]).astype(np.float32) + np.float32(1)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(out), expected)   # 1e300 → inf, as the cast says


def test_default_dtype_is_float64_with_x64():
    assert jax.config.jax_enable_x64  # tests/conftest.py
    kernel = sk.build_function(x + 1, x)
    assert kernel.dtype == np.float64
    assert kernel(np.array([1, 2], np.int32)).dtype == np.float64
    assert float(kernel(np.float64(1e-17))) == 1.0 + 1e-17


WITHOUT_X64 = textwrap.dedent("""
    import json
    import jax
    import numpy as np
    import sympy as sp
    import symkern as sk

    assert not jax.config.jax_enable_x64
    x = sp.Symbol("x")
    report = {}
    kernel = sk.build_function(sp.sin(x) + x, x)
    report["default_dtype"] = kernel.dtype.name
    for name in ("float64", "int64", "int32", "bool"):
        out = kernel(np.array([1, 0], dtype=name))
        report[name] = [str(out.dtype), np.asarray(out).tolist()]
    report["nan_inf"] = [str(v) for v in np.asarray(kernel(np.array([np.nan, np.inf, -np.inf])))]
    try:
        sk.build_function(x, x, dtype="float64")
        report["float64_build"] = "built"
    except sk.BuildError as error:
        report["float64_build"] = str(error)
    print(json.dumps(report))
""")


def test_default_dtype_is_float32_without_x64_in_a_fresh_process():
    env = dict(os.environ, JAX_ENABLE_X64="0", JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", WITHOUT_X64], env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout)
    expected = [float(np.float32(np.sin(np.float32(1))) + np.float32(1)), 0.0]
    assert report["default_dtype"] == "float32"
    for name in ("float64", "int64", "int32", "bool"):
        dtype, values = report[name]
        assert dtype == "float32", name
        np.testing.assert_allclose(values, expected, rtol=1e-6)
    assert report["nan_inf"] == ["nan", "nan", "nan"]
    assert "float64 needs jax.config.update('jax_enable_x64', True)" in report["float64_build"]


# ---- Piecewise is exact at its boundaries ------------------------------------------------

BOUNDARY = 0.5  # exact in binary at both dtypes
RELATIONS = {
    "Lt": (sp.Lt, [True, False, False]),
    "Le": (sp.Le, [True, True, False]),
    "Gt": (sp.Gt, [False, False, True]),
    "Ge": (sp.Ge, [False, True, True]),
    "Eq": (sp.Eq, [False, True, False]),
    "Ne": (sp.Ne, [True, False, True]),
}


@pytest.mark.parametrize("cse", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_piecewise_picks_the_right_branch_at_its_boundary(dtype, cse):
    names = sorted(RELATIONS)
    pieces = {name: sp.Piecewise((x + 10, RELATIONS[name][0](x, BOUNDARY)), (x - 10, True))
              for name in names}
    kernel = sk.build_function(pieces, x, cse=cse, dtype=dtype)
    boundary = np.array(BOUNDARY, dtype)
    values = np.array([np.nextafter(boundary, np.array(-1, dtype)), boundary,
                       np.nextafter(boundary, np.array(2, dtype))], dtype=dtype)
    outputs = kernel(values)
    for name in names:
        expected = np.where(RELATIONS[name][1], values + 10, values - 10).astype(dtype)
        np.testing.assert_array_equal(np.asarray(outputs[name]), expected, err_msg=name)
        # and SymPy agrees on every sample
        for value, want in zip(values, expected, strict=True):
            symbolic = pieces[name].subs(x, sp.Float(float(value), 30))
            assert float(symbolic) == pytest.approx(float(want), abs=1e-6), name


def test_piecewise_boundary_on_a_parameter_and_between_two_data_entries():
    kernel = sk.build_function(sp.Piecewise((1, x <= a), (2, sp.Eq(x, y)), (3, True)), [x, y],
                               params={"a": a}, dtype="float64")
    X = np.array([[0.5, 0.0], [0.75, 0.75], [0.75, 0.7], [0.25, 0.25]])
    np.testing.assert_array_equal(kernel(X, {"a": 0.5}), [1.0, 2.0, 3.0, 1.0])


def test_piecewise_gradient_at_the_boundary_is_the_taken_branchs():
    kernel = sk.build_function(sp.Piecewise((x**2, x < 1), (3 * x, True)), x, dtype="float64")
    assert float(jax.grad(kernel)(jnp.float64(1.0))) == 3.0
    assert float(jax.grad(kernel)(jnp.float64(np.nextafter(1.0, 0)))) == pytest.approx(2.0)
