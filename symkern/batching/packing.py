"""batching, stage 4: parameter packing — a tree of many parameter leaves as one buffer.

Imports jax, numpy and symkern.symbolic. A kernel whose parameter tree has at least
PACK_FROM_LEAVES leaves hands its executables one buffer instead of one argument per leaf;
the generated code still reads `ps['p0']`, from a view that slices the buffer.
"""

# Why: jit flattens every leaf of its arguments on every call and XLA compiles an executable
# with one parameter per leaf. With 10^5 scalar parameters (`x * Add(*p)`) a call took 11.9 s
# and the first 775 s at 9 GB, most of it in per-leaf work: checking and converting each leaf,
# JAX abstracting each leaf of each traced piece, and the executables' argument handling.
# Packed, each executable takes one buffer of the kernel's dtype (every parameter leaf is cast
# to it, so one dtype means one buffer), the body reads the leaves it uses as slices of it
# inside the trace, and a call converts the caller's tree with a few C-level passes
# (`np.fromiter` over the values) instead of a Python loop (docs/design/parameter-packing.md).

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from symkern.symbolic.arguments import ArgumentSpec

#: a tree of scalar leaves is packed from this many leaves on. A repeated call of
#: `x * (p0 + … )` with a dict of Python floats (100 samples, best of 2,000, shared 2-core CPU;
#: benchmarks/many_parameters.py --threshold) took, one argument per leaf against packed:
#: 1 leaf 9.5 / 11.9 µs, 2: 10.8 / 11.8, 4: 13.3 / 11.4, 8: 18.9 / 12.5, 64: 117 / 16
PACK_FROM_LEAVES = 4
#: a tree with array leaves is packed from this many leaves on: such leaves are checked one
#: by one either way and packing adds a concatenation. `x * Σ (v_k[0] + 2 v_k[1])` over
#: 2-vectors v_k, one argument per leaf against packed: 64 leaves, numpy values 201 / 219 µs a
#: call, device arrays 40 / 97 µs; 256: 720 / 704 µs, 130 / 261 µs, first call 0.9 / 1.8 s;
#: 1,024: 3.48 / 2.93 ms, 0.65 / 1.13 ms, first call 14.7 / 3.8 s (Chain(Dense(2, 2)…)
#: networks of 4-32 leaves also ran 10-40 % slower packed)
PACK_ARRAYS_FROM_LEAVES = 1024
#: leaves packed inside a trace (a caller's `jax.jit`, `jax.grad`), above this many of them,
#: reach XLA as one opaque buffer (`lax.optimization_barrier`): otherwise XLA folds each slice
#: of their concatenation to the leaf, the executable's own argument, and a loop fusion takes
#: one operand per parameter read. `jax.jit` around the 10^4-operation random shape with
#: 2,000 scalar parameters compiled in 236 s that way against 25 s behind the barrier
#: (running 100 against 132 ms a call at 100,000 samples). Up to this many — the count of
#: JAX-array leaves the direct call packs inside its own trace (kernel.DIRECT_TREE_LEAVES) —
#: the scalars stay foldable: the 2-link pendulum on a cart (6 leaves) ran 1.55 ms a call
#: with them and 2.50 ms behind the barrier
OPAQUE_ABOVE_LEAVES = 64


def packs(specs: Sequence[ArgumentSpec]) -> bool:
    """Whether a kernel with these parameter leaves takes them packed: PACK_FROM_LEAVES
    scalar leaves, or PACK_ARRAYS_FROM_LEAVES leaves when some are arrays."""
    scalar = all(spec.shape == () for spec in specs)
    return (len(specs) >= (PACK_FROM_LEAVES if scalar else PACK_ARRAYS_FROM_LEAVES)
            and all(spec.path for spec in specs))


#: the leaf types `ParameterPacker.pack` converts in one `np.fromiter` pass; any other leaf
#: (arrays, SymPy numbers, strings, device arrays, tracers) takes the per-leaf check
_SCALAR_TYPES = frozenset({float, int, bool, np.float64, np.float32, np.float16, np.int64,
                           np.int32, np.bool_})
