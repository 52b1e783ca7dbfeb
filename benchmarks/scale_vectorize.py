"""First result, throughput and latency against expression size, vectorized and scalar bodies.

Usage: python benchmarks/scale_vectorize.py [--sizes 1000,10000,100000] [--scalar-up-to 100000]
                                            [--timeout S] [--out benchmarks/results/scale_vectorize.json]

Workload: `benchmarks/workloads.generated(n)` (sums of `p*sin(p*x+x)*cos(p*x)` terms, ~2,500
operations per output). Each (size, mode) runs in a fresh child process with a time limit,
so every build and compile is cold: `vectorize=True` (templates as vectors) and
`vectorize=False` (the scalar body, split into pieces above 2,000 operations). Figures: the
SymPy construction time (not part of the build), the first result at batch 1,024 with
`kernel.timings`, throughput at batch 100,000 (best of 5, float32) and single-sample latency
(best of 30). Read ratios, not absolute times: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def job(size: int, vectorize: bool) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import jax
    import numpy as np
    import workloads

    import symkern as sk

    start = time.perf_counter()
    workload = workloads.generated(size)
    construct = time.perf_counter() - start
    data = workload.sample(100_000).astype(np.float32)
    params = {k: np.float32(v) for k, v in workload.param_values.items()}
    start = time.perf_counter()
    kernel = sk.build_function(workload.eqs, workload.inputs, params=workload.params,
                               vectorize=vectorize)
    jax.block_until_ready(kernel(data[:1024], params))
    first = time.perf_counter() - start
    kernel(data, params)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        jax.block_until_ready(kernel(data, params))
        times.append(time.perf_counter() - start)
    kernel(data[0], params)
    latencies = []
    for _ in range(30):
        start = time.perf_counter()
        jax.block_until_ready(kernel(data[0], params))
        latencies.append(time.perf_counter() - start)
    return {"operations": workload.ops, "construct_s": construct, "first_result_s": first,
            "timings": kernel.timings, "throughput": len(data) / min(times),
            "latency_s": min(latencies), "vectorized": "vec.chunked" in kernel.source}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--scalar-up-to", type=int, default=100_000)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/scale_vectorize.json")
    parser.add_argument("--job", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        print(json.dumps(job(int(args.job[0]), args.job[1] == "1")))
        return
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        for vectorize in (True, False):
            if not vectorize and size > args.scalar_up_to:
                continue
            try:
                done = subprocess.run([sys.executable, __file__, "--job", str(size),
                                       "1" if vectorize else "0"], capture_output=True,
                                      text=True, timeout=args.timeout, check=True)
                row = json.loads(done.stdout.strip().splitlines()[-1])
            except subprocess.TimeoutExpired:
                row = {"status": f"timeout after {args.timeout:.0f} s"}
            except subprocess.CalledProcessError as error:
                row = {"status": "failed", "stderr": error.stderr[-2000:]}
            row.update(size=size, vectorize=vectorize)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "timings"}), flush=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
