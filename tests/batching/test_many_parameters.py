"""A parameter tree of many leaves reaches the executables packed into one buffer, and every
call path (direct, checked, bound, flat, sharded, streamed, exported, traced) still takes
the caller's tree and gives what one argument per leaf gives."""

import ast
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import symkern as sk
from symkern.batching import build, packing
from symkern.batching import kernel as kernel_module
from symkern.batching.packing import (
    OPAQUE_ABOVE_LEAVES,
    PACK_ARRAYS_FROM_LEAVES,
    PACK_FROM_LEAVES,
    PackedParameters,
)
from symkern.codegen import passes
from symkern.codegen.packed_sums import PACKED_SUM_MIN_TERMS, sum_packed_parameters
from symkern.errors import ArgumentError

x = sp.Symbol("x")
X = np.linspace(-1.0, 1.0, 12).reshape(12, 1)


def _sum_kernel(count: int, **options):
    symbols = [sp.Symbol(f"p{i}") for i in range(count)]
    params = {f"p{i}": s for i, s in enumerate(symbols)}
    return sk.build_function(x * sp.Add(*symbols) + sp.sin(x) * symbols[0], [x],
                             params=params, **options), symbols


def _values(count: int) -> dict:
    return {f"p{i}": float(i % 5) - 1.5 for i in range(count)}


def _expected(values: dict) -> np.ndarray:
    return X[:, 0] * sum(values.values()) + np.sin(X[:, 0]) * values["p0"]


def _main_arguments(hlo: str) -> int:
    signature = next(line for line in hlo.splitlines() if "func.func public @main" in line)
    return len(re.findall(r"%arg\d+:", signature))


@pytest.fixture(scope="module")
def thousand():
    kernel, _ = _sum_kernel(1000)
    return kernel


def test_a_thousand_scalar_parameters_reach_the_executable_as_one_buffer(thousand):
    values = _values(1000)
    assert thousand.packs_parameters
    np.testing.assert_allclose(thousand(X, values), _expected(values), rtol=1e-12)
    # the kernel's const args (none here), the data, one buffer
    assert _main_arguments(thousand.hlo(X, values)) == 2
    assert "ps.sum_slices((0, 1000))" in thousand.source


def test_the_threshold_packs_from_PACK_FROM_LEAVES_scalar_leaves():
    below, _ = _sum_kernel(PACK_FROM_LEAVES - 1)
    at, _ = _sum_kernel(PACK_FROM_LEAVES)
    assert not below.packs_parameters and at.packs_parameters
    for kernel, count in ((below, PACK_FROM_LEAVES - 1), (at, PACK_FROM_LEAVES)):
        values = _values(count)
        np.testing.assert_allclose(kernel(X, values), _expected(values), rtol=1e-12)
        np.testing.assert_allclose(kernel(X, values), _expected(values), rtol=1e-12)
    assert _main_arguments(below.hlo(X, _values(PACK_FROM_LEAVES - 1))) == PACK_FROM_LEAVES
    assert _main_arguments(at.hlo(X, _values(PACK_FROM_LEAVES))) == 2


def test_array_leaves_pack_from_PACK_ARRAYS_FROM_LEAVES(monkeypatch):
    vectors = [sp.Matrix(sp.symbols(f"v{k}_0 v{k}_1")) for k in range(4)]
    params = {f"v{k}": v for k, v in enumerate(vectors)}
    expression = x * sum(v[0] - 2 * v[1] for v in vectors)
    values = {f"v{k}": np.array([k + 1.0, 0.5 * k]) for k in range(4)}
    expected = X[:, 0] * sum(v[0] - 2 * v[1] for v in values.values())
    monkeypatch.setattr(packing, "PACK_ARRAYS_FROM_LEAVES", 5)
    below = sk.build_function(expression, [x], params=params)
    monkeypatch.setattr(packing, "PACK_ARRAYS_FROM_LEAVES", 4)
    at = sk.build_function(expression, [x], params=params)
    assert PACK_ARRAYS_FROM_LEAVES > PACK_FROM_LEAVES
    assert not below.packs_parameters and at.packs_parameters
    for kernel in (below, at):
        np.testing.assert_allclose(kernel(X, values), expected, rtol=1e-12)
        device = jax.tree_util.tree_map(jnp.asarray, values)
        np.testing.assert_allclose(kernel(X, device), expected, rtol=1e-12)


