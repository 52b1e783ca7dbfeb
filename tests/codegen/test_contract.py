"""Tests of symkern.codegen.contract: which sums become matrix products, and kernels built
with it against independent references (hand-written JAX networks, the scalar body),
under jit, vmap, grad, bind and export."""

from __future__ import annotations

import ast

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import symkern as sk
from symkern.codegen import contract, passes
from symkern.codegen.contract import contract_linear_forms, is_contracted, is_tiled, tile
from symkern.errors import BuildError
from symkern.kernels.stage import compile_kernel


def _network(sizes: tuple[int, ...], jacobian: bool = False):
    """A scalarized tanh network (or its input Jacobian by the chain rule), its input
    symbols, its parameter symbols and random parameter values."""
    x = list(sp.symbols(f"x0:{sizes[0]}"))
    params, values = {}, {}
    rng = np.random.default_rng(len(sizes) * 10 + sizes[1])
    h, J = list(x), sp.eye(sizes[0])
    for k, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        W = sp.Matrix(n_out, n_in, lambda i, j, k=k: sp.Symbol(f"W{k}_{i}_{j}"))
        b = sp.Matrix(n_out, 1, lambda i, _, k=k: sp.Symbol(f"b{k}_{i}"))
        params[f"L{k}"] = {"W": W, "b": b}
        values[f"L{k}"] = {"W": rng.normal(size=(n_out, n_in)) / np.sqrt(n_in),
                           "b": rng.normal(size=n_out)}
        h = [sp.tanh(sp.Add(*[W[i, j] * h[j] for j in range(n_in)], b[i]))
             for i in range(n_out)]
        if jacobian:
            J = sp.Matrix([[(1 - h[i] ** 2) * sp.Add(*[W[i, j] * J[j, c] for j in range(n_in)
                                                       if J[j, c] != 0])
                            for c in range(J.cols)] for i in range(n_out)])
    return (J if jacobian else sp.Matrix(h)), x, params, values


@jax.jit  # one program a shape (its operations one by one compile each at each shape)
def _hand(X, values):
    h = X
    for layer in values.values():
        h = jnp.tanh(h @ jnp.asarray(layer["W"]).T + jnp.asarray(layer["b"]))
    return h


_CACHE: dict = {}


def _kernel():
    if "k" not in _CACHE:
        eqs, x, params, values = _network((5, 16, 16, 4))
        _CACHE["k"] = (sk.build_function(eqs, x, params=params, dtype="float64"), values)
    return _CACHE["k"]


