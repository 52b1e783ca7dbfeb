"""Where the 4-16-16-4 Jacobian's time goes, against sympy2jax's program.

Usage: python benchmarks/experiments/jacobian_fusions.py [--batch 100000] [--rounds 21]
                                                   [--workload jac-4-16-16-4] [--no-sympy2jax]

symkern's scalar body against sympy2jax's program, timed round-robin in one process
(median M samples/s at the batch), with what each compiles to: the optimized HLO's fusion
count and its arithmetic on batch-shaped values (multiply, add, subtract, tanh), and the
largest fusion. Variants of the symkern kernel, each checked against ``kernel(X, ps)``:

- ``entries only``: the entries' executable alone, without assembling ``(..., 4, 4)`` (what
  sympy2jax returns: a list of 16 arrays);
- ``shared sums materialized``: ``materialize_shared`` also computing, once, every
  data-dependent value of 8 operations or more that two entries read (the chain-rule sums
  each of 4 output entries repeats in its fusion), not only the costly functions;
- ``parameter factors first``: each product's parameter factors multiplied first, so
  ``d * W1[j, b] * W2[i, j]`` costs one batch multiply, not two;
- ``XLA: ...``: the entries' program compiled with an XLA CPU option alone (``entries only``
  and ``kernel(X, ps)`` compile with symkern's own choice: ``symkern.kernels.options``).

The conditional of ``shared sums materialized`` holds two identical branches, so its static
counts hold its work twice; one branch runs.
"""

from __future__ import annotations

import argparse
import ast
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import jax
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

import workloads  # noqa: E402
from compare import ADAPTERS, round_robin  # noqa: E402

import symkern as sk  # noqa: E402
import symkern.batching.build as build_module  # noqa: E402
import symkern.codegen.materialize as materialize  # noqa: E402
from symkern.codegen.operations import count_and_reads  # noqa: E402

#: a shared value of this many operations or more is materialized by the variant
SHARED_SUM_OPERATIONS = 8
XLA_OPTIONS = {"XLA: prefer_vector_width=256": {"xla_cpu_prefer_vector_width": 256},
               "XLA: prefer_vector_width=512": {"xla_cpu_prefer_vector_width": 512},
               "XLA: enable_fast_math": {"xla_cpu_enable_fast_math": True}}
ARITHMETIC = ("multiply", "add", "subtract", "tanh")


def hlo_summary(text: str) -> str:
    """Fusions, batch-shaped arithmetic and the largest fusion's arithmetic in optimized HLO."""
    arithmetic, largest = Counter(), 0
    for computation in re.split(r"\n(?=\S)", text):
        count = 0
        for line in computation.splitlines()[1:]:
            match = re.search(r"=\s*f32\[(\d[^\]]*)\]\S*\s+([\w-]+)\(", line)
            if match and match.group(2) in ARITHMETIC:
                arithmetic[match.group(2)] += 1
                count += 1
        if computation.startswith("%fused"):
            largest = max(largest, count)
    fusions = len(re.findall(r" fusion\(", text))
    return (f"{fusions} fusions, {sum(arithmetic.values())} batch arithmetic "
            f"({', '.join(f'{k} {arithmetic[k]}' for k in ARITHMETIC)}), largest fusion {largest}")


def _batched_names(function: ast.FunctionDef, data_names: list[str]) -> set[str]:
    batched = set(data_names)
    for statement in function.body:
        if isinstance(statement, ast.Assign) and count_and_reads(statement.value)[1] & batched:
            batched.update(t.id for t in statement.targets if isinstance(t, ast.Name))
    return batched


class _ParameterFactorsFirst(ast.NodeTransformer):
    """`a * p * q` with `a` batched and `p`, `q` not → `a * (p * q)`."""

    def __init__(self, batched: set[str]) -> None:
        self.batched = batched

    def _is_batched(self, node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id in self.batched for n in ast.walk(node))

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:  # noqa: N802 - ast's visitor name
        self.generic_visit(node)
        if not isinstance(node.op, ast.Mult):
            return node
        factors: list[ast.expr] = []

        def flatten(current: ast.expr) -> None:
            if isinstance(current, ast.BinOp) and isinstance(current.op, ast.Mult):
                flatten(current.left)
                flatten(current.right)
            else:
                factors.append(current)

        flatten(node)
        batched = [f for f in factors if self._is_batched(f)]
        constant = [f for f in factors if not self._is_batched(f)]
        if len(constant) < 2 or not batched:
            return node

        def product(items: list[ast.expr]) -> ast.expr:
            out = items[0]
            for item in items[1:]:
                out = ast.BinOp(out, ast.Mult(), item)
            return out

        return ast.BinOp(product(batched), ast.Mult(), product(constant))