def test_repeated_calls_with_new_values_never_recompile(thousand):
    thousand(X, _values(1000))
    compiled = thousand.compilations
    for shift in (1.0, 2.0, 3.0):
        values = {key: value + shift for key, value in _values(1000).items()}
        np.testing.assert_allclose(thousand(X, values), _expected(values), rtol=1e-12)
    assert thousand.compilations == compiled


def test_a_dict_in_another_key_order_and_a_list_of_symbols_give_the_same_values(thousand):
    values = _values(1000)
    reordered = dict(reversed(list(values.items())))
    np.testing.assert_allclose(thousand(X, reordered), _expected(values), rtol=1e-12)
    symbols = [sp.Symbol(f"p{i}") for i in range(40)]
    listed = sk.build_function(x * sp.Add(*symbols) + symbols[3], [x], params=symbols)
    numbers = [float(i) for i in range(40)]
    assert listed.packs_parameters
    np.testing.assert_allclose(listed(X, numbers), X[:, 0] * sum(numbers) + 3.0, rtol=1e-12)
    mixed = [np.float32(v) if i % 3 else int(v) for i, v in enumerate(numbers)]
    np.testing.assert_allclose(listed(X, mixed), X[:, 0] * sum(numbers) + 3.0, rtol=1e-12)


@pytest.mark.parametrize("change", ["missing", "extra", "string", "huge", "complex", "shape"])
def test_a_wrong_tree_or_leaf_is_the_same_argument_error_packed(thousand, change):
    values = _values(1000)
    if change == "missing":
        del values["p7"]
    elif change == "extra":
        values["q"] = 1.0
    elif change == "string":
        values["p7"] = "2"
    elif change == "huge":
        values["p7"] = 2 ** 2000
    elif change == "complex":
        values["p7"] = 1j
    else:
        values["p7"] = np.ones(2)
    with pytest.raises(ArgumentError, match="ps"):
        thousand(X, values)


def _packed_and_plain(monkeypatch, expression, params):
    """The same kernel built packing and with one argument per leaf."""
    packed = sk.build_function(expression, [x], params=params)
    monkeypatch.setattr(packing, "PACK_FROM_LEAVES", 10 ** 9)
    monkeypatch.setattr(packing, "PACK_ARRAYS_FROM_LEAVES", 10 ** 9)
    plain = sk.build_function(expression, [x], params=params)
    assert packed.packs_parameters and not plain.packs_parameters
    return packed, plain


def _same_error(packed, plain, values):
    with pytest.raises(ArgumentError) as packed_error:
        packed(X, values)
    with pytest.raises(ArgumentError) as plain_error:
        plain(X, values)
    assert str(packed_error.value) == str(plain_error.value)


@pytest.fixture
def nested(monkeypatch):
    """A kernel of a nested tree of seven scalar parameters, packing and not."""
    a = {f"p{i}": sp.Symbol(f"a{i}") for i in range(4)}
    b = [sp.Symbol(f"b{i}") for i in range(3)]
    expression = x * (sum(a.values()) + 2 * sum(b)) + sp.sin(x) * b[2]
    return _packed_and_plain(monkeypatch, expression, {"a": a, "b": b})


def _nested_values(a=(0.5, -1.0, 2.0, 3.0), b=(1.5, 0.25, -2.0)):
    return {"a": {f"p{i}": v for i, v in enumerate(a)}, "b": list(b)}


@pytest.mark.parametrize("kind", ["floats", "mixed numbers", "0-d arrays", "device scalars"])
def test_a_nested_tree_of_numbers_packs_with_one_check_over_its_leaves(nested, kind):
    packed, plain = nested
    values = _nested_values()
    if kind == "mixed numbers":
        values = {"a": {"p0": 0.5, "p1": np.float32(-1.0), "p2": 2, "p3": np.int64(3)},
                  "b": [np.float64(1.5), True, np.float16(-2.0)]}
    elif kind == "0-d arrays":
        values = jax.tree_util.tree_map(np.asarray, values)
    elif kind == "device scalars":
        values = jax.tree_util.tree_map(jnp.asarray, values)
    leaves = jax.tree_util.tree_leaves(values)
    assert isinstance(packed.program.packer.pack_flattened(leaves), PackedParameters)
    want = plain(X, values)
    np.testing.assert_allclose(packed(X, values), want, rtol=1e-12)
    np.testing.assert_allclose(packed(X, values), want, rtol=1e-12)