def test_network_layers_become_matrix_products():
    kernel, values = _kernel()
    assert is_contracted(kernel._generated.module)
    text = kernel.source
    assert text.count("jnp.tensordot(") == 3
    # the hidden layers stay one block each: tanh of the block, read by the next product
    assert "_lh0 = jnp.tanh(_lz0)" in text and "_lv1 = _lh0" in text
    assert "_lh1 = jnp.tanh(_lz1)" in text and "_lv2 = _lh1" in text
    # no weight is read as a scalar any more: the weights are gathered through tables
    assert "['W'][0, 0]" not in text
    X = np.random.default_rng(0).normal(size=(50, 5))
    np.testing.assert_allclose(kernel(X, values), _hand(X, values), rtol=1e-12, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(batch=st.sampled_from([(), (1,), (7,), (3, 4), (257,)]),
       seed=st.integers(0, 2**32 - 1), scale=st.floats(0.1, 3.0))
def test_values_against_hand_written_jax(batch, seed, scale):
    kernel, values = _kernel()
    rng = np.random.default_rng(seed)
    X = rng.normal(size=batch + (5,)) * scale
    params = jax.tree_util.tree_map(lambda v: v * rng.uniform(0.5, 1.5, np.shape(v)), values)
    got = kernel(X, params)
    assert np.shape(got) == batch + (4,)
    want = _hand(X.reshape(-1, 5), params).reshape(batch + (4,))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_same_values_as_the_scalar_body():
    kernel, values = _kernel()
    eqs, x, params, _ = _network((5, 16, 16, 4))
    scalar = sk.build_function(eqs, x, params=params, dtype="float64",
                               options=sk.BuildOptions(contract=False))
    assert scalar.form == "scalar" and kernel.form == "contracted"
    assert "tensordot" not in scalar.source
    X = np.random.default_rng(3).normal(size=(64, 5))
    np.testing.assert_allclose(kernel(X, values), scalar(X, values), rtol=1e-12, atol=1e-13)


def test_small_networks_and_jacobians_stay_scalar():
    eqs, x, params, values = _network((2, 3, 2))
    small = sk.build_function(eqs, x, params=params, dtype="float64")
    assert not is_contracted(small._generated.module)  # 3x2 weights: fastest fused
    # a 3-row output layer stays scalar sums over the rows of the hidden block
    eqs, x, params, values = _network((5, 16, 16, 3))
    narrow = sk.build_function(eqs, x, params=params, dtype="float64")
    assert narrow.source.count("jnp.tensordot(") == 2 and "_lv1 = _lh0" in narrow.source
    X = np.random.default_rng(2).normal(size=(6, 5))
    np.testing.assert_allclose(narrow(X, values), _hand(X, values), rtol=1e-12, atol=1e-12)
    eqs, x, params, values = _network((3, 8, 8, 2), jacobian=True)
    jac = sk.build_function(eqs, x, params=params, dtype="float64")
    # every layer's rows are read by scalar code (1 - h**2), and the chain-rule sums have
    # products of weights: left to the scalar body (docs/benchmarks.md)
    assert not is_contracted(jac._generated.module)
    X = np.random.default_rng(4).normal(size=(9, 3))
    want = jax.vmap(jax.jacfwd(lambda v: _hand(v[None], values)[0]))(jnp.asarray(X))
    np.testing.assert_allclose(jac(X, values), want, rtol=1e-10, atol=1e-12)


def test_grad_vmap_jit_bind_export_against_hand_written_jax():
    kernel, values = _kernel()
    X = jnp.asarray(np.random.default_rng(1).normal(size=(33, 5)))
    params = jax.tree_util.tree_map(jnp.asarray, values)

    def loss(f):
        return lambda X, ps: jnp.sum(f(X, ps) ** 2)

    ours = jax.grad(loss(kernel), argnums=(0, 1))(X, params)
    theirs = jax.grad(loss(_hand), argnums=(0, 1))(X, params)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-10, atol=1e-12)
    for a, b in zip(jax.tree_util.tree_leaves(ours[1]), jax.tree_util.tree_leaves(theirs[1]),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    J = jax.vmap(jax.jacfwd(lambda v: kernel(v, params)))(X)
    J_hand = jax.vmap(jax.jacfwd(lambda v: _hand(v[None], params)[0]))(X)
    np.testing.assert_allclose(J, J_hand, rtol=1e-10, atol=1e-12)
    scales = jnp.asarray([0.5, 1.0, 2.0])
    batched = jax.vmap(lambda s: kernel(X * s, params))(scales)
    for k, s in enumerate(scales):
        np.testing.assert_allclose(batched[k], _hand(X * s, params), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(jax.jit(kernel)(X, params), _hand(X, params), rtol=1e-10)
    np.testing.assert_allclose(kernel.bind(params)(X), _hand(X, params), rtol=1e-10)
    loaded = sk.load(kernel.export(X, params))
    np.testing.assert_allclose(loaded(X, params), _hand(X, params), rtol=1e-10)


def test_empty_batch_and_float32():
    kernel, values = _kernel()
    assert kernel(np.zeros((0, 5)), values).shape == (0, 4)
    eqs, x, params, _ = _network((5, 16, 16, 4))
    f32 = sk.build_function(eqs, x, params=params, dtype="float32")
    X = np.random.default_rng(5).normal(size=(20, 5)).astype(np.float32)
    got = f32(X, values)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _hand(X.astype(np.float64), values), rtol=2e-5, atol=2e-6)


def test_contracted_bodies_are_not_vectorized_or_split(monkeypatch):
    eqs, x, params, values = _network((5, 16, 16, 4))
    with pytest.raises(BuildError, match="vectorize=True.*contracted"):
        sk.build_function(eqs, x, params=params, vectorize=True)
    monkeypatch.setattr(passes, "SPLIT_ABOVE_OPERATIONS", 10)
    kernel = sk.build_function(eqs, x, params=params, dtype="float64")
    assert kernel._pieces is None  # pieces pass scalars between them, not blocks
    X = np.random.default_rng(6).normal(size=(8, 5))
    np.testing.assert_allclose(kernel(X, values), _hand(X, values), rtol=1e-12)


# --- the rule on hand-written bodies ------------------------------------------------------

def _forms_source(weights: list[list[str]], biases: list[str], wrap: str = "jnp.tanh",
                  consumer: str = "") -> str:
    """`h_i = wrap(sum_j weights[i][j] * _d_j + biases[i])` for each row, returned (with a
    `consumer` expression appended to the outputs when given)."""
    n = len(weights[0])
    lines = ["def kernel(x1, ps):"]
    lines += [f"    _d{j} = x1[..., {j}]" for j in range(n)]
    for i, row in enumerate(weights):
        terms = " + ".join(f"{w} * _d{j}" if w else f"_d{j}" for j, w in enumerate(row))
        bias = f" + {biases[i]}" if biases[i] else ""
        lines.append(f"    _h{i} = {wrap}({terms}{bias})")
    outputs = [f"_h{i}" for i in range(len(weights))] + ([consumer] if consumer else [])
    lines.append(f"    return {', '.join(outputs)}")
    return "\n".join(lines) + "\n"


def _run(module: ast.Module, hoisted, X, ps):
    function = jax.jit(compile_kernel(module, {}, "<test>"))
    return function(*[jnp.asarray(h.value) for h in hoisted], jnp.asarray(X), ps)


def _weight(kind: int, i: int, j: int) -> str:
    return [f"ps['W'][{i}, {j}]", f"-ps['W'][{i}, {j}]", f"2 * ps['W'][{i}, {j}]",
            f"ps['W'][{i}, {j}] * 0.5", "ps['a']", f"-3 * ps['V'][{j}]", "",
            f"ps['W'][{i}, {j}] * ps['V'][{j}]"][kind]


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(4, 7), inputs=st.integers(4, 6), chain_rule=st.booleans(),
       data=st.data())