_shape_of = operator.attrgetter("shape")
_dtype_of = operator.attrgetter("dtype")


class ParameterLayout:
    """Where each parameter leaf lies in the packed buffer: leaf `k` (argument order) is
    `buffer[offsets[k]:offsets[k] + sizes[k]]` reshaped to `shapes[k]`.

    `tree` maps each key of the generated code's `ps[...]` reads to a subtree or to a
    leaf's index (None when the tree is a single leaf, read as `ps` itself). Compared by
    identity: each kernel has one, and it is the static part of a `PackedParameters`
    pytree, so jit's cache compares it on every call.
    """

    def __init__(self, specs: Sequence[ArgumentSpec], dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)
        self.shapes = tuple(tuple(spec.shape) for spec in specs)
        self.sizes = tuple(math.prod(shape) for shape in self.shapes)
        self.offsets = tuple(itertools.accumulate(self.sizes[:-1], initial=0))[:len(self.sizes)]
        self.size = sum(self.sizes)
        self.scalar = all(shape == () for shape in self.shapes)
        tree: dict | None = {}
        for index, spec in enumerate(specs):
            if not spec.path:  # the tree is this one leaf, read as `ps` itself
                tree = None
                break
            node = tree
            for key in spec.path[:-1]:
                node = node.setdefault(key, {})
            node[spec.path[-1]] = index
        self.tree = tree

    def __repr__(self) -> str:
        return f"ParameterLayout({len(self.shapes)} leaves, {self.size} {self.dtype.name})"


@jax.tree_util.register_pytree_node_class
class PackedParameters:
    """A kernel's parameter leaves packed into one buffer of shape `(..., layout.size)`.

    A pytree whose only child is the buffer, so a jit, a `jax.grad` or a `jax.vmap` sees one
    array however many leaves there are; the generated code reads it as its `ps`
    (`__getitem__`), so it also crosses the jits of a kernel cut into pieces as one array.
    Leading axes of the buffer (a `jax.vmap` folded into the batch) lead every leaf read
    from it.
    """

    def __init__(self, buffer: Any, layout: ParameterLayout) -> None:
        self.buffer = buffer
        self.layout = layout

    def tree_flatten(self) -> tuple[tuple[Any], ParameterLayout]:
        return (self.buffer,), self.layout

    @classmethod
    def tree_unflatten(cls, layout: ParameterLayout, children: Sequence[Any]) -> PackedParameters:
        return cls(children[0], layout)

    def leaf(self, index: int) -> Any:
        """Leaf `index` (argument order), sliced out of the buffer and reshaped."""
        layout, buffer = self.layout, self.buffer
        start = layout.offsets[index]
        axis = np.ndim(buffer) - 1
        piece = lax.slice_in_dim(buffer, start, start + layout.sizes[index], axis=axis)
        return lax.reshape(piece, tuple(np.shape(buffer)[:axis]) + layout.shapes[index])

    def sum_slices(self, *runs: tuple[int, int]) -> Any:
        """The sum of the buffer's entries in each `[start, stop)` of `runs` (the rewritten
        code's form of a long sum of scalar parameters: symkern.codegen.packed_sums)."""
        axis = np.ndim(self.buffer) - 1
        total = None
        for start, stop in runs:
            part = jnp.sum(lax.slice_in_dim(self.buffer, start, stop, axis=axis), axis=axis)
            total = part if total is None else total + part
        return total

    def leaves(self) -> tuple[Any, ...]:
        """Every leaf, in argument order (one slice each: for the forms that list them).

        A buffer outside a trace is sliced on the host (eager slices would compile one
        program per position) and the leaves of a device buffer put back on its device."""
        buffer = self.buffer
        if isinstance(buffer, jax.core.Tracer):
            return tuple(self.leaf(index) for index in range(len(self.layout.shapes)))
        host = np.asarray(buffer)
        layout = self.layout
        lead = host.shape[:-1]
        leaves = tuple(host[..., start:start + size].reshape(lead + shape)
                       for start, size, shape in zip(layout.offsets, layout.sizes,
                                                     layout.shapes, strict=True))
        return tuple(jax.device_put(leaves)) if isinstance(buffer, jax.Array) else leaves

    def __getitem__(self, key: Any) -> Any:
        """What the generated code reads as `ps[key]`: `packed['L1']['W']` is leaf `W` of
        `L1`, sliced out of the buffer."""
        return ParameterView(self, self.layout.tree)[key]

    def __repr__(self) -> str:
        return f"PackedParameters({self.layout!r}, buffer shape {np.shape(self.buffer)})"


