"""codegen, stage 3 helper: the operations a vectorized kernel body calls (`vec.*`).

Imports jax. A vectorized body (symkern.codegen.vectorize) keeps every computed value as a
row of one store `R` of shape `(rows, *batch)` (batch last) and the kernel's scalars (its
parameters, constants and parameter-only values) in one vector `S`; each group of
statements sharing a template is one gather plus one elementwise expression over all its
members. Index arrays are const args of the kernel, never embedded in the program.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

#: samples evaluated together: the store of a chunk stays in cache and a group's
#: gathered operands are never materialized for the whole batch
CHUNK = 1024
#: instances per step of a wide reduction's loop
UNROLL = 4


def store(rows: Sequence[Any], dtype: Any) -> Any:
    """Rows 0 (zeros) and 1 (ones), then `rows` broadcast to one batch shape: `(n + 2, *batch)`."""
    values = jnp.broadcast_arrays(*[jnp.asarray(row, dtype) for row in rows])
    zero = jnp.zeros_like(values[0])
    return jnp.stack([zero, zero + 1, *values])


def scalars(values: Sequence[Any], arrays: Sequence[tuple[Any, tuple[int, ...]]],
            dtype: Any, numbers: Any = None, places: Sequence[int] = ()) -> Any:
    """Entries 0 (zero) and 1 (one), then `values`, then each (array, shape) raveled: the
    kernel's scalars as one vector. With `numbers` (the scalars that are numbers, one
    array), `values` are the others, at positions `places` of `numbers`."""
    pads = [jnp.zeros((), dtype), jnp.ones((), dtype)]
    if numbers is not None:
        body = jnp.asarray(numbers, dtype)
        if places:
            body = body.at[np.asarray(places)].set(
                jnp.stack([jnp.asarray(value, dtype).reshape(()) for value in values]))
        head = jnp.concatenate([jnp.stack(pads), body])
    else:
        head = jnp.stack([*pads, *[jnp.asarray(value, dtype).reshape(()) for value in values]])
    return jnp.concatenate([head, *[jnp.asarray(array, dtype).reshape(shape).ravel()
                                    for array, shape in arrays]])


def take_scalars(S: Any, index: Any, R: Any) -> Any:  # noqa: N803 - the store is R throughout
    """Scalars shaped to broadcast against the rows `R[index]`."""
    return S[index].reshape(index.shape + (1,) * (R.ndim - 1))


def _masked(value: Any, mask: Any, identity: float) -> Any:
    """`value` where `mask` (its leading axes) holds, `identity` at the pads."""
    return jnp.where(mask.reshape(mask.shape + (1,) * (value.ndim - mask.ndim)), value, identity)


def masked_sum(value: Any, mask: Any) -> Any:
    """Sum over the last index axis (`mask.ndim - 1`) of the present instances only."""
    return jnp.sum(_masked(value, mask, 0), axis=mask.ndim - 1)


def prod(value: Any, axis: int) -> Any:
    """The product over `axis` (of a few instances, at most SCAN_ABOVE) as a chain of
    multiplies. `jnp.prod`'s derivative reads the array's shape, which an exported
    kernel's symbolic batch does not have; a multiply's does not."""
    parts = jnp.moveaxis(value, axis, 0)
    out = parts[0]
    for k in range(1, parts.shape[0]):
        out = out * parts[k]
    return out


def masked_prod(value: Any, mask: Any) -> Any:
    """Product over the last index axis of the present instances only."""
    return prod(_masked(value, mask, 1), mask.ndim - 1)


def scan_reduce(kind: str, term: Callable[..., Any], tables: Sequence[Any], axis: int,
                mask: Any = None) -> Any:
    """`kind` ("sum" or "prod") over axis `axis` of `tables` of `term(*tables sliced there)`.

    One loop iteration per instance, UNROLL of them a step: each gathers one `(members,
    chunk)` block and adds it to the accumulator. XLA's fused gather-and-reduce over a wide
    axis ran 5-25x slower (docs/design/vectorize.md).
    """
    moved = [jnp.moveaxis(table, axis, 0) for table in tables]
    present = None if mask is None else jnp.moveaxis(mask, axis, 0)
    identity = 0 if kind == "sum" else 1
    combine = jnp.add if kind == "sum" else jnp.multiply

    def value(k: Any) -> Any:
        out = term(*[table[k] for table in moved])
        return out if present is None else _masked(out, present[k], identity)

    first = value(0)
    # four instances a step: 1.5-2x faster than one on this body (docs/design/vectorize.md)
    return lax.fori_loop(1, moved[0].shape[0], lambda k, acc: combine(acc, value(k)), first,
                         unroll=UNROLL)


def chunked(levels: Callable[[Any], Any], R: Any, chunk: int | None = None) -> Any:  # noqa: N803
    """`levels(R)` evaluated `chunk` (default CHUNK) samples at a time (`lax.map`);
    `(outputs, *batch)`.

    A batch of at most `chunk` samples (and a single sample) is one call, and so is a
    symbolic batch (an exported kernel). Larger batches are flattened, padded with their
    last sample to a multiple of `chunk` and cut.
    """
    chunk = CHUNK if chunk is None else chunk
    batch = R.shape[1:]
    if not all(isinstance(n, int) for n in batch):
        return levels(R)  # a symbolic batch (kernel.export): one call, unchunked
    size = math.prod(batch)
    if size <= chunk:
        return levels(R)
    flat = R.reshape(R.shape[0], size)
    count = -(-size // chunk)
    if count * chunk != size:
        flat = jnp.pad(flat, ((0, 0), (0, count * chunk - size)), mode="edge")
    pieces = flat.reshape(R.shape[0], count, chunk).transpose(1, 0, 2)
    out = lax.map(levels, pieces)  # (count, outputs, chunk)
    out = out.transpose(1, 0, 2).reshape(out.shape[1], count * chunk)[:, :size]
    return out.reshape((out.shape[0], *batch))

