"""`jax.vmap(kernel)` against the kernel's own batch, in one process, as a ratio.

    python benchmarks/vmap.py [--batch 100000] [--rounds 41] [--out benchmarks/results/vmap.json]

For each workload (the double pendulum, the 4-16-16-4 network and its input Jacobian),
times `jax.jit(lambda X: kernel(X, ps))` and `jax.jit(jax.vmap(lambda x: kernel(x, ps)))`
round-robin on the same float32 batch and reports M samples/s and own / vmap: the ratio of
throughputs (1.0: vmap costs what the kernel's own batch costs). Also checks that the two
give the same bits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads  # noqa: E402
from compare import round_robin  # noqa: E402

import symkern as sk  # noqa: E402

WORKLOADS = ("pendulum", "net-4-16-16-4", "jac-4-16-16-4")


def measure(name: str, batch: int, rounds: int) -> dict:
    wl = workloads.build(name)
    functions = {k: jax_impl for k, (jax_impl, _) in wl.functions.items()} or None
    kernel = sk.build_function(wl.eqs, wl.inputs, params=wl.params, functions=functions)
    X = jax.device_put(wl.sample(batch).astype(np.float32))
    ps = jax.tree_util.tree_map(lambda v: jax.device_put(np.asarray(v, np.float32)),
                                wl.param_values)
    own = jax.jit(lambda X, ps: kernel(X, ps))
    mapped = jax.jit(lambda X, ps: jax.vmap(lambda x: kernel(x, ps))(X))
    same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
        jax.tree_util.tree_leaves(own(X, ps)), jax.tree_util.tree_leaves(mapped(X, ps)),
        strict=True))
    times = round_robin({"own": lambda: jax.block_until_ready(own(X, ps)),
                         "vmap": lambda: jax.block_until_ready(mapped(X, ps))}, rounds)
    rates = {label: batch / statistics.median(t) / 1e6 for label, t in times.items()}
    return {"workload": name, "batch": batch, "own_msps": rates["own"],
            "vmap_msps": rates["vmap"], "vmap_over_own": rates["vmap"] / rates["own"],
            "bitwise_equal": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for name in args.workloads.split(","):
        row = measure(name, args.batch, args.rounds)
        rows.append(row)
        print(f"{name}: own {row['own_msps']:.1f} M/s, vmap {row['vmap_msps']:.1f} M/s, "
              f"vmap/own {row['vmap_over_own']:.2f}, bitwise equal {row['bitwise_equal']}",
              flush=True)
    if args.out:
        args.out.write_text(json.dumps({"jax": jax.__version__, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
