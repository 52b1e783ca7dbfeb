"""batching, stage 4: KernelProgram — what every kernel form is built on.

Imports jax, numpy, symkern.codegen and symkern.symbolic. A program is the traced
computation of a kernel, apart from how it is called: `entries` evaluates the generated
function over a batch, `assemble` turns its entries into the equations' structure,
`evaluate` does both. Kernel, BoundKernel, the flat, sharded, streamed and exported forms
and the structured-network kernel call these and nothing else of one another.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.custom_derivatives import SymbolicZero
from jax.extend.core import Var

from symkern.batching.packing import PackedParameters, ParameterPacker, packs
from symkern.codegen.pipeline import GeneratedCode
from symkern.symbolic.arguments import ArgumentSpec, EquationSet


@dataclass(frozen=True)
class KernelSignature:
    """What a kernel takes: its data arguments, its parameter leaves and tree, its dtype."""

    data: tuple[ArgumentSpec, ...]
    parameters: tuple[ArgumentSpec, ...]
    parameter_treedef: Any
    dtype: np.dtype

    #: whether the kernel is called with `ps` (also for an empty tree, `params={}`)
    takes_parameters: bool | None = None

    @property
    def has_parameters(self) -> bool:
        return bool(self.parameters) if self.takes_parameters is None else self.takes_parameters


def entry_dtypes(equations: EquationSet, dtype: np.dtype) -> tuple[np.dtype, ...]:
    """The dtype of each scalar entry of `equations`: bool for the entries of a condition
    leaf (`x > 0`, a Matrix of conditions), `dtype` for every other."""
    boolean = np.dtype(bool)
    return tuple(boolean if is_boolean else np.dtype(dtype)
                 for is_boolean, shape in zip(equations.boolean, equations.shapes, strict=True)
                 for _ in range(math.prod(shape)))


def batched_entries(equations: EquationSet, unbatched: Sequence[bool]) -> tuple[bool, ...]:
    """Per scalar entry of `equations`, whether it is shaped like the batch: all but those
    of an equation flagged in `unbatched` (GeneratedCode.unbatched; () flags none)."""
    flags = tuple(unbatched) or (False,) * len(equations.shapes)
    return tuple(not flag for flag, shape in zip(flags, equations.shapes, strict=True)
                 for _ in range(math.prod(shape)))


def complex_kernel_dtype(computed: np.dtype, dtype: np.dtype) -> np.dtype:
    """What an entry JAX computed in `computed` is returned as by a kernel of complex
    `dtype`: bool stays bool, a complex value takes `dtype`, a real one its real part's."""
    if computed == np.dtype(bool):
        return computed
    return np.dtype(dtype) if np.dtype(computed).kind == "c" else np.finfo(dtype).dtype


def _subscriptable(treedef: Any) -> bool:
    """Whether every node of a parameter tree is a dict, list or tuple (read as `ps[key]`)."""
    example = jax.tree_util.tree_unflatten(treedef, [0] * treedef.num_leaves)
    paths, _ = jax.tree_util.tree_flatten_with_path(example)
    keys = (jax.tree_util.DictKey, jax.tree_util.SequenceKey)
    return all(isinstance(key, keys) for path, _ in paths for key in path)


