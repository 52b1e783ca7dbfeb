"""Structured networks run whole against a chunk of samples at a time, measured in one process.

Usage: python benchmarks/experiments/structured_tiles.py [--batch 100000] [--rounds 21]
                                                   [--workloads net-4-16-16-4,...]
                                                   [--chunks none,512,1024,4096]

Networks through ``build_nn_function`` (the structured array program) with the batch run
whole against run ``kernel.tile_chunk`` samples at a time (``lax.map``), beside the
scalarized equations through ``build_function`` and the anchors sympy2jax and hand-written
jax (``compare.py``'s adapters), timed round-robin at the batch: median M samples/s, first
result at 1,024 samples, and the largest per-sample intermediate that decides the default.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

import workloads  # noqa: E402
from compare import ADAPTERS, round_robin  # noqa: E402

import symkern as sk  # noqa: E402

NETWORKS = ["net-4-16-16-4", "net-8-32-32-8", "jac-4-16-16-4", "jac-8-32-32-8"]


def _nn(wl, chunk):
    """A structured kernel of the workload's network with `tile_chunk` = `chunk` ("default":
    the kernel's own choice)."""
    snn = sk.SymbolicNetwork(wl.make_net())
    eqs = sk.jacobian(snn.output, snn.input) if wl.jacobian else snn.output
    kernel = sk.build_nn_function(eqs, snn)
    if chunk != "default":
        kernel.tile_chunk = chunk
    return kernel


def measure(name: str, chunks: list, batch: int, rounds: int,
            tools: list[str]) -> None:
    wl = workloads.build(name)
    X = wl.sample(batch)
    X32 = jax.device_put(X.astype(np.float32))
    ps = jax.tree_util.tree_map(lambda v: jax.device_put(np.asarray(v, np.float32)),
                                wl.param_values)
    calls, notes = {}, {}
    for chunk in chunks:
        start = time.perf_counter()
        kernel = _nn(wl, chunk)
        jax.block_until_ready(kernel(X32[:1024], ps))
        label = (f"symkern-nn, default ({kernel.tile_chunk})" if chunk == "default"
                 else f"symkern-nn, tile_chunk={chunk}")
        calls[label] = lambda kernel=kernel: jax.block_until_ready(kernel(X32, ps))
        notes[label] = (time.perf_counter() - start, kernel.largest_intermediate())
    for tool in tools:
        adapter = ADAPTERS[tool](wl)
        start = time.perf_counter()
        adapter.build()
        data, tree = adapter.prepare(X[:1024]), adapter.params(wl.param_values)
        jax.block_until_ready(adapter.call(data, tree))
        notes[tool] = (time.perf_counter() - start, None)
        data = adapter.prepare(X)
        calls[tool] = lambda adapter=adapter, data=data, tree=tree: jax.block_until_ready(
            adapter.call(data, tree))
    for call in calls.values():
        call()
    times = round_robin(calls, rounds)
    labels = list(calls)
    reference = np.asarray(jax.tree_util.tree_leaves(calls[labels[0]]())[0])
    anchors = [t for t in ("sympy2jax", "jax-hand") if t in times]
    best = max((batch / statistics.median(times[t]) for t in anchors), default=float("nan"))
    for label in labels:
        rate = batch / statistics.median(times[label])
        first, largest = notes[label]
        if label.startswith("symkern-nn"):
            out = np.asarray(jax.tree_util.tree_leaves(calls[label]())[0])
            diff = f"{float(np.max(np.abs(out - reference))):.1e}"
        else:
            diff = "–"
        print(f"| {name} | {label} | {largest if largest is not None else '–'} | {first:.2f} | "
              f"{rate / 1e6:.2f} | {rate / best:.2f} | {diff} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--workloads", default=",".join(NETWORKS))
    parser.add_argument("--chunks", default="none,1024,4096,16384,default",
                        help="tile_chunk values: none (whole batch), sizes, default")
    parser.add_argument("--tools", default="symkern,sympy2jax,jax-hand",
                        help="the other rows (compare.py's adapters); empty for none")
    args = parser.parse_args()
    chunks = [None if c == "none" else c if c == "default" else int(c)
              for c in args.chunks.split(",")]
    print(f"jax {jax.__version__}, batch {args.batch:,}, float32, median of {args.rounds} "
          "interleaved rounds")
    print("| workload | variant | largest per-sample intermediate | first result at 1,024 (s) | "
          "M samples/s | / best anchor (sympy2jax, jax-hand) | max abs diff to the first |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in args.workloads.split(","):
        measure(name, chunks, args.batch, args.rounds, [t for t in args.tools.split(",") if t])


if __name__ == "__main__":
    main()
