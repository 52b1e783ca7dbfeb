"""Shared costly values computed once, and mid-size bodies compiled whole, measured in one process.

Usage: python benchmarks/experiments/shared_values_and_whole_bodies.py [--batch 100000] [--rounds 7]
                                                   [--workloads pendulum,nlink-3,...]

Two questions, each answered with build_function's variants timed round-robin at the batch
(median of `--rounds` rounds after a warm-up, M samples/s; the form says how the kernel
assembles its entries: one executable, "fused", or two, "separate") beside the time to a first result
at batch 1,024:

* ``materialize``: costly values that several entries share computed once inside
  ``lax.cond`` (symkern.codegen.materialize) against the same kernel without the rule
  (``BuildOptions(materialize=False)``), with the sine/cosine/tanh count of the compiled
  entries program (XLA repeats a shared producer in every consumer fusion);
* ``whole`` (mid-size bodies): the defaults (one executable up to 5,000 operations) against
  pieces (the limit lowered to 2,000 operations) and the vectorized body.
"""

from __future__ import annotations

import argparse
import re
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
from compare import round_robin  # noqa: E402

import symkern as sk  # noqa: E402
from symkern.codegen import emit, passes  # noqa: E402

MATERIALIZE = ["pendulum", "net-2-3-2", "jac-2-3-2", "net-4-16-16-4", "nlink-3", "expr-1e3"]
WHOLE = ["net-8-32-32-8", "jac-4-16-16-4"]


def _built(wl, X1024, ps, settings: dict, **options):
    saved = {(m, k): getattr(m, k) for m, k in settings}
    for (module, name), value in settings.items():
        setattr(module, name, value)
    try:
        start = time.perf_counter()
        kernel = sk.build_function(wl.eqs, wl.inputs, params=wl.params, **options)
        jax.block_until_ready(kernel(X1024, ps))
        return kernel, time.perf_counter() - start
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


def _transcendentals(kernel, X, ps) -> int | None:
    """sin/cos/tanh in the compiled entries program (the one that runs separately from the
    assembly; with the assembly inside, XLA makes one fusion of everything)."""
    if kernel._pieces is not None:
        return None
    text = jax.jit(kernel.program.entries).lower(*kernel.prepare((X, ps))).compile().as_text()
    return len(re.findall(r"\b(sine|cosine|tanh)\(", text))


def measure(name: str, variants: dict, batch: int, rounds: int) -> None:
    wl = workloads.build(name)
    X = jax.device_put(wl.sample(batch).astype(np.float32))
    ps = jax.tree_util.tree_map(lambda v: jax.device_put(np.asarray(v, np.float32)),
                                wl.param_values)
    built = {label: _built(wl, X[:1024], ps, settings, **options)
             for label, (settings, options) in variants.items()}
    for kernel, _ in built.values():
        jax.block_until_ready(kernel(X, ps))
        jax.block_until_ready(kernel(X, ps))
    times = round_robin({label: lambda kernel=kernel: jax.block_until_ready(kernel(X, ps))
                         for label, (kernel, _) in built.items()}, rounds)
    reference = jax.tree_util.tree_leaves(next(iter(built.values()))[0](X, ps))
    for label, (kernel, first) in built.items():
        rate = batch / statistics.median(times[label]) / 1e6
        leaves = jax.tree_util.tree_leaves(kernel(X, ps))
        diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                   for a, b in zip(leaves, reference, strict=True))
        form = f"{kernel.form}, {kernel.assembly}"
        print(f"| {name} | {label} | {form} | {first:.2f} | {rate:.2f} | "
              f"{_transcendentals(kernel, X[:1024], ps)} | {diff:.1e} |", flush=True)


def print_header(batch: int, rounds: int) -> None:
    """The versions, the profile and the head of the table `measure` prints rows of."""
    print(f"jax {jax.__version__}, batch {batch:,}, float32, median of {rounds} "
          "interleaved rounds")
    print("| workload | variant | form | first result at 1,024 (s) | M samples/s | "
          "sin/cos/tanh in the entries program | max abs diff to the first variant |")
    print("|---|---|---|---:|---:|---:|---:|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=41)  # 7 rounds flipped 1.1x effects
    parser.add_argument("--workloads", default=",".join(MATERIALIZE + WHOLE))
    args = parser.parse_args()
    print_header(args.batch, args.rounds)
    for name in args.workloads.split(","):
        if name in WHOLE:
            variants = {
                "default": ({}, {}),
                "pieces (2,000-op limit)": ({(passes, "SPLIT_ABOVE_OPERATIONS"): 2000,
                                             (emit, "SHARE_PAIRS_ABOVE_OPERATIONS"): 2000}, {}),
                "vectorize=True": ({}, {"vectorize": True}),
            }
        else:
            variants = {"materialize (default)": ({}, {}),
                        "without": ({}, {"options": sk.BuildOptions(materialize=False)})}
        measure(name, variants, args.batch, args.rounds)


if __name__ == "__main__":
    main()