@pytest.mark.parametrize("kind", ["sympy numbers", "int8", "device and numpy", "float32 device"])
def test_leaves_the_one_check_does_not_take_are_checked_one_by_one(nested, kind):
    packed, plain = nested
    values = _nested_values()
    if kind == "sympy numbers":
        values["a"]["p1"], values["b"][0] = sp.Rational(-1, 2), sp.Float(1.5)
    elif kind == "int8":
        values["a"]["p3"] = np.int8(3)
    elif kind == "device and numpy":
        values["b"] = [jnp.asarray(v) for v in values["b"]]
        values["a"] = {k: np.asarray(v) for k, v in values["a"].items()}
    else:
        values = jax.tree_util.tree_map(lambda v: jnp.asarray(v, jnp.float32), values)
    assert packed.program.packer.pack_flattened(jax.tree_util.tree_leaves(values)) is None
    np.testing.assert_allclose(packed(X, values), plain(X, values), rtol=1e-12)


@pytest.mark.parametrize("change", ["missing", "extra", "tuple", "string", "none", "huge",
                                    "complex", "symbol", "shape"])
def test_a_wrong_leaf_of_a_nested_tree_is_the_error_of_one_argument_per_leaf(nested, change):
    values = _nested_values()
    if change == "missing":
        del values["a"]["p2"]
    elif change == "extra":
        values["b"].append(1.0)
    elif change == "tuple":
        values["b"] = tuple(values["b"])
    elif change == "string":
        values["a"]["p2"] = "2"
    elif change == "none":
        values["b"][1] = None
    elif change == "huge":
        values["b"][1] = 2 ** 2000
    elif change == "complex":
        values["a"]["p0"] = 1 + 2j
    elif change == "symbol":
        values["a"]["p0"] = sp.Symbol("q")
    else:
        values["b"][2] = np.ones(2)
    _same_error(*nested, values)


@pytest.mark.parametrize("change", ["missing", "extra", "string", "huge", "complex", "shape"])
def test_a_wrong_leaf_of_a_flat_dict_is_the_error_of_one_argument_per_leaf(monkeypatch,
                                                                           change):
    symbols = [sp.Symbol(f"p{i}") for i in range(12)]
    kernel_pair = _packed_and_plain(monkeypatch, x * sp.Add(*symbols),
                                    {f"p{i}": s for i, s in enumerate(symbols)})
    values = {f"p{i}": float(i) for i in range(12)}
    if change == "missing":
        del values["p7"]
    else:
        values.update({"extra": {"q": 1.0}, "string": {"p7": "2"}, "huge": {"p7": 2 ** 2000},
                       "complex": {"p7": 1j}, "shape": {"p7": np.ones(2)}}[change])
    _same_error(*kernel_pair, values)


@pytest.fixture
def vectors(monkeypatch):
    """A kernel of four 2-vector parameters, packing (PACK_ARRAYS_FROM_LEAVES lowered to 4)
    and not."""
    monkeypatch.setattr(packing, "PACK_ARRAYS_FROM_LEAVES", 4)
    vectors = [sp.Matrix(sp.symbols(f"v{k}_0 v{k}_1")) for k in range(4)]
    expression = x * sum(v[0] - 2 * v[1] for v in vectors)
    return _packed_and_plain(monkeypatch, expression,
                             {f"v{k}": v for k, v in enumerate(vectors)})


def _vector_values(make=np.array):
    return {f"v{k}": make([k + 1.0, 0.5 * k]) for k in range(4)}


@pytest.mark.parametrize("kind", ["float64", "float32", "int", "bool", "device"])
def test_a_tree_of_arrays_packs_with_one_check_over_its_leaves(vectors, kind):
    packed, plain = vectors
    values = _vector_values()
    if kind in ("float32", "int", "bool"):
        values = {k: v.astype(kind) for k, v in values.items()}
    elif kind == "device":
        values = jax.tree_util.tree_map(jnp.asarray, values)
    assert isinstance(packed.program.packer.pack_flattened(list(values.values())),
                      PackedParameters)
    np.testing.assert_allclose(packed(X, values), plain(X, values), rtol=1e-12)


@pytest.mark.parametrize("kind", ["lists", "numpy and device", "float32 device", "column",
                                  "sympy objects"])
