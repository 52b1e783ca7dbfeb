"""A scalar body above the pieces gate, compiled as pieces and as one executable.

Usage: python benchmarks/experiments/pieces_or_whole.py [--batch 100000] [--rounds 12]
                                                        [--workloads shape-products-1e4,...]
                                                        [--whole-first]

Each workload (benchmarks/workloads.py; the random shapes by default) is built twice in one
process, float32, `build_function(..., split=True)` and `split=False`, and each build is timed
to its first result at the batch. A third form is the pieces kernel under `jax.jit`: a call
under a trace sees the whole body, so the pieces become one executable (its compile is timed
from the built kernel). The three are then called in alternation for `--rounds` rounds, and
the median call gives samples/s. For each executable form the optimized HLO's loop fusions
over the batch are counted, with the instructions of the largest and of all of them together
(what XLA copied into several fusions is counted in each). `--whole-first` builds the single
executable first (a build can leave SymPy's caches warm for the next).

`--boundaries` adds two ways of keeping the pieces' boundaries inside one executable, each
traced from the pieces kernel's own piece functions: `barrier`, every piece's live values
through `lax.optimization_barrier`; `cond`, every piece inside a `lax.cond` of two equal
branches (fusion does not cross a branch; the predicate reads the data).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

import workloads  # noqa: E402
from one_pass import interleaved_ms  # noqa: E402


def batch_fusions(hlo: str, batch: int) -> tuple[int, int, int]:
    """(loop fusions over the batch, instructions of the largest, of all of them) in an
    optimized HLO module's text."""
    computations = {}
    for block in re.split(r"\n(?=\S)", hlo):
        match = re.match(r"%?(\S+) ", block)
        if match:
            computations[match.group(1)] = block.count("\n")
    entry = hlo[hlo.index("ENTRY"):]
    sizes = [computations.get(called, 0) for shape, called in
             re.findall(r"= (\S+) fusion\(.*?calls=%?([\w.\-]+)", entry) if f"[{batch}" in shape]
    return len(sizes), max(sizes, default=0), sum(sizes)


def boundaries(kernel, X, ps) -> dict:
    """One executable over the pieces kernel's pieces, their boundaries kept two ways:
    label -> (compiled executable, its arguments)."""
    import jax

    program = kernel._pieces
    const_values, data, parameters = kernel.prepare((X, ps))
    arguments = tuple(kernel.program.arguments(const_values, data, parameters))

    def chained(keep):
        def run(*arguments):
            values: dict = {}
            out: tuple = ()
            for piece, call in zip(program.split.pieces, program._jitted, strict=True):
                out = keep(call, arguments, tuple(values[n] for n in piece.live_in))
                values.update(zip(piece.live_out, out, strict=False))
            return out
        return run

    def barrier(call, arguments, live):
        return jax.lax.optimization_barrier(call(arguments, live))

    def cond(call, arguments, live):
        first = jax.tree_util.tree_leaves(arguments[len(const_values)])[0]
        return jax.lax.cond(first.ravel()[0] > 0, call, call, arguments, live)

    forms = {}
    for label, keep in (("barrier", barrier), ("cond", cond)):
        start = time.perf_counter()
        compiled = jax.jit(chained(keep)).lower(*arguments).compile()
        forms[label] = (compiled, arguments, round(time.perf_counter() - start, 2))
    return forms


def measure(name: str, batch: int, rounds: int, whole_first: bool,
            with_boundaries: bool = False) -> dict:
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
        if not split:  # the same program under jax.jit, for its optimized HLO
            text = jax.jit(lambda d, p, k=kernel: k(d, p)).lower(X, ps).compile().as_text()
            result["whole_fusions"] = batch_fusions(text, batch)
    pieces = kernels["pieces"]
    traced = jax.jit(lambda data, parameters: pieces(data, parameters))
    start = time.perf_counter()
    compiled = traced.lower(X, ps).compile()
    result["traced_compile_s"] = round(time.perf_counter() - start, 2)
    result["traced_fusions"] = batch_fusions(compiled.as_text(), batch)
    kernels["traced"] = compiled
    calls = {label: (lambda k=kernel: k(X, ps)) for label, kernel in kernels.items()}
    if with_boundaries and pieces.form != "pieces":
        result["boundaries"] = f"none: split=True built a {pieces.form} kernel"
    elif with_boundaries:
        for label, (executable, arguments, seconds) in boundaries(pieces, X, ps).items():
            result[f"{label}_compile_s"] = seconds
            if label != "cond":  # the cond form's fusions are in its branches, not the ENTRY
                result[f"{label}_fusions"] = batch_fusions(executable.as_text(), batch)
            calls[label] = lambda e=executable, a=arguments: e(*a)
    for label, ms in interleaved_ms(calls, (), rounds).items():
        result[f"{label}_msamples_s"] = round(batch / ms / 1e3, 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--workloads", default=",".join(workloads.SHAPE_WORKLOADS["1e4"]))
    parser.add_argument("--whole-first", action="store_true")
    parser.add_argument("--boundaries", action="store_true",
                        help="also one executable with the pieces' boundaries kept")
    args = parser.parse_args()
    for name in args.workloads.split(","):
        print(measure(name, args.batch, args.rounds, args.whole_first, args.boundaries),
              flush=True)


if __name__ == "__main__":
    main()
