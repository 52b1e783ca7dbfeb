"""symkern's scalar kernels: where the time goes, and what helps.

Usage: python benchmarks/experiments/scalar_kernel_variants.py [WORKLOAD ...] [--batch N]

For each workload (names from benchmarks/workloads.py; default pendulum, net-2-3-2,
net-4-16-16-4, expr-1e3) it builds one symkern kernel and times, interleaved round by
round (so a busy machine slows every variant alike), the same computation as:

- ``call``: ``kernel(X, ps)`` as users call it, this batch shape being the first seen;
- ``call_padded``: the same on a kernel first called at batch 1024, so that this batch
  is padded to its bucket (``symkern.batching.buckets``) and sliced back;
- ``compute``: ``kernel._compute_jitted`` alone (entries as a tuple, no assembly);
- ``fused``: ``kernel._jitted`` (entries stacked inside the same executable);
- ``batch_last``: the per-sample function traced on X.T (rows contiguous), one stack;
- ``batch_last_tuple``: the same, entries returned as a tuple;
- ``chunked``: ``lax.map`` over batch chunks of 4096 (cache-sized working set);
- ``scalar_params``: parameter leaves passed as scalars (one arg per entry);
- ``lambdify_jax``: SymPy's lambdify jax under jit(vmap) (the anchor).

It also prints the optimized-HLO fusion count of each variant and symkern's per-call
overhead (latency split into argument checks, compile-key bookkeeping and dispatch).
Results: one JSON line per workload on stdout.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import sympy as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import workloads  # noqa: E402

import symkern as sk  # noqa: E402


def fusions(jitted, *args) -> int:
    """Number of fusion computations in the optimized HLO (XLA CPU)."""
    text = jitted.lower(*args).compile().as_text()
    return len(re.findall(r"^\s*(?:ROOT )?\S+ = \S+ fusion\(", text, flags=re.M))


def interleaved(variants: dict, rounds: int) -> dict[str, float]:
    """Median seconds per call of each variant, timing them round-robin."""
    times: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():
        jax.block_until_ready(fn())
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def run(name: str, batch: int, rounds: int) -> dict:
    wl = workloads.build(name)
    kernel = sk.build_function(wl.eqs, wl.inputs, params=wl.params)
    ps = jax.tree_util.tree_map(lambda v: jnp.asarray(np.asarray(v, np.float32)), wl.param_values)
    X = jnp.asarray(wl.sample(batch, seed=1).astype(np.float32))
    XT = jnp.asarray(np.ascontiguousarray(np.asarray(X).T))
    prepared = kernel.prepare((X, ps))
    fn = kernel._function
    treedef = kernel.signature.parameter_treedef
    leaves = prepared[2]

    def per_sample_rows(xt, leaves):
        # x1[..., i] on a (n_in, N) array would index the wrong axis: move it to the front
        # by transposing back inside (XLA folds the transpose into the fused reads).
        return fn(xt.T, jax.tree_util.tree_unflatten(treedef, leaves))

    batch_last = jax.jit(lambda xt, leaves: jnp.stack(
        [jnp.broadcast_to(e, (xt.shape[1],)) for e in per_sample_rows(xt, leaves)]))
    batch_last_tuple = jax.jit(lambda xt, leaves: tuple(
        jnp.broadcast_to(e, (xt.shape[1],)) for e in per_sample_rows(xt, leaves)))

    chunk = 4096

    def chunked_body(x, leaves):
        n = x.shape[0] // chunk * chunk
        head = jax.lax.map(lambda c: jnp.stack(kernel._compute((), (c,), leaves), -1),
                           x[:n].reshape(-1, chunk, x.shape[1]))
        return head.reshape(n, -1)

    chunked = jax.jit(chunked_body)
    flat_leaves = [e for leaf in leaves for e in jnp.ravel(leaf)]
    scalar = jax.jit(lambda x, *scalars: kernel._compute(
        (), (x,), tuple(jnp.stack(scalars[o:o + leaf.size]).reshape(leaf.shape)
                        for o, leaf in zip(np.cumsum([0] + [lf.size for lf in leaves])[:-1], leaves,
                                           strict=True))))
    lam = sp.lambdify((wl.inputs, wl.flat_param_symbols()), wl.eqs, modules="jax", cse=True)
    lam_b = jax.jit(jax.vmap(lam, in_axes=(0, None)))
    P = jnp.asarray(wl.flat_param_values().astype(np.float32))

    padded_kernel = sk.build_function(wl.eqs, wl.inputs, params=wl.params)
    padded_kernel(X[:1024], ps)
    variants = {
        "call": lambda: kernel(X, ps),
        "call_padded": lambda: padded_kernel(X, ps),
        "compute": lambda: kernel._compute_jitted(*prepared),
        "fused": lambda: kernel._jitted(*prepared),
        "batch_last": lambda: batch_last(XT, leaves),
        "batch_last_tuple": lambda: batch_last_tuple(XT, leaves),
        "chunked": lambda: chunked(X, leaves),
        "scalar_params": lambda: scalar(X, *flat_leaves),
        "lambdify_jax": lambda: lam_b(X, P),
    }
    secs = interleaved(variants, rounds)
    out = {"workload": name, "batch": batch,
           "throughput_M": {k: round(batch / v / 1e6, 2) for k, v in secs.items()}}
    out["fusions"] = {
        "compute": fusions(kernel._compute_jitted, *prepared),
        "fused": fusions(kernel._jitted, *prepared),
        "batch_last": fusions(batch_last, XT, leaves),
        "lambdify_jax": fusions(lam_b, X, P),
    }
    # ---- per-call overhead at one sample ------------------------------------------------
    x1 = X[0]
    one = kernel.prepare((x1, ps))
    kernel(x1, ps)
    lam_one = jax.jit(lam)
    lat = interleaved({
        "call": lambda: kernel(x1, ps),
        "prepare_only": lambda: kernel.prepare((x1, ps)),
        "compute_jit_only": lambda: kernel._compute_jitted(*one),
        "assemble_jit_only": lambda: kernel._assemble_jitted(kernel._compute_jitted(*one)),
        "fused_jit_only": lambda: kernel._jitted(*one),
        "lambdify_jax_one": lambda: lam_one(x1, P),
    }, 200)
    out["latency_us"] = {k: round(v * 1e6, 1) for k, v in lat.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workloads", nargs="*",
                        default=["pendulum", "net-2-3-2", "net-4-16-16-4", "expr-1e3"])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    for name in args.workloads:
        print(json.dumps(run(name, args.batch, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
