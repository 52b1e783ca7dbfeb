"""Build time, first result and peak memory on random expression shapes, against lambdify-jax
and symengine, and the two regression cases of irregular scale.

Usage: python benchmarks/scale_shapes.py [--sizes 1000,10000,100000] [--million]
                                         [--profiles wide-sum,...] [--tools symkern,...]
                                         [--cases cosine-sum,params-1e4] [--params-1e5]
                                         [--timeout S] [--out PATH] [--no-reference]

Shapes: `benchmarks/shapes.py`, its five profiles (wide sums, deep nests, products of sums, a
shared DAG, many parameters), seed 0, at each size in operations (`--million` adds 10^6).
Cases: `cosine-sum` — `sum_i c_i * v_(i mod 2)**(i mod 3 + 1) * cos(i * v_((i+1) mod 2))`,
20,000 terms, two data symbols, every tool with cse=False; `params-1e4` (and `params-1e5`
with `--params-1e5`) — `x * Add(*p)` with 10^4 (10^5) scalar parameters.

Each (shape, tool) runs in a fresh child process under a time limit, the tools of a shape one
after another, so every build is cold and each peak RSS (ru_maxrss) is its own tool's. A
shape's float64 reference (`sympy.lambdify` on NumPy, 64 samples) is computed first in its
own process. Figures per tool: the build split by stage (symkern's `kernel.timings`;
lambdify's printing, then the first call that traces and compiles), the first result at
batch 1,024, the build per operation, a repeated call at batch 1,024 (median of 5), the RSS
before the build and the peak, and the error against the reference (the largest absolute
difference over the largest magnitude, per output). JAX tools compute in float32 under
`jax.jit(jax.vmap(f))` (lambdify-jax) or as built (symkern); symengine's `Lambdify` (LLVM)
in float64. Read ratios of tools measured side by side: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

SIZES = (1_000, 10_000, 100_000)
TOOLS = ("symkern", "lambdify-jax", "symengine")
CASES = ("cosine-sum", "params-1e4")
#: the batch of the first and the repeated calls
BATCH = 1_024
#: samples checked against the float64 reference
CHECK = 64
#: terms of one lambdify in the reference (a sum of 10^4 terms overflows Python's compiler)
REFERENCE_CHUNK = 500
#: terms of the cosine-sum case (about 10^5 operations)
COSINE_TERMS = 20_000


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _median_call(call: Any, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _error(got: np.ndarray, want: np.ndarray) -> float:
    """The largest absolute difference over the largest magnitude, the worst output."""
    got, want = np.asarray(got, np.float64).reshape(want.shape), np.asarray(want, np.float64)
    scale = np.maximum(np.max(np.abs(want), axis=0), 1e-300)
    return float(np.max(np.max(np.abs(got - want), axis=0) / scale))


class Problem:
    """What a tool is given: flat outputs, data symbols, parameter symbols and values."""

    def __init__(self, outputs: list, inputs: list, params: dict, values: dict, cse: bool,
                 operations: int, summary: dict) -> None:
        self.outputs, self.inputs, self.params, self.values = outputs, inputs, params, values
        self.cse, self.operations, self.summary = cse, operations, summary

    def data(self, n: int) -> np.ndarray:
        return np.random.default_rng(0).uniform(-1, 1, (n, len(self.inputs)))


def problem(kind: str, name: str, size: int, seed: int) -> Problem:
    """A shape (kind "shape": profile `name`, `size` operations) or a case."""
    import shapes

    from symkern.codegen.linearize import count_operations

    if kind == "shape":
        shape = shapes.generate(name, size, seed)
        return Problem(list(shape.eqs), shape.inputs, shape.params, shape.param_values, True,
                       shape.operations, shape.summary())
    start = time.perf_counter()
    if name == "cosine-sum":
        expr, inputs = shapes.cosine_sum(size, seed)
        params, values = {}, {}
    else:
        expr, x, params = shapes.parameter_sum(size)
        inputs = [x]
        values = {k: round(0.5 + (i % 1000) / 1000, 6) for i, k in enumerate(params)}
    operations = int(count_operations([expr]))
    summary = {"case": name, "size": size, "operations": operations, "inputs": len(inputs),
               "params": len(params), "construct_s": round(time.perf_counter() - start, 3)}
    return Problem([expr], inputs, params, values, name != "cosine-sum", operations, summary)


# --- tools: each returns its figures; `evaluate(X)` gives (n, outputs) float64 -------------


def run_symkern(p: Problem, X: np.ndarray) -> tuple[dict, Any]:
    import jax

    import symkern as sk

    single = p.summary.get("case") == "params"
    data_arg = p.inputs[0] if single else p.inputs
    start = time.perf_counter()
    kernel = sk.build_function(p.outputs if len(p.outputs) > 1 else p.outputs[0], data_arg,
                               params=p.params or None, cse=p.cse, dtype=np.float32)
    build = time.perf_counter() - start
    batch = (X[:BATCH, 0] if single else X[:BATCH]).astype(np.float32)
    args = (batch, p.values) if p.params else (batch,)
    start = time.perf_counter()
    jax.block_until_ready(kernel(*args))
    first = time.perf_counter() - start
    repeat = _median_call(lambda: jax.block_until_ready(kernel(*args)))
    figures = {"build_s": build, "first_call_s": first, "repeat_call_s": repeat,
               "stages": {k: round(v, 4) for k, v in kernel.timings.items()}}

    def evaluate(Xc: np.ndarray) -> np.ndarray:
        xs = (Xc[:, 0] if single else Xc).astype(np.float32)
        out = kernel(xs, p.values) if p.params else kernel(xs)
        if isinstance(out, list):  # one array per output
            return np.stack([np.asarray(o, np.float64) for o in out], axis=-1)
        return np.asarray(out, np.float64).reshape(len(Xc), -1)

    return figures, evaluate


def run_lambdify_jax(p: Problem, X: np.ndarray) -> tuple[dict, Any]:
    import jax
    import sympy as sp

    symbols = list(p.params.values())
    start = time.perf_counter()
    f = sp.lambdify((p.inputs, symbols), p.outputs, modules="jax", cse=p.cse)
    printed = time.perf_counter() - start
    batched = jax.jit(jax.vmap(f, in_axes=(0, None)))
    ps = jax.device_put(np.asarray(list(p.values.values()), np.float32))
    batch = jax.device_put(X[:BATCH].astype(np.float32))
    start = time.perf_counter()
    jax.block_until_ready(batched(batch, ps))
    first = time.perf_counter() - start
    repeat = _median_call(lambda: jax.block_until_ready(batched(batch, ps)))
    figures = {"build_s": printed, "first_call_s": first, "repeat_call_s": repeat,
               "stages": {"lambdify": round(printed, 4), "trace_compile_run": round(first, 4)}}

    def evaluate(Xc: np.ndarray) -> np.ndarray:
        out = batched(jax.device_put(Xc.astype(np.float32)), ps)
        return np.stack([np.asarray(o, np.float64) for o in out], axis=-1)

    return figures, evaluate


def run_symengine(p: Problem, X: np.ndarray) -> tuple[dict, Any]:
    import symengine as se

    symbols = list(p.params.values())
    start = time.perf_counter()
    f = se.Lambdify(list(p.inputs) + symbols, p.outputs, backend="llvm", cse=p.cse)
    build = time.perf_counter() - start
    values = np.asarray(list(p.values.values()), np.float64)

    def rows(Xc: np.ndarray) -> np.ndarray:
        # one row per sample holding every argument, parameters copied in (its users' cost)
        out = np.empty((len(Xc), Xc.shape[1] + values.size))
        out[:, :Xc.shape[1]], out[:, Xc.shape[1]:] = Xc, values
        return out

    batch = X[:BATCH].astype(np.float64)
    start = time.perf_counter()
    f(rows(batch))
    first = time.perf_counter() - start
    repeat = _median_call(lambda: f(rows(batch)))
    figures = {"build_s": build, "first_call_s": first, "repeat_call_s": repeat,
               "stages": {"lambdify_llvm": round(build, 4), "first_call": round(first, 4)}}

    def evaluate(Xc: np.ndarray) -> np.ndarray:
        return np.asarray(f(rows(Xc)), np.float64).reshape(len(Xc), -1)

    return figures, evaluate


RUNNERS = {"symkern": run_symkern, "lambdify-jax": run_lambdify_jax, "symengine": run_symengine}


def _chunks(expr: Any) -> list:
    """`expr` as a sum of parts of at most REFERENCE_CHUNK terms: a sum of 10^4 terms is too
    deep for Python's compiler in one lambdify (a RecursionError); `c * (a + b + ...)` is
    split through its one long sum."""
    import sympy as sp

    if expr.is_Add:
        return [sp.Add(*expr.args[i:i + REFERENCE_CHUNK]) for i in range(0, len(expr.args), REFERENCE_CHUNK)]
    if expr.is_Mul:
        sums = [f for f in expr.args if f.is_Add]
        if len(sums) == 1:
            rest = sp.Mul(*(f for f in expr.args if f is not sums[0]))
            return [rest * part for part in _chunks(sums[0])]
    return [expr]


def job_reference(kind: str, name: str, size: int, seed: int, path: Path) -> dict:
    import sympy as sp

    p = problem(kind, name, size, seed)
    X = p.data(CHECK)
    start = time.perf_counter()
    chunks = [(k, part) for k, e in enumerate(p.outputs) for part in _chunks(e)]
    # the tree as written (no SymPy cse): the float64 truth
    f = sp.lambdify((p.inputs, list(p.params.values())), [e for _, e in chunks], "numpy", cse=False)
    values = list(p.values.values())
    want = np.zeros((len(X), len(p.outputs)))
    for row, x in enumerate(X):
        for (k, _), value in zip(chunks, f(x, values), strict=True):
            want[row, k] += float(value)
    np.savez(path, X=X, want=want)
    return {**p.summary, "reference_s": round(time.perf_counter() - start, 3)}


def job_tool(tool: str, kind: str, name: str, size: int, seed: int, reference: Path | None) -> dict:
    if tool != "symengine":
        import jax  # noqa: F401  (imported before the RSS baseline, like the shape)
    if tool == "symengine":
        import symengine  # noqa: F401
    p = problem(kind, name, size, seed)
    X = p.data(BATCH)
    rss_before = _rss_mib()
    figures, evaluate = RUNNERS[tool](p, X)
    figures.update(tool=tool, **p.summary, rss_before_mib=round(rss_before, 1),
                   peak_rss_mib=round(_peak_mib(), 1),
                   first_result_s=figures["build_s"] + figures["first_call_s"])
    figures["build_per_operation_us"] = 1e6 * figures["first_result_s"] / max(p.operations, 1)
    if reference is not None and reference.exists():
        saved = np.load(reference)
        figures["error"] = _error(evaluate(saved["X"]), saved["want"])
    return {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in figures.items()}


# --- driver -----------------------------------------------------------------------------


def _child(args: list[str], timeout: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SYMKERN_CACHE_DIR"}
    try:
        done = subprocess.run([sys.executable, __file__, "--job", *args], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"status": f"timeout after {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-3:]
        return {"status": "failed", "reason": " | ".join(tail)[-600:]}
    return {"status": "ok", **json.loads(lines[-1])}


def _save(out: Path, results: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")


def _line(row: dict) -> str:
    if row.get("status") != "ok":
        name = row.get("shape", row.get("case"))
        return f"{name} {row.get('tool')}: {row['status']} {row.get('reason', '')}"
    return (f"{row.get('shape', row.get('case'))} {row['tool']}: ops {row['operations']}, first result "
            f"{row['first_result_s']:.2f} s ({row['build_per_operation_us']:.0f} us/op), repeat "
            f"{1e3 * row['repeat_call_s']:.2f} ms, peak {row['peak_rss_mib']:.0f} MiB, "
            f"error {row.get('error', float('nan')):.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--million", action="store_true", help="add shapes of 10^6 operations")
    parser.add_argument("--profiles", default=None, help="comma-separated (default: all five)")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--cases", default=",".join(CASES), help="'' for none")
    parser.add_argument("--params-1e5", action="store_true", help="add x*Add(*p) with 10^5 parameters")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the float64 reference (at 10^6 operations it takes longer than the tools)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per child process")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/scale_shapes.json")
    parser.add_argument("--job", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        what, rest = args.job[0], args.job[1:]
        if what == "reference":
            print(json.dumps(job_reference(rest[0], rest[1], int(rest[2]), int(rest[3]), Path(rest[4]))))
        else:
            reference = Path(rest[5]) if len(rest) > 5 else None
            print(json.dumps(job_tool(rest[0], rest[1], rest[2], int(rest[3]), int(rest[4]), reference)))
        return

    import shapes

    sizes = [int(s) for s in args.sizes.split(",") if s] + ([1_000_000] if args.million else [])
    profiles = args.profiles.split(",") if args.profiles else list(shapes.PROFILES)
    tools = args.tools.split(",")
    cases = [c for c in args.cases.split(",") if c] + (["params-1e5"] if args.params_1e5 else [])
    import jax
    import sympy

    results: dict[str, Any] = {
        "meta": {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpus": os.cpu_count(),
                 "platform": platform.platform(), "jax": jax.__version__, "sympy": sympy.__version__,
                 "batch": BATCH, "check_samples": CHECK, "timeout_s": args.timeout, "seed": args.seed},
        "shapes": [], "cases": []}
    work = Path(tempfile.mkdtemp(prefix="scale_shapes_"))
    for size in sizes:
        for profile in profiles:
            reference = work / f"{profile}-{size}.npz"
            ref = ({"status": "skipped"} if args.no_reference else
                   _child(["reference", "shape", profile, str(size), str(args.seed), str(reference)],
                          args.timeout))
            print(f"{profile}-{size} reference: {ref.get('status')} {ref.get('reference_s', '')}", flush=True)
            for tool in tools:
                row = _child(["tool", tool, "shape", profile, str(size), str(args.seed), str(reference)],
                             args.timeout)
                row.setdefault("shape", f"{profile}-{size}-s{args.seed}")
                row.update(tool=tool, profile=profile, target=size, reference=ref.get("status"))
                results["shapes"].append(row)
                print(_line(row), flush=True)
                _save(args.out, results)
    for case in cases:
        size = COSINE_TERMS if case == "cosine-sum" else int(float(case.split("-")[1]))
        name = "cosine-sum" if case == "cosine-sum" else "params"
        reference = work / f"{case}.npz"
        ref = _child(["reference", "case", name, str(size), str(args.seed), str(reference)], args.timeout)
        print(f"{case} reference: {ref.get('status')} {ref.get('reason', '')}", flush=True)
        for tool in tools:
            row = _child(["tool", tool, "case", name, str(size), str(args.seed), str(reference)],
                         args.timeout)
            row.update(tool=tool, case=case, reference=ref.get("status"))
            results["cases"].append(row)
            print(_line(row), flush=True)
            _save(args.out, results)
    _save(args.out, results)


if __name__ == "__main__":
    main()
