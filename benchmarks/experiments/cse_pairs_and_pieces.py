"""CSE pair sharing, and pieces against one executable, measured in one process.

Usage: python benchmarks/experiments/cse_pairs_and_pieces.py [workload ...]

For each workload, one process builds symkern variants and the JAX anchors, then calls them
in turn for 15 rounds at batch 100,000 (float32; medians, M samples/s):
- ``pairs``: CSE merges common sub-sums and sub-products at any size (linearize's pair
  sharing);
- ``no-pairs``: never merges them;
- ``default``: the build_function defaults;
- ``one-executable``: ``split=False, vectorize=False``;
- ``lambdify-jax`` and ``sympy2jax`` as ``compare.py`` uses them.
The time to the first result at batch 1,024 is printed beside each (one build each, so
read it loosely). Every symkern variant is checked against the first one.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import compare  # noqa: E402
import workloads  # noqa: E402

import symkern as sk  # noqa: E402
import symkern.codegen.emit as emit  # noqa: E402

BATCH, ROUNDS = 100_000, 15
DEFAULT = ["pendulum", "nlink-3", "expr-1e3", "net-4-16-16-4", "jac-2-3-2", "net-8-32-32-8",
           "jac-4-16-16-4"]


def symkern_variant(wl, share_above: int | None, **options):
    saved = emit.SHARE_PAIRS_ABOVE_OPERATIONS
    if share_above is not None:
        emit.SHARE_PAIRS_ABOVE_OPERATIONS = share_above
    try:
        return sk.build_function(wl.eqs, wl.inputs, params=wl.params, **options)
    finally:
        emit.SHARE_PAIRS_ABOVE_OPERATIONS = saved


def run(name: str) -> None:
    wl = workloads.build(name)
    first = jax.device_put(wl.sample(1024, seed=0).astype(np.float32))
    big = jax.device_put(wl.sample(BATCH, seed=1).astype(np.float32))
    ps = jax.tree_util.tree_map(lambda v: jax.device_put(np.float32(v)), wl.param_values)
    calls, built = {}, {}
    variants = {"pairs": (0, {"vectorize": False}), "no-pairs": (10**9, {"vectorize": False}),
                "default": (None, {}), "one-executable": (None, {"split": False, "vectorize": False})}
    for label, (share_above, options) in variants.items():
        t0 = time.perf_counter()
        kernel = symkern_variant(wl, share_above, **options)
        jax.block_until_ready(kernel(first, ps))
        built[label] = time.perf_counter() - t0
        calls[label] = (lambda kernel=kernel: jax.block_until_ready(kernel(big, ps)))
    reference = jax.tree_util.tree_leaves(calls["pairs"]())
    for label in variants:
        for got, want in zip(jax.tree_util.tree_leaves(calls[label]()), reference, strict=True):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-3, atol=2e-4)
    for tool_name in ("lambdify-jax", "sympy2jax"):
        tool = compare.ADAPTERS[tool_name](wl)
        t0 = time.perf_counter()
        tool.build()
        tool_ps = tool.params(wl.param_values)
        jax.block_until_ready(tool.call(first, tool_ps))
        built[tool_name] = time.perf_counter() - t0
        calls[tool_name] = (lambda tool=tool, tool_ps=tool_ps:
                            jax.block_until_ready(tool.call(big, tool_ps)))
    for call in calls.values():
        call()
    times = compare.round_robin(calls, ROUNDS)
    labels = list(calls)
    row = " | ".join(f"{BATCH / statistics.median(times[label]) / 1e6:.3g} ({built[label]:.2g} s)"
                     for label in labels)
    print(f"| {name} | {row} |", flush=True)


def main() -> None:
    names = sys.argv[1:] or DEFAULT
    print(f"batch {BATCH:,}, float32, median of {ROUNDS} interleaved rounds: M samples/s "
          "(first result at batch 1,024)")
    print("| workload | pairs | no-pairs | default | one-executable | lambdify-jax | sympy2jax |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        run(name)


if __name__ == "__main__":
    main()
