"""Constants never go into the compiled program: const args, bind, the warning, export."""

import re
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp

import symkern as sk

x0, x1, a = sp.symbols("x0 x1 a")
lookup = sp.Function("lookup")
table_of = sp.Function("table_of")


def interpolating(table):
    def implementation(v):
        # the grid is a staged jnp computation; only `table` is a closed-over array
        return jnp.interp(v, jnp.linspace(0.0, 1.0, table.size), table)

    return implementation


def build_with_table(table, **options):
    return sk.build_function(lookup(x0) * a + x1, [x0, x1], params={"a": a},
                             functions={"lookup": interpolating(table)}, dtype="float64", **options)


def hlo_and_compile_time(kernel, X, ps):
    text = kernel.hlo(X, ps)
    start = time.perf_counter()
    kernel(X, ps)
    return text, time.perf_counter() - start


def test_hlo_size_does_not_grow_with_a_captured_table():
    X = np.random.default_rng(0).uniform(size=(64, 2))
    small = build_with_table(np.linspace(0, 1, 128))          # 1 KB
    large = build_with_table(np.linspace(0, 1, 2 * 2**20))    # 16 MB
    small_text, small_seconds = hlo_and_compile_time(small, X, {"a": 2.0})
    large_text, large_seconds = hlo_and_compile_time(large, X, {"a": 2.0})
    print(f"HLO {len(small_text)} vs {len(large_text)} characters; "
          f"first call {small_seconds:.3f} s vs {large_seconds:.3f} s")
    assert abs(len(large_text) - len(small_text)) <= 0.10 * len(small_text)
    assert len(large_text) < 20_000
    assert large.const_args[0].nbytes == 16 * 2**20
    grid = np.linspace(0, 1, 2 * 2**20)
    np.testing.assert_allclose(large(X, {"a": 2.0}),
                               np.interp(X[:, 0], grid, grid) * 2 + X[:, 1], rtol=1e-12)


def test_const_args_come_first_in_the_lowered_signature():
    kernel = build_with_table(np.linspace(0, 1, 1000))
    text = kernel.hlo(np.zeros((3, 2)), {"a": 1.0})
    main = re.search(r"func\.func public @main\((.*?)\) ->", text).group(1)
    assert main.startswith("%arg0: tensor<1000xf64>")
    assert "dense<[" not in text


def test_array_literals_at_most_embed_max_bytes_stay_embedded():
    f = sp.Function("first")

    def first(table, v):
        return table[0] * v

    def build(values, dtype):
        return sk.build_function(f(sp.Array(values), x0), [x0], functions={"first": first},
                                 dtype=dtype)

    assert build([1.5, 2.5, 3.5, 4.5], "float64").const_args == ()          # 32 bytes
    assert len(build([1.5, 2.5, 3.5, 4.5, 5.5], "float64").const_args) == 1  # 40 bytes
    assert build([0.5] * 8, "float32").const_args == ()                    # 32 bytes
    hoisted = build([0.5] * 9, "float32")                                  # 36 bytes
    assert [c.shape for c in hoisted.const_args] == [(9,)]
    assert "_k0" in hoisted.source and "def kernel(_k0, x1)" in hoisted.source
    np.testing.assert_allclose(hoisted(np.array([[2.0]])), [1.0])


def test_embed_max_bytes_moves_the_threshold():
    f = sp.Function("first")
    kernel = sk.build_function(f(sp.Array([1.5] * 5), x0), [x0],
                               functions={"first": lambda t, v: t[0] * v}, dtype="float64",
                               embed_max_bytes=64)
    assert kernel.const_args == ()


def test_the_same_literal_twice_is_one_const_arg():
    f = sp.Function("first")
    table = sp.Array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    kernel = sk.build_function(sp.Matrix([f(table, x0), f(table, x1)]), [x0, x1],
                               functions={"first": lambda t, v: t[1] * v}, dtype="float64")
    assert [c.name for c in kernel.const_args] == ["_k0"]
    np.testing.assert_allclose(kernel(np.array([1.0, 3.0])), [2.0, 6.0])


def test_an_array_captured_by_two_functions_is_one_const_arg():
    shared = np.linspace(0, 1, 100)
    g = sp.Function("g")
    kernel = sk.build_function(
        lookup(x0) + g(x1), [x0, x1], dtype="float64",
        functions={"lookup": interpolating(shared), "g": lambda v: jnp.asarray(shared)[3] * v})
    assert len(kernel.const_args) == 1
    origin = kernel.const_args[0].origin
    assert 'functions["lookup"]' in origin and 'functions["g"]' in origin


