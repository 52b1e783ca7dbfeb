"""The assembly executable alone: k materialized entries → one (n, k) array, per stacking.

Usage: python benchmarks/experiments/assembly_stacking.py [k ...] [--batch N]

One process, every variant called in turn for 41 rounds (medians, ms):
- ``stack-last``: ``jnp.stack(entries, axis=-1)`` (a concatenate along the minor axis);
- ``stack-first-moved``: ``jnp.moveaxis(jnp.stack(entries), 0, -1)`` (XLA: a transpose);
- ``copy``: the same entries copied as they are (the bytes moved, no interleaving).
``Kernel._assemble_entries`` picks by the entry count (TRANSPOSED_ASSEMBLY_UP_TO).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np


def measure(k: int, n: int, rounds: int = 41) -> dict[str, float]:
    entries = tuple(jax.device_put(np.random.default_rng(i).random(n, np.float32))
                    for i in range(k))
    variants = {
        "stack-last": jax.jit(lambda es: jnp.stack(es, axis=-1)),
        "stack-first-moved": jax.jit(lambda es: jnp.moveaxis(jnp.stack(es), 0, -1)),
        "copy": jax.jit(lambda es: tuple(e + 0 for e in es)),
    }
    want = np.stack([np.asarray(e) for e in entries], axis=-1)
    for name, f in variants.items():
        if name != "copy":
            np.testing.assert_array_equal(np.asarray(f(entries)), want)
        jax.block_until_ready(f(entries))
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, f in variants.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(entries))
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("k", nargs="*", type=int, default=[2, 4, 8, 10, 16, 64])
    parser.add_argument("--batch", type=int, default=100_000)
    args = parser.parse_args()
    print(f"batch {args.batch:,}, float32, median ms of 41 interleaved rounds")
    print("| entries | stack-last | stack-first-moved | copy |")
    print("|---:|---:|---:|---:|")
    for k in args.k:
        row = measure(k, args.batch)
        print(f"| {k} | {row['stack-last']:.3f} | {row['stack-first-moved']:.3f} | {row['copy']:.3f} |",
              flush=True)


if __name__ == "__main__":
    main()
