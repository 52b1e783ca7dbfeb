"""batching, stage 4: batch-size buckets, so that a sweep of batch sizes compiles a bounded
number of times. Imports numpy only.

A kernel compiles the first `EXACT_SHAPES` batch shapes it is called with exactly (a
training loop, an evaluation set and a single sample pay no padding), and every batch shape
it has compiled stays exact. Any other batch is flattened to `n` samples and padded up to
`bucket_size(n)`:
sizes up to 16 are their own bucket; above, the bucket is the smallest `m · 2^e ≥ n` with
`8 ≤ m ≤ 16`, so padding costs less than 12.5 % and each octave of sizes holds 8 buckets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: batch sizes up to this are their own bucket
EXACT_UP_TO = 16
#: the number of distinct batch shapes a kernel compiles exactly before it pads to buckets
EXACT_SHAPES = 4


def bucket_size(n: int) -> int:
    """The padded batch size for `n` samples.

    >>> [bucket_size(n) for n in (1, 16, 17, 1000, 1001, 1025, 100_000)]
    [1, 16, 18, 1024, 1024, 1152, 106496]
    """
    if n <= EXACT_UP_TO:
        return n
    shift = n.bit_length() - 4
    multiple = -(-n // (1 << shift))
    return multiple << shift


def pad_batch(arrays: Sequence[object], sample_ranks: Sequence[int], n: int, size: int) -> tuple:
    """Flatten each array's batch to `n` rows and pad to `size` by repeating the last sample.

    Repeating a real sample (rather than zeros) keeps the padding rows inside every
    function's domain, so they cannot raise floating-point warnings or NaN checks.
    """
    padded = []
    for array, rank in zip(arrays, sample_ranks, strict=True):
        host = np.asarray(array)
        flat = host.reshape((n,) + host.shape[host.ndim - rank:])
        padded.append(np.concatenate([flat, np.repeat(flat[-1:], size - n, axis=0)])
                      if size > n else flat)
    return tuple(padded)
