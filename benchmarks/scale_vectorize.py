"""First result, throughput and latency against expression size, vectorized and scalar bodies.

Usage: python benchmarks/scale_vectorize.py [--family generated|nlink] [--sizes 1000,10000]
                                            [--scalar-up-to 100000] [--timeout S] [--out PATH]

Workloads: `generated` — `benchmarks/workloads.generated(n)` (sums of `p*sin(p*x+x)*cos(p*x)`
terms, ~2,500 operations per output; sizes are operations; float32); `nlink` —
`sympy.physics.mechanics.models.n_link_pendulum_on_cart(n)`: the full mass matrix, the
forcing and its dense Jacobian with respect to q (sizes are n; float64, checked against
`sympy.lambdify` with numpy at 4 samples). Each (size, mode) runs in a fresh child process
with a time limit, so every build and compile is cold: `vectorize=True` (templates as
vectors) and `vectorize=False` (the scalar body, split into pieces above 2,000 operations).
Figures: the SymPy construction time (not part of the build), the first result at batch
1,024 with `kernel.timings`, throughput at batch 100,000 (best of 5) and single-sample
latency (best of 30). Read ratios, not absolute times: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def nlink(n: int) -> tuple[dict, list, dict, dict]:
    """M, F and dF/dq of the n-link pendulum on a cart, with q, u as plain symbols."""
    import numpy as np
    import sympy as sp
    from sympy.physics.mechanics.models import n_link_pendulum_on_cart

    kane = n_link_pendulum_on_cart(n=n, cart_force=False)
    plain = {**{q: sp.Symbol(f"q{k}") for k, q in enumerate(kane.q)},
             **{u: sp.Symbol(f"u{k}") for k, u in enumerate(kane.u)}}
    mass, forcing = kane.mass_matrix_full.xreplace(plain), kane.forcing_full.xreplace(plain)
    qs = [plain[q] for q in kane.q]
    eqs = {"M": mass, "F": forcing, "dF/dq": forcing.jacobian(qs)}
    inputs = list(plain.values())
    constants = sorted(set().union(*(e.free_symbols for e in eqs.values())) - set(inputs), key=str)
    values = dict(zip((c.name for c in constants),
                      np.random.default_rng(1).uniform(0.5, 1.5, len(constants)), strict=True))
    return eqs, inputs, {c.name: c for c in constants}, values


def job(family: str, size: int, vectorize: bool) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import jax
    import numpy as np
    import sympy as sp
    import workloads

    import symkern as sk
    from symkern.codegen.linearize import count_operations

    start = time.perf_counter()
    if family == "nlink":
        jax.config.update("jax_enable_x64", True)
        eqs, inputs, symbols, params = nlink(size)
        operations = count_operations([e for m in eqs.values() for e in m])
        dtype = np.float64
    else:
        workload = workloads.generated(size)
        eqs, inputs, symbols = workload.eqs, workload.inputs, workload.params
        params = {k: np.float32(v) for k, v in workload.param_values.items()}
        operations, dtype = workload.ops, np.float32
    construct = time.perf_counter() - start
    data = np.random.default_rng(0).uniform(-1, 1, (100_000, len(inputs))).astype(dtype)
    start = time.perf_counter()
    kernel = sk.build_function(eqs, inputs, params=symbols, vectorize=vectorize,
                               dtype=dtype)
    jax.block_until_ready(kernel(data[:1024], params))
    first = time.perf_counter() - start
    error = None
    if family == "nlink":
        reference = sp.lambdify([inputs, list(symbols.values())], list(eqs.values()), "numpy")
        got = kernel(data[:4], params)
        error = 0.0
        for i in range(4):
            for name, want in zip(eqs, reference(data[i], list(params.values())), strict=True):
                want = np.asarray(want, float).reshape(np.shape(got[name][i]))
                error = max(error, float(np.max(np.abs(got[name][i] - want)
                                                / (np.abs(want) + 1e-12))))
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
    return {"operations": operations, "construct_s": construct, "first_result_s": first,
            "timings": kernel.timings, "throughput": len(data) / min(times),
            "latency_s": min(latencies), "vectorized": "vec.chunked" in kernel.source,
            "max_rel_error": error, "dtype": np.dtype(dtype).name}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=["generated", "nlink"], default="generated")
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--scalar-up-to", type=int, default=100_000)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/scale_vectorize.json")
    parser.add_argument("--job", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        print(json.dumps(job(args.job[0], int(args.job[1]), args.job[2] == "1")))
        return
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        for vectorize in (True, False):
            if not vectorize and size > args.scalar_up_to:
                continue
            try:
                done = subprocess.run([sys.executable, __file__, "--job", args.family, str(size),
                                       "1" if vectorize else "0"], capture_output=True,
                                      text=True, timeout=args.timeout, check=True)
                row = json.loads(done.stdout.strip().splitlines()[-1])
            except subprocess.TimeoutExpired:
                row = {"status": f"timeout after {args.timeout:.0f} s"}
            except subprocess.CalledProcessError as error:
                row = {"status": "failed", "stderr": error.stderr[-2000:]}
            row.update(family=args.family, size=size, vectorize=vectorize)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "timings"}), flush=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