def test_weights_signs_numbers_and_biases_against_the_scalar_body(rows, inputs, chain_rule,
                                                                  data):
    # weights that are products of two parameters only in the chain-rule mode
    kinds = data.draw(st.lists(st.lists(st.integers(0, 7 if chain_rule else 6),
                                        min_size=inputs, max_size=inputs),
                               min_size=rows, max_size=rows))
    biases = data.draw(st.lists(st.sampled_from(["", "ps['b'][{i}]", "1.5", "-ps['a']"]),
                                min_size=rows, max_size=rows))
    weights = [[_weight(k, i, j) for j, k in enumerate(row)] for i, row in enumerate(kinds)]
    source = _forms_source(weights, [b.format(i=i) for i, b in enumerate(biases)])
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    X = rng.normal(size=(11, inputs))
    ps = {"W": jnp.asarray(rng.normal(size=(rows, inputs))), "V": jnp.asarray(rng.normal(size=inputs)),
          "a": jnp.asarray(rng.normal()), "b": jnp.asarray(rng.normal(size=rows))}
    hoisted: list = []
    module = ast.parse(source)
    with pytest.MonkeyPatch.context() as patch:  # 4x4 and up, where the default asks for 64
        patch.setattr(contract, "CONTRACT_MIN_TERMS", 16)
        found = contract_linear_forms(module, np.dtype("float64"), hoisted, chain_rule)
    assert found is not None and found.groups == 1 and found.forms == rows
    text = ast.unparse(module)
    assert "jnp.tensordot(" in text
    # one weight matrix read whole, or the weights gathered through const-arg tables
    assert ("ps['W'][:" in text) != bool(hoisted)
    want = _run(ast.parse(source), [], X, ps)
    got = _run(module, hoisted, X, ps)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_left_alone(monkeypatch):
    monkeypatch.setattr(contract, "CONTRACT_MIN_TERMS", 16)
    square = [[f"ps['W'][{i}, {j}]" for j in range(4)] for i in range(4)]
    hoisted: list = []

    def rewrite(source: str):
        return contract_linear_forms(ast.parse(source), np.dtype("float32"), hoisted)

    assert rewrite(_forms_source(square, [""] * 4)) is not None
    hoisted.clear()
    # too few members, too few inputs
    assert rewrite(_forms_source(square[:3], [""] * 3)) is None
    assert rewrite(_forms_source([row[:3] for row in square], [""] * 4)) is None
    # a member read by scalar code: its rows would go through memory
    assert rewrite(_forms_source(square, [""] * 4, consumer="_h0 * 2")) is None
    # a weight that is a product of parameters (a Jacobian's chain rule), unless asked
    products = [[f"ps['W'][{i}, {j}] * ps['W'][{j}, {i}]" for j in range(4)] for i in range(4)]
    assert rewrite(_forms_source(products, [""] * 4)) is None
    assert contract_linear_forms(ast.parse(_forms_source(products, [""] * 4)),
                                 np.dtype("float32"), [], chain_rule=True) is not None
    # an input that is not a named local
    computed = _forms_source(square, [""] * 4).replace("* _d0", "* jnp.sin(_d0)")
    assert rewrite(computed) is None
    # no data argument, a name assigned twice, a body that is not straight-line
    assert rewrite(_forms_source(square, [""] * 4).replace("x1", "y1")) is None
    twice = _forms_source(square, [""] * 4).replace("_d1 = x1[..., 1]", "_d1 = x1[..., 1]\n    _d1 = _d1")
    assert rewrite(twice) is None
    looped = _forms_source(square, [""] * 4).replace("    _d0 = x1[..., 0]",
                                                     "    for _ in ():\n        pass\n    _d0 = x1[..., 0]")
    assert rewrite(looped) is None
    assert hoisted == []


