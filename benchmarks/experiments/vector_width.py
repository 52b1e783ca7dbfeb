"""XLA's CPU vector width for symkern's kernels, measured in one process.

Usage: python benchmarks/experiments/vector_width.py [--batch 100000] [--rounds 21]
                                                     [--workloads pendulum,...] [--widths 256,512]

For each workload, symkern's kernel is built once and its programs compiled again with
``compiler_options={"xla_cpu_prefer_vector_width": W}`` (``jax.jit(..., compiler_options=)``)
for each width W; ``kernel(X, ps)``'s two executables (entries, then assembly) are timed
round-robin at the batch, each width against the others. Prints median M samples/s, each
width's ratio to the first, and the largest difference between their results. XLA's
default on this jaxlib prefers 256-bit vectors; 512 is the width of AVX-512 registers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import jax
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

import workloads  # noqa: E402
from compare import ADAPTERS, round_robin  # noqa: E402

WORKLOADS = ["pendulum", "net-2-3-2", "net-4-16-16-4", "net-8-32-32-8", "jac-2-3-2",
             "jac-4-16-16-4", "nlink-3", "energy-2d", "expr-1e3", "expr-1e4"]


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])
    return ", ".join(f for f in ("avx2", "avx512f") if f in flags) or "neither avx2 nor avx512f"


def measure(name: str, widths: list[int], batch: int, rounds: int) -> None:
    wl = workloads.build(name)
    tool = ADAPTERS["symkern"](wl)
    tool.build()
    kernel = tool.kernel
    data, ps = tool.prepare(wl.sample(batch, seed=1)), tool.params(wl.param_values)
    prepared = kernel.prepare((data, ps))
    calls, results = {}, {}
    for width in widths:
        options = {"xla_cpu_prefer_vector_width": width}
        entries = jax.jit(kernel._compute, compiler_options=options)
        assemble = jax.jit(kernel._assemble_entries, compiler_options=options)

        def call(entries=entries, assemble=assemble):
            return jax.block_until_ready(assemble(entries(*prepared)))

        results[width] = np.asarray(jax.tree_util.tree_leaves(call())[0])
        calls[width] = call
    times = round_robin(calls, rounds)
    base = statistics.median(times[widths[0]])
    for width in widths:
        median = statistics.median(times[width])
        diff = float(np.max(np.abs(results[width] - results[widths[0]]))) if results[width].size else 0.0
        print(f"| {name} | {width} | {batch / median / 1e6:,.2f} | {base / median:.2f} | "
              f"{diff:.1e} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--widths", default="256,512")
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    print(f"jax {jax.__version__}, CPU flags: {_cpu_flags()}, batch {args.batch:,}, float32, "
          f"median of {args.rounds} interleaved rounds of kernel(X, ps)'s entries and assembly\n")
    print(f"| workload | vector width | M samples/s | / width {widths[0]} | max abs diff |")
    print("|---|---:|---:|---:|---:|")
    for name in args.workloads.split(","):
        measure(name, widths, args.batch, args.rounds)


if __name__ == "__main__":
    main()
