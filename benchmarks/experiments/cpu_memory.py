"""What a kernel call costs with glibc's allocator as it is and with freed memory reused.

Usage: python benchmarks/experiments/cpu_memory.py [--batch 100000] [--repeats 21]
                                                   [--workloads nlink-4:float32,nlink-8:float64]
                                                   [--cpu-loop c]

XLA's CPU runtime allocates a call's buffers with malloc; glibc maps a large block afresh
and unmaps it when it is freed, so the next call faults its pages in again. Each workload
and dtype runs in a child process per setting, and the child reports the median ms a call
at the batch and the minor page faults a call takes (`getrusage`, a count):

  system        glibc's defaults
  reuse         symkern.reuse_cpu_memory() before anything runs
  reuse-late    the same mallopt settings after JAX's backend has started (what the
                function refuses: XLA's threads already have heaps of their own)

With `--cpu-loop c` the kernels are built with `BuildOptions(cpu_loop="c")`, whose loop
advises the kernel to back its outputs with huge pages (`symkern.kernels.memory.
huge_page_bytes`), and the settings are:

  system        glibc's defaults
  small-pages   glibc's defaults, the loop called without that advice (huge page size 0)
  reuse         symkern.reuse_cpu_memory() before anything runs
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

SETTINGS = ["system", "reuse", "reuse-late"]
C_LOOP_SETTINGS = ["system", "small-pages", "reuse"]
DEFAULT = ("nlink-2:float64,nlink-4:float32,nlink-4:float64,nlink-8:float32,nlink-8:float64,"
           "nlink-4-nonconstant:float64,pendulum:float64")


def _late_settings() -> None:
    """reuse_cpu_memory's mallopt calls, made without its check that the backend is idle."""
    from symkern.kernels import memory

    libc = memory.glibc()
    for parameter, value in ((memory.M_ARENA_MAX, 1),
                             (memory.M_MMAP_THRESHOLD, memory.DEFAULT_UP_TO),
                             (memory.M_TRIM_THRESHOLD, memory.DEFAULT_UP_TO)):
        libc.mallopt(parameter, value)


def child(name: str, dtype: str, setting: str, batch: int, repeats: int, cpu_loop: str) -> dict:
    import symkern as sk
    from symkern.kernels import c_loop

    if setting == "reuse":
        sk.reuse_cpu_memory()
    import jax
    import numpy as np
    import workloads

    jax.config.update("jax_enable_x64", dtype == "float64")
    if setting == "reuse-late":
        jax.devices("cpu")
        _late_settings()
    wl = workloads.build(name)
    if setting == "small-pages":
        c_loop.huge_page_bytes = lambda: 0  # read when the kernel's call is traced
    kernel = sk.build_function(wl.eqs, wl.inputs, params=wl.params, dtype=dtype,
                               options=sk.BuildOptions(cpu_loop=cpu_loop))
    X = jax.device_put(wl.sample(batch, seed=1).astype(dtype))
    ps = jax.tree_util.tree_map(lambda v: jax.device_put(np.asarray(v, dtype)), wl.param_values)
    for _ in range(3):
        jax.block_until_ready(kernel(X, ps))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        jax.block_until_ready(kernel(X, ps))
        times.append(time.perf_counter() - began)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / repeats
    out_bytes = sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(kernel(X, ps)))
    return {"ms": statistics.median(times) * 1e3, "faults": faults,
            "output_pages": out_bytes / 4096}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--workloads", default=DEFAULT, help="WORKLOAD:DTYPE, comma-separated")
    parser.add_argument("--cpu-loop", default="xla", choices=["xla", "c"])
    parser.add_argument("--child", nargs=3, metavar=("WORKLOAD", "DTYPE", "SETTING"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.batch, args.repeats, args.cpu_loop)))
        return 0
    settings = C_LOOP_SETTINGS if args.cpu_loop == "c" else SETTINGS
    print(f"ms a call at {args.batch} samples (median of {args.repeats}) / minor page faults a "
          "call, a child process per setting; output pages = the outputs' 4 KiB pages")
    for item in args.workloads.split(","):
        name, dtype = item.split(":")
        row = {}
        for setting in settings:
            done = subprocess.run([sys.executable, __file__, "--child", name, dtype, setting,
                                   "--batch", str(args.batch), "--repeats", str(args.repeats),
                                   "--cpu-loop", args.cpu_loop],
                                  capture_output=True, text=True, check=True)
            row[setting] = json.loads(done.stdout.strip().splitlines()[-1])
        cells = "  ".join(f"{s} {row[s]['ms']:7.2f} ms / {row[s]['faults']:7.0f}" for s in settings)
        print(f"  {name:20s} {dtype:8s} {cells}  (output pages {row['system']['output_pages']:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
