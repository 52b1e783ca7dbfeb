"""XLA compile time, trace time and compile memory of huge kernel bodies, and what bounds them.

Usage: python benchmarks/scale_compile.py [--sizes 250,750,2500,7500] [--timeout S] [--quick]
                                          [--sections scaling,split,flags,barrier,trace]

Workload: sum_{i<n} sin(x_{i%6}*(i+1)) * a * x_{(i+2)%6}, 6 data symbols, 1 parameter,
float32 (about 4 operations per term: n=2500 is 10^4 operations). Kernels are built with
`symkern.build_function` once per size (sources cached under --workdir); every measurement
then runs in a fresh child process with a time limit, so each compile is cold and its peak
memory (ru_maxrss less the RSS before tracing) is its own. Read ratios, not absolute times:
the machine is shared.

Variants, all on the same rewritten kernel source:
- single: the kernel as one executable (what `Kernel._compute_jitted` compiles today);
- flags:  single, compiled with XLA compiler options (see FLAG_SETS);
- barrier: one executable, `lax.optimization_barrier` on the live values at each cut;
- split:  `symkern.kernels.split.SplitProgram`, pieces of at most P operations, compiled
          one after another (w1) or in 2 threads (w2), run in sequence;
- trace:  per-op cost of tracing `jnp.*` calls against `lax.*` primitives.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BATCH = 100_000
#: XLA CPU compiler options tried against the default pipeline
FLAG_SETS: dict[str, dict[str, Any]] = {
    "O0": {"xla_backend_optimization_level": 0},
    "no-expensive-llvm": {"xla_llvm_disable_expensive_passes": True},
    "O0+no-expensive": {"xla_backend_optimization_level": 0,
                        "xla_llvm_disable_expensive_passes": True},
    "no-unroll+no-slp": {"xla_cpu_disable_loop_unrolling": True,
                         "xla_cpu_disable_slp_vectorizer": True},
    "codegen-split-1": {"xla_cpu_parallel_codegen_split_count": 1},
    "no-fusion-emitters": {"xla_cpu_use_fusion_emitters": False},
}


def expression(n_terms: int) -> tuple[Any, list, dict]:
    import sympy as sp

    xs = sp.symbols("x0:6")
    a = sp.Symbol("a")
    terms = [sp.sin(xs[i % 6] * (i + 1)) * a * xs[(i + 2) % 6] for i in range(n_terms)]
    return sp.Add(*terms), list(xs), {"a": a}


# --- child jobs -------------------------------------------------------------------------


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def job_build(n_terms: int, workdir: Path) -> dict:
    import symkern as sk

    expr, data, params = expression(n_terms)
    start = time.perf_counter()
    kernel = sk.build_function(expr, data, params=params)
    build = time.perf_counter() - start
    (workdir / f"kernel_{n_terms}.py").write_text(kernel.source)
    body = kernel._generated.module.body[0].body
    return {"build": build, "statements": len(body), **kernel.timings}


class _HoistReads(ast.NodeTransformer):
    """`x1[..., i]` → a local `_x1_i` assigned once at the top (what a rule could do)."""

    def __init__(self) -> None:
        self.reads: dict[str, ast.expr] = {}

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        text = ast.unparse(node)
        if isinstance(node.value, ast.Name) and node.value.id.startswith("x") \
                and text.startswith(node.value.id + "[..., "):
            name = "_" + text.replace("[..., ", "_").replace("]", "").replace(", ", "_")
            self.reads.setdefault(name, node)
            return ast.Name(name, ast.Load())
        return self.generic_visit(node)


def hoist_reads(module: ast.Module) -> ast.Module:
    hoister = _HoistReads()
    function = module.body[0]
    function.body = [hoister.visit(s) for s in function.body]
    function.body[:0] = [ast.Assign([ast.Name(n, ast.Store())], v)
                         for n, v in hoister.reads.items()]
    return ast.fix_missing_locations(module)


def _load(n_terms: int, workdir: Path, reads: bool = False):
    import numpy as np

    from symkern.codegen.operations import operation_count
    from symkern.kernels.stage import compile_kernel

    module = ast.parse((workdir / f"kernel_{n_terms}.py").read_text())
    if reads:
        module = hoist_reads(module)
    function = compile_kernel(module, None, "<bench>")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, 6), dtype=np.float32)
    ps = {"a": np.float32(0.5)}
    return module, function, x, ps, operation_count(module)


def _throughput(call, *args) -> float:
    import jax

    jax.block_until_ready(call(*args))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        jax.block_until_ready(call(*args))
        times.append(time.perf_counter() - start)
    return BATCH / sorted(times)[2]


def _finish(entries: tuple, arguments: tuple) -> tuple:
    # what Kernel._compute does with the entries: cast, broadcast to the batch shape
    import jax.numpy as jnp

    batch = arguments[0].shape[:-1]
    return tuple(jnp.broadcast_to(jnp.asarray(e, jnp.float32), batch) for e in entries)


def job_single(n_terms: int, workdir: Path, options: dict | None = None,
               barrier_ops: int | None = None, reads: bool = False) -> dict:
    import jax
    import numpy as np

    module, function, x, ps, ops = _load(n_terms, workdir, reads)
    if barrier_ops is None:
        def compute(x1, ps):
            return _finish(function(x1, ps), (x1,))
    else:
        from symkern.kernels.split import SplitProgram

        program = SplitProgram.from_module(module, 10**9, max_operations=barrier_ops)

        def compute(x1, ps):
            # the pieces traced into one executable, live values behind a barrier
            values: dict = {}
            out: tuple = ()
            for piece, raw in zip(program.split.pieces, program._raw, strict=True):
                out = raw(x1, ps, tuple(values[n] for n in piece.live_in))
                out = jax.lax.optimization_barrier(out)
                values.update(zip(piece.live_out, out, strict=False))
            return _finish(tuple(values[r] for r in program.split.results), (x1,))

    jitted = jax.jit(compute)
    rss0 = _rss_mib()
    t0 = time.perf_counter()
    traced = jitted.trace(x, ps)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
    t3 = time.perf_counter()
    peak = _maxrss_mib() - rss0
    result = compiled(x, ps)
    reference = _finish(function(x[:64], ps), (x[:64],))
    error = float(np.max(np.abs(np.asarray(result[0][:64]) - np.asarray(reference[0]))))
    return {"ops": ops, "trace": t1 - t0, "lower": t2 - t1, "xla_compile": t3 - t2,
            "compile_mib": peak, "throughput": _throughput(compiled, x, ps),
            "hlo_chars": len(lowered.as_text()), "max_abs_diff_vs_eager": error,
            "equations": len(traced.jaxpr.eqns)}


def job_split(n_terms: int, workdir: Path, max_ops: int, workers: int,
              reads: bool = False) -> dict:
    import jax
    import numpy as np

    from symkern.kernels.split import SplitProgram

    module, function, x, ps, ops = _load(n_terms, workdir, reads)
    start = time.perf_counter()
    program = SplitProgram.from_module(module, 10**9, max_operations=max_ops, finish=_finish,
                                       workers=workers)
    prepare = time.perf_counter() - start
    rss0 = _rss_mib()
    program.compile(x, ps)
    peak = _maxrss_mib() - rss0
    error: float | str = "not checked (the single executable is what is too slow)"
    if ops <= 40_000:
        single = jax.jit(lambda x1, ps: _finish(function(x1, ps), (x1,)))
        error = float(np.max(np.abs(np.asarray(program(x[:64], ps)[0])
                                    - np.asarray(single(x[:64], ps)[0]))))
    live = sum(len(p.live_out) for p in program.split.pieces[:-1])
    return {"ops": ops, "pieces": len(program.split.pieces), "split_python": prepare,
            "trace_and_lower": program.timings["trace_and_lower"],
            "xla_compile": program.timings["xla_compile"], "compile_mib": peak,
            "throughput": _throughput(program, x, ps), "live_values": live,
            "max_abs_diff": error}


def job_trace(n_ops: int) -> dict:
    """Seconds per traced op for jnp-level calls against lax primitives (make_jaxpr)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    x = np.zeros((8, 6), np.float32)

    def chain(step):
        def f(x1):
            v = x1[..., 0]
            for _ in range(n_ops):
                v = step(v, x1)
            return v
        return f

    col = lax.index_in_dim(jnp.zeros((8, 6), jnp.float32), 0, axis=-1, keepdims=False)
    del col
    steps = {
        "jnp.sin(v)": lambda v, x1: jnp.sin(v),
        "lax.sin(v)": lambda v, x1: lax.sin(v),
        "v * v (tracer __mul__)": lambda v, x1: v * v,
        "lax.mul(v, v)": lambda v, x1: lax.mul(v, v),
        "3 * v (python scalar)": lambda v, x1: 3 * v,
        "lax.mul(v, 3.0 const)": lambda v, x1: lax.mul(v, np.float32(3.0)),
        "x1[..., 4] (jnp indexing)": lambda v, x1: x1[..., 4],
        "lax.index_in_dim(x1, 4)": lambda v, x1: lax.index_in_dim(x1, 4, axis=-1,
                                                                  keepdims=False),
    }
    out = {}
    for name, step in steps.items():
        start = time.perf_counter()
        jax.make_jaxpr(chain(step))(x)
        out[name] = (time.perf_counter() - start) / n_ops
    return out