# --- a Jacobian too big to compile whole: chain-rule sums contracted, a chunk at a time ----

def _tiled_jacobian(chunk: int = 16):
    if ("jac", chunk) not in _CACHE:
        eqs, x, params, values = _network((3, 8, 8, 2), jacobian=True)
        with pytest.MonkeyPatch.context() as patch:  # as if above the pieces limit
            patch.setattr(passes, "SPLIT_ABOVE_OPERATIONS", 200)
            patch.setattr(contract, "TILE_CHUNK", chunk)  # chunks of `chunk` samples, padded
            _CACHE["jac", chunk] = (sk.build_function(eqs, x, params=params, dtype="float64"),
                                    values)
    return _CACHE["jac", chunk]


def _hand_jacobian(X, values):
    X = jnp.asarray(X)
    flat = X.reshape(-1, X.shape[-1])
    J = jax.vmap(jax.jacfwd(lambda v: _hand(v[None], values)[0]))(flat)
    return J.reshape(X.shape[:-1] + J.shape[1:])


@settings(max_examples=12, deadline=None)
@given(batch=st.sampled_from([(), (0,), (1,), (16,), (37,), (5, 7)]),
       chunk=st.sampled_from([4, 16, 1024]), seed=st.integers(0, 2**32 - 1))
def test_tiled_jacobian_against_jacfwd(batch, chunk, seed):
    kernel, values = _tiled_jacobian(chunk)
    assert f"vec.chunked(_lt, _ltr, {chunk})" in kernel.source
    assert is_tiled(kernel._generated.module) and kernel.assembly == "fused"
    # the chain-rule sums are products too: weights W2[k,j] * W1[j,c], gathered by tables
    assert kernel.source.count("jnp.tensordot(") == 2 and kernel.const_args
    X = np.random.default_rng(seed).normal(size=batch + (3,))
    got = jax.jit(kernel)(X, values)
    assert got.shape == batch + (2, 3)
    np.testing.assert_allclose(got, _hand_jacobian(X, values), rtol=1e-10, atol=1e-12)