def test_arrays_the_one_check_does_not_take_are_checked_one_by_one(vectors, kind):
    packed, plain = vectors
    values = _vector_values()
    if kind == "lists":
        values = {k: list(v) for k, v in values.items()}
    elif kind == "numpy and device":
        values["v1"] = jnp.asarray(values["v1"])
    elif kind == "float32 device":
        values = {k: jnp.asarray(v, jnp.float32) for k, v in values.items()}
    elif kind == "column":
        values["v2"] = values["v2"].reshape(2, 1)
    else:
        values["v0"] = np.array([sp.Rational(1, 2), sp.Integer(3)], dtype=object)
    assert packed.program.packer.pack_flattened(list(values.values())) is None
    np.testing.assert_allclose(packed(X, values), plain(X, values), rtol=1e-12)


@pytest.mark.parametrize("change", ["length", "matrix", "complex", "strings", "symbols"])
def test_a_wrong_array_leaf_is_the_error_of_one_argument_per_leaf(vectors, change):
    values = _vector_values()
    values["v3"] = {"length": np.ones(3), "matrix": np.ones((2, 2)),
                    "complex": np.array([1j, 2.0]), "strings": np.array(["1", "2"]),
                    "symbols": np.array([sp.Symbol("q"), 1], dtype=object)}[change]
    _same_error(*vectors, values)


def test_gradients_keep_the_tree_and_match_the_unpacked_kernel():
    count = 60
    packed, _ = _sum_kernel(count)
    values = _values(count)
    assert packed.packs_parameters

    def loss(kernel, ps):
        return jnp.sum(kernel(X, ps) ** 2)

    got = jax.grad(lambda ps: loss(packed, ps))(values)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(values)
    residual = 2 * _expected(values)
    for key in values:
        want = np.sum(residual * (X[:, 0] + (np.sin(X[:, 0]) if key == "p0" else 0.0)))
        np.testing.assert_allclose(got[key], want, rtol=1e-10)
    np.testing.assert_allclose(jax.jit(lambda ps: packed(X, ps))(values), _expected(values),
                               rtol=1e-12)


def _batch_fusion_operands(hlo: str, batch: int) -> list[int]:
    """Operands of each fusion over the batch in the ENTRY of an optimized HLO module."""
    entry = hlo[hlo.index("ENTRY"):]
    return [len(re.findall(r"%[\w.\-]+", call)) for call in re.findall(
        rf"= f\d+\[{batch}[^\n]*? fusion\(([^)]*)\)", entry)]