def build_variant(wl, name: str):
    """`build_function` of the workload with the variant's change patched in for the build."""
    costly, materialize_shared = materialize.is_costly, build_module.materialize_shared

    def shared_sums_too(node, batched):
        if costly(node, batched):
            return True
        count, reads = count_and_reads(node)
        return count >= SHARED_SUM_OPERATIONS and bool(reads & batched)

    def factors_first(module, data_names):
        function = module.body[0]
        module = _ParameterFactorsFirst(_batched_names(function, data_names)).visit(module)
        ast.fix_missing_locations(module)
        return materialize_shared(module, data_names) or module

    if name == "shared sums materialized":
        materialize.is_costly = shared_sums_too
    elif name == "parameter factors first":
        build_module.materialize_shared = factors_first
    try:
        return sk.build_function(wl.eqs, wl.inputs, params=wl.params)
    finally:
        materialize.is_costly, build_module.materialize_shared = costly, materialize_shared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--workload", default="jac-4-16-16-4")
    parser.add_argument("--no-sympy2jax", action="store_true")
    args = parser.parse_args()
    wl = workloads.build(args.workload)
    X = wl.sample(args.batch, seed=1)
    X32 = jax.device_put(X.astype(np.float32))
    ps = jax.tree_util.tree_map(lambda v: jax.device_put(np.asarray(v, np.float32)),
                                wl.param_values)
    calls, summaries, builds = {}, {}, {}
    reference = None

    def blocking(call):
        return lambda: jax.block_until_ready(call())

    for name in ("kernel(X, ps)", "shared sums materialized", "parameter factors first"):
        start = time.perf_counter()
        kernel = build_variant(wl, "" if name == "kernel(X, ps)" else name)
        jax.block_until_ready(kernel(X32[:1024], ps))
        builds[name] = time.perf_counter() - start
        out = np.asarray(kernel(X32, ps))
        if reference is None:
            reference, base = out, kernel
        else:
            print(f"{name}: max abs diff to kernel(X, ps) {np.max(np.abs(out - reference)):.1e}")
        prepared = kernel.prepare((X32, ps))
        summaries[name] = hlo_summary(
            kernel._compute_top.lower(*prepared).compile().as_text())
        calls[name] = blocking(lambda kernel=kernel: kernel(X32, ps))
    prepared = base.prepare((X32, ps))
    calls["entries only"] = blocking(lambda: base._compute_top(*prepared))
    lowered = base._compute_jitted.lower(*prepared)
    for name, options in XLA_OPTIONS.items():
        compiled = lowered.compile(compiler_options=options)
        summaries[name] = hlo_summary(compiled.as_text())
        calls[name] = blocking(lambda compiled=compiled: compiled(*prepared))
    if not args.no_sympy2jax:
        tool = ADAPTERS["sympy2jax"](wl)
        start = time.perf_counter()
        tool.build()
        data, tool_ps = tool.prepare(X), tool.params(wl.param_values)
        jax.block_until_ready(tool.call(data[:1024], tool_ps))
        builds["sympy2jax"] = time.perf_counter() - start
        summaries["sympy2jax"] = hlo_summary(tool.fn.lower(data, tool_ps).compile().as_text())
        calls["sympy2jax"] = blocking(lambda: tool.call(data, tool_ps))
    for call in calls.values():
        call()
    times = round_robin(calls, args.rounds)
    print(f"\njax {jax.__version__}, {args.workload}, batch {args.batch:,}, float32, "
          f"median of {args.rounds} interleaved rounds\n")
    print("| variant | M samples/s | first result at 1,024 (s) | optimized HLO of the entries |")
    print("|---|---:|---:|---|")
    for name, seconds in times.items():
        rate = args.batch / statistics.median(seconds) / 1e6
        first = f"{builds[name]:.1f}" if name in builds else "–"
        print(f"| {name} | {rate:.2f} | {first} | {summaries.get(name, 'as kernel(X, ps)')} |")


if __name__ == "__main__":
    main()
