"""Many scalar parameters: `x * Add(*p)` with 10^4 and 10^5 parameters `p0 … p(n-1)`.

Run: `python benchmarks/many_parameters.py [--sizes 10000 100000] [--threshold]`. Each size
runs in its own subprocess, so its peak RSS (`resource.getrusage`) is its own: build, first
call, best repeated call (100 samples, a dict of Python floats as a user passes it), and the
same repeated call with the parameters already packed (`kernel.pack_parameters`). With
`--threshold` it also times repeated calls of kernels of 1…64 parameters taking their
parameters packed and one argument per leaf (the measurement behind PACK_FROM_LEAVES).
Writes benchmarks/results/many_parameters.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "many_parameters.json"
SAMPLES = 100
REPEATS = 50


def _best(call, repeats: int = REPEATS) -> float:
    import jax

    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(call())
        best = min(best, time.perf_counter() - start)
    return best


def measure(size: int) -> dict:
    """One size, in this process: build, first call, repeated calls, peak RSS."""
    import numpy as np
    import sympy as sp

    import symkern as sk

    x = sp.Symbol("x")
    symbols = [sp.Symbol(f"p{i}") for i in range(size)]
    params = {f"p{i}": s for i, s in enumerate(symbols)}
    start = time.perf_counter()
    kernel = sk.build_function(x * sp.Add(*symbols), [x], params=params)
    build = time.perf_counter() - start
    values = {f"p{i}": float(i % 7) for i in range(size)}
    X = np.linspace(0.0, 1.0, SAMPLES).reshape(SAMPLES, 1)
    start = time.perf_counter()
    result = np.asarray(kernel(X, values))
    first = time.perf_counter() - start
    expected = X[:, 0] * sum(values.values())
    if not np.allclose(result, expected, rtol=1e-4):
        raise AssertionError(f"{size} parameters: wrong result")
    repeated = _best(lambda: kernel(X, values))
    packed = kernel.pack_parameters(values)
    repeated_packed = _best(lambda: kernel(X, packed))
    return {"parameters": size, "build_s": round(build, 3), "first_call_s": round(first, 3),
            "repeated_call_ms": round(repeated * 1e3, 3),
            "repeated_call_packed_ms": round(repeated_packed * 1e3, 3),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "packed": kernel.packs_parameters, "timings": {
                k: round(v, 3) for k, v in kernel.timings.items()}}


def threshold(sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)) -> list[dict]:
    """Repeated calls of `x * (p0 + … )` with the parameters packed and one leaf per
    argument, for each size (PACK_FROM_LEAVES forced to either side)."""
    import numpy as np
    import sympy as sp

    import symkern as sk
    from symkern.batching import packing

    x = sp.Symbol("x")
    X = np.linspace(0.0, 1.0, SAMPLES).reshape(SAMPLES, 1)
    rows = []
    default = packing.PACK_FROM_LEAVES
    try:
        for size in sizes:
            symbols = [sp.Symbol(f"p{i}") for i in range(size)]
            params = {f"p{i}": s for i, s in enumerate(symbols)}
            values = {f"p{i}": float(i) for i in range(size)}
            row = {"parameters": size}
            for name, pack_from in (("packed_us", 1), ("leaves_us", size + 1)):
                packing.PACK_FROM_LEAVES = pack_from
                kernel = sk.build_function(x * sp.Add(*symbols), [x], params=params)
                kernel(X, values)
                row[name] = round(_best(lambda k=kernel, v=values: k(X, v), 2000) * 1e6, 1)
            rows.append(row)
    finally:
        packing.PACK_FROM_LEAVES = default
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--threshold", action="store_true")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the subprocess's size
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one)))
        return
    runs = []
    for size in args.sizes:
        done = subprocess.run([sys.executable, __file__, "--one", str(size)], check=True,
                              capture_output=True, text=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(runs[-1]), flush=True)
    results = {"benchmark": "x * Add(*p), p a dict of scalar parameters", "samples": SAMPLES,
               "machine": f"{platform.machine()}, {platform.python_version()}", "runs": runs}
    if args.threshold:
        results["threshold"] = threshold()
        print(json.dumps(results["threshold"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