def test_const_args_are_device_arrays_with_their_origin():
    kernel = build_with_table(np.linspace(0, 1, 1000))
    (const,) = kernel.const_args
    assert isinstance(const.value, jax.Array)
    assert const.origin == ('closed over by functions["lookup"] (hoist_captured_constants), '
                            "used by eqs")
    assert np.asarray(const).shape == (1000,)


def test_rebinding_parameters_never_recompiles(compile_events):
    W = sp.Matrix(2, 2, sp.symbols("w0:4"))
    kernel = sk.build_function(W * sp.Matrix([x0, x1]), [x0, x1], params={"W": W},
                               dtype="float64")
    X = np.random.default_rng(0).normal(size=(10, 2))
    kernel.bind({"W": np.eye(2)})(X)
    compile_events.clear()
    for k in range(5):
        Wk = np.full((2, 2), float(k))
        np.testing.assert_allclose(kernel.bind({"W": Wk})(X), X @ Wk.T, rtol=1e-12)
    assert compile_events == []


def test_bound_kernel_lists_its_frozen_parameters_as_const_args():
    bound = build_with_table(np.linspace(0, 1, 10)).bind({"a": 3.0})
    assert [c.name for c in bound.const_args] == ["_k0", 'ps["a"]']
    assert bound.const_args[-1].origin == 'ps["a"] frozen by bind'


def test_large_constants_warn_once_listing_each_with_its_origin(monkeypatch):
    monkeypatch.setenv("SYMKERN_CAPTURED_CONSTANTS_WARN_BYTES", "4000")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_with_table(np.linspace(0, 1, 1000))
    relevant = [w for w in caught if issubclass(w.category, sk.CapturedConstantsWarning)]
    assert len(relevant) == 1
    message = str(relevant[0].message)
    assert "8,000 bytes" in message and 'closed over by functions["lookup"]' in message


def test_the_warning_can_be_disabled(monkeypatch):
    monkeypatch.setenv("SYMKERN_CAPTURED_CONSTANTS_WARN_BYTES", "-1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_with_table(np.linspace(0, 1, 100_000))


def test_export_round_trip_without_the_constants_in_the_blob():
    table = np.linspace(0, 1, 100_000)
    kernel = build_with_table(table)
    X = np.random.default_rng(1).uniform(size=(5, 2))
    blob = kernel.export(X, {"a": 2.0})
    assert len(blob) < 100_000 < table.nbytes
    loaded = sk.load(blob, const_args=kernel.const_args)
    np.testing.assert_allclose(loaded(X, {"a": 2.0}), kernel(X, {"a": 2.0}), rtol=1e-15)
    other_batch = np.random.default_rng(2).uniform(size=(11, 2))
    np.testing.assert_allclose(loaded(other_batch, {"a": 2.0}), kernel(other_batch, {"a": 2.0}),
                               rtol=1e-15)


def test_loading_without_the_const_args_is_a_clear_error():
    kernel = build_with_table(np.linspace(0, 1, 1000))
    blob = kernel.export(np.zeros((2, 2)), {"a": 1.0})
    with pytest.raises(sk.ConstArgsError, match=r"exported without its 1 const arg\(s\) \[_k0"):
        sk.load(blob)
    with pytest.raises(sk.ConstArgsError, match=r"_k0 expected float64\[1000\], got float64\[10\]"):
        sk.load(blob, const_args=[np.zeros(10)])


def test_x64_mismatch_between_export_and_load_is_an_error():
    kernel = build_with_table(np.linspace(0, 1, 100))
    blob = kernel.export(np.zeros((2, 2)), {"a": 1.0})
    jax.config.update("jax_enable_x64", False)
    try:
        with pytest.raises(sk.DtypeMismatchError, match="lowered with jax_enable_x64=True"):
            sk.load(blob, const_args=kernel.const_args)
    finally:
        jax.config.update("jax_enable_x64", True)


def test_a_user_function_must_return_one_value_per_sample():
    with pytest.raises(sk.BuildError, match='functions\\["lookup"\\]: expected one scalar'):
        sk.build_function(lookup(x0), [x0], functions={"lookup": lambda v: jnp.stack([v, v])},
                          dtype="float64")
