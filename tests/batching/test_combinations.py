"""Every body form × batch shapes around every threshold × every call path, against a reference.

The forms are the pipeline's (symkern.codegen.passes.FORMS and the polynomial sin and cos):
scalar (with and without const args, with parameters and two data arguments), contracted,
tiled, vectorized, pieces, structured, the array program of a matrix expression, parameters
packed in one buffer (both sides of batching.packing.PACK_FROM_LEAVES: the scalar form's two
parameters, the packed form's five), the interpreter's instruction table (with two data
arguments, and with packed parameters), the C loop of `BuildOptions(cpu_loop="c")` (in
both dtypes, with packed parameters, writing its outputs past the caches from 64
samples on, and with log and powers in a block of several sections; skipped without a C++
compiler), and a batch of linear systems with
`jnp.linalg.solve` and with the C solve on both sides of its unrolled sizes. The batch shapes
sit on both sides of each size the kernels know (1, 63-65, 1,023-1,025, 4,095-4,097, the
tiles of 4,096, the interpreter's 1,024 and the C loop's two threads, built here to take at
least 32 samples each, and outputs with and without whole huge pages for the C loop) and
include `()` and a 2-D batch. The call paths are eager,
`jax.jit`, `jax.vmap`, `jax.grad` with respect to data and parameters, bind, flat, shard,
stream and export/load.
Each result is compared with an independent float64 reference: the same equations written by
hand in `jax.numpy` (a network too), differentiated by `jax.grad`.

`make test` runs a bounded profile: every path at two batch shapes, and every batch shape
eagerly; `SYMKERN_SLOW=1` (`make test-all`) runs the whole matrix.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp

import symkern as sk
from symkern.batching.packing import PACK_FROM_LEAVES
from symkern.codegen import c_loop as c_printing
from symkern.codegen import passes
from symkern.codegen.c_solve import UNROLLED_UP_TO
from symkern.kernels import c_loop as c_loops
from symkern.kernels import memory

SLOW = bool(os.environ.get("SYMKERN_SLOW"))
BATCHES: tuple[tuple[int, ...], ...] = (
    (), (1,), (63,), (64,), (65,), (1023,), (1024,), (1025,), (4095,), (4096,), (4097,), (3, 5))
#: the batches every call path runs at in the bounded profile (the 2-D one: TWO_D_PATHS)
PATH_BATCHES = ((65,), (3, 5))
TWO_D_PATHS = ("eager", "jit", "vmap")
#: the bounded profile's eager batches of the forms whose thresholds sit elsewhere (each new
#: shape compiles; pieces compile every piece): both sides of 64 and of a tile of 4,096
EAGER_BATCHES = {form: ((), (1,), (64,), (65,), (4096,), (4097,), (3, 5))
                 for form in ("scalar-const-args", "contracted", "vectorized", "scalar-packed",
                             "array", "array-solve", "array-c-solve", "array-c-solve-general")}
EAGER_BATCHES["pieces"] = ((1,), (64,), (65,), (3, 5))
# both sides of a tile of 1,024 and of the register quantum of 64 (every path runs at 65
# and at (3, 5), 15 samples, too)
for _form in ("interpreted", "interpreted-packed"):
    EAGER_BATCHES[_form] = ((), (1,), (1023,), (1024,), (1025,), (3, 5))
EAGER_BATCHES["tiled"] = ((1,), (63,), (64,), (65,), (1025,), (3, 5))  # tiles of 64 here
for _form in ("c-loop", "c-loop-float32", "c-loop-packed", "c-loop-streamed",
              "c-loop-powers-sections"):
    # both sides of two threads (and of streaming from 64 samples)
    EAGER_BATCHES[_form] = ((), (1,), (63,), (64,), (65,), (4097,), (3, 5))
PATHS = ("eager", "jit", "vmap", "grad_data", "grad_params", "bind", "flat", "shard", "stream",
         "export")
#: batches every call path runs at for one form, in the bounded profile too: at 262,145
#: samples the C loop's outputs hold whole 2 MiB pages, which its call advises the kernel to
#: back with huge pages; at PATH_BATCHES they hold none
FORM_PATH_BATCHES = {"c-loop": ((262_145,),)}


@dataclass
class Case:
    """A kernel of one form, its reference, how to make its data and parameter values."""

    kernel: Any
    reference: Callable[..., Any]  # (data..., ps) -> the equations' structure, in float64
    data: Callable[[tuple[int, ...]], tuple[np.ndarray, ...]]
    ps: Any
    rtol: float = 1e-10
    #: the reference as jitted programs (`references`)
    jitted: dict[str, Callable[..., Any]] = field(default_factory=dict)


# ---- the forms ---------------------------------------------------------------------------

x0, x1, y, a, c = sp.symbols("x0 x1 y a c")
lookup = sp.Function("lookup")
TABLE = np.linspace(0.0, 1.0, 256) ** 2  # 2 KiB: a const arg


def _lookup_jax(v: Any) -> Any:
    return jnp.interp(v, jnp.linspace(-4.0, 4.0, TABLE.size), jnp.asarray(TABLE))


def _uniform(shape: tuple[int, ...], width: int | None, seed: int, scale: float = 1.5):
    full = shape + ((width,) if width else ())
    return np.random.default_rng(seed + sum(shape)).uniform(-scale, scale, full)


#: the fewest samples a thread of a `cpu_loop="c"` kernel takes in these cases: the batches
#: of 63-65 sit on both sides of two threads (kernels otherwise take symkern.kernels.c_loop.GRAIN)
C_LOOP_GRAIN = 32


@contextlib.contextmanager
def c_loop_grain(cpu_loop: str) -> Iterator[None]:
    """Builds inside run a `cpu_loop="c"` kernel with threads of C_LOOP_GRAIN samples; the
    case is skipped where there is no C++ compiler."""
    if cpu_loop != "c":
        yield
        return
    if c_loops.compiler() is None:
        pytest.skip("cpu_loop='c' needs a C++ compiler")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(c_loops, "GRAIN", C_LOOP_GRAIN)
        yield


def _scalar_case(dtype: str = "float64", const: bool = False, interpret: bool = False,
                 cpu_loop: str = "xla", stream_from_samples: int | None = None,
                 powers: bool = False, section_operations: int | None = None) -> Case:
    extra = lookup(x0) if const else sp.Integer(0)
    # `powers`: log, a power of half an odd integer and a power the C loop computes as pow,
    # exp(y log x) inline where |y log x| <= 1 in float64 (c_math.POW_INLINE_UP_TO) and the C
    # library's pow elsewhere: |y log(2 + x1)| reaches 1.9 on the data below
    # and x1*exp(c): a parameter's function inside an entry data reaches, computed once a
    # call (`h_K`); tanh(20 x1) on both sides of c_math.TANH_SATURATES (|20 x1| reaches 30)
    more = (sp.log(2 + x0) + (1 + x0 ** 2) ** sp.Rational(3, 2) + (2 + x1) ** y
            + x1 * sp.exp(c) + sp.tanh(20 * x1) if powers else sp.Integer(0))
    eqs = {"v": sp.Matrix([sp.sin(x0) * a + x1 * y + extra, sp.tanh(x0 * x1), sp.cos(y) * c]),
           "s": sp.cos(x0) * a * y - sp.exp(-x1 ** 2) * c + more}
    functions = {"lookup": _lookup_jax} if const else None
    with c_loop_grain(cpu_loop), pytest.MonkeyPatch.context() as patch:
        if stream_from_samples is not None:  # as if the last-level cache held that many
            # samples' four entries: the C loop writes larger outputs past the caches
            size = stream_from_samples * 4 * np.dtype(dtype).itemsize
            patch.setattr(memory, "last_level_cache_bytes", lambda: size)
        if section_operations is not None:  # a block in sections of at most this many operations
            patch.setattr(c_printing, "SECTIONS_ABOVE_OPERATIONS", section_operations)
            patch.setattr(c_printing, "SECTION_OPERATIONS", section_operations)
        kernel = sk.build_function(eqs, [x0, x1], y, params={"a": a, "c": c}, dtype=dtype,
                                   functions=functions,
                                   options=sk.BuildOptions(interpret=interpret, cpu_loop=cpu_loop))
    assert (kernel.form == "interpreted") == interpret, kernel.form
    if powers and cpu_loop == "c":
        assert "sk_pow_core(" in kernel.source and "sqrt(" in kernel.source
        assert re.search(r"const double h_\d+ = sk_exp\(p_\d+\);", kernel.source)
    if section_operations is not None:
        assert "sk_section_2(" in kernel.source, kernel.source
    if const:
        assert kernel.const_args, "the table is a const arg"

    def reference(X, Y, ps):
        X, Y = jnp.asarray(X, jnp.float64), jnp.asarray(Y, jnp.float64)
        q, r = X[..., 0], X[..., 1]
        lk = _lookup_jax(q) if const else 0.0
        return {"v": jnp.stack([jnp.sin(q) * ps["a"] + r * Y + lk, jnp.tanh(q * r),
                                jnp.cos(Y) * ps["c"]], axis=-1),
                "s": jnp.cos(q) * ps["a"] * Y - jnp.exp(-r ** 2) * ps["c"]
                + (jnp.log(2 + q) + (1 + q ** 2) ** 1.5 + (2 + r) ** Y + r * jnp.exp(ps["c"])
                   + jnp.tanh(20 * r) if powers else 0.0)}

    cast = np.float32 if dtype == "float32" else np.float64
    return Case(kernel, reference,
                lambda shape: (_uniform(shape, 2, 0).astype(cast), _uniform(shape, None, 1).astype(cast)),
                {"a": cast(0.7), "c": cast(-1.3)}, 1e-10 if dtype == "float64" else 2e-5)


def _network(sizes: tuple[int, ...]):
    xs = list(sp.symbols(f"n0:{sizes[0]}"))
    params, values = {}, {}
    rng = np.random.default_rng(sum(sizes))
    h = list(xs)
    for k, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        W = sp.Matrix(n_out, n_in, lambda i, j, k=k: sp.Symbol(f"W{k}_{i}_{j}"))
        b = sp.Matrix(n_out, 1, lambda i, _, k=k: sp.Symbol(f"b{k}_{i}"))
        params[f"L{k}"] = {"W": W, "b": b}
        values[f"L{k}"] = {"W": rng.normal(size=(n_out, n_in)) / np.sqrt(n_in),
                           "b": rng.normal(size=n_out)}
        h = [sp.tanh(sp.Add(*[W[i, j] * h[j] for j in range(n_in)], b[i])) for i in range(n_out)]
    return sp.Matrix(h), xs, params, values


def _network_reference(X, ps):
    h = jnp.asarray(X, jnp.float64)
    for key in sorted(ps):
        h = jnp.tanh(h @ jnp.asarray(ps[key]["W"], jnp.float64).T
                     + jnp.asarray(ps[key]["b"], jnp.float64))
    return h


def _contracted_case(tiled: bool = False) -> Case:
    eqs, xs, params, values = _network((5, 16, 16, 4))
    with pytest.MonkeyPatch.context() as patch:
        if tiled:  # as if above the pieces limit: chain-rule sums too, run in tiles of 64
            patch.setattr(passes, "SPLIT_ABOVE_OPERATIONS", 200)
            patch.setattr(sk.codegen.contract, "TILE_CHUNK", 64)
        kernel = sk.build_function(eqs, xs, params=params, dtype="float64")
    assert kernel.form == ("tiled" if tiled else "contracted"), kernel.form
    return Case(kernel, _network_reference, lambda shape: (_uniform(shape, 5, 2),), values)


P = sp.symbols("p0:3")
V = sp.symbols("v0:4")


def _templated_eqs():
    terms = [sp.sin(P[i % 3] * V[i % 4]) * V[(i + 1) % 4] * (i + 1) for i in range(60)]
    return sp.Matrix([sp.Add(*terms[:30]), sp.Add(*terms[30:])])


def _templated_reference(X, ps):
    X = jnp.asarray(X, jnp.float64)
    p = [jnp.asarray(ps[f"p{k}"], jnp.float64) for k in range(3)]
    terms = [jnp.sin(p[i % 3] * X[..., i % 4]) * X[..., (i + 1) % 4] * (i + 1) for i in range(60)]
    return jnp.stack([sum(terms[:30]), sum(terms[30:])], axis=-1)


def _vectorized_case() -> Case:
    kernel = sk.build_function(_templated_eqs(), list(V), params={f"p{k}": P[k] for k in range(3)},
                               dtype="float64", vectorize=True)
    assert kernel.form == "vectorized"
    return Case(kernel, _templated_reference, lambda shape: (_uniform(shape, 4, 3),),
                {f"p{k}": 0.3 * (k + 1) for k in range(3)})


def _pieces_case() -> Case:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(passes, "SPLIT_ABOVE_OPERATIONS", 50)
        patch.setattr(passes, "PIECE_OPERATIONS", 40)
        kernel = sk.build_function(_templated_eqs(), list(V),
                                   params={f"p{k}": P[k] for k in range(3)}, dtype="float64",
                                   vectorize=False, progress=False)
    assert kernel.form == "pieces"
    return Case(kernel, _templated_reference, lambda shape: (_uniform(shape, 4, 4),),
                {f"p{k}": 0.3 * (k + 1) for k in range(3)})


def hnn_case(hidden: int, dtype: str = "float64") -> Case:
    """The README's Hamiltonian network: H = Linear(tanh(Dense(2, hidden)(x))), field
    (dH/dp, -dH/dq), a structured kernel above 64 weights."""
    net = sk.Chain(sk.Dense(2, hidden, "tanh"), sk.Linear(hidden, 1))
    snn = sk.SymbolicNetwork(net)
    g = sk.gradient(snn.output[0], snn.input)
    kernel = sk.build_nn_function(sp.Matrix([g[1], -g[0]]), snn, dtype=dtype)

    def reference(X, ps):
        def H(x):
            h = jnp.tanh(jnp.asarray(ps["L1"]["W"], jnp.float64) @ x
                         + jnp.asarray(ps["L1"]["b"], jnp.float64))
            return (jnp.asarray(ps["L2"]["W"], jnp.float64) @ h
                    + jnp.asarray(ps["L2"]["b"], jnp.float64))[0]

        X = jnp.asarray(X, jnp.float64)
        flat = X.reshape((-1, 2))
        grads = jax.vmap(jax.grad(H))(flat)
        return jnp.stack([grads[:, 1], -grads[:, 0]], axis=-1).reshape(X.shape)

    cast = np.float32 if dtype == "float32" else np.float64
    ps = jax.tree_util.tree_map(lambda v: np.asarray(v, cast), net.init_params(seed=hidden))
    return Case(kernel, reference, lambda shape: (_uniform(shape, 2, 5).astype(cast),), ps,
                1e-10 if dtype == "float64" else 2e-5)


def _packed_case(interpret: bool = False, cpu_loop: str = "xla") -> Case:
    """Five scalar parameters: past PACK_FROM_LEAVES, every executable takes them as one
    buffer (the scalar form's two parameters stay separate arguments)."""
    d, e, f = sp.symbols("d e f")
    # with the C loop and the interpreter, two entries no data reaches between those it does
    # (the C loop computes them once a call and copies them into each block's rows); not with
    # XLA's compiled program, which with `a*c + exp(f)` among its entries gives a sample of a
    # batch of 1 other last bits than in a larger batch: XLA's CPU backend contracts
    # multiply-adds into fused ones program by program (docs/design/output-assembly.md,
    # "Determinism"), and test_a_sample_gets_the_same_bits_in_every_batch fails on it
    invariant = cpu_loop == "c" or interpret
    entries = [sp.sin(x0) * a + x1 * d, sp.cos(x1) * c - e * x0 ** 2 + f]
    eqs = sp.Matrix([entries[0], sp.Rational(1, 2), entries[1], a * c + sp.exp(f)] if invariant
                    else entries)
    with c_loop_grain(cpu_loop):
        kernel = sk.build_function(eqs, [x0, x1],
                                   params={"a": a, "c": c, "d": d, "e": e, "f": f},
                                   dtype="float64",
                                   options=sk.BuildOptions(interpret=interpret, cpu_loop=cpu_loop))
    assert kernel.packs_parameters and len({"a", "c", "d", "e", "f"}) >= PACK_FROM_LEAVES
    assert (kernel.form == "interpreted") == interpret, kernel.form

    def reference(X, ps):
        X = jnp.asarray(X, jnp.float64)
        q, r = X[..., 0], X[..., 1]

        def each(value):
            return jnp.broadcast_to(value, q.shape)

        first, second = (jnp.sin(q) * ps["a"] + r * ps["d"],
                         jnp.cos(r) * ps["c"] - ps["e"] * q ** 2 + ps["f"])
        return jnp.stack([first, each(0.5), second, each(ps["a"] * ps["c"] + jnp.exp(ps["f"]))]
                         if invariant else [first, second], axis=-1)

    return Case(kernel, reference, lambda shape: (_uniform(shape, 2, 3),),
                {"a": 0.7, "c": -1.3, "d": 0.4, "e": 1.1, "f": -0.2})


def _array_case() -> Case:
    """A matrix expression of MatrixSymbols: the array program (`s*W*x + b`, its trace)."""
    W, b = sp.MatrixSymbol("W", 3, 2), sp.MatrixSymbol("b", 3, 1)
    xm, s = sp.MatrixSymbol("xm", 2, 1), sp.Symbol("s")
    M = sp.MatrixSymbol("M", 2, 2)
    eqs = {"y": s * W * xm + b, "t": sp.Trace(M * xm * xm.T)}
    kernel = sk.build_function(eqs, xm, params={"W": W, "b": b, "s": s, "M": M},
                               dtype="float64")
    assert kernel.form == "structured" and "@" in kernel.source, kernel.source

    def reference(X, ps):
        X = jnp.asarray(X, jnp.float64)
        W, b, M = (jnp.asarray(ps[k], jnp.float64) for k in ("W", "b", "M"))
        y = ps["s"] * X @ W.T + b[:, 0]
        return {"t": jnp.einsum("ij,...j,...i->...", M, X, X), "y": y}

    rng = np.random.default_rng(11)
    return Case(kernel, reference, lambda shape: (_uniform(shape, 2, 4),),
                {"W": rng.normal(size=(3, 2)), "b": rng.normal(size=(3, 1)), "s": 0.8,
                 "M": rng.normal(size=(2, 2))})


def _solve_case(size: int, cpu_loop: str = "xla") -> Case:
    """A batch of linear systems, `s * Inverse(A) * b` with A and b read from the data: one
    batched `jnp.linalg.solve`, or with `cpu_loop="c"` the C solve, whose systems of up to
    UNROLLED_UP_TO unknowns run an unrolled copy and the larger ones its general loop."""
    A, bv, s = sp.MatrixSymbol("A", size, size), sp.MatrixSymbol("bv", size, 1), sp.Symbol("s")
    with c_loop_grain(cpu_loop):
        kernel = sk.build_function({"x": s * sp.Inverse(A) * bv}, A, bv, params={"s": s},
                                   dtype="float64", options=sk.BuildOptions(cpu_loop=cpu_loop))
    solver = "clinalg.solve(" if cpu_loop == "c" else "jnp.linalg.solve("
    assert solver in kernel.source, kernel.source

    def reference(M, v, ps):
        M, v = jnp.asarray(M, jnp.float64), jnp.asarray(v, jnp.float64)
        return {"x": ps["s"] * jnp.linalg.solve(M, v[..., None])[..., 0]}

    def data(shape):  # far from singular: the diagonal shifted by the size
        return _uniform(shape + (size,), size, 6) + size * np.eye(size), _uniform(shape, size, 7)

    return Case(kernel, reference, data, {"s": 0.8}, 1e-9)


FORMS: dict[str, Callable[[], Case]] = {
    "scalar": _scalar_case,
    "scalar-const-args": lambda: _scalar_case(const=True),
    "scalar-polynomial-trig": lambda: _scalar_case("float32"),
    "contracted": _contracted_case,
    "tiled": lambda: _contracted_case(tiled=True),
    "vectorized": _vectorized_case,
    "pieces": _pieces_case,
    "structured": lambda: hnn_case(40),
    "scalar-packed": _packed_case,
    "array": _array_case,
    # the instruction table (symkern.codegen.interpret), its scalars and packed parameters
    "interpreted": lambda: _scalar_case(interpret=True),
    "interpreted-packed": lambda: _packed_case(interpret=True),
    # one C loop over the batch (BuildOptions(cpu_loop="c"), threads of C_LOOP_GRAIN samples)
    "c-loop": lambda: _scalar_case(cpu_loop="c"),
    "c-loop-float32": lambda: _scalar_case("float32", cpu_loop="c"),
    "c-loop-packed": lambda: _packed_case(cpu_loop="c"),
    # outputs from 64 samples on written past the caches (symkern.kernels.c_loop.streams)
    "c-loop-streamed": lambda: _scalar_case(cpu_loop="c", stream_from_samples=64),
    # log and powers, its block in sections (symkern.codegen.c_loop.SECTION_OPERATIONS)
    # of at most 40 operations
    "c-loop-powers-sections": lambda: _scalar_case(cpu_loop="c", powers=True, section_operations=40),
    # a batch of linear systems: jnp.linalg.solve (what the C solve leaves above
    # SOLVE_UP_TO), and the C solve on both sides of UNROLLED_UP_TO
    "array-solve": lambda: _solve_case(3),
    "array-c-solve": lambda: _solve_case(3, cpu_loop="c"),
    "array-c-solve-general": lambda: _solve_case(UNROLLED_UP_TO + 1, cpu_loop="c"),
}
_BUILT: dict[str, Case] = {}


def case_of(form: str) -> Case:
    """The form's case, built once for the module (`hnn-<width>`: the Hamiltonian field)."""
    if form not in _BUILT:
        _BUILT[form] = (hnn_case(int(form[4:])) if form.startswith("hnn-") else FORMS[form]())
    return _BUILT[form]


# ---- the call paths ------------------------------------------------------------------------

def _total(tree: Any) -> Any:
    return sum(jnp.sum(leaf) for leaf in jax.tree_util.tree_leaves(tree))


def _stream(kernel, data, ps):
    batch = np.shape(data[0])[:1]
    chunks = list(kernel.stream(tuple(data) if len(data) > 1 else data[0], ps,
                                chunk=max(1, batch[0] // 3 + 1), progress=False))
    return jax.tree_util.tree_map(lambda *parts: np.concatenate(parts), *chunks)


def references(case: Case) -> dict[str, Callable[..., Any]]:
    """The case's reference, its gradient with respect to the first data argument and to the
    parameters, each one jitted program: a call traces and compiles one program per batch
    shape, where the reference run op by op compiles each operation at each shape (half of the
    matrix's compile time)."""
    if not case.jitted:
        ref = case.reference
        case.jitted.update({
            "value": jax.jit(ref),
            "grad_data": jax.jit(jax.grad(lambda d, rest, ps: _total(ref(d, *rest, ps)))),
            "grad_params": jax.jit(jax.grad(lambda ps, data: _total(ref(*data, ps)))),
        })
    return case.jitted


def run_path(path: str, case: Case, data: tuple, ps: Any) -> tuple[Any, Any]:
    """(what symkern computed, what the reference computes) along `path`; a vmapped kernel is
    compared with the reference of the whole batch."""
    k, reference = case.kernel, references(case)
    if path.startswith("grad"):
        if path == "grad_data":
            return (jax.grad(lambda d: _total(k(d, *data[1:], ps)))(data[0]),
                    reference["grad_data"](jnp.asarray(data[0], jnp.float64), data[1:], ps))
        if path == "grad_params":
            wide = jax.tree_util.tree_map(lambda v: jnp.asarray(v, jnp.float64), ps)
            return jax.grad(lambda p: _total(k(*data, p)))(ps), reference["grad_params"](wide, data)
        raise AssertionError(path)
    want = reference["value"](*data, ps)
    if path == "eager":
        return k(*data, ps), want
    if path == "jit":
        return jax.jit(lambda *args: k(*args))(*data, ps), want
    if path == "vmap":  # over the leading batch axis, parameters shared
        return jax.vmap(lambda *d: k(*d, ps))(*data), want
    if path == "bind":
        return k.bind(ps)(*data), want
    if path == "flat":
        return k.flat()(*data, k.flatten(ps)), want
    if path == "shard":
        return k.shard()(*data, ps), want
    if path == "stream":
        return _stream(k, data, ps), want
    if path == "export":
        loaded = sk.load(k.export(*data, ps), k.const_args)
        return loaded(*data, ps), want
    raise AssertionError(path)


def assert_close(got: Any, want: Any, rtol: float) -> None:
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves, strict=True):
        w = np.asarray(w, np.float64)
        assert np.shape(g) == w.shape
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=rtol,
                                   atol=rtol * max(1.0, float(np.abs(w).max(initial=0.0))))


def _applies(path: str, batch: tuple[int, ...]) -> bool:
    # vmap maps a leading axis (a batch of () has none); stream reads rows (one batch axis)
    return not (path == "vmap" and not batch or path == "stream" and len(batch) != 1)


def _matrix() -> list[Any]:
    cells = []
    for form in FORMS:
        extra = FORM_PATH_BATCHES.get(form, ())
        for batch in BATCHES + extra:
            for path in PATHS:
                if not _applies(path, batch):
                    continue
                bounded = batch in extra or (
                    batch in EAGER_BATCHES.get(form, BATCHES) if path == "eager"
                    else batch in PATH_BATCHES and (batch == PATH_BATCHES[0]
                                                    or path in TWO_D_PATHS))
                marks = [] if bounded else [pytest.mark.slow]
                cells.append(pytest.param(form, batch, path, marks=marks,
                                          id=f"{form}-{'x'.join(map(str, batch)) or 'one'}-{path}"))
    return cells


@pytest.mark.parametrize(("form", "batch", "path"), _matrix())
def test_every_form_batch_and_call_path_matches_the_reference(form, batch, path):
    case = case_of(form)
    data = case.data(batch)
    got, want = run_path(path, case, data, case.ps)
    assert_close(got, want, case.rtol if not path.startswith("grad") else max(case.rtol, 1e-9))


#: forms whose programs hold matrix products: XLA's CPU dot (Eigen) blocks its sums by the
#: matrices' sizes, so the batch size changes their order; a sample's value then moves by an
#: ulp or two with the batch (docs/design/output-assembly.md, "Determinism")
DOT_FORMS = {"contracted", "tiled", "structured"}


@pytest.mark.parametrize("form", list(FORMS))
def test_a_sample_gets_the_same_bits_in_every_batch(form):
    case = case_of(form)
    sizes = (1, 63, 64, 65, 1025, 4097) if form != "pieces" else (1, 64)
    widest = case.data((max(sizes),))
    first = None
    for n in sizes:
        out = case.kernel(*(d[:n] for d in widest), case.ps)
        head = [np.asarray(leaf)[:1] for leaf in jax.tree_util.tree_leaves(out)]
        if first is None:
            first = head
        for h, f in zip(head, first, strict=True):
            if form in DOT_FORMS:
                np.testing.assert_array_max_ulp(h, f, maxulp=8)
            else:
                np.testing.assert_array_equal(h, f)


@pytest.mark.parametrize("hidden", [8, 40, 128])
@pytest.mark.parametrize("batch", [1, 64, 512, 5000])
def test_the_hamiltonian_field_equals_vmap_of_grad_in_every_path(hidden, batch):
    case = case_of(f"hnn-{hidden}")
    data = case.data((batch,))
    # every path at 64 (both sides of the eager assembly's 64 are a batch apart), the paths
    # that split or shard the batch at the rest; all of them at every batch under SYMKERN_SLOW
    paths = PATHS if SLOW or batch == 64 else ("eager", "jit", "shard", "flat")
    for path in paths:
        got, want = run_path(path, case, data, case.ps)
        assert_close(got, want, 1e-9)
