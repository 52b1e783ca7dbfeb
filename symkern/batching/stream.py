"""batching, stage 4: evaluate a batch too large for memory in fixed-size, double-buffered chunks.

Imports jax, numpy, tqdm, symkern.kernels, symkern.codegen, symkern.symbolic, symkern.errors
and symkern.batching.kernel.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from symkern.batching.kernel import BoundKernel, Kernel
from symkern.errors import ArgumentError

Block = tuple[tuple[np.ndarray, ...], int]  # (arrays of exactly `chunk` rows, rows that are real)


# ---- giving back the pages of memory-mapped files ------------------------------------------
# A memory-mapped file's pages count in the process's resident set once touched, and stay
# there until the OS needs the memory: streaming a 1 GiB .npy would show 1 GiB of RSS though
# none of it is needed any more. Dropping the pages of finished rows from this process's page
# table (MADV_DONTNEED) keeps the resident set at a few chunks. It is only done on Linux and
# only for shared mappings (numpy modes "r", "r+", "w+"), where the data lives in the file and
# the page cache: a read re-faults it from there, and a dirty page is still written back.
# It would discard data in a private ("c", copy-on-write) mapping, which is never released.
_SHARED_MODES = frozenset({"r", "r+", "w+"})
_PAGE = mmap.PAGESIZE
_madvise = None
if sys.platform.startswith("linux") and hasattr(mmap, "MADV_DONTNEED"):
    try:
        _libc = ctypes.CDLL(None, use_errno=True)
        _madvise = _libc.madvise
        _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _madvise.restype = ctypes.c_int
    except (OSError, AttributeError):  # no libc symbol: releasing is an optimisation only
        _madvise = None


def _release(array: Any, start: int, stop: int) -> None:
    """Drop rows [start, stop) of a file-backed, shared np.memmap from the resident set."""
    if (_madvise is None or not isinstance(array, np.memmap)
            or getattr(array, "mode", None) not in _SHARED_MODES
            or not array.flags.c_contiguous or array.ndim == 0 or stop <= start):
        return
    row = array.strides[0]
    begin = array.ctypes.data + start * row
    end = array.ctypes.data + stop * row
    # Inward to whole pages: a page shared with rows not yet read or written stays.
    begin = -(-begin // _PAGE) * _PAGE
    end = end // _PAGE * _PAGE
    if end > begin:
        _madvise(begin, end - begin, mmap.MADV_DONTNEED)


# ---- the source, as blocks of exactly `chunk` rows ---------------------------------------------
def _host_block(arrays: tuple[Any, ...], rows: int, chunk: int, dtype: np.dtype) -> Block:
    """Copy `rows` rows into fresh arrays of the kernel's dtype, padded to `chunk` rows.

    A copy, not a view: the block must not pin the source's pages, and a fresh C-contiguous
    buffer is what the host-to-device copy reads fastest. The padding repeats the last real
    sample (never zeros, which could make a NaN that a NaN checker would report).
    """
    block = []
    for a in arrays:
        out = np.empty((chunk,) + tuple(a.shape[1:]), dtype)
        out[:rows] = a[:rows]
        if rows < chunk:
            out[rows:] = out[rows - 1] if rows else 0
        block.append(out)
    return tuple(block), rows


def _array_blocks(arrays: tuple[Any, ...], chunk: int, dtype: np.dtype) -> Iterator[Block]:
    size = int(arrays[0].shape[0])
    for start in range(0, size, chunk):
        stop = min(start + chunk, size)
        block = _host_block(tuple(a[start:stop] for a in arrays), stop - start, chunk, dtype)
        for a in arrays:
            _release(a, start, stop)
        yield block


def _rechunk(pieces: Iterable[tuple[Any, ...]], chunk: int, dtype: np.dtype) -> Iterator[Block]:
    """Pieces of any sizes → blocks of exactly `chunk` rows, so that one executable serves all."""
    buffer: list[tuple[Any, ...]] = []
    buffered = 0
    for piece in pieces:
        rows, offset = int(np.shape(piece[0])[0]), 0
        while offset < rows:
            take = min(chunk - buffered, rows - offset)
            buffer.append(tuple(a[offset:offset + take] for a in piece))
            buffered += take
            offset += take
            if buffered == chunk:
                yield _host_block(_join(buffer), chunk, chunk, dtype)
                buffer, buffered = [], 0
    if buffered:
        yield _host_block(_join(buffer), buffered, chunk, dtype)


def _join(buffer: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    if len(buffer) == 1:
        return buffer[0]
    return tuple(np.concatenate([np.asarray(p[i]) for p in buffer], axis=0)
                 for i in range(len(buffer[0])))


def _check_array(value: Any, label: str, spec: Any, kinds: str = "biuf") -> Any:
    """`value` if it is an array of rows of `spec`'s per-sample shape (as given: before the
    rows are blocked and padded, so an error shows the caller's shape) whose dtype is of
    `kinds` (complex too for a complex kernel: `_kinds`)."""
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise ArgumentError(f"{label}: expected an array, got {type(value).__name__}")
    if np.dtype(value.dtype).kind not in kinds:
        raise ArgumentError(f"{label}: expected real numbers, got dtype {np.dtype(value.dtype).name}")
    if np.ndim(value) == 0:
        raise ArgumentError(f"{label}: expected a leading (batch) axis to stream over, got a scalar")
    if tuple(value.shape[1:]) not in (spec.shape, spec.declared_shape):
        expected = ", ".join(["rows", *map(str, spec.shape)])
        raise ArgumentError(f"{label}: expected shape ({expected}), got {tuple(value.shape)}")
    return value


def _kinds(dtype: np.dtype) -> str:
    """The dtype kinds a kernel of `dtype` streams: real numbers, and complex ones into a
    complex kernel (a complex value copied into a real block would lose its imaginary part)."""
    return "biufc" if np.dtype(dtype).kind == "c" else "biuf"


def _pieces(source: Iterable[Any], specs: list[Any], kinds: str) -> Iterator[tuple[Any, ...]]:
    labels = [spec.label for spec in specs]
    for index, item in enumerate(source):
        piece = tuple(item) if isinstance(item, (tuple, list)) else (item,)
        if len(piece) != len(labels):
            raise ArgumentError(f"source[{index}]: expected {len(labels)} data array(s) "
                                f"({', '.join(labels)}), got {len(piece)}")
        piece = tuple(_check_array(a, f"source[{index}] {spec.label}", spec, kinds)
                      for a, spec in zip(piece, specs, strict=True))
        if len({int(np.shape(a)[0]) for a in piece}) > 1:
            raise ArgumentError(f"source[{index}]: the data arrays differ in length "
                                f"{[int(np.shape(a)[0]) for a in piece]}")
        yield piece


def _blocks(source: Any, specs: list[Any], chunk: int,
            dtype: np.dtype) -> tuple[Iterator[Block], int | None]:
    """The source as blocks, and its number of rows where known in advance; `specs`: the
    kernel's data arguments."""
    labels = [spec.label for spec in specs]
    is_array = isinstance(source, (np.ndarray, jax.Array))
    arrays_per_argument = (isinstance(source, tuple) and len(labels) > 1 and len(source) == len(labels)
                           and all(isinstance(a, (np.ndarray, jax.Array)) for a in source))
    if is_array or arrays_per_argument:
        arrays = (source,) if is_array else tuple(source)
        if len(arrays) != len(labels):
            raise ArgumentError(f"source: the kernel takes {len(labels)} data arguments "
                                f"({', '.join(labels)}); pass a tuple of that many arrays")
        arrays = tuple(_check_array(a, f"source {spec.label}", spec, _kinds(dtype))
                       for a, spec in zip(arrays, specs, strict=True))
        lengths = {int(a.shape[0]) for a in arrays}
        if len(lengths) > 1:
            raise ArgumentError(f"source: the data arrays differ in length {sorted(lengths)}")
        return _array_blocks(arrays, chunk, dtype), lengths.pop()
    if isinstance(source, (str, bytes)) or not isinstance(source, Iterable):
        raise ArgumentError("source: expected a numpy array, a memory-mapped .npy, or an iterable "
                            f"of chunks, got {type(source).__name__}")
    return _rechunk(_pieces(source, specs, _kinds(dtype)), chunk, dtype), None


