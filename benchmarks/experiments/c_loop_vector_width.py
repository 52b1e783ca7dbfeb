"""The C loop's vector width: one printed loop compiled at the compiler's preferred width
and at 512 bits, timed in one process.

Usage: python benchmarks/experiments/c_loop_vector_width.py [--batch 100000] [--rounds 21]
                                                            [--workloads pendulum,...]
                                                            [--dtypes float32,float64]
                                                            [--widths native,256,512]

A block of the C loop (symkern.codegen.c_loop) is `BLOCK` samples: one 512-bit vector of the
dtype's numbers. `g++ -march=native` on a CPU with AVX-512 may still prefer 256-bit vectors
(GCC's tuning for most Intel cores does, for their clock under 512-bit instructions), and a
block is then two vectors of every value. For each workload and dtype the kernel's loop is
printed once (`BuildOptions(cpu_loop="c")`) and compiled once per width: `native` with
`symkern.kernels.c_loop.FLAGS` minus any `-mprefer-vector-width`, `W` with
`-mprefer-vector-width=W`, each registered under a name of its own. The loops are called
round-robin through `symkern.kernels.c_loop.call_loop` at the batch (freed memory reused,
both threads); prints median ms a call, each width's time over the first's, and whether the
results are the same bits. Needs g++ or clang++ and an x86-64 CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

from one_pass import interleaved_ms, start_process  # noqa: E402  (the same timing)

DEFAULT = "pendulum,nlink-2,nlink-4,nlink-8,net-4-16-16-4,jac-4-16-16-4"


def _renamed(printed, label: str):
    """`printed` registered under a name of its own (the width in its digest)."""
    digest = hashlib.sha256((printed.digest + label).encode()).hexdigest()[:16]
    symbol = f"symkern_c_loop_{digest}"
    return dataclasses.replace(printed, source=printed.source.replace(printed.symbol, symbol),
                               symbol=symbol, digest=digest)


def measure(name: str, dtype: str, widths: list[str], batch: int, rounds: int) -> str:
    import jax
    import numpy as np
    import workloads

    import symkern as sk
    from symkern.kernels import c_loop as loops

    wl = workloads.build(name)
    kernel = sk.build_function(wl.eqs, wl.inputs, params=wl.params, dtype=dtype,
                               options=sk.BuildOptions(cpu_loop="c"))
    program = kernel.program
    X = jax.device_put(wl.sample(batch).astype(dtype))
    flat = jax.device_put(np.concatenate([np.ravel(np.asarray(v, dtype))
                                          for v in jax.tree_util.tree_leaves(wl.param_values)]))
    base = tuple(flag for flag in loops.FLAGS if not flag.startswith("-mprefer-vector-width"))
    functions = {}
    for width in widths:
        printed = _renamed(program.printed, width)
        loops.FLAGS = base if width == "native" else base + (f"-mprefer-vector-width={width}",)
        loops.compile_loop(printed)

        def call(data, parameters, printed=printed):
            return loops.call_loop(printed, (data,), program._data_shapes, parameters,
                                   program.equations.shapes, data.shape[:1], program.grain,
                                   program.stream_from)

        functions[width] = jax.jit(call)
    results = {w: [np.asarray(leaf) for leaf in f(X, flat)] for w, f in functions.items()}
    first = results[widths[0]]
    same = all(all(np.array_equal(a, b, equal_nan=True) for a, b in zip(first, r, strict=True))
               for r in results.values())
    ms = interleaved_ms(functions, (X, flat), rounds)
    cells = "  ".join(f"{w} {ms[w]:7.2f} ({ms[w] / ms[widths[0]]:.2f})" for w in widths)
    return f"{name:16s} {dtype:8s} {cells}  same bits: {same}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--workloads", default=DEFAULT)
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--widths", default="native,512")
    args = parser.parse_args()
    start_process()
    widths = args.widths.split(",")
    print(f"ms a call at {args.batch:,} samples, median of {args.rounds} interleaved rounds "
          f"(time over {widths[0]}'s)")
    for name in args.workloads.split(","):
        for dtype in args.dtypes.split(","):
            print(measure(name, dtype, widths, args.batch, args.rounds), flush=True)


if __name__ == "__main__":
    main()