@pytest.mark.slow  # the tiled form's paths run in tests/batching/test_combinations.py too
def test_tiled_jacobian_grad_vmap_bind_export():
    kernel, values = _tiled_jacobian()
    X = jnp.asarray(np.random.default_rng(7).normal(size=(40, 3)))
    params = jax.tree_util.tree_map(jnp.asarray, values)
    ours = jax.grad(lambda X: jnp.sum(kernel(X, params) ** 2))(X)
    theirs = jax.grad(lambda X: jnp.sum(_hand_jacobian(X, params) ** 2))(X)
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12)
    one = jax.vmap(lambda v: kernel(v, params))(X)
    np.testing.assert_allclose(one, _hand_jacobian(X, params), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(kernel.bind(params)(X), _hand_jacobian(X, params), rtol=1e-10)
    loaded = sk.load(kernel.export(X, params), kernel.const_args)
    np.testing.assert_allclose(loaded(X, params), _hand_jacobian(X, params), rtol=1e-10)
    assert not tile(ast.parse("def kernel(x1, ps):\n    _c0 = jnp.sin(x1[..., 0])\n"
                              "    return _c0 * jnp.sum(x1)\n"))  # a data read after the reads


def test_gathered_weights_beside_a_captured_table():
    """Weights that are scalar parameters (not one matrix) are gathered through `_li`
    tables; a user function's captured table is a const arg after them (symkern.load needs
    both)."""
    x = list(sp.symbols("x0:6"))
    w = [[sp.Symbol(f"w{i}{j}") for j in range(6)] for i in range(12)]
    lookup = sp.Function("lookup")
    table = np.linspace(-1.0, 1.0, 64)

    def lookup_jax(u):
        return jnp.take(table, jnp.clip((u * 10 + 32).astype(jnp.int32), 0, 63))

    eqs = [sp.tanh(sp.Add(*[w[i][j] * x[j] for j in range(6)])) for i in range(12)]
    eqs.append(lookup(x[0]) * 2)
    params = {f"w{i}{j}": w[i][j] for i in range(12) for j in range(6)}
    kernel = sk.build_function(eqs, x, params=params, functions={"lookup": lookup_jax},
                               dtype="float64", embed_max_bytes=0)
    assert "jnp.tensordot(" in kernel.source and "_li0" in kernel.source
    names = [c.name for c in kernel.const_args]
    assert names[0].startswith("_li") and not names[-1].startswith("_li")  # tables, then the table
    rng = np.random.default_rng(8)
    values = {k: rng.normal() for k in params}
    X = rng.normal(size=(10, 6)) * 0.5
    W = np.array([[values[f"w{i}{j}"] for j in range(6)] for i in range(12)])
    want = np.concatenate([np.tanh(X @ W.T), 2 * np.asarray(lookup_jax(X[:, 0]))[:, None]], 1)
    got = np.stack(kernel(X, values), axis=-1)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    loaded = sk.load(kernel.export(X, values), kernel.const_args)
    np.testing.assert_allclose(np.stack(loaded(X, values), axis=-1), want, rtol=1e-12)
