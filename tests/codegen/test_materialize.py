"""Tests of symkern.codegen.materialize: which values go into `lax.cond`, at which level, and
kernels built with it against independent references (SymPy float64, hand-written JAX,
jax.jacfwd), under jit, vmap, grad, bind and export."""

from __future__ import annotations

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
from symkern.codegen.materialize import PREDICATE, STAGE_PREFIX, is_costly, materialize_shared
from symkern.errors import CodegenDriftError


def _rewrite(source: str, data=("x1",)):
    return materialize_shared(ast.parse(source), list(data))


def _stage_outputs(module: ast.Module) -> list[list[str]]:
    """The names each `lax.cond` assigns, in order."""
    function = module.body[0]
    levels = []
    for statement in function.body:
        if (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Call)
                and ast.unparse(statement.value.func) == "lax.cond"):
            levels.append([n.id for n in statement.targets[0].elts])
    return levels


SOURCE = """
def kernel(x1, ps):
    _d0 = x1[..., 0]
    _d1 = x1[..., 1]
    _c0 = jnp.cos(_d0)
    _c1 = jnp.sin(_d1)
    _c2 = jnp.exp(ps['a'])
    _c3 = _d0 * _d1
    _c5 = _c0 + _c3
    _c4 = jnp.tanh(_c5)
    _c6 = jnp.exp(_c3 + _d0)
    return _c0 * _c1, _c0 + _c2, _c1 * _c4, _c4 - _c3, _c3 + _c6, _c6
"""


def test_shared_costly_batched_values_only():
    module = _rewrite(SOURCE)
    # _c0 (cos, three entries) and then _c4 (tanh of _c5, which reads _c0; two entries) at
    # the next level; _c1 (sin) is shared too; _c2 reads only a parameter; _c3 is shared
    # but cheap; _c6, an exp of arithmetic, is costly and shared too
    assert _stage_outputs(module) == [["_c0", "_c1", "_c6"], ["_c4"]]
    text = ast.unparse(module)
    assert f"{PREDICATE} = jnp.isnan(jnp.sum(jnp.ravel(x1)[:1]))" in text
    assert f"def {STAGE_PREFIX}0():" in text and f"def {STAGE_PREFIX}1():" in text
    # the kernel's own body no longer computes what the conditionals return
    body = [ast.unparse(s) for s in module.body[0].body if isinstance(s, ast.Assign)]
    assert not any(line.startswith(("_c0 =", "_c1 =", "_c4 =")) for line in body)


def test_nothing_to_do():
    one_entry = "def kernel(x1, ps):\n    _c0 = jnp.sin(x1[..., 0])\n    return _c0 * _c0\n"
    assert _rewrite(one_entry) is None  # one entry: one fusion, nothing to duplicate
    cheap = "def kernel(x1, ps):\n    _c0 = x1[..., 0] * 2\n    return _c0 + 1, _c0 * 3\n"
    assert _rewrite(cheap) is None
    params_only = "def kernel(x1, ps):\n    _c0 = jnp.sin(ps['a'])\n    return _c0 * x1[..., 0], _c0\n"
    assert _rewrite(params_only) is None
    assert _rewrite(SOURCE, data=()) is None  # no data argument: nothing batched


def test_a_name_assigned_twice_is_left_alone():
    twice = ("def kernel(x1, ps):\n    _c0 = jnp.sin(x1[..., 0])\n    _c0 = jnp.cos(_c0)\n"
             "    return _c0, _c0 + 1\n")
    assert _rewrite(twice) is None


def test_not_straight_line_is_left_alone():
    vectorized = ("def kernel(x1, ps):\n    def _levels(_R):\n        return _R\n"
                  "    _c0 = jnp.sin(x1[..., 0])\n    return _c0, _c0 + 1\n")
    assert _rewrite(vectorized) is None


def test_drift_is_loud():
    with pytest.raises(CodegenDriftError, match="materialize_shared"):
        _rewrite("def other(x1):\n    return x1\n")
    with pytest.raises(CodegenDriftError, match="return"):
        _rewrite("def kernel(x1, ps):\n    _c0 = x1\n")


@pytest.mark.parametrize(("expression", "costly"), [
    ("jnp.sin(_d0)", True),
    ("jnp.sin(ps['a']) * _d0", False),  # a scalar per fusion, not per element
    ("1 / 2 * _d0", False),
    ("_d0 / 2", False),
    ("2 / _d0", True),
    ("_d0 ** 0.5", True),
    ("lax.integer_pow(_d0, 2)", False),
    ("lax.integer_pow(_d0, -1)", True),
    ("jsp.erf(_d0)", True),
    ("jnp.hypot(_d0, _d0)", True),
    ("functions['f'](_d0)", True),
    ("jnp.abs(_d0) + _d0 * _d0", False),
    ("jnp.tanh(_d0 + 1)", True),  # an operand that is arithmetic: a network's tanh of a sum
    ("x1[..., 0] / _d0", True),
])
def test_is_costly(expression, costly):
    assert is_costly(ast.parse(expression, mode="eval").body, {"_d0", "x1"}) is costly


q = sp.symbols("q0:3")
a, b = sp.symbols("a b")


def _mass_like():
    """Entries that all read the same few sines and cosines (a mass matrix's pattern)."""
    s, c = [sp.sin(v) for v in q], [sp.cos(v) for v in q]
    rows = [[a * c[i] * c[j] + b * s[i] * s[j] + (1 if i == j else 0) for j in range(3)]
            for i in range(3)]
    return sp.Matrix(rows), [sp.tanh(c[0] * s[1]) * s[2], sp.sqrt(1 + c[0] ** 2) * s[1]]


