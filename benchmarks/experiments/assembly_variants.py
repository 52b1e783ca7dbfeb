"""How a kernel's outputs are assembled, at batch 100,000: one process, interleaved medians.

Usage: python benchmarks/experiments/assembly_variants.py [workload ...]

Variants of the same symkern kernel (M samples/s):
- ``current``: ``kernel(X, ps)`` — above 1,024 samples, the entries' executable, then the
  assembly executable;
- ``entries-only``: the entries' executable alone (what sympy2jax returns: a list);
- ``fused-stack``: one executable, entries stacked inside (the ANCHORS.md fusion trap);
- ``dus``: one executable writing each entry into its column with dynamic_update_slice;
- ``barrier``: one executable, ``lax.optimization_barrier`` on the entries, then a stack;
- ``stack0-T``: one executable, entries stacked on a leading axis, then transposed.
Every variant is checked against ``kernel(X, ps)`` first.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import compare  # noqa: E402
import workloads  # noqa: E402

BATCH = 100_000


def variants(kernel, prepared):
    def dus(*prepared):
        entries = kernel._compute(*prepared)
        out = jnp.zeros(entries[0].shape + (len(entries),), kernel.dtype)
        for j, entry in enumerate(entries):
            out = lax.dynamic_update_slice(out, entry[:, None], (0, j))
        return out

    def barrier(*prepared):
        return jnp.stack(lax.optimization_barrier(kernel._compute(*prepared)), axis=-1)

    def stack_transposed(*prepared):
        return jnp.stack(kernel._compute(*prepared), axis=0).T

    jitted = {name: jax.jit(f) for name, f in
              (("dus", dus), ("barrier", barrier), ("stack0-T", stack_transposed))}
    calls = {"entries-only": lambda: kernel._compute_jitted(*prepared),
             "fused-stack": lambda: kernel._jitted(*prepared)}
    calls.update({name: (lambda j=j: j(*prepared)) for name, j in jitted.items()})
    return calls


def columns(out) -> np.ndarray:
    """Every leaf of a result as columns of one (batch, entries) array."""
    return np.concatenate([np.asarray(leaf).reshape(BATCH, -1)
                           for leaf in jax.tree_util.tree_leaves(out)], axis=1)


def main(names: list[str]) -> None:
    for name in names:
        wl = workloads.build(name)
        tool = compare.ADAPTERS["symkern"](wl)
        tool.build()
        kernel = tool.kernel
        X = tool.prepare(wl.sample(BATCH, seed=1))
        ps = tool.params(wl.param_values)
        prepared = kernel.prepare((X, ps))
        calls = {"current": lambda k=kernel, x=X, p=ps: k(x, p), **variants(kernel, prepared)}
        reference = columns(kernel(X, ps))
        for label, call in calls.items():
            if label != "entries-only":
                got = columns(call())
                np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5, err_msg=label)
        times: dict[str, list[float]] = {label: [] for label in calls}
        for _ in range(7):
            for label, call in calls.items():
                start = time.perf_counter()
                jax.block_until_ready(call())
                times[label].append(time.perf_counter() - start)
        print(name, " ".join(f"{label}={BATCH / statistics.median(t) / 1e6:.1f}M"
                             for label, t in times.items()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["net-2-3-2", "jac-2-3-2", "net-4-16-16-4", "pendulum"])
