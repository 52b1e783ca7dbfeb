"""What lambdify returns and takes beyond real numbers of one batch shape: conditions as bool
arrays, data arguments whose batch shapes broadcast, sums up to an integer parameter, and
complex kernels. Each against `sympy.lambdify(..., "numpy")` in float64, through jax.jit,
jax.vmap, jax.grad where it has a meaning, and export/load."""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st
from sympy.logic.boolalg import ITE

import symkern as sk
from symkern.batching import build
from symkern.codegen import passes

jax.config.update("jax_enable_x64", True)

x, y, a = sp.symbols("x y a")
FLOAT0 = jax.dtypes.float0


def _matrix_of_conditions(rows: list) -> sp.Matrix:
    # SymPy deprecates non-Expr entries in a Matrix but builds it; lambdify users write it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sp.Matrix(rows)


def _samples(count: int, seed: int = 0) -> np.ndarray:
    values = np.random.default_rng(seed).choice([-1.0, -0.5, 0.0, 0.5, 1.0, 2.0], (count, 2))
    return values


# ---- conditions as bool arrays ---------------------------------------------------------

CONDITIONS = {
    "greater": x > 0,
    "eq": sp.Eq(x, y),
    "ne": sp.Ne(x, y),
    "and": sp.And(x > 0, y < 1),
    "or": sp.Or(x > y, sp.Eq(y, 0)),
    "not": sp.Not(x >= y),
    "xor": sp.Xor(x > 0, y > 0),
    "ite": ITE(x > 0, y > 0, y < 0),
    "true": sp.true,
}


def test_each_condition_is_a_bool_array_equal_to_lambdify():
    kernel = sk.build_function(CONDITIONS, [x, y], dtype="float64")
    data = _samples(12)
    expected = {name: np.broadcast_to(np.asarray(
        sp.lambdify([x, y], condition, "numpy")(data[:, 0], data[:, 1]), bool), (12,))
        for name, condition in CONDITIONS.items()}
    loaded = sk.load(kernel.export(data))
    for result in (kernel(data), jax.jit(kernel)(data), loaded(data),
                   jax.tree_util.tree_map(lambda leaf: leaf.reshape(12),
                                          jax.vmap(kernel)(data.reshape(3, 4, 2)))):
        for name in CONDITIONS:
            assert result[name].dtype == np.bool_ and result[name].shape == (12,), name
            np.testing.assert_array_equal(result[name], expected[name], err_msg=name)
    one = kernel(data[0])
    assert all(one[name].shape == () and bool(one[name]) == expected[name][0]
               for name in CONDITIONS)