def _hand(X, ps):
    s, c = jnp.sin(X), jnp.cos(X)
    M = ps["a"] * c[..., :, None] * c[..., None, :] + ps["b"] * s[..., :, None] * s[..., None, :]
    M = M + jnp.eye(3, dtype=X.dtype)
    v = [jnp.tanh(c[..., 0] * s[..., 1]) * s[..., 2], jnp.sqrt(1 + c[..., 0] ** 2) * s[..., 1]]
    return M, v


def _kernel(**options):
    # the library's sin: this counts XLA's sine calls (the polynomial has none)
    M, v = _mass_like()
    return sk.build_function([M, v], list(q), params={"a": a, "b": b},
                             options=sk.BuildOptions(trig="library", **options))


PS = {"a": 0.7, "b": -1.3}


def _sine_count(kernel, X):
    ps = {k: jnp.float32(v) for k, v in PS.items()}
    text = jax.jit(kernel).lower(X, ps).compile().as_text()
    return len(re.findall(r"\bsine\(", text))


def test_kernel_computes_each_shared_sine_once():
    kernel = _kernel()
    assert "lax.cond(" in kernel.source
    X = jnp.asarray(np.random.default_rng(0).uniform(-2, 2, (4096, 3)), jnp.float32)
    # sin(q0..q2) once each in each of the conditional's two (identical) branches; the same
    # kernel without the rule repeats them in every entry's fusion
    assert _sine_count(kernel, X) == 6
    plain = _kernel(materialize=False)
    assert "lax.cond(" not in plain.source
    assert _sine_count(plain, X) > 6
    for ours, theirs in zip(jax.tree_util.tree_leaves(kernel(X, PS)),
                            jax.tree_util.tree_leaves(plain(X, PS)), strict=True):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


@settings(max_examples=25, deadline=None)
@given(batch=st.sampled_from([(), (1,), (7,), (64,), (3, 5), (300,)]),
       seed=st.integers(0, 2**32 - 1))
def test_values_against_sympy_float64(batch, seed):
    kernel = _kernel_cached()
    X = np.random.default_rng(seed).uniform(-3, 3, batch + (3,))
    got_M, got_v = kernel(X, PS)
    M, v = _mass_like()
    reference = sp.lambdify([list(q), a, b], [M, v], "numpy")
    flat = X.reshape(-1, 3)
    ref_M = np.array([np.asarray(reference(row, PS["a"], PS["b"])[0], float) for row in flat])
    ref_v = np.array([[float(e) for e in reference(row, PS["a"], PS["b"])[1]] for row in flat])
    assert np.shape(got_M) == batch + (3, 3) and np.shape(got_v[0]) == batch
    np.testing.assert_allclose(np.asarray(got_M).reshape(-1, 3, 3), ref_M, rtol=2e-5, atol=2e-5)
    for k in range(2):
        np.testing.assert_allclose(np.asarray(got_v[k]).reshape(-1), ref_v[:, k],
                                   rtol=2e-5, atol=2e-5)


_CACHE: dict = {}


def _kernel_cached():
    if "k" not in _CACHE:
        _CACHE["k"] = _kernel()
    return _CACHE["k"]


def test_grad_vmap_jit_bind_export_against_hand_written_jax():
    kernel = _kernel_cached()
    rng = np.random.default_rng(1)
    X = jnp.asarray(rng.uniform(-2, 2, (33, 3)), jnp.float32)
    ps = {k: jnp.float32(v) for k, v in PS.items()}

    def scalar(f):
        def total(X, ps):
            M, v = f(X, ps)
            return jnp.sum(M ** 2) + jnp.sum(v[0] * v[1])
        return total

    ours = jax.grad(scalar(kernel), argnums=(0, 1))(X, ps)
    theirs = jax.grad(scalar(_hand), argnums=(0, 1))(X, ps)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-4, atol=1e-4)
    for key in ps:
        np.testing.assert_allclose(ours[1][key], theirs[1][key], rtol=1e-4)
    # per-sample Jacobians through vmap(jacfwd) of the kernel on one sample
    J = jax.vmap(jax.jacfwd(lambda x: kernel(x, ps)[0]))(X)
    J_hand = jax.vmap(jax.jacfwd(lambda x: _hand(x, ps)[0]))(X)
    np.testing.assert_allclose(J, J_hand, rtol=1e-4, atol=1e-5)
    # vmap over a parameter (the predicate is then batched: a select of equal branches)
    scales = jnp.asarray([0.5, 1.0, 2.0], jnp.float32)
    batched = jax.vmap(lambda s: kernel(X, {"a": s, "b": ps["b"]})[0])(scales)
    for k, s in enumerate(scales):
        np.testing.assert_allclose(batched[k], _hand(X, {"a": s, "b": ps["b"]})[0],
                                   rtol=1e-5, atol=1e-5)
    jitted = jax.jit(kernel)(X, ps)
    np.testing.assert_allclose(jitted[0], _hand(X, ps)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(kernel.bind(ps)(X)[0], _hand(X, ps)[0], rtol=1e-5, atol=1e-5)
    loaded = sk.load(kernel.export(X, ps))
    np.testing.assert_allclose(loaded(X, ps)[0], _hand(X, ps)[0], rtol=1e-5, atol=1e-5)


def test_empty_batch_and_nan_inputs():
    kernel = _kernel_cached()
    M, v = kernel(np.zeros((0, 3), np.float32), PS)
    assert M.shape == (0, 3, 3) and v[0].shape == (0,)
    X = np.array([[np.nan, 0.0, 1.0], [0.5, 0.25, -1.0]], np.float32)
    got = kernel(X, PS)[0]
    assert np.isnan(np.asarray(got[0])).any()  # the predicate is NaN-true: same branch body
    np.testing.assert_allclose(got[1], _hand(jnp.asarray(X[1:]), PS)[0][0], rtol=1e-5)
