"""batching, stage 4: the Kernel a user calls — argument checks, batch shapes, result structure.

Imports jax, numpy, symkern.kernels, symkern.codegen, symkern.symbolic and symkern.errors.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np

from symkern.batching.buckets import EXACT_SHAPES, bucket_size, pad_batch
from symkern.batching.packing import PackedParameters, parameter_leaves
from symkern.batching.program import ScalarProgram
from symkern.codegen.passes import BuildOptions
from symkern.codegen.stopwatch import CALL_STAGES, Stopwatch
from symkern.errors import ArgumentError, DtypeMismatchError
from symkern.kernels.constants import ConstArg
from symkern.kernels.export import example_arguments, export_function, save_file
from symkern.kernels.options import kernel_jit
from symkern.kernels.values import as_real_array, broadcast_data

#: the assembly executable stacks a leaf of at most this many entries along a new leading
#: axis and moves it last (a transpose), wider leaves along the last axis: from materialized
#: entries at 100k samples, 2 / 4 / 8 entries took 0.08 / 0.12 / 0.12 ms transposed and
#: 0.29 / 0.24 / 0.37 ms stacked last, but 10 / 16 entries 2.6 / 4.8 ms transposed
#: against 1.0 / 0.5 ms (docs/design/output-assembly.md)
TRANSPOSED_ASSEMBLY_UP_TO = 8
#: `kernel.tune` times each assembly at least TUNE_ROUNDS times, and more (up to
#: TUNE_MAX_ROUNDS) until TUNE_SECONDS have passed: a sub-millisecond kernel's best of three
#: flipped its choice between runs on a shared machine, and at 100k samples nlink-3's first
#: rounds ran 2-4x slower than later ones (fresh buffers)
TUNE_ROUNDS = 5
TUNE_MAX_ROUNDS = 25
TUNE_SECONDS = 0.1
#: ... and stops after one round once this many seconds have passed (long calls)
TUNE_MAX_SECONDS = 1.0
#: a parameter tree of at most this many leaves, all of them JAX arrays, goes to the direct
#: path as it is and is packed inside its trace: packing 5 device scalars before the call
#: (the checks, then a jitted concatenate) cost 87 µs a call (the double pendulum at 100,000
#: samples, 947 against 860 µs prepacked), and the jit takes 64 leaves in ~30 µs more than one
DIRECT_TREE_LEAVES = 64


def _shape_text(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def weak_method(owner: Any, name: str) -> Callable[..., Any]:
    """`owner.name` as a function holding `owner` only weakly."""
    reference = weakref.ref(owner)

    def call(*args: Any) -> Any:
        return getattr(reference(), name)(*args)

    call.__name__ = name
    return call


def integer_array(leaf: Any) -> bool:
    """Whether `leaf` is an array of integers (a Python int is not): with jax_enable_x64 off
    jit casts a 64-bit one to 32 bits, wrapping every value outside that range (jax#18385),
    and a traced one does not tell whether it was, so the checked path casts them on the host."""
    dtype = getattr(leaf, "dtype", None)
    return (dtype is not None and dtype.kind in "iu"
            and not getattr(getattr(leaf, "aval", leaf), "weak_type", False))


def refuse_integer_arrays(owner: Any, leaves: Sequence[Any]) -> None:
    """In a direct path's trace: integer arrays take the checked path instead (ArgumentError,
    which call_direct reads as "not taken"), and `owner` remembers it (its `integers_seen`,
    call_direct's argument)."""
    if any(map(integer_array, leaves)):
        owner.integers_seen = True
        raise ArgumentError("integer arrays take the checked path (cast on the host)")


def _leaf_signature(leaf: Any) -> tuple:
    """Shape, dtype and weak type of a leaf as jit keys it (numpy ones under disable_jit)."""
    aval = getattr(leaf, "aval", None)
    if aval is not None:
        return tuple(aval.shape), str(aval.dtype), bool(aval.weak_type)
    return tuple(np.shape(leaf)), str(np.result_type(leaf)), type(leaf) in (int, float, bool)


def _jit_takes(args: tuple) -> bool:
    """Whether jit takes every leaf of `args` as it is (else the checked arrays are used)."""
    for leaf in jax.tree_util.tree_leaves(args):
        if isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
            # integer arrays are cast on the host, and floats wider than 64 bits (longdouble,
            # clongdouble), which jit does not take; complex ones reach a complex kernel's
            # checks (a real kernel's refuse them)
            if not (leaf.dtype.kind in "bf" and leaf.dtype.itemsize <= 8
                    or leaf.dtype.kind == "c" and leaf.dtype.itemsize <= 16):
                return False
        elif type(leaf) is int:
            if not -2**31 <= leaf < 2**31:
                return False
        elif type(leaf) not in (float, bool, complex):
            return False
    return True


#: what `call_direct` returns when the direct path was not taken
NOT_TAKEN = object()


def call_direct(direct: Callable[..., Any], shapes: set, const_values: tuple,
                args: tuple, integers_seen: bool = False) -> Any:
    """`direct(const_values, args)` if `args[0]`'s shape has run fused before, else NOT_TAKEN.

    The direct path of Kernel, BoundKernel and FlatKernel: the call's arguments go to one
    jit unchanged and its checks run at trace time. A wrong argument count or a failing
    check raises there; jit cannot take some arguments (an integer array: `integer_array`,
    which the traced checks refuse, or a Python int outside int32), and a jit compiled with
    compiler options cannot be nested in a caller's trace (a ValueError). Either way the path is
    not taken and the caller's checked path raises the same error without JAX's traceback
    note, or casts on the host. Once the direct path has refused integer arrays
    (`integers_seen`), every call's leaves are looked at first (about 1 µs), so such calls
    go to the checked path without tracing again.
    """
    try:
        if args[0].shape in shapes:
            if integers_seen and any(map(integer_array, jax.tree_util.tree_leaves(args))):
                return NOT_TAKEN
            return direct(const_values, args)
    except (IndexError, AttributeError, TypeError, ValueError, OverflowError, ArgumentError):
        pass
    return NOT_TAKEN


def check_dtype_policy(dtype: np.dtype) -> None:
    """A float64 kernel needs jax_enable_x64 now as when it was built."""
    if np.dtype(dtype) in (np.dtype("float64"), np.dtype("complex128")) \
            and not jax.config.jax_enable_x64:
        raise DtypeMismatchError(
            f"dtype: this kernel computes in {np.dtype(dtype).name}, which needs "
            "jax.config.update('jax_enable_x64', True); with x64 disabled JAX would "
            "silently compute in float32"
        )


class Kernel:
    """A batched, compiled evaluation of a set of SymPy equations.

    Call it as `kernel(*data, ps)` (or `kernel(*data)` without parameters). Each data
    argument takes an array of shape `batch + per-sample shape`, the batch shapes
    broadcasting together (NumPy's rules) to the call's batch; the result has the equations'
    structure, each leaf shaped `batch + its shape` (bool for conditions).
    It is an ordinary JAX function: `jax.jit`, `jax.grad` and `jax.vmap` go through it.

    >>> import sympy as sp, symkern as sk
    >>> x0, x1, a = sp.symbols("x0 x1 a")
    >>> k = sk.build_function(sp.sin(x0) * a + x1**2, [x0, x1], params={"a": a})
    >>> k(np.zeros((4, 2)), {"a": 2.0}).shape
    (4,)
    """

    def __init__(
        self,
        program: ScalarProgram,
        timings: dict[str, float],
        const_args: tuple[ConstArg, ...] = (),
        progress: bool | None = None,
        split: Any = None,
        options: BuildOptions | None = None,
    ) -> None:
        #: the traced computation (symkern.batching.program): entries, assembly, evaluate
        self.program = program
        self._generated = program.generated
        self.signature = program.signature
        self.equations = program.equations
        #: the choices the build used (symkern.codegen.passes.BuildOptions)
        self.options = options if options is not None else BuildOptions()
        self.timings = dict(timings)
        self._progress = progress
        # a huge body compiled as separate pieces (symkern.kernels.split); traced calls
        # (jit, grad, vmap, export) still see the whole body through _evaluate
        self._pieces = split
        self._const_args = tuple(const_args)
        self._const_values = tuple(c.value for c in const_args)
        # jit functions that reach this kernel through a weak reference: a strong one would
        # make a cycle, and a dropped kernel's executables and const args would wait for
        # Python's cyclic collector instead of being freed at once
        # traced calls (jit, grad, vmap): `jax.vmap` folds its axis into the batch
        self._jitted = jax.jit(weak_method(self, "_evaluate_traced"))
        # Top-level calls run the entries and their assembly as two executables: stacking
        # scalar entries inside the fused body measured 100x slower (docs/design/output-assembly.md).
        self._compute_jitted = jax.jit(weak_method(self, "_compute"))
        self._assemble_jitted = jax.jit(weak_method(self, "_assemble_entries"))
        # The same two for top-level calls, compiled with symkern's CPU options
        # (symkern.kernels.options); JAX takes compiler options on top-level jits only, so
        # traced calls, shard() and the flat form use the two above.
        self._compute_top = kernel_jit(weak_method(self, "_compute"))
        self._assemble_top = kernel_jit(weak_method(self, "_assemble_entries"))
        # The direct path: `kernel(*args)` handed to one jit as it came. Its checks run at
        # trace time, once per argument signature, so a repeated call costs what calling
        # a jitted function costs (benchmarks/dispatch.py, docs/design/dispatch.md). Only shapes the
        # checked path has already run fused take it (`_direct_shapes`: first data
        # argument's shape); anything jit cannot take falls back to the checked path.
        self._direct = kernel_jit(weak_method(self, "_evaluate_arguments"))
        self._direct_shapes: set[tuple[int, ...]] = set()
        self._direct_signatures: set[tuple] = set()
        # The same for shapes that run separately: the entries' executable takes the
        # call's arguments as they came, then the assembly executable runs.
        self._direct_entries = kernel_jit(weak_method(self, "_compute_arguments"))
        self._separate_shapes: set[tuple[int, ...]] = set()
        self._entries_signatures: set[tuple] = set()
        self._needs_assembly = program.needs_assembly
        #: how matrix-shaped outputs are assembled at every batch size: "fused" (one
        #: executable) or "separate" (entries, then assembly), decided at build time from the
        #: body (symkern.codegen.passes.decide_assembly), or by `tune`
        self.assembly: str = program.generated.assembly or "fused"
        #: what `tune` measured: {"batch": samples, "rounds": timed rounds, "fused_s" /
        #: "separate_s": each form's best seconds, "assembly": the choice}; None until tuned
        self.tuned: dict[str, Any] | None = None
        # whether the direct path has refused integer arrays (call_direct)
        self.integers_seen = False
        self._seen: set[tuple] = set()
        self._batch_shapes: set[tuple[int, ...]] = set()
        self._lock = threading.RLock()  # re-entered: tune compiles under it
        self._compilations = 0
        # a tree of many leaves reaches every executable as one buffer (packing.py)
        self._packer = program.packer

    # ---- what each stage produced -------------------------------------------------------
    @property
    def source(self) -> str:
        """The kernel's code after every rewrite rule (stage 2), as astor prints it; with
        `cpu_loop="c"`, the C++ loop its calls run (the XLA program's code, which its
        derivatives run: `kernel.program.portable.source`)."""
        return self.program.source

    @property
    def upstream_source(self) -> str:
        """The per-sample code SymPy's JAX printer emitted (stage 1)."""
        return self._generated.upstream.source

    @property
    def const_args(self) -> tuple[ConstArg, ...]:
        """Constants passed to the executable before the data arguments, with their origins.

        They are device-resident, prepended at every call, and never embedded in the
        compiled program; the caller never passes them.
        """
        return self._const_args

    @property
    def dtype(self) -> np.dtype:
        return self.signature.dtype

    def assemble(self, entries: tuple) -> Any:
        """Entries (as `program.entries` returns them) → the equations' structure, by the
        kernel's assembly executable."""
        return self._assemble_jitted(entries)

    @property
    def form(self) -> str:
        """The body's form (symkern.codegen.passes.FORMS): scalar, contracted, tiled, ..."""
        return self._generated.form

    @property
    def const_values(self) -> tuple[Any, ...]:
        """The const args' device arrays, in the executable's order."""
        return self._const_values

    def __repr__(self) -> str:
        data = ", ".join(f"{s.label}: {_shape_text(s.shape)}" for s in self.signature.data)
        params = ", ps" if self.signature.has_parameters else ""
        return (f"{type(self).__name__}({data}{params}) -> {len(self.equations.leaves)} "
                f"equation(s), {self.dtype.name}, {self.form} body, {self.assembly} assembly, "
                f"{self.options!r}")

    # ---- the traced computation ---------------------------------------------------------
    def _compute(self, const_args: tuple, data: tuple, parameter_leaves: tuple) -> tuple:
        return self.program.entries(const_args, data, parameter_leaves)

    def _assemble_entries(self, entries: tuple) -> Any:
        """The assembly executable's function: entries already materialized."""
        return self.program.assemble(entries, TRANSPOSED_ASSEMBLY_UP_TO)

    def _evaluate(self, const_args: tuple, data: tuple, parameter_leaves: tuple) -> Any:
        return self.program.evaluate(const_args, data, parameter_leaves)

    def _evaluate_traced(self, const_args: tuple, data: tuple, parameter_leaves: tuple) -> Any:
        return self.program.vmappable(const_args, data, parameter_leaves)

    def _evaluate_arguments(self, const_args: tuple, args: tuple) -> Any:
        """The direct path's traced function: the call's own arguments, checked here.

        Runs once per argument signature (jit caches on it), so these checks cost
        nothing on repeated calls; a failing check raises the same error as the checked
        path. A new x64 setting is a new signature too, so the dtype policy holds.
        """
        data, parameter_leaves = self._checked_arguments(args, self._direct_signatures)
        return self._evaluate(const_args, data, parameter_leaves)

    def _compute_arguments(self, const_args: tuple, args: tuple) -> tuple:
        """`_evaluate_arguments` for shapes that run separately: the entries only."""
        data, parameter_leaves = self._checked_arguments(args, self._entries_signatures)
        return self._compute(const_args, data, parameter_leaves)

    def _checked_arguments(self, args: tuple, signatures: set) -> tuple[tuple, tuple]:
        leaves, treedef = jax.tree_util.tree_flatten(args)
        refuse_integer_arrays(self, leaves)
        _, data, parameter_leaves = self.prepare(args)
        signatures.add((treedef, tuple(map(_leaf_signature, leaves))))
        return data, parameter_leaves

    @property
    def compilations(self) -> int:
        """Programs compiled for top-level calls: one per batch shape and argument dtype."""
        return (self._compilations + len(self._direct_signatures)
                + len(self._entries_signatures))

    def _batch_shape_of(self, data: Sequence[Any]) -> tuple[int, ...]:
        return self.program.batch_shape(data)

    # ---- argument checks --------------------------------------------------------------------
    def _split(self, args: tuple) -> tuple[tuple, Any]:
        n_data = len(self.signature.data)
        expected = n_data + (1 if self.signature.has_parameters else 0)
        if len(args) != expected:
            names = [s.label for s in self.signature.data]
            if self.signature.has_parameters:
                names.append("ps")
            raise ArgumentError(
                f"kernel: expected {expected} argument(s) ({', '.join(names)}), got {len(args)}"
            )
        return args[:n_data], (args[n_data] if self.signature.has_parameters else None)

    def _as_array(self, value: Any, label: str) -> Any:
        return as_real_array(value, label, self.dtype)

    def check_data(self, data: Sequence[Any]) -> tuple[Any, ...]:
        arrays = [self._as_array(value, spec.label)
                  for spec, value in zip(self.signature.data, data, strict=True)]
        # the batch shape of the arguments that read one way only, which settles an array
        # that fits a vector MatrixSymbol both ways (a batch of one 1×n sample)
        settled = next((shape[:len(shape) - len(spec.shape)]
                        for spec, shape in zip(self.signature.data, map(np.shape, arrays), strict=True)
                        if not (spec.matrix_symbols and spec.declared_shape != spec.shape)
                        and len(shape) >= len(spec.shape)), None)
        batches: list[tuple[int, ...]] = []
        for k, spec in enumerate(self.signature.data):
            array = arrays[k]
            shape = tuple(np.shape(array))
            declared = spec.declared_shape
            # a MatrixSymbol with a side of 1 (a vector) takes its declared shape too
            vector_symbol = bool(spec.matrix_symbols) and declared != spec.shape
            if (vector_symbol and len(shape) >= 2 and shape[-2:] == declared
                    and not (settled is not None and shape[:-2] != settled
                             and shape[:-1] == settled)):
                shape = shape[:-2] + spec.shape
                array = array.reshape(shape)
            rank = len(spec.shape)
            if not shape and math.prod(spec.shape) == 1:  # one number for a 1×1 argument
                shape = spec.shape
                array = array.reshape(shape)
            if len(shape) < rank or shape[len(shape) - rank:] != spec.shape:
                also = f" or {_shape_text(('...',) + declared)}" if vector_symbol else ""
                raise ArgumentError(
                    f"{spec.label}: expected shape {_shape_text(('...',) + spec.shape)}{also}, "
                    f"got {_shape_text(shape)}"
                )
            arrays[k] = array
            batches.append(shape[: len(shape) - rank])
        return broadcast_data(arrays, batches, [spec.label for spec in self.signature.data])

    def check_parameters(self, ps: Any) -> tuple[Any, ...]:
        if not self.signature.has_parameters:
            return ()
        return self._checked_leaves(ps, *jax.tree_util.tree_flatten(ps))

    def _checked_leaves(self, ps: Any, leaves: list, treedef: Any) -> tuple[Any, ...]:
        """`check_parameters` of `ps`, flattened already to `leaves` and `treedef`."""
        if treedef != self.signature.parameter_treedef:
            try:
                leaves = self.signature.parameter_treedef.flatten_up_to(ps)
            except (ValueError, TypeError) as error:
                raise ArgumentError(
                    f"ps: expected a tree of the structure {self.signature.parameter_treedef}, "
                    f"got {treedef}"
                ) from error
        arrays = []
        for spec, value in zip(self.signature.parameters, leaves, strict=True):
            if not (isinstance(value, jax.Array) and value.dtype == self.dtype
                    and value.shape == spec.shape):
                value = self._as_array(value, spec.label)
                if (tuple(np.shape(value)) == spec.declared_shape != spec.shape
                        or not np.shape(value) and math.prod(spec.shape) == 1):
                    value = value.reshape(spec.shape)
                if tuple(np.shape(value)) != spec.shape:
                    raise ArgumentError(f"{spec.label}: expected shape {_shape_text(spec.shape)}, "
                                        f"got {_shape_text(np.shape(value))}")
            arrays.append(value)
        return tuple(arrays)

    @property
    def packs_parameters(self) -> bool:
        """Whether the executables take the parameters packed into one buffer: a tree of at
        least PACK_FROM_LEAVES scalar leaves, or PACK_ARRAYS_FROM_LEAVES leaves with arrays
        among them (symkern.batching.packing, docs/design/parameter-packing.md)."""
        return self._packer is not None

    def pack_parameters(self, ps: Any) -> Any:
        """`ps` checked, as the executables take it: packed into one buffer
        (`PackedParameters`) when the kernel packs, else the tuple of its leaves. Every
        call path takes a packed tree in place of `ps` (`kernel(X, kernel.pack_parameters(ps))`),
        which skips converting the tree on each call."""
        packer = self._packer
        if packer is None:
            return self.check_parameters(ps)
        if packer.accepts(ps):
            return ps
        packed = packer.pack(ps)  # a flat dict or list of numbers, without flattening
        if packed is not None:
            return packed
        leaves, treedef = jax.tree_util.tree_flatten(ps)
        if treedef == self.signature.parameter_treedef:
            packed = packer.pack_flattened(leaves)
            if packed is not None:
                return packed
        return packer.pack_leaves(self._checked_leaves(ps, leaves, treedef))

    def _packed_arguments(self, args: tuple) -> tuple:
        """The call's arguments with `ps` packed, when the kernel packs and the count fits
        (a small tree of JAX arrays stays as it is: DIRECT_TREE_LEAVES)."""
        if self._packer is None or len(args) != len(self.signature.data) + 1:
            return args
        ps = args[-1]
        if len(self.signature.parameters) <= DIRECT_TREE_LEAVES:
            leaves = jax.tree_util.tree_leaves(ps)
            if leaves and all(isinstance(leaf, jax.Array) for leaf in leaves):
                return args
        return args[:-1] + (self.pack_parameters(ps),)

    # ---- calling ------------------------------------------------------------------------
    def prepare(self, args: tuple) -> tuple:
        """A call's arguments checked: `(const values, data arrays, parameters)`, the
        parameters as `pack_parameters` gives them."""
        check_dtype_policy(self.dtype)
        data, ps = self._split(args)
        return (self._const_values, self.check_data(data), self.pack_parameters(ps))

    def _note_compilations(self, jobs: Sequence[tuple]) -> None:
        """Compile ahead of the first call of each batch shape, timing trace, lower and
        compile: `jobs` are `(jitted, key, arguments, counted)`, each done once per key.

        Traced and lowered in turn, then compiled in parallel threads (XLA's compile
        releases the GIL). With cores to spare tune's three programs cost about one compile's
        time; on a 2-core machine, where XLA compiles one program on both cores already,
        the pendulum's three went 0.23 → 0.18 s (docs/design/output-assembly.md).
        """
        if all(job[1] in self._seen for job in jobs):
            return
        with self._lock:
            jobs = [job for job in jobs if job[1] not in self._seen]
            if not jobs:
                return
            first = not self._seen
            stopwatch = Stopwatch(progress=self._progress if first else False,
                                  label="symkern first call", stages=CALL_STAGES)
            lowered = []
            for jitted, _, arguments, _ in jobs:
                with stopwatch.stage("trace"):
                    traced = jitted.trace(*arguments)
                with stopwatch.stage("lower"):
                    lowered.append(traced.lower())
            with stopwatch.stage("xla_compile"):
                if len(lowered) == 1:
                    lowered[0].compile()
                else:
                    with ThreadPoolExecutor(len(lowered)) as pool:
                        list(pool.map(lambda low: low.compile(), lowered))
            stopwatch.close()
            if first:
                self.timings.update(stopwatch.timings)
            for _, key, _, counted in jobs:
                self._compilations += counted
                self._seen.add(key)

    def _execute_split(self, prepared: tuple, batch_shape: tuple[int, ...]) -> Any:
        const_values, data, parameter_leaves = prepared
        arguments = self.program.arguments(const_values, data, parameter_leaves)
        key = ("split", batch_shape)
        if key not in self._seen:
            with self._lock:
                if key not in self._seen:
                    self._pieces.compile(*arguments)
                    if not self._seen:
                        self.timings.update(self._pieces.timings)
                    self._compilations += 1
                    self._seen.add(key)
        entries = self._pieces(*arguments)
        if self._needs_assembly:
            return self._assemble_top(entries)
        return jax.tree_util.tree_unflatten(self.equations.treedef, list(entries))

    def _execute(self, prepared: tuple, batch_shape: tuple[int, ...],
                 raw: tuple | None = None) -> Any:
        if self._pieces is not None:
            return self._execute_split(prepared, batch_shape)
        if self.runs_fused:
            return self._execute_fused(prepared, batch_shape, raw)
        return self._execute_separate(prepared, batch_shape, raw)

    @property
    def runs_fused(self) -> bool:
        """Whether a call runs as one executable: nothing to assemble, or `assembly` fused.

        The same at every batch size: the two forms round differently, and which of them
        computes a sample must not depend on the batch it is in.
        """
        return not self._needs_assembly or self.assembly == "fused"

    def _fused_job(self, prepared: tuple, batch_shape: tuple[int, ...],
                   raw: tuple | None) -> tuple:
        """`(jitted, key, arguments, counted)` of the one-executable form.

        On the call's own arguments when jit takes them (a Python float stays weakly
        typed), so that repeating the call takes the direct path (`__call__`).
        """
        const_values, data, parameter_leaves = prepared
        if raw is not None and _jit_takes(raw):
            return (self._direct, ("fused", batch_shape, "raw"), (const_values, raw), False)
        args = data
        if isinstance(parameter_leaves, PackedParameters):
            args += (parameter_leaves,)
        elif self.signature.has_parameters:
            args += (jax.tree_util.tree_unflatten(self.signature.parameter_treedef,
                                                  parameter_leaves),)
        return (self._direct, ("fused", batch_shape), (const_values, args), False)

    def _entries_job(self, prepared: tuple, batch_shape: tuple[int, ...],
                     raw: tuple | None) -> tuple:
        """`_fused_job` for the entries' executable of the two-executable form."""
        if raw is not None and _jit_takes(raw):
            return (self._direct_entries, ("entries", batch_shape, "raw"),
                    (prepared[0], raw), False)
        return (self._compute_top, ("entries", batch_shape), prepared, True)

    def _assembly_job(self, batch_shape: tuple[int, ...]) -> tuple:
        """`_fused_job` for the assembly executable: one entry per scalar of each leaf."""
        entries = tuple(jax.ShapeDtypeStruct(shape, dtype)
                        for shape, dtype in zip(self.program.entry_shapes(batch_shape),
                                                self.program.entry_dtypes, strict=True))
        return (self._assemble_top, ("assembly", batch_shape), (entries,), False)

    def _run_job(self, job: tuple, shapes: set, register: bool) -> Any:
        """Compile `job` unless done, run it; a call's own arguments register its shape
        with the direct path (`shapes`) when `register`."""
        jitted, key, arguments, _ = job
        self._note_compilations([job])
        result = jitted(*arguments)
        if register and key[-1] == "raw":
            shapes.add(tuple(np.shape(arguments[1][0])))  # as the direct path compares it
        return result

    def _execute_fused(self, prepared: tuple, batch_shape: tuple[int, ...],
                       raw: tuple | None, register: bool = True) -> Any:
        """Entries and their assembly in one executable (the direct path's function)."""
        return self._run_job(self._fused_job(prepared, batch_shape, raw), self._direct_shapes,
                             register)

    def _execute_separate(self, prepared: tuple, batch_shape: tuple[int, ...],
                          raw: tuple | None = None, register: bool = True) -> Any:
        """The entries' executable, then the assembly executable."""
        entries = self._run_job(self._entries_job(prepared, batch_shape, raw),
                                self._separate_shapes, register)
        return self._assemble_top(entries)

    def tune(self, *args: Any) -> dict[str, Any]:
        """Time both assemblies on these arguments and keep the faster for every batch.

        Neither form wins everywhere (docs/design/output-assembly.md): at 100k samples one
        executable ran the 2-3-2 network's Jacobian 2.8x slower than entries and assembly
        apart, and nlink-3's mass matrix 1.4x faster. The build decides from the body
        (`decide_assembly`); this measures instead, on the caller's say-so, and returns what
        it measured (also kept as `kernel.tuned`). A choice that changes recompiles each
        batch shape once, in the chosen form. Returns without measuring when the kernel has
        nothing to assemble (also a C loop's, `cpu_loop="c"`, which writes each equation
        whole) or runs as pieces.
        """
        args = self._packed_arguments(args)
        prepared = self.prepare(args)
        batch_shape = self._batch_shape_of(prepared[1])
        if not self._needs_assembly or self._pieces is not None:
            return {"batch": math.prod(batch_shape), "assembly": self.assembly, "rounds": 0}
        raw = args if prepared[1] else None
        runs = {"fused": lambda: self._execute_fused(prepared, batch_shape, raw, register=False),
                "separate": lambda: self._execute_separate(prepared, batch_shape, raw,
                                                           register=False)}
        best = {name: float("inf") for name in runs}
        with self._lock:
            start = time.perf_counter()
            self._note_compilations([self._fused_job(prepared, batch_shape, raw),
                                     self._entries_job(prepared, batch_shape, raw),
                                     self._assembly_job(batch_shape)])
            for run in runs.values():  # warm up
                jax.block_until_ready(run())
            timed_from = time.perf_counter()
            for rounds in range(1, TUNE_MAX_ROUNDS + 1):
                for name, run in runs.items():
                    began = time.perf_counter()
                    jax.block_until_ready(run())
                    best[name] = min(best[name], time.perf_counter() - began)
                elapsed = time.perf_counter() - timed_from
                if (rounds >= TUNE_ROUNDS and elapsed >= TUNE_SECONDS
                        or elapsed >= TUNE_MAX_SECONDS):
                    break
            choice = "fused" if best["fused"] <= best["separate"] else "separate"
            if choice != self.assembly:
                # shapes the direct path knows ran in the other form
                self._direct_shapes.clear()
                self._separate_shapes.clear()
                self.assembly = choice
            if raw is not None and _jit_takes(raw):
                shapes = self._direct_shapes if choice == "fused" else self._separate_shapes
                shapes.add(tuple(np.shape(raw[0])))
            self.tuned = {"batch": math.prod(batch_shape), "rounds": rounds,
                          "fused_s": best["fused"], "separate_s": best["separate"],
                          "assembly": choice}
            self.timings["tune"] = self.timings.get("tune", 0.0) + time.perf_counter() - start
        return dict(self.tuned)

    def run(self, prepared: tuple, raw: tuple | None = None) -> Any:
        """Run checked arguments (`prepare`); `raw`, the call's own arguments, if unpadded."""
        const_values, data, parameters = prepared
        if any(isinstance(a, jax.core.Tracer)
               for a in data + tuple(jax.tree_util.tree_leaves(parameters))):
            return self._jitted(*prepared)
        batch_shape = self._batch_shape_of(data)
        exact = batch_shape in self._batch_shapes
        if not exact:
            with self._lock:
                exact = len(self._batch_shapes) < EXACT_SHAPES
                if exact:
                    self._batch_shapes.add(batch_shape)
        n = math.prod(batch_shape)
        size = bucket_size(n)
        if exact or (size == n and len(batch_shape) <= 1) or n == 0:
            return self._execute(prepared, batch_shape, raw if data else None)
        ranks = [len(spec.shape) for spec in self.signature.data]
        padded = pad_batch(data, ranks, n, size)
        # the call's own parameters with the padded data: the same signature as an
        # unpadded call of the bucket's size, so the two share one executable
        raw_padded = tuple(padded) + tuple(raw[len(data):]) if raw is not None else None
        result = self._execute((const_values, padded, parameters), (size,), raw_padded)
        return self.program.map_batched(
            lambda leaf: jax.device_put(np.asarray(leaf)[:n].reshape(batch_shape + leaf.shape[1:])),
            result)

    def call_direct(self, args: tuple) -> Any:
        """The direct path (call_direct) of a shape that ran fused or separately before;
        NOT_TAKEN when the checked path must run (`run`)."""
        result = call_direct(self._direct, self._direct_shapes, self._const_values, args,
                             self.integers_seen)
        if result is NOT_TAKEN and self._separate_shapes:
            result = call_direct(self._direct_entries, self._separate_shapes,
                                 self._const_values, args, self.integers_seen)
            if result is not NOT_TAKEN:
                return self._assemble_top(result)
        return result

    def __call__(self, *args: Any) -> Any:
        args = self._packed_arguments(args)
        result = self.call_direct(args)
        if result is not NOT_TAKEN:
            return result
        return self.run(self.prepare(args), args)

    def jaxpr(self, *args: Any) -> Any:
        """The jaxpr of the whole call (stage 3) for arguments of these shapes."""
        return jax.make_jaxpr(self._jitted)(*self.prepare(args))

    def hlo(self, *args: Any, dialect: str = "stablehlo") -> str:
        """The lowered program as text, const args first in its signature."""
        return self._jitted.lower(*self.prepare(args)).as_text(dialect=dialect)

    def export(self, *args: Any) -> bytes:
        """Serialize the kernel for `symkern.load`, with a symbolic batch shape.

        `args` are example arguments (their batch shape's rank is kept, not its sizes).
        The const args are exported as ordinary arguments: the blob does not contain them,
        and loading it requires supplying them (`symkern.load(blob, kernel.const_args)`).
        """
        const_values, data, parameters = self.prepare(args)
        ps = (jax.tree_util.tree_unflatten(self.signature.parameter_treedef,
                                           parameter_leaves(parameters))
              if self.signature.has_parameters else None)
        treedef = self.signature.parameter_treedef

        program = self.program.portable  # an FFI target lives in this process only

        def run(const_args: tuple, data: tuple, ps: Any) -> Any:
            leaves = treedef.flatten_up_to(ps) if ps is not None else ()
            return program.evaluate(const_args, data, tuple(leaves))

        descriptions = [{"name": c.name, "origin": c.origin} for c in self._const_args]
        return export_function(run, const_values, descriptions, data,
                               [len(s.shape) for s in self.signature.data], ps, self.dtype,
                               [s.label for s in self.signature.parameters])

    def save(self, path: str | os.PathLike, *args: Any) -> Path:
        """Write the kernel and its const args to one file, for `symkern.load(path)`.

        `args` are example arguments as for `export` (their batch shape's rank is kept);
        without them the file takes one batch dimension. The file is a numpy .npz archive
        (the exported program, the const args, a manifest with a digest over them), read
        back without pickle.
        """
        if not args:
            signature = self.signature
            args = example_arguments(
                [spec.shape for spec in signature.data],
                signature.parameter_treedef if signature.has_parameters else None,
                [spec.shape for spec in signature.parameters], self.dtype)
        return save_file(path, self.export(*args), self.const_args)

    def shard(self, mesh: Any = None) -> Any:
        """This kernel with its batch split over all local devices (docs/scaling.md)."""
        from symkern.batching.shard import shard  # shard.py builds on this module

        return shard(self, mesh)

    def stream(self, source: Any, ps: Any = None, chunk: int = 65536, out: Any = None,
               progress: bool = True) -> Any:
        """Evaluate a batch larger than memory chunk by chunk (docs/scaling.md)."""
        from symkern.batching.stream import stream  # stream.py builds on this module

        return stream(self, source, ps, chunk=chunk, out=out, progress=progress)

    def flatten(self, ps: Any) -> Any:
        """`ps` as one device buffer, leaves raveled in argument order, for `kernel.flat()`."""
        from symkern.batching.flat import flatten_parameters  # flat.py builds on this module

        return flatten_parameters(self, ps)

    def flat(self) -> Any:
        """The flat-parameter form: `kernel.flat()(*data, kernel.flatten(ps))`."""
        from symkern.batching.flat import FlatKernel  # flat.py builds on this module

        return FlatKernel(self)

    def bind(self, ps: Any) -> BoundKernel:
        """Freeze the parameters as device-resident arrays: `kernel.bind(ps)(X)`.

        The parameters stay arguments of the executable, so binding new values of the
        same shapes reuses the compiled program.
        """
        return BoundKernel(self, jax.device_put(self.pack_parameters(ps)))


class BoundKernel:
    """A kernel with its parameters frozen: called with the data arguments only.

    The parameter values are device-resident const args of the same executable, so
    binding new values of the same shapes and dtypes never recompiles.
    """

    def __init__(self, kernel: Kernel, parameter_leaves: Any) -> None:
        self.kernel = kernel
        #: the frozen parameters as `kernel.pack_parameters` gives them (one packed
        #: buffer, or the tuple of leaves)
        self.parameter_leaves = parameter_leaves
        # the frozen tree as the direct path takes it: same signature as a checked call
        if isinstance(parameter_leaves, PackedParameters):
            self._tail: tuple = (parameter_leaves,)
        else:
            self._tail = ((jax.tree_util.tree_unflatten(kernel.signature.parameter_treedef,
                                                        list(parameter_leaves)),)
                          if kernel.signature.has_parameters else ())

    @property
    def const_args(self) -> tuple[ConstArg, ...]:
        """The kernel's const args, then each frozen parameter leaf (or the one buffer the
        leaves are packed in)."""
        if isinstance(self.parameter_leaves, PackedParameters):
            count = len(self.kernel.signature.parameters)
            return self.kernel.const_args + (ConstArg(
                "ps", self.parameter_leaves.buffer,
                f"the {count} parameter leaves, packed in one buffer, frozen by bind"),)
        frozen = tuple(ConstArg(spec.label, value, f"{spec.label} frozen by bind")
                       for spec, value in zip(self.kernel.signature.parameters,
                                              self.parameter_leaves, strict=True))
        return self.kernel.const_args + frozen

    def __call__(self, *data: Any) -> Any:
        kernel = self.kernel
        if data:
            result = kernel.call_direct(data + self._tail)
            if result is not NOT_TAKEN:
                return result
        return kernel.run(self._prepare(data), tuple(data) + self._tail)

    def _prepare(self, data: tuple) -> tuple:
        kernel = self.kernel
        check_dtype_policy(kernel.dtype)
        if len(data) != len(kernel.signature.data):
            raise ArgumentError(f"bound kernel: expected {len(kernel.signature.data)} data "
                                f"argument(s), got {len(data)}")
        return (kernel.const_values, kernel.check_data(data), self.parameter_leaves)

    @property
    def source(self) -> str:
        """The kernel's code (`Kernel.source`): the frozen parameters are arguments of it."""
        return self.kernel.source

    @property
    def upstream_source(self) -> str:
        return self.kernel.upstream_source

    def _traced(self) -> Any:
        program = self.kernel.program
        leaves, structure = jax.tree_util.tree_flatten(self.parameter_leaves)

        def evaluate(const_args: tuple, data: tuple) -> Any:
            # the frozen leaves are closed over as constants of the trace; lowered, each
            # above embed_max_bytes is a const arg of the executable, as in `const_args`
            frozen = const_args[len(const_args) - len(leaves):]
            return program.evaluate(const_args[:len(const_args) - len(leaves)], data,
                                    jax.tree_util.tree_unflatten(structure, frozen))

        return jax.jit(evaluate)

    def jaxpr(self, *data: Any) -> Any:
        """The jaxpr of a bound call: const args (the kernel's, then the frozen parameter
        leaves) as its first arguments, then the data."""
        const_values, checked, parameters = self._prepare(data)
        return jax.make_jaxpr(self._traced())(
            const_values + tuple(jax.tree_util.tree_leaves(parameters)), checked)

    def hlo(self, *data: Any, dialect: str = "stablehlo") -> str:
        """The lowered program of a bound call: the frozen parameters are arguments of its
        signature (after the kernel's const args), never embedded constants."""
        const_values, checked, parameters = self._prepare(data)
        return self._traced().lower(const_values + tuple(jax.tree_util.tree_leaves(parameters)),
                                    checked).as_text(dialect=dialect)

    def __repr__(self) -> str:
        return f"BoundKernel({self.kernel!r})"
