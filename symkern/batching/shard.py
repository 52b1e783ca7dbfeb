"""batching, stage 4: a kernel whose batch is split over devices with jax.sharding.

Imports jax, numpy, symkern.kernels, symkern.codegen, symkern.symbolic, symkern.errors and
symkern.batching.kernel.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from symkern.batching.kernel import TRANSPOSED_ASSEMBLY_UP_TO, Kernel
from symkern.errors import ArgumentError


def default_mesh() -> Mesh:
    """A one-axis mesh named "batch" over every device JAX sees (all processes' devices)."""
    return Mesh(np.array(jax.devices()), ("batch",))


class ShardedKernel:
    """A kernel whose batch (the leading axis) is split over the devices of a mesh.

    Call it like the kernel, `sharded(*data, ps)`. Data arguments are split along their
    leading axis over all the mesh's axes together; parameters and the kernel's const args
    are replicated on every device — the const args once, here, not at every call. Each
    result leaf is sharded the same way as the data.

    A batch whose leading size is not a multiple of the device count is padded with copies
    of its last sample, evaluated, and sliced back. JAX's named shardings cannot split an
    axis unevenly, so such a result is *replicated* on every device (the slice gathers it);
    keep the batch a multiple of `sharded.device_count` for a sharded result.

    With several processes (`jax.distributed.initialize`) and a mesh spanning them, each
    process passes its own part of the batch — the same size in every process, a multiple
    of its local device count — and gets back the global array; `sharded.local(result)`
    gives this process's part as numpy. See docs/scaling.md.

    >>> import sympy as sp, symkern as sk
    >>> x0, a = sp.symbols("x0 a")
    >>> sharded = shard(sk.build_function(a * x0, [x0], params={"a": a}))
    >>> sharded(np.ones((8, 1)), {"a": 2.0}).shape
    (8,)
    """

    def __init__(self, kernel: Kernel, mesh: Mesh | None = None) -> None:
        if not kernel.signature.data:
            raise ArgumentError("shard: the kernel has no data arguments, so no batch to split")
        self.kernel = kernel
        self.mesh = default_mesh() if mesh is None else mesh
        # The batch is split over every axis of the mesh at once: a 2×2 mesh splits it 4 ways.
        self.batch_sharding = NamedSharding(self.mesh, PartitionSpec(tuple(self.mesh.axis_names)))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.multi_process = bool(self.mesh.is_multi_process)
        # Placed once per device here; every call reuses these buffers.
        self.const_values = tuple(jax.device_put(np.asarray(c.value), self.replicated)
                                  for c in kernel.const_args)
        # Explicit out_shardings: propagation alone may replicate an output that reads no
        # data (a broadcast constant). The kernel's own assembly (kernel.assembly): one
        # executable, or the entries and then their assembly, so that a sharded sample
        # gets the kernel's value.
        # An unbatched equation (constant_outputs="unbatched") is replicated.
        program = kernel.program.portable  # a custom call is not split over devices
        self.program = program
        arguments = (self.replicated, self.batch_sharding, self.replicated)
        leaves = jax.tree_util.tree_unflatten(
            program.equations.treedef,
            [self.replicated if flag else self.batch_sharding for flag in program.unbatched])
        entries = tuple(self.batch_sharding if batched else self.replicated
                        for batched in program.entry_batched)
        self._evaluate = jax.jit(program.evaluate, in_shardings=arguments, out_shardings=leaves)
        self._compute = jax.jit(program.entries, in_shardings=arguments, out_shardings=entries)
        self._assemble = jax.jit(partial(program.assemble, transpose_up_to=TRANSPOSED_ASSEMBLY_UP_TO),
                                 in_shardings=(entries,), out_shardings=leaves)

    @property
    def device_count(self) -> int:
        """How many ways the batch is split: the mesh's size."""
        return int(self.mesh.size)

    @property
    def local_device_count(self) -> int:
        """How many of the mesh's devices belong to this process."""
        return sum(d.process_index == jax.process_index() for d in self.mesh.devices.flat)

    def __repr__(self) -> str:
        return f"ShardedKernel({self.kernel!r}, over {self.device_count} device(s))"

    def _place_data(self, data: tuple[Any, ...]) -> tuple[tuple[Any, ...], int, int]:
        """Pad the leading axis to a multiple of the device count and split it over devices."""
        size = int(np.shape(data[0])[0])
        if self.multi_process:
            if size % self.local_device_count:
                raise ArgumentError(
                    f"x1: with several processes each process's batch must be a multiple of its "
                    f"{self.local_device_count} local device(s), got {size}")
            placed = tuple(jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(a))
                           for a in data)
            return placed, size, 0
        padding = -size % self.device_count
        if padding:
            data = tuple(_pad_leading(a, padding) for a in data)
        return tuple(jax.device_put(a, self.batch_sharding) for a in data), size, padding

    def place(self, *args: Any) -> tuple[tuple, tuple, tuple]:
        """Check the arguments and put them on the mesh: `(const args, data, parameter leaves)`.

        Data split along the leading axis (padded to a multiple of the device count, a single
        sample as a batch of one), parameters and const args replicated. `sharded(*args)`
        evaluates exactly these; this is for inspecting where each piece lives.
        """
        return self._place(args)[0]

    def _place(self, args: tuple) -> tuple[tuple[tuple, tuple, tuple], int, int, bool]:
        kernel = self.kernel
        # Cast numpy data on the host: the kernel's own cast would first copy the whole
        # batch to the default device and only then reshard it.
        n_data = len(kernel.signature.data)
        args = tuple(np.asarray(a, kernel.dtype)
                     if i < n_data and isinstance(a, np.ndarray) and a.dtype.kind in "biuf"
                     and a.dtype != kernel.dtype else a
                     for i, a in enumerate(args))
        _, data, parameter_leaves = kernel.prepare(args)
        rank = len(kernel.signature.data[0].shape)
        one_sample = np.ndim(data[0]) == rank
        if one_sample:
            # A single sample is a batch of one, so that there is a leading axis to split.
            data = tuple(a[None] for a in data)
        placed, size, padding = self._place_data(data)
        # a tuple of leaves, or the one buffer they are packed in (Kernel.pack_parameters)
        parameters = jax.tree_util.tree_map(lambda p: jax.device_put(p, self.replicated),
                                            parameter_leaves)
        return (self.const_values, placed, parameters), size, padding, one_sample

    def __call__(self, *args: Any) -> Any:
        kernel = self.kernel
        placed, size, padding, one_sample = self._place(args)
        if kernel.runs_fused:
            result = self._evaluate(*placed)
        else:
            result = self._assemble(self._compute(*placed))
        if one_sample:
            return self.program.map_batched(lambda leaf: leaf[0], result)
        if padding:
            return self.program.map_batched(lambda leaf: leaf[:size], result)
        return result

    def local(self, result: Any) -> Any:
        """This process's part of a (global) result, as numpy arrays in the result's structure.

        The addressable shards are put back in the order of their position along the batch
        axis; with one process this is simply the whole result.
        """
        def part(leaf: jax.Array) -> np.ndarray:
            shards = {}
            for piece in leaf.addressable_shards:
                start = (piece.index[0].start or 0) if piece.index else 0
                shards.setdefault(start, piece.data)
            return np.concatenate([np.asarray(shards[k]) for k in sorted(shards)], axis=0)

        return jax.tree_util.tree_unflatten(
            self.program.equations.treedef,
            [part(leaf) if batched else np.asarray(leaf.addressable_shards[0].data)
             for leaf, batched in self.program.batched_leaves(result)])


def _pad_leading(array: Any, padding: int) -> Any:
    """Append `padding` copies of the last sample (zeros for an empty batch) along axis 0.

    Copies of a real sample, not zeros, so that the padding cannot produce a NaN or an
    infinity (e.g. 1/x at 0) that a NaN checker would report for samples nobody asked for.
    """
    xp = np if isinstance(array, np.ndarray) else jax.numpy
    if array.shape[0] == 0:
        filler = xp.zeros((padding,) + tuple(array.shape[1:]), array.dtype)
    else:
        filler = xp.repeat(array[-1:], padding, axis=0)
    return xp.concatenate([array, filler], axis=0)


def shard(kernel: Kernel, mesh: Mesh | None = None) -> ShardedKernel:
    """Split `kernel`'s batch over the devices of `mesh` (by default all of JAX's devices).

    >>> import sympy as sp, symkern as sk
    >>> x0 = sp.Symbol("x0")
    >>> sharded = shard(sk.build_function(x0 + 1, [x0]))
    >>> sharded(np.zeros((3, 1))).tolist()
    [1.0, 1.0, 1.0]
    """
    return ShardedKernel(kernel, mesh)