@pytest.mark.parametrize("count", [OPAQUE_ABOVE_LEAVES, OPAQUE_ABOVE_LEAVES + 1, 200])
def test_leaves_packed_inside_a_callers_trace_reach_the_fusion_as_one_buffer(count):
    """Under a caller's `jax.jit` the leaves are the executable's own arguments; packed and
    sliced back, XLA folds every slice to its scalar argument, and a loop fusion taking one
    operand per parameter compiled 10x slower (2,000 parameters, 10^4 operations). Above
    OPAQUE_ABOVE_LEAVES the packed buffer stays one operand, as in the kernel's own call;
    up to it the scalars are folded in (faster on small trees)."""
    batch = 64
    symbols = [sp.Symbol(f"p{i}") for i in range(count)]
    kernel = sk.build_function(sum(s * sp.sin((i + 1) * x) for i, s in enumerate(symbols)),
                               [x], params={f"p{i}": s for i, s in enumerate(symbols)})
    assert kernel.packs_parameters
    values = {f"p{i}": 0.01 * i - 0.5 for i in range(count)}
    data = np.linspace(-1.0, 1.0, batch).reshape(batch, 1)
    jitted = jax.jit(lambda d, ps: kernel(d, ps))
    operands = _batch_fusion_operands(jitted.lower(data, values).compile().as_text(), batch)
    assert operands, "no loop fusion over the batch"
    if count > OPAQUE_ABOVE_LEAVES:
        assert max(operands) < 10, operands
    else:
        assert max(operands) > count, operands
    want = sum(v * np.sin((i + 1) * data[:, 0]) for i, v in enumerate(values.values()))
    np.testing.assert_allclose(jitted(data, values), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(kernel(data, values), want, rtol=1e-12, atol=1e-12)
    grads = jax.jit(jax.grad(lambda ps: jnp.sum(kernel(data, ps))))(values)
    for i, key in enumerate(values):
        np.testing.assert_allclose(grads[key], np.sum(np.sin((i + 1) * data[:, 0])),
                                   rtol=1e-10, atol=1e-12)


def test_vmap_over_packed_parameters_folds_and_matches_a_loop(thousand):
    rows = [_values(1000), {k: 2 * v for k, v in _values(1000).items()}]
    stacked = jax.tree_util.tree_map(lambda *v: jnp.array(v), *rows)
    got = jax.vmap(lambda ps: thousand(X, ps))(stacked)
    for k, values in enumerate(rows):
        np.testing.assert_allclose(got[k], _expected(values), rtol=1e-12)
    data = np.stack([X, 2 * X])
    got = jax.vmap(lambda d, ps: thousand(d, ps))(data, stacked)
    for k, values in enumerate(rows):
        scaled = data[k][:, 0] * sum(values.values()) + np.sin(data[k][:, 0]) * values["p0"]
        np.testing.assert_allclose(got[k], scaled, rtol=1e-12)


def test_bind_flat_shard_stream_export_and_a_prepacked_tree_agree(thousand):
    values = _values(1000)
    want = _expected(values)
    bound = thousand.bind(values)
    np.testing.assert_allclose(bound(X), want, rtol=1e-12)
    assert [c.name for c in bound.const_args] == ["ps"]
    assert _main_arguments(bound.hlo(X)) == 2
    theta = thousand.flatten(values)
    assert theta.shape == (1000,)
    np.testing.assert_allclose(thousand.flat()(X, theta), want, rtol=1e-12)
    np.testing.assert_allclose(thousand.shard()(X, values), want, rtol=1e-12)
    streamed = np.concatenate(list(thousand.stream(X, values, chunk=5, progress=False)))
    np.testing.assert_allclose(streamed, want, rtol=1e-12)
    prepacked = thousand.pack_parameters(values)
    assert isinstance(prepacked, PackedParameters)
    np.testing.assert_allclose(thousand(X, prepacked), want, rtol=1e-12)
    np.testing.assert_allclose(thousand(X, jax.device_put(prepacked)), want, rtol=1e-12)


@pytest.mark.parametrize("count", [OPAQUE_ABOVE_LEAVES, OPAQUE_ABOVE_LEAVES + 1])
def test_every_call_path_agrees_on_both_sides_of_OPAQUE_ABOVE_LEAVES(count):
    kernel, _ = _sum_kernel(count)
    values = _values(count)
    device = {key: jnp.asarray(value) for key, value in values.items()}
    want = _expected(values)
    for ps in (values, device):
        np.testing.assert_allclose(kernel(X, ps), want, rtol=1e-12)
        np.testing.assert_allclose(jax.jit(lambda d, p: kernel(d, p))(X, ps), want, rtol=1e-12)
    doubled = {key: 2 * value for key, value in values.items()}
    stacked = jax.tree_util.tree_map(lambda *v: jnp.array(v), values, doubled)
    mapped = jax.jit(jax.vmap(lambda p: kernel(X, p)))(stacked)
    for row, tree in zip(mapped, (values, doubled), strict=True):
        np.testing.assert_allclose(row, _expected(tree), rtol=1e-12)
    weights = X[:, 0] + 2.0
    grads = jax.grad(lambda p: jnp.sum(weights * kernel(X, p)))(device)
    for key in values:
        expected = np.sum(weights * (X[:, 0] + (np.sin(X[:, 0]) if key == "p0" else 0.0)))
        np.testing.assert_allclose(grads[key], expected, rtol=1e-10)
    np.testing.assert_allclose(kernel.bind(values)(X), want, rtol=1e-12)
    np.testing.assert_allclose(kernel.flat()(X, kernel.flatten(values)), want, rtol=1e-12)
    np.testing.assert_allclose(kernel.shard()(X, values), want, rtol=1e-12)
    streamed = np.concatenate(list(kernel.stream(X, values, chunk=5, progress=False)))
    np.testing.assert_allclose(streamed, want, rtol=1e-12)
    loaded = sk.load(kernel.export(X, values), kernel.const_args)
    np.testing.assert_allclose(loaded(X, values), want, rtol=1e-12)


def test_an_exported_packing_kernel_loads_and_takes_the_tree():
    kernel, _ = _sum_kernel(40)
    values = _values(40)
    assert kernel.packs_parameters
    loaded = sk.load(kernel.export(X, values), kernel.const_args)
    np.testing.assert_allclose(loaded(X, values), _expected(values), rtol=1e-12)


def test_a_body_cut_into_pieces_hands_each_piece_one_buffer(monkeypatch):
    count = 60
    symbols = [sp.Symbol(f"p{i}") for i in range(count)]
    # one distinct function per parameter: no long sum; cut into pieces of 50 operations
    monkeypatch.setattr(passes, "SPLIT_ABOVE_OPERATIONS", 100)
    monkeypatch.setattr(build, "PIECE_OPERATIONS", 50)
    expression = sum(sp.sin(s * x + i) for i, s in enumerate(symbols))
    kernel = sk.build_function(expression, [x], params={f"p{i}": s for i, s in enumerate(symbols)},
                               dtype="float64")
    values = {f"p{i}": 0.01 * i for i in range(count)}
    want = sum(np.sin(0.01 * i * X[:, 0] + i) for i in range(count))
    assert kernel.packs_parameters and kernel.form == "pieces"
    np.testing.assert_allclose(kernel(X, values), want, rtol=1e-9)
    np.testing.assert_allclose(kernel(X, values), want, rtol=1e-9)
    np.testing.assert_allclose(jax.jit(lambda ps: kernel(X, ps))(values), want, rtol=1e-9)


def _sum_source(terms: int) -> str:
    return ("def kernel(x1, ps):\n    _c0 = " + " + ".join(f"ps['p{k}']" for k in range(terms))
            + "\n    return (x1[..., 0] * _c0,)")


@pytest.mark.parametrize("terms", [PACKED_SUM_MIN_TERMS - 1, PACKED_SUM_MIN_TERMS])
def test_packed_sums_rewrite_from_PACKED_SUM_MIN_TERMS_terms(terms):
    module = ast.parse(_sum_source(terms))
    before = ast.unparse(module)
    count = sum_packed_parameters(module, {(f"p{k}",): k for k in range(terms)})
    if terms < PACKED_SUM_MIN_TERMS:
        assert count == 0 and ast.unparse(module) == before
    else:
        assert count == 1 and f"ps.sum_slices((0, {terms}))" in ast.unparse(module)


def test_packed_sums_absorb_pure_locals_read_once_and_keep_other_terms():
    source = ("def kernel(x1, ps):\n"
              "    _c0 = " + " + ".join(f"ps['p{k}']" for k in range(0, 10)) + "\n"
              "    _c1 = " + " + ".join(f"ps['p{k}']" for k in range(12, 20)) + "\n"
              "    _c2 = _c0 + _c1 + ps['W'] + x1[..., 0]\n"
              "    _c3 = _c1\n"
              "    return (_c2 * _c3,)")
    module = ast.parse(source)
    offsets = {(f"p{k}",): k for k in range(20)}
    assert sum_packed_parameters(module, offsets) == 3
    text = ast.unparse(module)
    # _c0 is read once and absorbed; _c1 is read twice and stays; `ps['W']` is no scalar leaf
    assert "_c0 =" not in text
    assert "_c2 = ps.sum_slices((0, 10)) + _c1 + ps['W'] + x1[..., 0]" in text
    assert "_c1 = ps.sum_slices((12, 20))" in text


def test_repeated_entries_are_summed_as_often_as_they_occur():
    module = ast.parse(_sum_source(9).replace("ps['p8']", "ps['p0']"))
    sum_packed_parameters(module, {(f"p{k}",): k for k in range(9)})
    assert "ps.sum_slices((0, 8), (0, 1))" in ast.unparse(module)


leaf_kinds = st.sampled_from(["symbol", "column", "matrix", "matrix_symbol"])


@st.composite
def parameter_trees(draw):
    """A random tree (dicts and lists) of 4-12 leaves of random kinds, with the symbols of
    each leaf and the value the caller passes for it."""
    count = draw(st.integers(4, 12))
    kinds = [draw(leaf_kinds) for _ in range(count)]
    leaves, values, entries = [], [], []
    for k, kind in enumerate(kinds):
        if kind == "symbol":
            leaf = sp.Symbol(f"s{k}")
            symbols, value = [leaf], float(k) / 3
        elif kind == "column":
            leaf = sp.Matrix(sp.symbols(f"c{k}_0:3"))
            symbols, value = list(leaf), np.arange(3.0) + k
        elif kind == "matrix":
            leaf = sp.Matrix(2, 2, sp.symbols(f"m{k}_0:4"))
            symbols, value = list(leaf), np.arange(4.0).reshape(2, 2) - k
        else:
            leaf = sp.MatrixSymbol(f"M{k}", 2, 2)
            symbols, value = list(sp.Matrix(leaf)), np.arange(4.0).reshape(2, 2) * 0.5 + k
        leaves.append(leaf)
        values.append(value)
        entries.append((symbols, np.ravel(value)))
    split = draw(st.integers(1, count - 1))
    shape = draw(st.sampled_from(["dict", "nested", "list"]))
    if shape == "dict":
        tree = ({f"k{k}": leaf for k, leaf in enumerate(leaves)},
                {f"k{k}": value for k, value in enumerate(values)})
    elif shape == "nested":
        tree = ({"a": {f"k{k}": leaf for k, leaf in enumerate(leaves[:split])},
                 "b": list(leaves[split:])},
                {"a": {f"k{k}": value for k, value in enumerate(values[:split])},
                 "b": list(values[split:])})
    else:
        tree = (list(leaves), list(values))
    return tree, entries


@settings(max_examples=6, deadline=None)
@given(parameter_trees(), st.booleans())
def test_random_parameter_trees_give_the_values_of_one_argument_per_leaf(case, packed):
    (params, values), entries = case
    symbols = [s for leaf_symbols, _ in entries for s in leaf_symbols]
    numbers = np.concatenate([numbers for _, numbers in entries])
    weights = np.arange(1, len(symbols) + 1) / len(symbols)
    expression = x * sum(w * s for w, s in zip(weights, symbols, strict=True)) \
        + sp.cos(x) * symbols[-1] ** 2
    saved = packing.PACK_FROM_LEAVES, packing.PACK_ARRAYS_FROM_LEAVES
    try:
        packing.PACK_FROM_LEAVES = packing.PACK_ARRAYS_FROM_LEAVES = 4 if packed else 10 ** 9
        kernel = sk.build_function(expression, [x], params=params)
    finally:
        packing.PACK_FROM_LEAVES, packing.PACK_ARRAYS_FROM_LEAVES = saved
    assert kernel.packs_parameters == packed
    want = X[:, 0] * float(weights @ numbers) + np.cos(X[:, 0]) * numbers[-1] ** 2
    np.testing.assert_allclose(kernel(X, values), want, rtol=1e-10)
    np.testing.assert_allclose(kernel(X, values), want, rtol=1e-10)
    grads = jax.grad(lambda ps: jnp.sum(kernel(X, ps)))(values)
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(
        jax.tree_util.tree_map(jnp.asarray, values))
    np.testing.assert_allclose(kernel.bind(values)(X), want, rtol=1e-10)
    np.testing.assert_allclose(kernel.flat()(X, kernel.flatten(values)), want, rtol=1e-10)


@pytest.mark.parametrize("count", [5, kernel_module.DIRECT_TREE_LEAVES + 1])
def test_a_small_tree_of_device_arrays_is_packed_inside_the_direct_call(monkeypatch, count):
    """Up to DIRECT_TREE_LEAVES leaves, all JAX arrays: the call hands the tree to the direct
    path as it is (packed in its trace); past it, or with Python numbers, it packs first."""
    x = sp.Symbol("x")
    symbols = sp.symbols(f"q0:{count}")
    kernel = sk.build_function(x * sp.Add(*[s * (i + 1) for i, s in enumerate(symbols)]), x,
                               params={str(s): s for s in symbols})
    assert kernel.packs_parameters
    values = {str(s): 0.01 * i for i, s in enumerate(symbols)}
    device = {key: jax.device_put(np.asarray(v, kernel.dtype)) for key, v in values.items()}
    X = np.linspace(-1.0, 1.0, 8).astype(kernel.dtype)
    want = X * sum(0.01 * i * (i + 1) for i in range(count))
    kernel(X, values)  # the shape has run: later calls take the direct path
    kernel(X, device)  # the direct path traced for a tree of arrays (packed in its trace)
    packed = []
    original = kernel.pack_parameters
    monkeypatch.setattr(kernel, "pack_parameters", lambda ps: packed.append(1) or original(ps))
    np.testing.assert_allclose(kernel(X, device), want, rtol=1e-5)
    assert bool(packed) == (count > kernel_module.DIRECT_TREE_LEAVES)
    packed.clear()
    np.testing.assert_allclose(kernel(X, values), want, rtol=1e-5)
    assert packed  # Python numbers are packed on the host
