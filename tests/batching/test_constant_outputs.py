"""`constant_outputs="unbatched"`: an equation that reads no data comes back shaped like the
equation alone, in every body form and call path, against a reference written in jax.numpy.

The reference gives such an equation without batch axes too; `jax.vmap` of it broadcasts
them, as `jax.vmap` of the kernel must. The default ("broadcast") kernel of the same
equations is a second reference: its batched leaves must be the same bits, its constant
ones the unbatched value at every sample.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st

import symkern as sk
from symkern.batching import build
from symkern.batching.buckets import EXACT_SHAPES
from symkern.codegen import passes
from symkern.errors import ArgumentError, BuildError

x0, x1, a, c = sp.symbols("x0 x1 a c")
UNBATCHED = sk.BuildOptions(constant_outputs="unbatched")


def _eqs(extra_params: tuple = ()) -> dict:
    """Batched leaves (v, mix) and unbatched ones: numbers (I, n), parameter-only (m, k)."""
    tail = sp.Add(*extra_params) if extra_params else sp.Integer(0)
    return {"v": sp.Matrix([sp.sin(x0) * a + x1 + tail, sp.tanh(x0 * x1)]),
            "I": sp.Matrix([[1, 0], [0, 1]]),
            "m": sp.Matrix([[a + c, 2 * a], [0, 1 + tail]]),
            "k": a * c,
            "n": sp.Rational(3, 2),
            "mix": sp.Matrix([x0, 1])}


def _equations(X, ps):
    X = jnp.asarray(X, jnp.float64)
    q, r = X[..., 0], X[..., 1]
    pa, pc = jnp.asarray(ps["a"], jnp.float64), jnp.asarray(ps["c"], jnp.float64)
    tail = sum((jnp.asarray(ps[k], jnp.float64) for k in sorted(ps) if k not in ("a", "c")),
               jnp.float64(0.0))
    return {"v": jnp.stack([jnp.sin(q) * pa + r + tail, jnp.tanh(q * r)], axis=-1),
            "I": jnp.eye(2),
            "m": jnp.stack([jnp.stack([pa + pc, 2 * pa]), jnp.stack([jnp.float64(0.0), 1 + tail])]),
            "k": pa * pc,
            "n": jnp.float64(1.5),
            "mix": jnp.stack([q, jnp.ones_like(q)], axis=-1)}


#: the reference as one program (a call compiles it once per shape, where the operations run
#: one by one compile each of them at each shape)
_reference = jax.jit(_equations)
UNBATCHED_LEAVES = {"I", "m", "k", "n"}


def _build(form: str, constant_outputs: str = "unbatched"):
    extra = sp.symbols("d e f") if form == "packed" else ()
    params = {"a": a, "c": c, **{s.name: s for s in extra}}
    options = sk.BuildOptions(constant_outputs=constant_outputs,
                              interpret=form == "interpreted", vectorize=False)
    if form == "pieces":
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(passes, "SPLIT_ABOVE_OPERATIONS", 8)
            patch.setattr(passes, "PIECE_OPERATIONS", 4)
            patch.setattr(build, "PIECE_OPERATIONS", 4)
            kernel = sk.build_function(_eqs(extra), [x0, x1], params=params, dtype="float64",
                                       options=options, progress=False)
    else:
        kernel = sk.build_function(_eqs(extra), [x0, x1], params=params, dtype="float64",
                                   options=options)
    expected_form = {"interpreted": "interpreted", "pieces": "pieces"}.get(form)
    if expected_form:
        assert kernel.form == expected_form, kernel.form
    if form == "packed":
        assert kernel.packs_parameters
    ps = {"a": 0.7, "c": -1.3, **{s.name: 0.1 * (k + 1) for k, s in enumerate(extra)}}
    return kernel, ps


FORMS = ("scalar", "packed", "interpreted", "pieces")
_KERNELS: dict[tuple[str, str], tuple] = {}


def kernel_of(form: str, constant_outputs: str = "unbatched"):
    if (form, constant_outputs) not in _KERNELS:
        _KERNELS[form, constant_outputs] = _build(form, constant_outputs)
    return _KERNELS[form, constant_outputs]


def _data(batch: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + sum(batch)).uniform(-1.5, 1.5, batch + (2,))


def assert_tree_close(got, want, rtol=1e-12):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                   rtol=rtol, atol=rtol)


def _total(tree):
    return sum(jnp.sum(leaf) for leaf in jax.tree_util.tree_leaves(tree))


def test_the_source_broadcasts_only_what_reads_data():
    kernel, _ = kernel_of("scalar")
    returned = kernel.source.strip().splitlines()[-1]
    assert returned.count("jnp.broadcast_to") == 1, returned  # `mix`'s constant 1
    assert kernel.program.unbatched == (True, True, True, False, True, False)  # I k m mix n v
    default, _ = kernel_of("scalar", "broadcast")
    assert default.program.unbatched == (False,) * 6
    # I's 4 entries, k, m's 4, mix's 1, n
    assert default.source.strip().splitlines()[-1].count("jnp.broadcast_to") == 11


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("batch", [(), (0,), (1,), (64,), (65,), (3, 5)])
def test_every_form_and_batch_matches_the_reference(form, batch):
    kernel, ps = kernel_of(form)
    X = _data(batch)
    got = kernel(X, ps)
    assert_tree_close(got, _reference(X, ps))
    for name in UNBATCHED_LEAVES:
        assert np.shape(got[name]) == np.shape(_reference(X, ps)[name])


@pytest.mark.parametrize("form", FORMS)
def test_past_the_exact_shapes_padded_batches_keep_unbatched_leaves_whole(form):
    kernel, ps = _build(form)  # a kernel of its own: it counts the shapes it has seen
    for n in range(3, 3 + EXACT_SHAPES + 3):
        X = _data((n,), seed=n)
        assert_tree_close(kernel(X, ps), _reference(X, ps))


PATHS = ("jit", "vmap", "vmap_params", "grad_data", "grad_params", "bind", "flat", "shard",
         "stream", "stream_out", "export", "save", "separate", "tuned")


def _path(path: str, kernel, X, ps, tmp_path):
    """(kernel's result, reference's) along `path`."""
    ref = _reference
    if path == "jit":
        return jax.jit(lambda X, ps: kernel(X, ps))(X, ps), ref(X, ps)
    if path == "vmap":
        return jax.vmap(lambda X: kernel(X, ps))(X), jax.vmap(lambda X: ref(X, ps))(X)
    if path == "vmap_params":  # each mapped sample its own `a`: the unbatched leaves read it
        many = {**ps, "a": np.linspace(0.2, 1.4, X.shape[0])}
        axes = ({**{k: None for k in ps}, "a": 0},)
        return (jax.vmap(lambda X, p: kernel(X, p), in_axes=(0,) + axes)(X, many),
                jax.vmap(lambda X, p: ref(X, p), in_axes=(0,) + axes)(X, many))
    if path == "grad_data":
        return (jax.grad(lambda X: _total(kernel(X, ps)))(X),
                jax.grad(lambda X: _total(ref(X, ps)))(X))
    if path == "grad_params":
        return (jax.grad(lambda p: _total(kernel(X, p)))(ps),
                jax.grad(lambda p: _total(ref(X, p)))(ps))
    if path == "bind":
        return kernel.bind(ps)(X), ref(X, ps)
    if path == "flat":
        return kernel.flat()(X, kernel.flatten(ps)), ref(X, ps)
    if path == "shard":
        sharded = kernel.shard()
        result = sharded(X, ps)
        assert_tree_close(sharded.local(result), ref(X, ps))
        return result, ref(X, ps)
    if path == "stream":
        chunks = list(kernel.stream(X, ps, chunk=4, progress=False))
        for chunk in chunks:
            for name in UNBATCHED_LEAVES:
                assert np.shape(chunk[name]) == np.shape(ref(X, ps)[name])
        joined = {name: (chunks[0][name] if name in UNBATCHED_LEAVES
                         else np.concatenate([chunk[name] for chunk in chunks]))
                  for name in chunks[0]}
        return joined, ref(X, ps)
    if path == "stream_out":
        want = ref(X, ps)
        out = {name: np.zeros(np.shape(value)) for name, value in want.items()}
        return kernel.stream(X, ps, chunk=4, out=out, progress=False), want
    if path == "export":
        loaded = sk.load(kernel.export(X, ps), kernel.const_args)
        assert_tree_close(loaded(X[:0], ps), ref(X[:0], ps))
        assert_tree_close(jax.vmap(lambda X: loaded(X, ps))(X.reshape((X.shape[0], 1, 2))),
                          jax.vmap(lambda X: ref(X, ps))(X.reshape((X.shape[0], 1, 2))))
        return loaded(X, ps), ref(X, ps)
    if path == "save":
        loaded = sk.load(kernel.save(tmp_path / "kernel.skx", X, ps))
        return loaded(X, ps), ref(X, ps)
    if path in ("separate", "tuned"):
        other = _build("scalar")[0]
        if path == "separate":
            other.assembly = "separate"
        else:
            assert other.tune(X, ps)["assembly"] in ("fused", "separate")
        return other(X, ps), ref(X, ps)
    raise AssertionError(path)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("path", PATHS)
def test_every_call_path_matches_the_reference(form, path, tmp_path):
    if path in ("separate", "tuned") and form != "scalar":
        pytest.skip("the assembly forms are the scalar kernel's")
    kernel, ps = kernel_of(form)
    X = _data((9,))
    got, want = _path(path, kernel, X, ps, tmp_path)
    assert_tree_close(got, want, rtol=1e-10)


@pytest.mark.parametrize("form", FORMS)
def test_batched_leaves_are_the_default_kernels_bits(form):
    kernel, ps = kernel_of(form)
    default, _ = kernel_of(form, "broadcast")
    X = _data((70,))
    got, full = kernel(X, ps), default(X, ps)
    for name in full:
        if name in UNBATCHED_LEAVES:
            np.testing.assert_array_equal(np.broadcast_to(got[name], np.shape(full[name])),
                                          full[name])
        else:
            np.testing.assert_array_equal(got[name], full[name])


@given(flags=st.lists(st.booleans(), min_size=1, max_size=5),
       batch=st.sampled_from([(), (0,), (1,), (2,), (7,), (65,), (2, 3)]))
def test_random_equations_unbatched_exactly_where_they_read_no_data(flags, batch):
    """Each equation reads data or not (`flags`): the unbatched kernel's leaf is the default
    kernel's without its batch axes exactly where it does not."""
    eqs = [sp.Matrix([[sp.cos(x0) * a + k, x1], [k, a * k]]) if reads
           else sp.Matrix([[a + k, 1], [k * c, 0]]) for k, reads in enumerate(flags)]
    ps = {"a": 0.3, "c": 2.0}
    kernel = sk.build_function(eqs, [x0, x1], params={"a": a, "c": c}, dtype="float64",
                               options=UNBATCHED)
    default = sk.build_function(eqs, [x0, x1], params={"a": a, "c": c}, dtype="float64")
    X = _data(batch)
    got, full = kernel(X, ps), default(X, ps)
    for reads, leaf, wide in zip(flags, got, full, strict=True):
        assert np.shape(leaf) == (np.shape(wide) if reads else (2, 2))
        np.testing.assert_array_equal(np.broadcast_to(leaf, np.shape(wide)), wide)


