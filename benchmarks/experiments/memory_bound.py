"""The copy-bandwidth target on a memory-bound expression, measured in one process.

Usage: python benchmarks/experiments/memory_bound.py [--batches 100000,1000000,10000000]
                                                     [--rounds 31] [--workload energy-2d]

A workload with a dozen operations on 20 bytes a sample runs as fast as its bytes move.
Its tools (symkern and the JAX anchors, through ``compare.py``'s adapters) are timed
round-robin with two references moving the same bytes (the kernel's input and output,
float32): ``jnp.copy`` of a buffer that size, which XLA runs as a memory copy, and ``-b``
of it, the one elementwise pass XLA compiles for any kernel. Prints median samples/s and
each one's ratio to the copy, as ``compare.py``'s copy column reads it (samples/s of a
kernel that moved its bytes at copy bandwidth).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

import workloads  # noqa: E402
from compare import ADAPTERS, round_robin  # noqa: E402

TOOLS = ["symkern", "lambdify-jax", "sympy2jax"]


def _blocking(call):
    return lambda: jax.block_until_ready(call())


def measure(wl, batch: int, rounds: int, tools: list[str]) -> list[tuple[str, float]]:
    """Median samples/s of each tool and of the two references at `batch`."""
    X = wl.sample(batch, seed=1)
    calls = {}
    for name in tools:
        tool = ADAPTERS[name](wl)
        tool.build()
        data, ps = tool.prepare(X), tool.params(wl.param_values)
        jax.block_until_ready(tool.call(data, ps))
        calls[name] = _blocking(lambda tool=tool, data=data, ps=ps: tool.call(data, ps))
    values = batch * (len(wl.inputs) + len(wl.flat_entries()))  # what a kernel moves once
    buffer = jax.device_put(np.ones(values, np.float32))
    copy, negate = jax.jit(jnp.copy), jax.jit(jnp.negative)
    for reference in (copy, negate):
        jax.block_until_ready(reference(buffer))
    # a copy reads and writes the buffer: it moves twice a kernel's bytes, so a kernel
    # moving its bytes at copy bandwidth takes half the copy's time
    calls["jnp.copy (reference)"] = _blocking(lambda: copy(buffer))
    calls["-b, XLA elementwise (reference)"] = _blocking(lambda: negate(buffer))
    times = round_robin(calls, rounds)
    rates = {}
    for name, seconds in times.items():
        median = statistics.median(seconds)
        rates[name] = batch / (median / 2) if "(reference)" in name else batch / median
    return list(rates.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="100000,1000000,10000000")
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--workload", default="energy-2d")
    parser.add_argument("--tools", default=",".join(TOOLS))
    args = parser.parse_args()
    wl = workloads.build(args.workload)
    tools = [t for t in args.tools.split(",") if t]
    print(f"jax {jax.__version__}, {args.workload} ({wl.ops} operations, "
          f"{4 * (len(wl.inputs) + len(wl.flat_entries()))} bytes a sample), float32, "
          f"median of {args.rounds} interleaved rounds\n")
    print("| batch | tool | M samples/s | / copy bandwidth |")
    print("|---:|---|---:|---:|")
    for batch in (int(b) for b in args.batches.split(",")):
        rates = measure(wl, batch, args.rounds, tools)
        copy = dict(rates)["jnp.copy (reference)"]
        for name, rate in rates:
            print(f"| {batch:,} | {name} | {rate / 1e6:,.0f} | {rate / copy:.2f} |", flush=True)


if __name__ == "__main__":
    main()