# ---- the pipeline ---------------------------------------------------------------------------------
def _results(call: Any, blocks: Iterator[Block], bar: Any,
             program: Any) -> Iterator[tuple[int, int, Any]]:
    """(start row, rows, result as numpy) per block, with the next block's transfer overlapping;
    an unbatched equation's value (`program.unbatched`) as it is in every block.

    JAX dispatch is asynchronous: the call on block k returns at once, block k+1 is read from
    the source and its host-to-device copy issued, and only then do we wait for block k.
    """
    def place(block: Block | None) -> tuple[tuple[jax.Array, ...], int] | None:
        return None if block is None else (tuple(jax.device_put(a) for a in block[0]), block[1])

    start = 0
    pending = place(next(blocks, None))
    while pending is not None:
        device_block, rows = pending
        result = call(device_block)                    # dispatched, not finished
        pending = place(next(blocks, None))            # read and send block k+1 meanwhile
        host = program.map_batched(lambda leaf, n=rows: np.asarray(leaf)[:n],  # waits
                                   jax.tree_util.tree_map(np.asarray, result))
        bar.update(rows)
        yield start, rows, host
        start += rows


def _check_out(out: Any, kernel: Kernel, total: int | None) -> list[Any]:
    equations = kernel.equations
    try:
        leaves = equations.treedef.flatten_up_to(out)
    except (ValueError, TypeError) as error:
        raise ArgumentError(f"out: expected arrays in the equations' structure {equations.treedef}, "
                            f"got {jax.tree_util.tree_structure(out)}") from error
    for index, (leaf, shape, unbatched) in enumerate(zip(leaves, equations.shapes,
                                                         kernel.program.unbatched, strict=True)):
        label = "out" if len(leaves) == 1 else f"out leaf {index}"
        if not hasattr(leaf, "shape") or not hasattr(leaf, "__setitem__") or isinstance(leaf, jax.Array):
            raise ArgumentError(f"{label}: expected a writable numpy array or memmap, "
                                f"got {type(leaf).__name__}")
        leaf_shape = tuple(leaf.shape)
        if unbatched:  # constant_outputs="unbatched": the equation's value, once
            if leaf_shape != tuple(shape):
                raise ArgumentError(f"{label}: expected shape {tuple(shape)} for an unbatched "
                                    f"equation (constant_outputs='unbatched'), got {leaf_shape}")
            continue
        if len(leaf_shape) < 1 + len(shape) or leaf_shape[len(leaf_shape) - len(shape):] != tuple(shape):
            raise ArgumentError(f"{label}: expected shape (rows, ..., {', '.join(map(str, shape))}) "
                                f"for an equation of shape {tuple(shape)}, got {leaf_shape}"
                                if shape else f"{label}: expected shape (rows, ...), got {leaf_shape}")
        if total is not None and leaf_shape[0] != total:
            raise ArgumentError(f"{label}: expected {total} rows like the source, got {leaf_shape[0]}")
    return leaves