def test_a_matrix_of_conditions_is_a_bool_array_not_floats():
    matrix = _matrix_of_conditions([[x > y, sp.Ne(x, y)], [sp.And(x > 0, y > 0), x <= 0]])
    kernel = sk.build_function(matrix, [x, y], dtype="float64")
    data = _samples(7, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = sp.lambdify([x, y], matrix, "numpy")
    expected = np.stack([np.asarray(reference(*row), bool) for row in data])
    result = kernel(data)
    assert result.dtype == np.bool_ and result.shape == (7, 2, 2)
    np.testing.assert_array_equal(result, expected)
    np.testing.assert_array_equal(jax.jit(kernel)(data), expected)
    np.testing.assert_array_equal(sk.load(kernel.export(data))(data), expected)


def test_a_matrix_mixing_conditions_and_numbers_is_numeric_as_in_numpy():
    matrix = _matrix_of_conditions([x > 0, x * y])
    kernel = sk.build_function(matrix, [x, y], dtype="float64")
    data = _samples(5, seed=2)
    result = kernel(data)
    assert result.dtype == np.float64
    np.testing.assert_array_equal(result, np.stack([data[:, 0] > 0, data[:, 0] * data[:, 1]], -1))


def _mixed_kernel():
    eqs = {"b": x > a, "f": sp.sin(x) * y * a,
           "m": _matrix_of_conditions([[x > y, sp.Eq(x, y)]])}
    return sk.build_function(eqs, [x, y], params={"a": a}, dtype="float64")


def test_mixed_trees_give_each_leaf_its_own_dtype_on_every_call_path():
    kernel = _mixed_kernel()
    data = _samples(6, seed=3)
    ps = {"a": 0.25}
    expected = {"b": data[:, 0] > 0.25, "f": np.sin(data[:, 0]) * data[:, 1] * 0.25,
                "m": np.stack([data[:, 0] > data[:, 1], data[:, 0] == data[:, 1]], -1)[:, None]}
    loaded = sk.load(kernel.export(data, ps))
    for result in (kernel(data, ps), jax.jit(kernel)(data, ps),
                   jax.vmap(kernel, in_axes=(0, None))(data, ps), kernel.bind(ps)(data),
                   loaded(data, ps)):
        assert {n: v.dtype for n, v in result.items()} == {
            "b": np.bool_, "f": np.float64, "m": np.bool_}
        np.testing.assert_array_equal(result["b"], expected["b"])
        np.testing.assert_array_equal(result["m"], expected["m"])
        np.testing.assert_allclose(result["f"], expected["f"], rtol=1e-15)


def test_a_bool_output_has_no_gradient_as_in_jax():
    kernel = _mixed_kernel()
    data = _samples(6, seed=4)
    ps = {"a": 0.25}
    # the float leaf differentiates; the bool leaves' tangents are float0, as for jnp code
    gradient = jax.grad(lambda d: kernel(d, ps)["f"].sum())(data)
    np.testing.assert_allclose(gradient[:, 0], np.cos(data[:, 0]) * data[:, 1] * 0.25,
                               rtol=1e-14)
    _, tangents = jax.jvp(lambda d: kernel(d, ps), (data,), (np.ones_like(data),))
    assert tangents["b"].dtype == FLOAT0 and tangents["m"].dtype == FLOAT0
    _, reference = jax.jvp(lambda d: {"b": d[:, 0] > 0.25}, (data,), (np.ones_like(data),))
    assert reference["b"].dtype == FLOAT0
    # jax.grad of a bool output is JAX's own TypeError, for the kernel and the loaded one
    loaded = sk.load(kernel.export(data, ps))
    for function in (kernel, loaded):
        with pytest.raises(TypeError, match="grad requires real-valued outputs"):
            jax.grad(lambda d, f=function: f(d, ps)["b"].sum())(data)
        _, pullback = jax.vjp(lambda d, f=function: f(d, ps), data)
        cotangent = {"b": np.zeros(6, FLOAT0), "f": np.ones(6), "m": np.zeros((6, 1, 2), FLOAT0)}
        np.testing.assert_allclose(pullback(cotangent)[0], gradient, rtol=1e-14)
    with pytest.raises(TypeError, match="grad requires real-valued outputs"):
        jax.grad(lambda d: jnp.sum(d > 0))(data)


def test_a_condition_inside_piecewise_still_gives_a_number():
    kernel = sk.build_function(sp.Piecewise((x, ITE(x > 0, y > 0, y < 0)), (0, True)), [x, y],
                               dtype="float64")
    data = _samples(8, seed=5)
    reference = sp.lambdify([x, y], sp.Piecewise((x, ITE(x > 0, y > 0, y < 0)), (0, True)))
    assert kernel(data).dtype == np.float64
    np.testing.assert_allclose(kernel(data), [reference(*row) for row in data], rtol=0)


# ---- broadcasting between data arguments -------------------------------------------------

BROADCAST_EXPR = sp.sin(a) * x**2 + a


@functools.cache
def _broadcast_kernel():
    return sk.build_function(BROADCAST_EXPR, a, x, dtype="float64")


@pytest.mark.parametrize(("a_shape", "x_shape"), [
    ((), (5,)), ((1,), (5,)), ((4, 1), (5,)), ((4, 1), (4, 5)), ((5,), ()), ((1, 5), (3, 1)),
])
def test_data_arguments_broadcast_like_numpy(a_shape, x_shape):
    kernel = _broadcast_kernel()
    rng = np.random.default_rng(len(a_shape) * 10 + len(x_shape))
    av, xv = rng.uniform(-1, 1, a_shape), rng.uniform(-2, 2, x_shape)
    reference = sp.lambdify((a, x), BROADCAST_EXPR, "numpy")
    expected = reference(av, xv)
    batch = np.broadcast_shapes(a_shape, x_shape)
    result = kernel(av, xv)
    assert result.shape == batch
    np.testing.assert_allclose(result, expected, rtol=1e-15)
    np.testing.assert_allclose(jax.jit(kernel)(av, xv), expected, rtol=1e-15)
    np.testing.assert_allclose(sk.load(kernel.export(av, xv))(av, xv), expected, rtol=1e-15)
    gradient = jax.grad(lambda p, q: kernel(p, q).sum())(av, xv)
    np.testing.assert_allclose(gradient, _summed_to(np.cos(av) * xv**2 + 1, a_shape),
                               rtol=1e-13)


def _summed_to(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`values` summed over the axes broadcasting added to an array of `shape`."""
    values = values.sum(axis=tuple(range(values.ndim - len(shape))))
    return values.sum(axis=tuple(k for k, d in enumerate(shape) if d == 1),
                      keepdims=True).reshape(shape)


def test_vmap_over_one_argument_broadcasts_the_other():
    kernel = _broadcast_kernel()
    xs = np.linspace(-1, 1, 6)
    reference = sp.lambdify((a, x), BROADCAST_EXPR, "numpy")
    np.testing.assert_allclose(jax.vmap(kernel, in_axes=(None, 0))(0.3, xs),
                               reference(0.3, xs), rtol=1e-15)
    np.testing.assert_allclose(jax.vmap(kernel, in_axes=(0, None))(xs, xs[:4]),
                               reference(xs[:, None], xs[:4]), rtol=1e-15)


@given(st.lists(st.integers(1, 3), min_size=0, max_size=3),
       st.lists(st.sampled_from([True, False]), min_size=3, max_size=3),
       st.integers(0, 2))
def test_random_broadcastable_batch_shapes_match_numpy(shape, ones, dropped):
    # two batch shapes that broadcast: the second has 1 where `ones` says and fewer axes
    first = tuple(shape)
    second = tuple(1 if one else d for d, one in zip(first, ones, strict=False))[dropped:]
    kernel = _broadcast_vector_kernel()
    rng = np.random.default_rng(sum(first) + dropped)
    u, v = rng.uniform(-1, 1, first + (2,)), rng.uniform(-1, 1, second)
    expected = np.stack([u[..., 0] * v + u[..., 1], np.cos(v) * u[..., 1]], axis=-1)
    # XLA may fuse a multiply-add: a last-bit difference where the sum cancels
    np.testing.assert_allclose(kernel(u, v), expected, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(jax.jit(kernel)(u, v), expected, rtol=1e-13, atol=1e-15)


@functools.cache
def _broadcast_vector_kernel():
    return sk.build_function(sp.Matrix([x * a + y, sp.cos(a) * y]), [x, y], a, dtype="float64")


def test_batch_shapes_that_do_not_broadcast_name_both_arguments():
    kernel = _broadcast_kernel()
    with pytest.raises(sk.ArgumentError,
                       match=r"x2: batch shape \(5,\) does not broadcast with x1's \(3,\)"):
        kernel(np.ones(3), np.ones(5))
    three = sk.build_function(a * x * y, a, x, y, dtype="float64")
    with pytest.raises(sk.ArgumentError,
                       match=r"x3: batch shape \(4,\) does not broadcast with x2's \(3,\)"):
        three(np.ones((3, 1)), np.ones(3), np.ones(4))
    loaded = sk.load(kernel.export(np.ones(3), np.ones(3)))
    with pytest.raises(sk.ArgumentError, match=r"x2: batch shape \(5,\) does not broadcast"):
        loaded(np.ones(3), np.ones(5))


def test_one_number_for_a_one_by_one_argument():
    m = sp.MatrixSymbol("M", 1, 1)
    w = sp.Symbol("w")
    kernel = sk.build_function(sp.sin(m[0, 0]) * x * w, m, x, params={"W": sp.Matrix([[w]])},
                               dtype="float64")
    xs = np.linspace(-1, 1, 4)
    expected = np.sin(0.5) * xs * 2.0
    np.testing.assert_allclose(kernel(0.5, xs, {"W": 2.0}), expected, rtol=1e-15)
    np.testing.assert_allclose(kernel(np.array([[0.5]]), xs, {"W": np.array([[2.0]])}),
                               expected, rtol=1e-15)
    np.testing.assert_allclose(jax.jit(kernel)(0.5, xs, {"W": 2.0}), expected, rtol=1e-15)
    loaded = sk.load(kernel.export(0.5, xs, {"W": 2.0}))
    np.testing.assert_allclose(loaded(0.5, xs, {"W": 2.0}), expected, rtol=1e-15)
    vector = sk.build_function(2 * x, [x], dtype="float64")
    assert float(vector(3.0)) == 6.0


# ---- sums and products up to an integer parameter -------------------------------------------

n, m = sp.symbols("n m", integer=True)
k, j = sp.symbols("k j", integer=True)


@functools.cache
def _partial_sum_kernel():
    return sk.build_function(sp.Sum(x**k / (k + 1), (k, 0, sp.Min(n, 12))), x,
                             params={"n": n}, dtype="float64")


@pytest.mark.parametrize("count", [-1, 0, 1, 5, 12, 20])
def test_a_sum_up_to_an_integer_parameter_matches_lambdify(count):
    kernel = _partial_sum_kernel()
    xs = np.linspace(-0.9, 0.9, 7)
    # lambdify loops in Python over range(0, n + 1): n must be a number there
    reference = sp.lambdify((x, n), sp.Sum(x**k / (k + 1), (k, 0, n)), "numpy")
    expected = reference(xs, min(count, 12)) * np.ones_like(xs)
    ps = {"n": count}
    np.testing.assert_allclose(kernel(xs, ps), expected, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(jax.jit(kernel)(xs, ps), expected, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(jax.vmap(kernel, in_axes=(0, None))(xs, ps), expected,
                               rtol=1e-14, atol=1e-15)
    derivative = sum(kk * xs ** (kk - 1) / (kk + 1) for kk in range(1, min(count, 12) + 1))
    np.testing.assert_allclose(jax.grad(lambda v: kernel(v, ps).sum())(xs),
                               derivative * np.ones_like(xs), rtol=1e-13, atol=1e-15)


def test_the_parameter_bound_changes_without_recompiling_and_exports():
    kernel = _partial_sum_kernel()
    xs = np.linspace(-0.5, 0.5, 4)
    kernel(xs, {"n": 2})
    compiled = kernel.compilations
    np.testing.assert_allclose(kernel(xs, {"n": 3}), 1 + xs / 2 + xs**2 / 3 + xs**3 / 4,
                               rtol=1e-15)
    assert kernel.compilations == compiled
    loaded = sk.load(kernel.export(xs, {"n": 2}))
    np.testing.assert_allclose(loaded(xs, {"n": 1}), 1 + xs / 2, rtol=1e-15)
    np.testing.assert_allclose(jax.grad(lambda v: loaded(v, {"n": 2}).sum())(xs),
                               0.5 + 2 * xs / 3, rtol=1e-15)


def test_a_product_and_nested_sums_with_parameter_bounds():
    xs = np.linspace(-0.9, 0.9, 5)
    product = sk.build_function(sp.Product(x + k, (k, sp.Max(m, 1), sp.Min(n, 6))), x,
                                params={"m": m, "n": n}, dtype="float64")
    np.testing.assert_allclose(product(xs, {"m": 2, "n": 4}), (xs + 2) * (xs + 3) * (xs + 4),
                               rtol=1e-15)
    np.testing.assert_allclose(product(xs, {"m": 5, "n": 4}), np.ones_like(xs), rtol=0)
    nested = sk.build_function(sp.Sum(x**(k + j), (j, 0, k), (k, 0, sp.Min(n, 4))), x,
                               params={"n": n}, dtype="float64")
    reference = sp.lambdify((x, n), sp.Sum(x**(k + j), (j, 0, k), (k, 0, n)), "numpy")
    np.testing.assert_allclose(nested(xs, {"n": 2}), reference(xs, 2), rtol=1e-14)


def test_a_bound_with_no_stated_largest_value_is_a_build_error_with_the_route():
    with pytest.raises(sk.UnsupportedFunctionError,
                       match=r"no largest value known at build; .*write it as Min\(n, 100\)"):
        sk.build_function(sp.Sum(x**k, (k, 0, n)), x, params={"n": n})


# ---- complex kernels -----------------------------------------------------------------------

z, w, c = sp.symbols("z w c")
COMPLEX_EQUATIONS = {
    "exp": sp.exp(sp.I * z) * w, "log": sp.log(z) + c, "re": sp.re(z * w), "im": sp.im(z / w),
    "abs": sp.Abs(z - c) ** 2, "arg": sp.arg(z), "conjugate": sp.conjugate(z) * c,
    "matrix": sp.Matrix([z * sp.I, sp.Abs(w)]),
}
#: what NumPy's lambdify computes each in, given complex arguments
COMPLEX_KINDS = {"exp": "c", "log": "c", "re": "f", "im": "f", "abs": "f", "arg": "f",
                 "conjugate": "c", "matrix": "c"}


@functools.cache
def _complex_kernel():
    return sk.build_function(COMPLEX_EQUATIONS, z, w, params={"c": c})


@functools.cache
def _complex_loaded():
    values = _complex_samples(3, 9)
    return sk.load(_complex_kernel().export(values, values, {"c": 1j}))


def _complex_samples(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(-2, 2, count) + 1j * rng.uniform(-2, 2, count)


def _complex_reference(values_z, values_w, value_c) -> dict:
    out = {}
    for name, equation in COMPLEX_EQUATIONS.items():
        function = sp.lambdify((z, w, c), equation, "numpy")
        if name == "matrix":
            out[name] = np.stack([np.asarray(function(a, b, value_c)).reshape(2)
                                  for a, b in zip(values_z, values_w, strict=True)])
        else:
            out[name] = function(values_z, values_w, value_c)
    return out


def test_the_imaginary_unit_builds_a_complex_kernel_matching_lambdify():
    kernel = _complex_kernel()
    assert kernel.dtype == np.complex128
    zs, ws = _complex_samples(6, 0), _complex_samples(6, 1)
    ps = {"c": 0.5 - 1.5j}
    expected = _complex_reference(zs, ws, ps["c"])
    loaded = _complex_loaded()
    for result in (kernel(zs, ws, ps), jax.jit(kernel)(zs, ws, ps),
                   jax.vmap(kernel, in_axes=(0, 0, None))(zs, ws, ps), loaded(zs, ws, ps),
                   kernel.bind(ps)(zs, ws)):
        for name, want in expected.items():
            got = result[name]
            assert got.dtype.kind == COMPLEX_KINDS[name], name
            assert got.dtype.itemsize == (16 if COMPLEX_KINDS[name] == "c" else 8), name
            np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15, err_msg=name)


def test_a_complex_kernel_takes_real_numbers_and_gives_them_complex_results():
    kernel = sk.build_function(sp.exp(sp.I * z), z)
    ts = np.linspace(-np.pi, np.pi, 5)
    np.testing.assert_allclose(kernel(ts), np.exp(1j * ts), rtol=1e-15, atol=1e-16)
    assert complex(kernel(0.5)) == pytest.approx(np.exp(0.5j), rel=1e-15)


def test_gradients_of_a_complex_kernel_are_jax_gradients():
    kernel = _complex_kernel()
    zs, ws = _complex_samples(5, 2), _complex_samples(5, 3)
    ps = {"c": 0.25 + 0.5j}

    def by_hand(u, v, p):  # the same equations in jax.numpy
        return {"abs": jnp.abs(u - p["c"]) ** 2, "re": jnp.real(u * v),
                "exp": jnp.exp(1j * u) * v}

    # a real output of complex inputs: JAX's convention (holomorphic=False)
    def loss(function, u, v, p):
        out = function(u, v, p)
        return out["abs"].sum() + 3 * out["re"].sum()

    got = jax.grad(functools.partial(loss, kernel), (0, 1, 2))(zs, ws, ps)
    want = jax.grad(functools.partial(loss, by_hand), (0, 1, 2))(zs, ws, ps)
    for name, g, h in zip(("z", "w", "c"), jax.tree_util.tree_leaves(got),
                          jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(g, h, rtol=1e-13, err_msg=name)
    # a holomorphic output
    got = jax.grad(lambda u: kernel(u, ws[0], ps)["exp"], holomorphic=True)(zs[0])
    np.testing.assert_allclose(got, 1j * np.exp(1j * zs[0]) * ws[0], rtol=1e-14)
    loaded = _complex_loaded()
    got = jax.grad(lambda u: loaded(u, ws, ps)["abs"].sum())(zs)
    want = jax.grad(lambda u: by_hand(u, ws, ps)["abs"].sum())(zs)
    np.testing.assert_allclose(got, want, rtol=1e-13)


def test_dtype_asks_for_a_complex_kernel():
    kernel = sk.build_function(z**2 + 1, z, dtype="complex128")
    zs = _complex_samples(4, 4)
    np.testing.assert_allclose(kernel(zs), zs**2 + 1, rtol=1e-15)
    np.testing.assert_allclose(jax.vmap(jax.grad(kernel, holomorphic=True))(zs), 2 * zs,
                               rtol=1e-15)
    single = sk.build_function(sp.exp(sp.I * z), z, dtype="complex64")
    assert single(np.float32(1.0)).dtype == np.complex64
    np.testing.assert_allclose(single(1.0), np.exp(1j), rtol=1e-6)


def test_a_real_kernel_keeps_refusing_complex_numbers():
    real = sk.build_function(z**2, z, dtype="float64")
    with pytest.raises(sk.ArgumentError, match="x1: expected real numbers, got dtype complex128"):
        real(np.array([1j]))
    with pytest.raises(sk.BuildError, match="the imaginary unit I has no value in a real kernel"):
        sk.build_function(sp.I * z, z, dtype="float64")
    kernel = sk.build_function(z**2, z, dtype="complex128")
    with pytest.raises(sk.ArgumentError,
                       match="x1: expected an array of complex numbers, got str 'a'"):
        kernel(["a", None])
    with pytest.raises(sk.ArgumentError, match="x1: expected numbers, got dtype str"):
        kernel(np.array(["a"]))


@pytest.mark.slow  # compiles a dozen pieces: several seconds
def test_a_body_compiled_in_pieces_keeps_each_entry_dtype(monkeypatch):
    # the pieces' limits lowered, as in tests/kernels/test_split.py, for a quick compile
    monkeypatch.setattr(passes, "SPLIT_ABOVE_OPERATIONS", 100)
    monkeypatch.setattr(build, "PIECE_OPERATIONS", 60)
    series = sum(sp.sin(z * q) / q for q in range(1, 25))
    eqs = {"wave": sp.exp(sp.I * series), "modulus": sp.Abs(series), "sign": sp.re(series) > 0}
    kernel = sk.build_function(eqs, z, split=True)
    assert kernel.form == "pieces"
    zs = np.linspace(-1.0, 1.0, 4) + 0.01j
    values = np.sum([np.sin(zs * q) / q for q in range(1, 25)], axis=0)
    for result in (kernel(zs), jax.jit(kernel)(zs)):
        assert {n: v.dtype for n, v in result.items()} == {
            "wave": np.complex128, "modulus": np.float64, "sign": np.bool_}
        np.testing.assert_allclose(result["wave"], np.exp(1j * values), rtol=1e-13)
        np.testing.assert_allclose(result["modulus"], np.abs(values), rtol=1e-13)
        np.testing.assert_array_equal(result["sign"], values.real > 0)


def test_shard_and_stream_keep_bool_and_complex_outputs():
    conditions = sk.build_function({"b": x > y, "f": x * y}, [x, y], dtype="float64")
    data = _samples(10, seed=6)
    out = {"b": np.zeros(10, bool), "f": np.zeros(10)}
    for result in (conditions.shard()(data),
                   conditions.stream(data, chunk=4, out=out, progress=False)):
        assert result["b"].dtype == np.bool_
        np.testing.assert_array_equal(result["b"], data[:, 0] > data[:, 1])
    kernel = sk.build_function(sp.exp(sp.I * z), z)
    zs = _complex_samples(10, 7)
    np.testing.assert_allclose(kernel.shard()(zs), np.exp(1j * zs), rtol=1e-15)
    streamed = np.concatenate(list(kernel.stream(zs, chunk=4, progress=False)))
    assert streamed.dtype == np.complex128
    np.testing.assert_allclose(streamed, np.exp(1j * zs), rtol=1e-15)
    real = sk.build_function(z**2, z, dtype="float64")
    with pytest.raises(sk.ArgumentError, match="expected real numbers, got dtype complex128"):
        next(iter(real.stream(zs, chunk=4, progress=False)))


def test_matrix_expressions_with_the_imaginary_unit_build_a_complex_kernel():
    matrix = sp.MatrixSymbol("M", 2, 2)
    kernel = sk.build_function(sp.I * matrix * matrix, matrix)
    values = np.random.default_rng(8).normal(size=(3, 2, 2))
    assert kernel.dtype == np.complex128
    np.testing.assert_allclose(kernel(values), 1j * values @ values, rtol=1e-14)


def test_a_repeated_complex_call_takes_the_direct_path(monkeypatch):
    kernel = sk.build_function(z**2 + c, z, params={"c": c}, dtype="complex128")
    zs = _complex_samples(5, 10)
    kernel(zs, {"c": 1j})
    calls = []
    checked = kernel.prepare
    monkeypatch.setattr(kernel, "prepare", lambda args: calls.append(args) or checked(args))
    for _ in range(3):
        np.testing.assert_allclose(kernel(zs, {"c": 1j}), zs**2 + 1j, rtol=1e-15)
    assert calls == []  # neither checked nor traced again
    real = sk.build_function(z**2, z, dtype="float64")
    real(zs.real)
    with pytest.raises(sk.ArgumentError, match="x1: expected real numbers, got dtype complex128"):
        real(zs)
