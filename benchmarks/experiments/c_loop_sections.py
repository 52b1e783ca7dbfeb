"""The C loop's sections: one workload's loop printed whole and in sections of several sizes,
each built and timed in one process.

Usage: python benchmarks/experiments/c_loop_sections.py [--batch 100000] [--rounds 11]
                                                        [--workloads shape-wide-sum-1e3,...]
                                                        [--dtypes float32,float64]
                                                        [--sections whole,default,4000,1500]

A block of the C loop (symkern.codegen.c_loop) computes every statement of the body for
`BLOCK` samples in one vectorized loop. Above `SECTIONS_ABOVE_OPERATIONS` operations it is
split into sections of at most `SECTION_OPERATIONS`, a noinline function each, the values a
later section reads passing through a row of `V`. g++'s time on one function grows faster
than its length, so the sections bound the build; the values through `V` are a store and a
load each. For each workload and dtype the kernel is built in each way (`whole`: never
split; `default`: the module's thresholds; a number N: sections of at most N operations
whatever the body's size), timed from the start of `build_function` to its return (printing
and g++), then the kernels are called round-robin at the batch (freed memory reused, both
threads). Prints the sections, the build seconds, the median ms a call, each one's time over
the first's, and whether the results are the same bits as the first's. Needs g++ or clang++
and an x86-64 CPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

from one_pass import interleaved_ms, start_process  # noqa: E402  (the same timing)

DEFAULT = "shape-wide-sum-1e3,shape-deep-nest-1e3,nlink-8,jac-4-16-16-4"


def measure(name: str, dtype: str, sections: list[str], batch: int, rounds: int) -> list[str]:
    import jax
    import numpy as np
    import workloads

    import symkern as sk
    from symkern.codegen import c_loop as printing

    wl = workloads.build(name)
    X = jax.device_put(wl.sample(batch).astype(dtype))
    ps = jax.tree_util.tree_map(lambda v: np.asarray(v, dtype), wl.param_values)
    kernels, builds, counts = {}, {}, {}
    default = printing.SECTIONS_ABOVE_OPERATIONS, printing.SECTION_OPERATIONS
    try:
        for label in sections:
            if label == "whole":
                printing.SECTIONS_ABOVE_OPERATIONS = 10**18
            elif label != "default":
                printing.SECTIONS_ABOVE_OPERATIONS, printing.SECTION_OPERATIONS = 0, int(label)
            began = time.perf_counter()
            kernels[label] = sk.build_function(wl.eqs, wl.inputs, params=wl.params, dtype=dtype,
                                               options=sk.BuildOptions(cpu_loop="c"))
            builds[label] = time.perf_counter() - began
            source = kernels[label].program.printed.source
            counts[label] = max(1, source.count("SK_SECTION int sk_section_"))
    finally:
        printing.SECTIONS_ABOVE_OPERATIONS, printing.SECTION_OPERATIONS = default
    results = {label: [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(k(X, ps))]
               for label, k in kernels.items()}
    first = results[sections[0]]
    ms = interleaved_ms(kernels, (X, ps), rounds)
    lines = []
    for label in sections:
        same = all(np.array_equal(a, b, equal_nan=True)
                   for a, b in zip(first, results[label], strict=True))
        lines.append(f"{name:22s} {dtype:8s} {label:>6s}: {counts[label]:3d} section(s)  build "
                     f"{builds[label]:6.1f} s  {ms[label]:8.2f} ms ({ms[label] / ms[sections[0]]:.2f})"
                     f"  same bits: {same}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--workloads", default=DEFAULT)
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--sections", default="whole,default,4000,1500")
    args = parser.parse_args()
    start_process()
    sections = args.sections.split(",")
    print(f"ms a call at {args.batch:,} samples, median of {args.rounds} interleaved rounds "
          f"(time over {sections[0]}'s)")
    for name in args.workloads.split(","):
        for dtype in args.dtypes.split(","):
            for line in measure(name, dtype, sections, args.batch, args.rounds):
                print(line, flush=True)


if __name__ == "__main__":
    main()