def child_main(spec: dict) -> None:
    workdir = Path(spec["workdir"])
    kind = spec["kind"]
    if kind == "build":
        result = job_build(spec["n"], workdir)
    elif kind == "single":
        result = job_single(spec["n"], workdir, spec.get("options"), spec.get("barrier_ops"),
                            spec.get("reads", False))
    elif kind == "split":
        result = job_split(spec["n"], workdir, spec["max_ops"], spec["workers"],
                           spec.get("reads", False))
    elif kind == "trace":
        result = job_trace(spec["n_ops"])
    else:
        raise ValueError(kind)
    print("RESULT " + json.dumps(result), flush=True)


# --- the parent: one child per measurement ---------------------------------------------


def run_child(spec: dict, timeout: float, env: dict | None = None) -> dict | str:
    command = [sys.executable, __file__, "--child", json.dumps(spec)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})}, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return f">{timeout:.0f}s"
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return "failed: " + (done.stderr.strip().splitlines() or ["?"])[-1][:120]


def _cell(value: Any, fmt: str = "{:.2f}") -> str:
    return fmt.format(value) if isinstance(value, (int, float)) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="250,750,2500,7500")
    parser.add_argument("--split-size", type=int, default=2500,
                        help="terms of the workload for the split/flags/barrier sections")
    parser.add_argument("--pieces", default="500,1000,2500,5000",
                        help="operation budgets per piece for the split section")
    parser.add_argument("--barrier-pieces", default="1000",
                        help="operation budgets between barriers for the barrier section")
    parser.add_argument("--sections", default="scaling,split,reads,flags,barrier,trace")
    parser.add_argument("--timeout", type=float, default=400)
    parser.add_argument("--workdir", default="/tmp/symkern_scale_compile")
    parser.add_argument("--quick", action="store_true", help="sizes 250,750; split at 750")
    parser.add_argument("--json", help="also write every result to this file")
    args = parser.parse_args()
    if args.child:
        child_main(json.loads(args.child))
        return
    if args.quick:
        args.sizes, args.split_size, args.pieces = "250,750", 750, "500,1000"
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    sections = set(args.sections.split(","))
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[str, Any] = {}

    def ensure_built(n: int) -> dict | str:
        key = f"build {n}"
        cached = workdir / f"build_{n}.json"
        if cached.exists() and (workdir / f"kernel_{n}.py").exists():
            results[key] = json.loads(cached.read_text())
        else:
            results[key] = run_child({"kind": "build", "n": n, "workdir": str(workdir)},
                                     args.timeout)
            if isinstance(results[key], dict):
                cached.write_text(json.dumps(results[key]))
        return results[key]

    if "scaling" in sections:
        print("\n## Compile time against body size (one executable)\n")
        print("| terms | ops | stmts | build (emit+rewrite) | trace | lower | XLA compile "
              "| compile MiB | ms/op XLA | ksamples/s |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for n in sizes:
            built = ensure_built(n)
            if not isinstance(built, dict):
                print(f"| {n} | build {built} |")
                continue
            r = run_child({"kind": "single", "n": n, "workdir": str(workdir)}, args.timeout)
            results[f"single {n}"] = r
            if isinstance(r, dict):
                print(f"| {n} | {r['ops']} | {built['statements']} | {built['build']:.1f} s "
                      f"| {r['trace']:.2f} s | {r['lower']:.2f} s | {r['xla_compile']:.2f} s "
                      f"| {r['compile_mib']:.0f} | {1e3 * r['xla_compile'] / r['ops']:.2f} "
                      f"| {r['throughput'] / 1e3:.0f} |", flush=True)
            else:
                print(f"| {n} | | {built['statements']} | {built['build']:.1f} s | {r} |",
                      flush=True)

    n = args.split_size
    if sections & {"split", "reads", "flags", "barrier"}:
        ensure_built(n)
        base = results.get(f"single {n}") or run_child(
            {"kind": "single", "n": n, "workdir": str(workdir)}, args.timeout)
        results[f"single {n}"] = base

    def row(label: str, r: dict | str) -> None:
        if not isinstance(r, dict):
            print(f"| {label} | {r} |", flush=True)
            return
        lower = r.get("trace_and_lower", r.get("trace", 0) + r.get("lower", 0))
        ratio = base["xla_compile"] / r["xla_compile"] if isinstance(base, dict) else float("nan")
        speed = r["throughput"] / base["throughput"] if isinstance(base, dict) else float("nan")
        print(f"| {label} | {r.get('pieces', 1)} | {lower:.2f} s | {r['xla_compile']:.2f} s "
              f"| {ratio:.1f}x | {r['compile_mib']:.0f} | {r['throughput'] / 1e3:.0f} "
              f"| {speed:.2f} |", flush=True)

    header = ("| variant | executables | trace+lower | XLA compile | compile speed-up "
              "| compile MiB | ksamples/s | throughput vs single |\n"
              "|---|---|---|---|---|---|---|---|")
    if "split" in sections:
        print(f"\n## Split into separately compiled pieces ({n} terms)\n\n{header}")
        row("single", base)
        for budget in (int(p) for p in args.pieces.split(",")):
            for workers in (1, 2):
                r = run_child({"kind": "split", "n": n, "workdir": str(workdir),
                               "max_ops": budget, "workers": workers}, args.timeout)
                results[f"split {n} {budget} w{workers}"] = r
                row(f"split ≤{budget} ops, {workers} thread(s)", r)
    if "reads" in sections:
        print(f"\n## Data reads hoisted to one local per column ({n} terms)\n\n{header}")
        row("single", base)
        r = run_child({"kind": "single", "n": n, "workdir": str(workdir), "reads": True},
                      args.timeout)
        results[f"reads {n}"] = r
        row("single, reads hoisted", r)
        budget = int(args.pieces.split(",")[-1])
        r = run_child({"kind": "split", "n": n, "workdir": str(workdir), "max_ops": budget,
                       "workers": 2, "reads": True}, args.timeout)
        results[f"reads split {n} {budget}"] = r
        row(f"split ≤{budget} ops, 2 threads, reads hoisted", r)
    if "barrier" in sections:
        print(f"\n## optimization_barrier at cuts, one executable ({n} terms)\n\n{header}")
        row("single", base)
        for budget in (int(p) for p in args.barrier_pieces.split(",")):
            r = run_child({"kind": "single", "n": n, "workdir": str(workdir),
                           "barrier_ops": budget}, args.timeout)
            results[f"barrier {n} {budget}"] = r
            row(f"barrier every ≤{budget} ops", r)
    if "flags" in sections:
        print(f"\n## XLA compiler options, one executable ({n} terms)\n\n{header}")
        row("single (defaults)", base)
        for name, options in FLAG_SETS.items():
            r = run_child({"kind": "single", "n": n, "workdir": str(workdir),
                           "options": options}, args.timeout)
            results[f"flags {n} {name}"] = r
            row(name, r)
    if "trace" in sections:
        print("\n## Tracing cost per op (make_jaxpr of a 10^4-op chain)\n")
        r = run_child({"kind": "trace", "n_ops": 10_000, "workdir": str(workdir)}, args.timeout)
        results["trace"] = r
        print("| call | µs per traced op |\n|---|---|")
        if isinstance(r, dict):
            for name, seconds in r.items():
                print(f"| `{name}` | {seconds * 1e6:.0f} |")
        else:
            print(f"| all | {r} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