def test_one_sample_and_no_data_equation_at_all():
    kernel = sk.build_function([sp.Matrix([a, 1]), a * c], [x0], params={"a": a, "c": c},
                               dtype="float64", options=UNBATCHED)
    for X in (np.zeros(1), np.zeros((4, 1)), np.zeros((2, 3, 1))):
        got = kernel(X, {"a": 2.0, "c": 3.0})
        assert [np.shape(v) for v in got] == [(2,), ()]
        np.testing.assert_array_equal(got[0], [2.0, 1.0])


def test_stream_out_asks_an_unbatched_equations_own_shape():
    kernel, ps = kernel_of("scalar")
    X = _data((6,))
    out = {name: np.zeros(np.shape(value)) for name, value in _reference(X, ps).items()}
    out["I"] = np.zeros((6, 2, 2))
    with pytest.raises(ArgumentError, match=r"out leaf 0: expected shape \(2, 2\) for an unbatched"):
        kernel.stream(X, ps, chunk=4, out=out, progress=False)


def test_the_option_is_checked_and_refused_where_it_has_no_meaning():
    with pytest.raises(BuildError, match="constant_outputs: expected one of"):
        sk.BuildOptions(constant_outputs="lazy")
    W, xm = sp.MatrixSymbol("W", 2, 2), sp.MatrixSymbol("xm", 2, 1)
    with pytest.raises(BuildError, match="constant_outputs: 'unbatched' applies to scalar bodies"):
        sk.build_function(W * xm, xm, params={"W": W}, options=UNBATCHED)
    snn = sk.SymbolicNetwork(sk.Chain(sk.Dense(2, 40, "tanh"), sk.Linear(40, 1)))
    with pytest.raises(BuildError, match="constant_outputs: 'unbatched' applies to scalar bodies"):
        sk.build_nn_function(snn.output, snn, options=UNBATCHED)


def test_complex_and_boolean_equations_keep_their_dtype_unbatched():
    x = sp.Symbol("x")
    kernel = sk.build_function([sp.I * a, sp.exp(sp.I * x), sp.Matrix([1 + sp.I, a])], [x],
                               params={"a": a}, options=UNBATCHED)
    got = kernel(np.zeros((3, 1)), {"a": 2.0})
    assert [(np.shape(v), v.dtype) for v in got] == [((), np.complex128), ((3,), np.complex128),
                                                     ((2,), np.complex128)]
    np.testing.assert_array_equal(got[2], [1 + 1j, 2.0])
    kernel = sk.build_function([sp.true, x > 0, a > 1], [x], params={"a": a}, options=UNBATCHED)
    got = kernel(np.ones((3, 1)), {"a": 2.0})
    assert [(np.shape(v), v.dtype) for v in got] == [((), bool), ((3,), bool), ((), bool)]
    assert bool(got[0]) and bool(got[2]) and np.all(got[1])
