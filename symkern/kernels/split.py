"""kernels, stage 3 helper: cut a huge kernel body into pieces compiled as separate executables.

Imports jax, ast, symkern.codegen, symkern.kernels.stage and symkern.errors; nothing from batching.
"""

# Why: XLA's CPU compile time and memory grow with the size of one HLO module, and a shared
# DAG lets fusion copy cheap producers into every consumer (ANCHORS.md). The rewritten
# kernel body is a straight-line program (assignments, then one `return` of the entries),
# so it can be cut anywhere: each piece becomes a function taking the kernel's arguments
# plus the locals it reads from earlier pieces (live-in) and returning the locals later
# pieces read (live-out). Values crossing a cut are materialized in memory, which is
# exactly the "keep shared values materialized" remedy, and each piece is compiled on its
# own, so compile cost is bounded per piece and the pieces can compile in parallel.

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import hashlib
import json
import os
import platform
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from symkern.codegen.cache import write_atomically
from symkern.codegen.operations import count_and_reads
from symkern.codegen.rules import KERNEL_NAME
from symkern.errors import CacheWarning, CodegenDriftError
from symkern.kernels.stage import LazyKernelFunction

#: name of the tuple argument through which a piece receives its live-in values
LIVE_IN = "_live"
#: prefix of the locals that hold the kernel's returned entries once the return is split
RESULT_PREFIX = "_r"


def _drift(what: str, found: ast.AST) -> CodegenDriftError:
    return CodegenDriftError(f"split_module: expected {what}, found {ast.unparse(found)[:200]!r}")


def _kernel_function(module: ast.Module) -> ast.FunctionDef:
    functions = [s for s in module.body if isinstance(s, ast.FunctionDef)]
    if len(functions) != 1 or functions[0].name != KERNEL_NAME:
        raise CodegenDriftError(f"split_module: expected one function {KERNEL_NAME}(...) in the "
                                f"module, found {[f.name for f in functions]}")
    return functions[0]