class ScalarProgram:
    """A generated function that returns one array per scalar entry of the equations.

    `entries(const_args, data, parameter_leaves)` gives every entry shaped like the batch;
    `assemble(entries)` stacks each matrix-shaped leaf's entries along its trailing axes.
    """

    def __init__(self, generated: GeneratedCode, function: Callable[..., tuple[Any, ...]],
                 signature: KernelSignature, equations: EquationSet,
                 const_values: tuple[Any, ...]) -> None:
        self.generated = generated
        self.function = function
        self.signature = signature
        self.equations = equations
        self.const_values = tuple(const_values)
        #: whether any output is matrix-shaped (its entries need stacking)
        self.needs_assembly = any(equations.shapes)
        # the generated code reads `ps[key]` at every level: a tree with nodes read by
        # attribute (namedtuple, dataclass) reaches it as nested dicts (code_parameters)
        self._parameters_by_path = not _subscriptable(signature.parameter_treedef)
        #: a tree of many leaves is read from one buffer (symkern.batching.packing): the
        #: executables take it packed, and leaves handed in one by one are packed first
        self.packer = (ParameterPacker(signature.parameters, signature.parameter_treedef,
                                       signature.dtype)
                       if packs(signature.parameters) else None)
        #: per equation, whether it comes back without batch axes, shaped like the
        #: equation alone (`constant_outputs="unbatched"`: it reads no data)
        self.unbatched = tuple(generated.unbatched) or (False,) * len(equations.shapes)
        #: per entry, whether `entries` shapes it like the batch
        self.entry_batched = batched_entries(equations, generated.unbatched)
        self._vmappable: Callable[..., Any] | None = None
        if generated.form == "interpreted":
            # its parameters are scalars of the instruction table (symkern.codegen.interpret):
            # parameters mapped per sample take JAX's batching of the loop
            self.folds_scalar_parameters = False

    @property
    def dtype(self) -> np.dtype:
        return self.signature.dtype

    @property
    def source(self) -> str:
        """The code the program's calls run: the generated function's, after every pass."""
        return self.generated.source

    @property
    def portable(self) -> ScalarProgram:
        """This program as the exported and sharded forms run it (symkern.batching.c_loop's
        runs its calls elsewhere)."""
        return self

    @functools.cached_property
    def entry_dtypes(self) -> tuple[np.dtype, ...]:
        """Each entry's dtype: in a real kernel `entry_dtypes`' (bool for conditions, the
        kernel's otherwise); in a complex kernel the kind JAX computes it in at the kernel's
        precision, as NumPy's lambdify does (`Abs(z)`, `re(z)` real, `z**2` complex)."""
        if self.dtype.kind != "c":
            return entry_dtypes(self.equations, self.dtype)
        specs = (tuple(jax.ShapeDtypeStruct(np.shape(c), c.dtype) for c in self.const_values),
                 tuple(jax.ShapeDtypeStruct(spec.shape, self.dtype)
                       for spec in self.signature.data),
                 tuple(jax.ShapeDtypeStruct(spec.shape, self.dtype)
                       for spec in self.signature.parameters))
        traced = jax.eval_shape(
            lambda *given: tuple(self.function(*self.arguments(*given))), *specs)
        return tuple(complex_kernel_dtype(entry.dtype, self.dtype) for entry in traced)

    @property
    def entry_count(self) -> int:
        """How many arrays `entries` returns."""
        return sum(math.prod(shape) for shape in self.equations.shapes)

    def batch_shape(self, data: Sequence[Any]) -> tuple[int, ...]:
        """The batch shape of checked data arguments (`()` without data)."""
        if not data:
            return ()
        shape = tuple(data[0].shape)
        return shape[: len(shape) - len(self.signature.data[0].shape)]

    def code_parameters(self, parameter_leaves: tuple) -> Any:
        """The `ps` the generated code reads: the caller's tree, or nested dicts by the
        same keys when a node of it is read by attribute (`ps['p']` for a namedtuple's `p`).

        Packed parameters (symkern.batching.packing) are read as they are: they take the
        same keys and slice their buffer."""
        if self.packer is not None and not isinstance(parameter_leaves, PackedParameters):
            parameter_leaves = self.packer.pack_leaves(parameter_leaves)
        if isinstance(parameter_leaves, PackedParameters):
            return parameter_leaves if parameter_leaves.layout.tree is not None \
                else parameter_leaves.leaf(0)
        if not self._parameters_by_path:
            return jax.tree_util.tree_unflatten(self.signature.parameter_treedef,
                                                parameter_leaves)
        root: dict = {}
        for spec, leaf in zip(self.signature.parameters, parameter_leaves, strict=True):
            if not spec.path:
                return leaf
            node = root
            for key in spec.path[:-1]:
                node = node.setdefault(key, {})
            node[spec.path[-1]] = leaf
        return root

    def arguments(self, const_args: tuple, data: tuple, parameter_leaves: tuple) -> list[Any]:
        """The generated function's positional arguments: const args, data, the `ps` tree."""
        arguments = list(const_args) + list(data)
        if self.signature.parameters:
            arguments.append(self.code_parameters(parameter_leaves))
        return arguments

    def entries(self, const_args: tuple, data: tuple, parameter_leaves: tuple,
                mapped: int | None = None) -> tuple:
        """Every scalar entry of every equation, each shaped like the batch, but those of
        an unbatched equation (`unbatched`), which are one number each, or `(mapped,)`:
        one per sample of a `jax.vmap` axis of that size folded into the batch, whose
        parameters they may read (`vmappable`)."""
        arguments = self.arguments(const_args, data, parameter_leaves)
        batch_shape = self.batch_shape(data)
        entries = []
        for entry, dtype, batched in zip(self.function(*arguments), self.entry_dtypes,
                                         self.entry_batched, strict=True):
            entry = jnp.asarray(entry, dtype)
            if batched:
                entries.append(jnp.broadcast_to(entry, batch_shape))
            elif mapped is None:
                entries.append(jnp.broadcast_to(entry, ()))
            else:  # a folded parameter reads as (mapped, 1, ...): see `vmappable`
                entries.append(jnp.broadcast_to(
                    entry, (mapped,) + (1,) * (len(batch_shape) - 1)).reshape((mapped,)))
        return tuple(entries)

    def assemble(self, entries: tuple, transpose_up_to: int = 0,
                 mapped: int | None = None) -> Any:
        """Entries → the equations' structure, each array leaf shaped `batch + its shape`
        (an unbatched one `its shape`, or `(mapped,) + its shape`: `entries`').

        A leaf of at most `transpose_up_to` entries is stacked along a new leading axis,
        which is then moved last; the others are stacked along the last axis.
        """
        batched = [entry for entry, flag in zip(entries, self.entry_batched, strict=True)
                   if flag]
        batch_shape = tuple(np.shape(batched[0])) if batched else ()
        leaves, start = [], 0
        for shape, unbatched in zip(self.equations.shapes, self.unbatched, strict=True):
            count = int(np.prod(shape, dtype=int))
            chunk = entries[start:start + count]
            start += count
            if not shape:
                leaves.append(chunk[0])
            elif unbatched:
                lead = () if mapped is None else (mapped,)
                leaves.append(jnp.stack(chunk, axis=-1).reshape(lead + tuple(shape)))
            else:
                stacked = (jnp.moveaxis(jnp.stack(chunk), 0, -1) if count <= transpose_up_to
                           else jnp.stack(chunk, axis=-1))
                leaves.append(stacked.reshape(batch_shape + tuple(shape)))
        return jax.tree_util.tree_unflatten(self.equations.treedef, leaves)

    def entry_shapes(self, batch_shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        """The shape of each of `entries`' arrays for a batch of `batch_shape`."""
        return tuple(tuple(batch_shape) if batched else () for batched in self.entry_batched)

    def batched_leaves(self, result: Any) -> list[tuple[Any, bool]]:
        """A result's array leaves, each with whether it leads with the batch axes."""
        return list(zip(self.equations.treedef.flatten_up_to(result),
                        (not flag for flag in self.unbatched), strict=True))

    def map_batched(self, function: Callable[[Any], Any], result: Any) -> Any:
        """`function` applied to each leaf of `result` that leads with the batch axes; an
        unbatched one (`unbatched`) as it is."""
        return jax.tree_util.tree_unflatten(
            self.equations.treedef,
            [function(leaf) if batched else leaf for leaf, batched in self.batched_leaves(result)])

    def evaluate(self, const_args: tuple, data: tuple, parameter_leaves: tuple,
                 mapped: int | None = None) -> Any:
        """The equations' values: `assemble(entries(...))` (`mapped`: `entries`')."""
        return self.assemble(self.entries(const_args, data, parameter_leaves, mapped),
                             mapped=mapped)

    #: whether a parameter leaf of shape () mapped by `jax.vmap` can be folded into the
    #: batch (the generated code reads it only in elementwise arithmetic)
    folds_scalar_parameters = True

    @property
    def vmappable(self) -> Callable[..., Any]:
        """`evaluate` as `jax.vmap` should see it: a mapped axis of the data is folded into
        the program's own batch (one leading batch axis more), so that `jax.vmap(kernel)`
        runs the kernel's own batched program instead of JAX's batching of each of its
        operations (which turns its conditionals into selects computing both branches).

        Parameter leaves mapped per sample fold too where they are scalars of a scalar
        body (reshaped to broadcast against the batch); any other mapped parameter, or a
        mapped argument without mapped data, takes JAX's own batching. Derivatives are the
        unfolded program's (`jax.custom_jvp`), so `jax.grad` and `jax.jvp` go through, and
        `jax.vmap` of them takes JAX's batching.
        """
        if self._vmappable is None:
            self._vmappable = _foldable(self)
        return self._vmappable


def _foldable(program: ScalarProgram) -> Callable[..., Any]:
    """`program.evaluate` with the batching rule of `ScalarProgram.vmappable`."""
    evaluate = program.evaluate
    ranks = [len(spec.shape) for spec in program.signature.data]
    scalar_leaves = [spec.shape == () for spec in program.signature.parameters]
    all_scalar = all(scalar_leaves)

    @custom_vmap
    def folded(const_args: tuple, data: tuple, parameter_leaves: tuple) -> Any:
        return evaluate(const_args, data, parameter_leaves)

    @folded.def_vmap
    def fold(axis_size: int, in_batched: tuple, const_args: tuple, data: tuple,
             parameter_leaves: tuple) -> tuple[Any, Any]:
        const_batched, data_batched, leaves_batched = in_batched
        packed = isinstance(parameter_leaves, PackedParameters)
        # a packed buffer is mapped as a whole: it folds when every leaf is a scalar
        mapped_leaves = [leaves_batched.buffer] if packed else leaves_batched
        scalars = [all_scalar] if packed else scalar_leaves
        unfolded = (any(const_batched) or not any(data_batched)
                    or any(mapped and not (scalar and program.folds_scalar_parameters)
                           for mapped, scalar in zip(mapped_leaves, scalars, strict=True)))
        if unfolded:
            axes = jax.tree_util.tree_map(lambda mapped: 0 if mapped else None, in_batched)
            out = jax.vmap(evaluate, in_axes=axes)(const_args, data, parameter_leaves)
            return out, jax.tree_util.tree_map(lambda _: True, out)
        batch = next(tuple(array.shape[:array.ndim - rank])
                     for array, rank, mapped in zip(data, ranks, data_batched, strict=True)
                     if mapped)
        data = tuple(array if mapped else jnp.broadcast_to(array, batch + array.shape[array.ndim - rank:])
                     for array, rank, mapped in zip(data, ranks, data_batched, strict=True))
        if packed and leaves_batched.buffer:
            # (axis, size) → (axis, 1, ..., size): each leaf read leads with (axis, 1, ...)
            buffer = parameter_leaves.buffer
            parameter_leaves = PackedParameters(
                jnp.reshape(buffer, (axis_size,) + (1,) * (len(batch) - 1) + buffer.shape[-1:]),
                parameter_leaves.layout)
        elif not packed:
            parameter_leaves = tuple(
                jnp.reshape(leaf, (axis_size,) + (1,) * (len(batch) - 1)) if mapped else leaf
                for leaf, mapped in zip(parameter_leaves, leaves_batched, strict=True))
        if any(mapped_leaves) and not all(program.entry_batched):
            # an unbatched equation may read a mapped parameter: one value per mapped sample
            out = evaluate(const_args, data, parameter_leaves, mapped=axis_size)
            return out, jax.tree_util.tree_map(lambda _: True, out)
        out = evaluate(const_args, data, parameter_leaves)
        return out, program.map_batched(lambda _: True, jax.tree_util.tree_map(lambda _: False, out))

    @jax.custom_jvp
    def vmappable(const_args: tuple, data: tuple, parameter_leaves: tuple) -> Any:
        return folded(const_args, data, parameter_leaves)

    def _jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
        # only the arguments with a tangent are differentiated: `jax.grad` w.r.t. the
        # parameters computes no tangent of the data (a zero tangent instantiated would
        # still be propagated through every operation that reads the data)
        flat, tree = jax.tree_util.tree_flatten(primals)
        flat_tangents = tree.flatten_up_to(tangents)
        active = [k for k, t in enumerate(flat_tangents) if not isinstance(t, SymbolicZero)]

        def of_active(*values: Any) -> Any:
            arguments = list(flat)
            for k, value in zip(active, values, strict=True):
                arguments[k] = value
            return evaluate(*tree.unflatten(arguments))

        if not active:
            out = evaluate(*primals)
            return out, jax.tree_util.tree_map(jnp.zeros_like, out)
        return jax.jvp(of_active, [flat[k] for k in active], [flat_tangents[k] for k in active])

    vmappable.defjvp(_jvp, symbolic_zeros=True)
    return vmappable


class StructuredProgram(ScalarProgram):
    """A structured network's array program: its function returns *pieces*, whole leaves
    (a network output, Jacobian or parameter gradient, one array already shaped
    `batch + shape`) or the scalar entries of leaves written as SymPy formulas around the
    network (`J∇H`), which `assemble` stacks.

    With `tile_chunk`, a batch of more samples runs that many at a time (`lax.map`).
    """

    #: a structured body reads its parameters as whole matrices (`x @ W.T`)
    folds_scalar_parameters = False

    def __init__(self, generated: GeneratedCode, function: Callable[..., tuple[Any, ...]],
                 signature: KernelSignature, equations: EquationSet,
                 const_values: tuple[Any, ...], layout: Any,
                 tile_chunk: int | None = None) -> None:
        super().__init__(generated, function, signature, equations, const_values)
        self.layout = layout
        self.needs_assembly = layout.needs_assembly
        self.tile_chunk = tile_chunk
        #: the same program without custom calls (BuildOptions(cpu_loop="c") makes its
        #: solves C loops): what export and shard run; None when this one has none
        self.portable_program: StructuredProgram | None = None
        self.entry_dtypes = (np.dtype(self.dtype),) * self.entry_count

    @property
    def portable(self) -> StructuredProgram:
        """This program as the exported and sharded forms run it: without the C solve's
        custom calls where it has them (an FFI target lives in the process that compiled it)."""
        return self.portable_program or self

    @property
    def entry_count(self) -> int:
        return sum(leaf.count for leaf in self.layout.leaves)

    def entry_shapes(self, batch_shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        shapes: list[tuple[int, ...]] = []
        for leaf in self.layout.leaves:
            shape = tuple(batch_shape) if leaf.stacked else tuple(batch_shape) + tuple(leaf.shape)
            shapes += [shape] * leaf.count
        return tuple(shapes)

    def largest_intermediate(self) -> int:
        """The most values an array computed from the data holds for one sample."""
        specs = [jax.ShapeDtypeStruct(spec.shape, self.dtype) for spec in self.signature.data]
        leaves = [jax.ShapeDtypeStruct(spec.shape, self.dtype)
                  for spec in self.signature.parameters]
        jaxpr = jax.make_jaxpr(self.shaped_pieces, static_argnums=(3,))(
            self.const_values, tuple(specs), tuple(leaves), ()).jaxpr
        first = len(self.const_values)
        per_sample = set(jaxpr.invars[first:first + len(specs)])
        largest = 0
        for eqn in jaxpr.eqns:  # in order: an equation reads only what came before it
            if any(var in per_sample for var in eqn.invars if isinstance(var, Var)):
                per_sample.update(eqn.outvars)
                largest = max([largest, *(math.prod(var.aval.shape) for var in eqn.outvars)])
        return largest

    def entries(self, const_args: tuple, data: tuple, parameter_leaves: tuple,
                mapped: int | None = None) -> tuple:
        batch_shape = self.batch_shape(data)  # every piece is batched: `mapped` changes nothing
        chunk = self.tile_chunk
        if (chunk is None or not all(isinstance(n, int) for n in batch_shape)
                or math.prod(batch_shape) <= chunk):
            return self.shaped_pieces(const_args, data, parameter_leaves, batch_shape)
        size = math.prod(batch_shape)
        count = -(-size // chunk)
        tiles = []
        for spec, array in zip(self.signature.data, data, strict=True):
            flat = jnp.reshape(array, (size, *spec.shape))
            if count * chunk != size:  # padded with the last sample: real values, no NaN
                flat = jnp.pad(flat, [(0, count * chunk - size)] + [(0, 0)] * len(spec.shape),
                               mode="edge")
            tiles.append(flat.reshape((count, chunk, *spec.shape)))
        out = jax.lax.map(lambda tile: self.shaped_pieces(const_args, tuple(tile),
                                                          parameter_leaves, (chunk,)),
                          tuple(tiles))
        return tuple(piece.reshape((count * chunk, *piece.shape[2:]))[:size]
                     .reshape(batch_shape + piece.shape[2:]) for piece in out)

    def shaped_pieces(self, const_args: tuple, data: tuple, parameter_leaves: tuple,
                      batch_shape: tuple) -> tuple:
        """The function's pieces, each broadcast to `batch_shape` (+ its leaf's shape)."""
        pieces = list(self.function(*self.arguments(const_args, data, parameter_leaves)))
        shaped = []
        for leaf in self.layout.leaves:
            shape = batch_shape if leaf.stacked else batch_shape + tuple(leaf.shape)
            for piece in pieces[leaf.start:leaf.start + leaf.count]:
                shaped.append(jnp.broadcast_to(jnp.asarray(piece, self.dtype), shape))
        return tuple(shaped)

    def assemble(self, entries: tuple, transpose_up_to: int = 0,
                 mapped: int | None = None) -> Any:
        leaves = []
        for leaf in self.layout.leaves:
            chunk = entries[leaf.start:leaf.start + leaf.count]
            if leaf.stacked:
                batch_shape = tuple(np.shape(chunk[0]))
                leaves.append(jnp.stack(chunk, axis=-1).reshape(batch_shape + tuple(leaf.shape)))
            else:
                leaves.append(chunk[0])
        return jax.tree_util.tree_unflatten(self.equations.treedef, leaves)
