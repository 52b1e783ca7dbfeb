"""A scalar body above the pieces gate, compiled as pieces and as one executable.

Usage: python benchmarks/experiments/pieces_or_whole.py [--batch 100000] [--rounds 12]
                                                        [--workloads shape-products-1e4,...]
                                                        [--whole-first]

Each workload (benchmarks/workloads.py; the random shapes by default) is built twice in one
process, float32, `build_function(..., split=True)` and `split=False`, and each build is timed
to its first result at the batch. The two kernels are then called in alternation for
`--rounds` rounds, and the median call gives samples/s. `--whole-first` builds the single
executable first (a build can leave SymPy's caches warm for the next).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

import workloads  # noqa: E402


def measure(name: str, batch: int, rounds: int, whole_first: bool) -> dict:
    import jax
    import numpy as np

    import symkern as sk

    wl = workloads.build(name)
    X = jax.device_put(wl.sample(batch, seed=1).astype(np.float32))
    ps = jax.tree_util.tree_map(lambda v: jax.device_put(np.asarray(v, np.float32)),
                                wl.param_values)
    kernels, result = {}, {"workload": name}
    for split in ((False, True) if whole_first else (True, False)):
        start = time.perf_counter()
        kernel = sk.build_function(wl.eqs, wl.inputs, params=wl.params, dtype="float32",
                                   split=split)
        jax.block_until_ready(kernel(X, ps))
        label = "pieces" if split else "whole"
        result[f"{label}_first_result_s"] = round(time.perf_counter() - start, 2)
        result[f"{label}_form"] = kernel.form
        kernels[label] = kernel
    times: dict[str, list[float]] = {label: [] for label in kernels}
    for _ in range(rounds):
        for label, kernel in kernels.items():
            start = time.perf_counter()
            jax.block_until_ready(kernel(X, ps))
            times[label].append(time.perf_counter() - start)
    for label in kernels:
        result[f"{label}_msamples_s"] = round(batch / statistics.median(times[label]) / 1e6, 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--workloads", default=",".join(workloads.SHAPE_WORKLOADS["1e4"]))
    parser.add_argument("--whole-first", action="store_true")
    args = parser.parse_args()
    for name in args.workloads.split(","):
        print(measure(name, args.batch, args.rounds, args.whole_first), flush=True)


if __name__ == "__main__":
    main()