def _stored(statement: ast.stmt) -> list[str]:
    return [n.id for t in statement.targets for n in ast.walk(t)  # type: ignore[attr-defined]
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


@dataclass(frozen=True)
class Piece:
    """One piece of a split kernel: its module and the locals that cross its boundaries.

    `module` holds `def kernel(<kernel arguments>, _live)`: `_live` is the tuple of
    `live_in` values (in that order) and the function returns the tuple of `live_out`:
    the locals it defines that later pieces read; the last piece returns the kernel's
    entries, in order (its `live_out` is `SplitModule.results`).
    """

    module: ast.Module
    live_in: tuple[str, ...]
    live_out: tuple[str, ...]
    statements: int
    operations: int


@dataclass(frozen=True)
class SplitModule:
    """A kernel module cut into pieces; `results` names the locals that hold its entries,
    in the order the kernel returns them (a constant entry keeps its expression)."""

    pieces: tuple[Piece, ...]
    arguments: tuple[str, ...]
    results: tuple[str, ...]


def _normalized_body(function: ast.FunctionDef) -> tuple[list[ast.Assign], list[str]]:
    """The body as assignments only: each returned entry that is not already a local is
    assigned to `_rK`, so the (possibly huge) return tuple is split like the rest."""
    *statements, returned = function.body
    if not isinstance(returned, ast.Return) or not isinstance(returned.value, ast.Tuple):
        raise _drift("the body to end with `return (entry, ...)` (stack_outputs first)", returned)
    assigned: set[str] = set()
    for statement in statements:
        if not isinstance(statement, ast.Assign):
            raise _drift("straight-line assignments before the return", statement)
        names = _stored(statement)
        if len(names) != 1 or not isinstance(statement.targets[0], ast.Name):
            raise _drift("one name assigned per statement", statement)
        if names[0] in assigned:
            # single assignment is what makes a cut anywhere valid; say so if it changes
            raise _drift(f"each local assigned once ({names[0]} is assigned twice)", statement)
        assigned.add(names[0])
    body = list(statements)
    results: list[str] = []
    for k, entry in enumerate(returned.value.elts):
        if isinstance(entry, ast.Name) and entry.id in assigned:
            results.append(entry.id)
            continue
        name = f"{RESULT_PREFIX}{k}"
        if name in assigned:
            raise _drift(f"no local named {name}", function)
        body.append(ast.Assign([ast.Name(name, ast.Store())], entry))
        results.append(name)
    return body, results


def _groups(costs: Sequence[tuple[int, int]], max_statements: int,
            max_operations: int | None) -> list[range]:
    """Consecutive statement ranges, each within both budgets (a lone statement over the
    operation budget gets a piece of its own)."""
    groups: list[range] = []
    start, statements, operations = 0, 0, 0
    for index, (count, ops) in enumerate(costs):
        full = statements + count > max_statements or (
            max_operations is not None and operations + ops > max_operations)
        if statements and full:
            groups.append(range(start, index))
            start, statements, operations = index, 0, 0
        statements += count
        operations += ops
    if statements or not groups:
        groups.append(range(start, len(costs)))
    return groups


def split_module(module: ast.Module, max_statements: int, *,
                 max_operations: int | None = None) -> SplitModule:
    """Cut the rewritten kernel module into pieces of at most `max_statements` statements
    (and, if given, about `max_operations` operations), with explicit live-in/live-out.

    Every returned entry becomes a statement of its own first, so a kernel with many
    outputs is cut too. The module is not modified.

    >>> import ast
    >>> src = "def kernel(x1, ps):\\n    _c0 = x1[..., 0] * 2\\n    _c1 = _c0 + 1\\n    return (_c1 * _c0,)"
    >>> split = split_module(ast.parse(src), 1)
    >>> [(p.live_in, p.live_out) for p in split.pieces]
    [((), ('_c0',)), (('_c0',), ('_c1',)), (('_c0', '_c1'), ('_r0',))]
    """
    if not isinstance(max_statements, int) or max_statements < 1:
        raise ValueError(f"max_statements: expected a positive int, got {max_statements!r}")
    function = _kernel_function(module)
    arguments = tuple(a.arg for a in function.args.args)
    if LIVE_IN in arguments:
        raise _drift(f"no kernel argument named {LIVE_IN}", function.args)
    body, results = _normalized_body(function)
    local_names = {_stored(s)[0] for s in body}
    walked = [count_and_reads(s.value) for s in body]
    reads = [names & local_names for _, names in walked]
    counts = [count for count, _ in walked]
    groups = _groups([(1, count) for count in counts], max_statements, max_operations)

    # Backward liveness over the pieces: what a piece must hand on is what any later
    # piece (or the final result) reads; single assignment makes this exact.
    # The last piece returns the entries themselves, so results computed earlier are
    # among its live-ins.
    needed_after: set[str] = set(results)
    live: list[tuple[set[str], set[str]]] = []
    for index in range(len(groups) - 1, -1, -1):
        group = groups[index]
        defined = {_stored(body[i])[0] for i in group}
        used = set().union(*(reads[i] for i in group)) if group else set()
        live_out = defined & needed_after
        live_in = used - defined
        if index == len(groups) - 1:
            live_in |= needed_after - defined
        live.append((live_in, live_out))
        needed_after = (needed_after - defined) | live_in
    live.reverse()
    if needed_after:
        raise _drift(f"every local read to be assigned first ({sorted(needed_after)[:5]})",
                     function)

    # Names are ordered by first definition, so the tuples are deterministic.
    position = {_stored(s)[0]: k for k, s in enumerate(body)}
    pieces = []
    for index, (group, (live_in, live_out)) in enumerate(zip(groups, live, strict=True)):
        ins = tuple(sorted(live_in, key=position.__getitem__))
        outs = (tuple(results) if index == len(groups) - 1
                else tuple(sorted(live_out, key=position.__getitem__)))
        statements: list[ast.stmt] = []
        if ins:
            statements.append(ast.Assign(
                [ast.Tuple([ast.Name(n, ast.Store()) for n in ins], ast.Store())]
                if len(ins) > 1 else [ast.Name(ins[0], ast.Store())],
                ast.Name(LIVE_IN, ast.Load()) if len(ins) > 1 else ast.Subscript(
                    ast.Name(LIVE_IN, ast.Load()), ast.Constant(0), ast.Load())))
        statements.extend(body[i] for i in group)  # shared with the whole body, never mutated
        statements.append(ast.Return(ast.Tuple([ast.Name(n, ast.Load()) for n in outs],
                                               ast.Load())))
        args = copy.deepcopy(function.args)
        args.args.append(ast.arg(LIVE_IN))
        # parsed, not constructed: FunctionDef's required fields differ across Pythons
        piece = ast.parse(f"def {KERNEL_NAME}():\n    pass\n")
        piece.body[0].args = args
        piece.body[0].body = statements
        # source positions are added when (if) the piece's Python function is compiled
        pieces.append(Piece(piece, ins, outs, len(group),
                            sum(counts[i] for i in group)))
    return SplitModule(tuple(pieces), arguments, tuple(results))


def _spec(value: Any) -> Any:
    return jax.ShapeDtypeStruct(jax.numpy.shape(value), jax.numpy.result_type(value),
                                weak_type=getattr(getattr(value, "aval", None), "weak_type", False))


@dataclass
class SplitProgram:
    """Run a split kernel: each piece is its own `jax.jit`, run in sequence.

    Called like the kernel function (`program(*arguments)`, the kernel's own positional
    arguments) it returns the kernel's entries. Eagerly, each piece runs as its own
    executable, compiled on first use for those argument shapes; `compile(*arguments)`
    compiles them all ahead of time, with `workers` threads (XLA's compile releases the
    GIL). Under a trace (`jax.jit`, `jax.grad`, `jax.vmap` around it) the pieces are called
    as nested jitted functions, which the enclosing computation inlines.
    `finish(entries, arguments)`, if given, is applied to the entries inside the last piece.
    """

    split: SplitModule
    functions: Mapping[str, Callable] | None = None
    finish: Callable[[tuple, tuple], tuple] | None = None
    workers: int = 1
    timings: dict[str, float] = field(default_factory=dict)
    #: compiled pieces on disk (symkern.enable_cache), or None
    store: ExecutableStore | None = None

    def __post_init__(self) -> None:
        self._raw = [LazyKernelFunction(p.module, self.functions, f"<symkern piece {k}>")
                     for k, p in enumerate(self.split.pieces)]
        self._jitted = [jax.jit(self._wrap(k)) for k in range(len(self._raw))]
        self._compiled: dict[tuple, list[Any]] = {}

    @classmethod
    def from_module(cls, module: ast.Module, max_statements: int, *,
                    max_operations: int | None = None, **options: Any) -> SplitProgram:
        return cls(split_module(module, max_statements, max_operations=max_operations),
                   **options)

    def _wrap(self, k: int) -> Callable[[tuple, tuple], tuple]:
        raw, last = self._raw[k], k == len(self._raw) - 1
        finish = self.finish

        def piece(arguments: tuple, live: tuple) -> tuple:
            out = raw(*arguments, live)
            if last and finish is not None:
                return finish(out, arguments)
            return out

        return piece

    def _run(self, calls: Sequence[Callable[[tuple, tuple], tuple]], arguments: tuple) -> tuple:
        values: dict[str, Any] = {}
        out: tuple = ()
        for piece, call in zip(self.split.pieces, calls, strict=True):
            out = call(arguments, tuple(values[n] for n in piece.live_in))
            values.update(zip(piece.live_out, out, strict=False))
        return out

    @staticmethod
    def _key(arguments: tuple) -> tuple:
        leaves, treedef = jax.tree_util.tree_flatten(arguments)
        return (treedef, tuple((jax.numpy.shape(v), jax.numpy.result_type(v)) for v in leaves))

    def compile(self, *arguments: Any) -> list[Any]:
        """Trace and lower every piece in sequence, then compile them (in parallel with
        `workers` > 1); returns the compiled executables, also used by later eager calls."""
        key = self._key(arguments)
        if key in self._compiled:
            return self._compiled[key]
        start = time.perf_counter()
        specs = jax.tree_util.tree_map(_spec, arguments)
        if self.store is not None:
            loaded = self.store.load(specs, len(self.split.pieces), self.workers)
            if loaded is not None:
                self.timings["executable_load"] = time.perf_counter() - start
                self._compiled[key] = loaded
                return loaded
        lowered, live_specs = [], {}
        for piece, jitted in zip(self.split.pieces, self._jitted, strict=True):
            low = jitted.trace(specs, tuple(live_specs[n] for n in piece.live_in)).lower()
            live_specs.update(zip(piece.live_out, low.out_info, strict=False))
            lowered.append(low)
        lowered_at = time.perf_counter()
        with _counting_cache_hits() as hits:
            if self.workers > 1:
                with ThreadPoolExecutor(self.workers) as pool:
                    compiled = list(pool.map(lambda low: low.compile(), lowered))
            else:
                compiled = [low.compile() for low in lowered]
        self.timings["trace_and_lower"] = lowered_at - start
        self.timings["xla_compile"] = time.perf_counter() - lowered_at
        self._compiled[key] = compiled
        if self.store is not None and not hits:
            self.store.save(specs, compiled)
        return compiled

    def __call__(self, *arguments: Any) -> tuple:
        leaves = jax.tree_util.tree_leaves(arguments)
        if any(isinstance(v, jax.core.Tracer) for v in leaves):
            return self._run(self._jitted, arguments)
        return self._run(self.compile(*arguments), arguments)


@functools.cache
def _machine() -> str:
    """What a CPU executable was compiled for: the device and, on CPU, the processor's
    model and feature flags (XLA targets the host; code for another ISA must not load)."""
    device = jax.devices()[0]
    described = f"{device.platform}:{device.device_kind}:{platform.machine()}"
    if device.platform == "cpu":
        try:
            with open("/proc/cpuinfo") as handle:
                lines = [line for line in handle if line.startswith(("model name", "flags"))]
            described += "".join(sorted(set(lines)))
        except OSError:
            described += platform.processor()
    return described


#: the event JAX records when it takes an executable from its persistent cache
_PERSISTENT_CACHE_HIT = "/jax/compilation_cache/cache_hits"


@contextlib.contextmanager
def _counting_cache_hits() -> Iterator[list[str]]:
    """The persistent-cache hits recorded while open (in any thread). On the CPU an
    executable JAX took from its cache does not serialize whole: stored, it loads in the
    next process and fails when called (`Function slice_bitcast_fusion.5 not found`), so
    the store keeps only pieces XLA compiled."""
    hits: list[str] = []

    def listener(event: str, **kwargs: Any) -> None:
        if event == _PERSISTENT_CACHE_HIT:
            hits.append(event)

    jax.monitoring.register_event_listener(listener)
    try:
        yield hits
    finally:
        jax.monitoring.unregister_event_listener(listener)


class ExecutableStore:
    """A split program's compiled pieces on disk, for a second process.

    JAX's persistent cache skips XLA's compile but not tracing and lowering, which it needs
    for its key: at 10^5 operations those still took 5.6 s of a cached 10 s build. Here the
    executables themselves are serialized (`jax.experimental.serialize_executable`) under a
    key of the generated code (`key`, from the code-generation cache), the argument shapes
    and dtypes, the JAX version, backend, x64 setting and the machine (CPU model and flags).
    An entry is an .npz archive, read without pickle: each piece's executable and its
    argument and result trees (PyTreeDef protos), and a manifest with the key and a digest
    over all of them. An entry that does not check out is a cache miss (a CacheWarning
    says why); like JAX's own cache, the directory must be trusted (symkern.enable_cache).
    """

    def __init__(self, directory: str | os.PathLike, key: str) -> None:
        self.directory = Path(directory)
        self.key = key

    def _path(self, specs: Any) -> tuple[Path, str]:
        leaves, treedef = jax.tree_util.tree_flatten(specs)
        described = [str(treedef), jax.__version__, jax.default_backend(),
                     str(jax.config.jax_enable_x64), self.key, _machine()]
        described += [f"{leaf.shape}:{leaf.dtype}:{leaf.weak_type}" for leaf in leaves]
        digest = hashlib.sha256("\n".join(described).encode()).hexdigest()
        return self.directory / digest[:2] / f"{digest}.npz", digest

    @staticmethod
    def _digest(entry: str, parts: Sequence[bytes]) -> str:
        digest = hashlib.sha256(b"symkern executables\0" + entry.encode() + b"\0")
        for part in parts:
            digest.update(len(part).to_bytes(8, "little") + part)
        return digest.hexdigest()

    def load(self, specs: Any, count: int, workers: int = 1) -> list[Any] | None:
        from jax.experimental.serialize_executable import deserialize_and_load

        path, entry = self._path(specs)
        if not path.exists():
            return None
        try:
            with np.load(path, allow_pickle=False) as stored:
                manifest = json.loads(stored["manifest"].tobytes())
                if manifest.get("entry") != entry or manifest.get("count") != count:
                    raise ValueError("written for other arguments or another program")
                parts = [stored[f"{kind}_{k}"].tobytes()
                         for k in range(count) for kind in ("executable", "in", "out")]
            if manifest.get("digest") != self._digest(entry, parts):
                raise ValueError("the digest does not match the entry's content")
            registry = jax.tree_util.default_registry
            restore = type(jax.tree_util.tree_structure(None)).deserialize_using_proto
            items = [(parts[3 * k], restore(registry, parts[3 * k + 1]),
                      restore(registry, parts[3 * k + 2])) for k in range(count)]
            with ThreadPoolExecutor(max(workers, 1)) as pool:
                return list(pool.map(lambda item: deserialize_and_load(*item), items))
        except Exception as error:  # noqa: BLE001 - any damage to an entry is a cache miss
            warnings.warn(f"executable cache: the entry {path} is not used "
                          f"({type(error).__name__}: {str(error)[:200]}); it is removed and "
                          "the pieces compiled again", CacheWarning, stacklevel=2)
            path.unlink(missing_ok=True)
            return None

    def save(self, specs: Any, compiled: Sequence[Any]) -> None:
        from jax.experimental.serialize_executable import serialize

        path, entry = self._path(specs)
        try:
            stored = [serialize(executable) for executable in compiled]
            parts = [part for payload, in_tree, out_tree in stored
                     for part in (bytes(payload), in_tree.serialize_using_proto(),
                                  out_tree.serialize_using_proto())]
        except Exception:  # noqa: BLE001 - an executable or tree that does not serialize
            return  # is not stored, which is never an error for the build
        arrays = {f"{kind}_{k}": np.frombuffer(parts[3 * k + j], np.uint8)
                  for k in range(len(stored)) for j, kind in enumerate(("executable", "in", "out"))}
        manifest = {"entry": entry, "count": len(stored), "digest": self._digest(entry, parts)}
        arrays["manifest"] = np.frombuffer(json.dumps(manifest).encode(), np.uint8)
        try:
            write_atomically(path, lambda handle: np.savez(handle, **arrays))
        except OSError as error:
            warnings.warn(f"executable cache: could not write {path} ({error}); the pieces "
                          "are not cached", CacheWarning, stacklevel=2)
