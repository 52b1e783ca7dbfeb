"""Can XLA's CPU backend write a many-entry kernel's outputs in one pass, as a loop per sample does?

Usage: python benchmarks/experiments/one_pass.py [--batch 102400] [--rounds 21]
                                                 [--workloads nlink-2:float64,...]

numba over lambdify's source computes each sample's entries in registers and writes each
once; symkern's program computes every entry as its own array over the batch and then copies
the entries into the `(batch, entries)` output (a concatenate of more than 8 operands is not
fused on XLA's CPU backend). Each variant evaluates the same kernel's entries, in one
process with freed memory reused (`symkern.reuse_cpu_memory`), interleaved, median ms a call:

  kernel       the kernel's own program (its equations' shapes)
  stack        the entries stacked along the last axis, one `(batch, entries)` array
  tree         stacks of at most 8 along the last axis, then along new middle axes, 8 at a
               level: nothing exceeds XLA's limit, so the whole output is one fusion
  entry-major  the entries stacked along a leading axis, then transposed
  tiles-T      `lax.map` over chunks of T samples, each chunk's entries stacked

Each variant's fusions and unfused concatenates in its optimized HLO are printed beside it,
and every variant is checked against `stack`.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

DEFAULT = "nlink-2:float64,nlink-2-nonconstant:float64,nlink-8:float32"
WIDTH = 8


def tree_stack(entries: list, jnp) -> object:
    """(batch, m) from m arrays shaped (batch,): stacks of at most WIDTH at every level."""
    m = len(entries)
    depth = 1
    while WIDTH ** depth < m:
        depth += 1
    padded = list(entries) + [entries[0] * 0] * (WIDTH ** depth - m)
    level = [jnp.stack(padded[i:i + WIDTH], axis=-1) for i in range(0, len(padded), WIDTH)]
    while len(level) > 1:
        level = [jnp.stack(level[i:i + WIDTH], axis=1) for i in range(0, len(level), WIDTH)]
    return level[0].reshape(entries[0].shape[0], -1)[:, :m]


def built(name: str, dtype: str, batch: int) -> tuple:
    """A workload's kernel program, its const args, a batch of data and the parameter
    leaves, on the device: `(program, consts, X, leaves)`."""
    import jax
    import numpy as np
    import workloads

    import symkern as sk

    wl = workloads.build(name)
    kernel = sk.build_function(wl.eqs, wl.inputs, params=wl.params, dtype=dtype)
    X = jax.device_put(wl.sample(batch).astype(dtype))
    leaves = tuple(jax.device_put(np.asarray(v, dtype))
                   for v in jax.tree_util.tree_leaves(wl.param_values))
    return kernel.program, tuple(kernel.const_values), X, leaves


def start_process() -> None:
    """What a measuring process of these experiments does first: freed memory reused (which
    must come before JAX's backend starts, `symkern.reuse_cpu_memory`), then float64 on."""
    import symkern as sk

    sk.reuse_cpu_memory()
    import jax

    jax.config.update("jax_enable_x64", True)


def interleaved_ms(functions: dict, arguments: tuple, rounds: int) -> dict[str, float]:
    """Each of `functions` called on `arguments` in turn for `rounds` rounds: label -> median
    ms a call."""
    import jax

    times: dict[str, list[float]] = {label: [] for label in functions}
    for _ in range(rounds):
        for label, f in functions.items():
            began = time.perf_counter()
            jax.block_until_ready(f(*arguments))
            times[label].append(time.perf_counter() - began)
    return {label: statistics.median(t) * 1e3 for label, t in times.items()}


def measure(name: str, dtype: str, batch: int, rounds: int) -> str:
    """One workload's variants, interleaved: a line of ms a call (fusions/concatenates)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    program, consts, X, leaves = built(name, dtype, batch)

    def entries(data, parameters):
        return list(program.entries(consts, (data,), parameters))

    def tiles(size):
        def run(data, parameters):
            chunks = data.reshape(-1, size, data.shape[-1])
            return lax.map(lambda c: jnp.stack(entries(c, parameters), axis=-1),
                           chunks).reshape(data.shape[0], -1)
        return run

    variants = {
        "kernel": lambda data, parameters: program.evaluate(consts, (data,), parameters),
        "stack": lambda data, parameters: jnp.stack(entries(data, parameters), axis=-1),
        "tree": lambda data, parameters: tree_stack(entries(data, parameters), jnp),
        "entry-major": lambda data, parameters: jnp.stack(entries(data, parameters)).T,
        "tiles-1024": tiles(1024),
        "tiles-4096": tiles(4096),
    }
    jitted = {key: jax.jit(f) for key, f in variants.items()}
    want = np.asarray(jitted["stack"](X, leaves))
    shapes = {}
    for key, f in jitted.items():
        out = f(X, leaves)
        if key != "kernel":
            np.testing.assert_array_equal(np.asarray(out), want)
        text = f.lower(X, leaves).compile().as_text()
        body = text[text.index("ENTRY"):]
        shapes[key] = (body.count(" fusion("), len(re.findall(r"= \S+ concatenate\(", body)))
    ms = interleaved_ms(jitted, (X, leaves), rounds)
    cells = "  ".join(f"{key} {ms[key]:.2f} ({shapes[key][0]}/"
                      f"{shapes[key][1]})" for key in jitted)
    return f"  {name} {dtype}: {cells}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=102_400)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--workloads", default=DEFAULT, help="WORKLOAD:DTYPE, comma-separated")
    args = parser.parse_args(argv)

    start_process()
    print(f"ms a call at {args.batch} samples, median of {args.rounds} interleaved rounds "
          "(fusions / unfused concatenates in the optimized HLO)")
    for item in args.workloads.split(","):
        name, dtype = item.split(":")
        print(measure(name, dtype, args.batch, args.rounds), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