class ParameterView:
    """A node of the parameter tree over a packed buffer: `view[key]` is the subtree or the
    leaf under `key`, each leaf sliced only when read (a body that reads ten of 10^5 leaves
    traces ten slices)."""

    def __init__(self, packed: PackedParameters, node: dict) -> None:
        self._packed = packed
        self._node = node

    def __getitem__(self, key: Any) -> Any:
        child = self._node[key]
        if isinstance(child, dict):
            return ParameterView(self._packed, child)
        return self._packed.leaf(child)


class ParameterPacker:
    """A caller's parameter tree → `PackedParameters`, without per-leaf Python work where
    the tree allows it.

    `pack(ps)` takes the fast route when every leaf is a scalar and `ps` is the kernel's own
    flat container (a dict or a list/tuple of the leaves) holding Python or numpy numbers:
    one `np.fromiter` over its values, reordered by a permutation worked out once per key
    order (JAX orders a dict's leaves by sorted key, which costs 30 ms at 10^5 keys). It
    returns None for anything else. Any tree of the kernel's structure then goes through
    `pack_flattened`, its flattened leaves checked by a few passes over all of them (a
    nested tree of 10^5 floats 528 → 29 ms a call, 4,096 numpy 2-vectors 15.6 → 1.9 ms),
    and the leaves those passes do not settle are checked one by one (`pack_leaves` of
    `Kernel.check_parameters`), which names a wrong one.
    """

    def __init__(self, specs: Sequence[ArgumentSpec], treedef: Any, dtype: np.dtype) -> None:
        self.layout = ParameterLayout(specs, dtype)
        example = jax.tree_util.tree_unflatten(treedef, list(range(treedef.num_leaves)))
        flat = (self.layout.scalar and treedef.num_nodes == treedef.num_leaves + 1
                and all(len(spec.path) == 1 for spec in specs))
        self._container = type(example) if flat and type(example) in (dict, list, tuple) else None
        self._keys = tuple(spec.path[0] for spec in specs) if self._container is dict else ()
        self._order: tuple = ()
        self._permutation: np.ndarray | None = None
        # one executable for device arrays (an eager ravel and concatenate per leaf took
        # 100-400 µs for 2-16 leaves); inside a caller's trace it is inlined
        self._concatenate = jax.jit(functools.partial(_concatenate, dtype=self.layout.dtype))

    def pack(self, ps: Any) -> PackedParameters | None:
        """`ps` packed on the host by the fast route, or None where it does not apply."""
        container = self._container
        if container is None or type(ps) is not container:
            return None
        values = ps.values() if container is dict else ps
        if len(values) != self.layout.size:
            return None
        buffer = self._scalar_buffer(values)
        if buffer is None:
            return None
        if container is dict:
            order = tuple(ps)
            if order != self._order:
                position = {key: index for index, key in enumerate(order)}
                if not all(key in position for key in self._keys):
                    return None
                self._permutation = np.fromiter(map(position.__getitem__, self._keys), np.intp,
                                                count=len(self._keys))
                self._order = order
            buffer = buffer[self._permutation]
        return PackedParameters(buffer, self.layout)

    def pack_flattened(self, leaves: Sequence[Any]) -> PackedParameters | None:
        """The leaves of a tree of the kernel's structure (`jax.tree_util.tree_flatten`
        order) packed after a few checks over all of them at once, or None where a leaf needs
        the per-leaf check (`pack_leaves` of `Kernel.check_parameters`): Python or numpy
        numbers for scalar leaves; numpy arrays of bool, integers or floats, or device arrays
        of the kernel's dtype (not tracers), each of its leaf's exact shape."""
        layout = self.layout
        if layout.scalar and len(leaves) == layout.size:
            buffer = self._scalar_buffer(leaves)
            if buffer is not None:
                return PackedParameters(buffer, layout)
        types = set(map(type, leaves))
        device = bool(types) and all(issubclass(kind, jax.Array) for kind in types)
        if not (device or types == {np.ndarray}) or tuple(map(_shape_of, leaves)) != layout.shapes:
            return None
        dtypes = set(map(_dtype_of, leaves))
        if device:
            return (PackedParameters(self._concatenate(tuple(leaves)), layout)
                    if dtypes == {layout.dtype} else None)
        if not all(dtype.kind in "biuf" for dtype in dtypes):
            return None
        # each leaf cast straight to the buffer's dtype, as the per-leaf check casts it
        buffer = np.concatenate(leaves, axis=None, dtype=layout.dtype, casting="unsafe")
        return PackedParameters(buffer, layout)

    def _scalar_buffer(self, values: Any) -> np.ndarray | None:
        """`values` (a sized iterable of the layout's length) as the buffer when every one
        is a Python or numpy number of _SCALAR_TYPES within the dtype's range, else None."""
        count = self.layout.size
        # values that start with a Python float are counted as such first: one pass of
        # identity comparisons took 1.1 ms at 10^5 floats, the set of their types 1.5 ms
        floats = (type(next(iter(values), None)) is float
                  and operator.countOf(map(type, values), float) == count)
        if not (floats or set(map(type, values)) <= _SCALAR_TYPES):
            return None
        try:
            return np.fromiter(values, self.layout.dtype, count=count)
        except (OverflowError, ValueError, TypeError):
            return None  # the per-leaf check names the leaf

    def pack_leaves(self, leaves: Sequence[Any]) -> PackedParameters:
        """Checked leaves (`Kernel.check_parameters`) packed: on the host when all are numpy,
        else with one jitted `jnp.concatenate` (device arrays stay on their device; tracers
        pack inside the trace, so `jax.grad` returns a gradient per leaf, behind a barrier
        above OPAQUE_ABOVE_LEAVES leaves)."""
        dtype = self.layout.dtype
        if all(isinstance(leaf, (np.ndarray, np.generic)) for leaf in leaves):
            buffer = (np.concatenate([np.ravel(leaf) for leaf in leaves]).astype(dtype, copy=False)
                      if leaves else np.zeros((0,), dtype))
        else:
            buffer = self._concatenate(tuple(leaves))
            if len(leaves) > OPAQUE_ABOVE_LEAVES and any(
                    isinstance(leaf, jax.core.Tracer) for leaf in leaves):
                buffer = lax.optimization_barrier(buffer)
        return PackedParameters(buffer, self.layout)

    def accepts(self, ps: Any) -> bool:
        """Whether `ps` is already packed for this kernel (one buffer of its layout)."""
        return (isinstance(ps, PackedParameters) and ps.layout is self.layout
                and tuple(np.shape(ps.buffer)) == (self.layout.size,)
                and np.dtype(ps.buffer.dtype) == self.layout.dtype)


def _concatenate(leaves: tuple, dtype: np.dtype) -> Any:
    return jnp.concatenate([jnp.ravel(jnp.asarray(leaf, dtype)) for leaf in leaves])


def parameter_leaves(parameters: Any) -> tuple[Any, ...]:
    """The leaves of a prepared call's parameters: a tuple of leaves, or packed ones sliced."""
    if isinstance(parameters, PackedParameters):
        return parameters.leaves()
    return tuple(parameters)