def stream(
    kernel: Kernel | BoundKernel,
    source: Any,
    ps: Any = None,
    chunk: int = 65536,
    out: Any = None,
    progress: bool = True,
) -> Any:
    """Evaluate `kernel` over a batch streamed from `source` in chunks of `chunk` rows.

    `source` is a numpy array (a memory-mapped `.npy` from `np.load(path, mmap_mode="r")`
    too), a tuple of arrays for a kernel with several data arguments, or an iterable of
    chunks — each a tuple of data arrays, or one array for one data argument — of any sizes.
    The leading axis is the one streamed. Memory stays bounded by a few chunks: rows are
    copied into fixed `chunk`-row blocks (the last one padded, so one executable serves
    every block), block k+1 is sent to the device while block k computes, and the pages of
    a memory-mapped source or `out` are given back once their rows are done.

    With `out` — a numpy array, a memmap (`np.lib.format.open_memmap`), or a pytree of them
    in the equations' structure — the results are written into it and `out` is returned.
    Without, a generator yields each chunk's result (numpy arrays, the equations'
    structure). A tqdm progress bar is shown when `progress` and stderr is a terminal.

    >>> import sympy as sp, symkern as sk
    >>> x0, x1 = sp.symbols("x0 x1")
    >>> k = sk.build_function(x0 * x1, [x0, x1])
    >>> X = np.arange(10.0).reshape(5, 2)
    >>> stream(k, X, chunk=2, out=np.zeros(5), progress=False).tolist()
    [0.0, 6.0, 20.0, 42.0, 72.0]
    >>> [r.tolist() for r in stream(k, [X[:3], X[3:]], chunk=4, progress=False)]
    [[0.0, 6.0, 20.0, 42.0], [72.0]]
    """
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ArgumentError(f"chunk: expected a positive number of rows, got {chunk!r}")
    chunk = int(chunk)
    base = kernel.kernel if isinstance(kernel, BoundKernel) else kernel
    signature = base.signature
    if not signature.data:
        raise ArgumentError("stream: the kernel has no data arguments, so nothing to stream")

    # Parameters: checked and sent to the device once, not with every chunk.
    if isinstance(kernel, BoundKernel) or not signature.has_parameters:
        if ps is not None:
            raise ArgumentError("ps: this kernel takes no parameters (bound or none), got a value")

        def call(data: tuple[jax.Array, ...]) -> Any:
            return kernel(*data)
    else:
        if base.packs_parameters:  # one buffer, which every chunk's call takes as it is
            placed = jax.device_put(base.pack_parameters(ps))
        else:
            leaves = tuple(jax.device_put(a) for a in base.check_parameters(ps))
            placed = jax.tree_util.tree_unflatten(signature.parameter_treedef, leaves)

        def call(data: tuple[jax.Array, ...]) -> Any:
            return kernel(*data, placed)

    blocks, total = _blocks(source, list(signature.data), chunk, base.dtype)
    out_leaves = None if out is None else _check_out(out, base, total)

    def run() -> Iterator[tuple[int, int, Any]]:
        bar = tqdm(total=total, unit="sample", unit_scale=True, desc="symkern",
                   disable=None if progress else True)  # None: shown only on a terminal
        try:
            yield from _results(call, blocks, bar, base.program)
        finally:
            bar.close()

    if out_leaves is None:
        return (result for _, _, result in run())
    for start, rows, result in run():
        for leaf, (value, batched) in zip(out_leaves, base.program.batched_leaves(result),
                                          strict=True):
            if not batched:
                leaf[...] = value
                continue
            if start + rows > leaf.shape[0]:
                raise ArgumentError(f"out: has {leaf.shape[0]} rows, the source gave more")
            leaf[start:start + rows] = value
            _release(leaf, start, start + rows)
    return out
