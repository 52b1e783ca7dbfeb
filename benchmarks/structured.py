"""Structured networks against hand-written jax.jit: build time and throughput, by width.

Usage: python benchmarks/structured.py [--widths 8 32 128 256] [--repeats 5]
                                        [--write docs/_structured_figures.md]

Network: in 8 → w → w → out 8, tanh, float32. Three workloads, each against the hand-written
equivalent (jax.jit of `net.apply`, of `vmap(jacfwd)`, of `vmap(grad)` of the per-sample
squared loss):

* build: a fresh kernel's first call (SymPy, rules, trace, lower, XLA compile, run) at batch
  1024, against a fresh `jax.jit`'s first call; the median of `--repeats` fresh builds each;
* throughput: samples/s at batch 100,000 (median of 3×`--repeats` interleaved calls). Per-sample
  parameter gradients of width 256 are 280 KB a sample (26 GB at 100k), so the gradient's
  batch is capped at what fits in GRADIENT_BYTES of output; the table says which batch ran.

Targets (the issue): build ≤ 2× hand-written, throughput ≥ 0.67× hand-written.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import sympy as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from symkern.batching.structured import build_structured_function  # noqa: E402
from symkern.symbolic.networks import Chain, Dense  # noqa: E402
from symkern.symbolic.structured import StructuredNetwork  # noqa: E402

BATCH_BUILD = 1024
BATCH_RUN = 100_000
GRADIENT_BYTES = 1 << 30


def network(width: int) -> Chain:
    return Chain(Dense(8, width, "tanh"), Dense(width, width, "tanh"), Dense(width, 8, "tanh"))


def params32(net: Chain) -> dict:
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), net.init_params(seed=0))


def block(tree):
    return jax.tree_util.tree_map(lambda a: a.block_until_ready(), tree)


def handwritten(net: Chain, workload: str):
    """A fresh jitted hand-written function (a new closure: a real compile each time)."""
    def apply(x, ps):
        return net.apply(x, ps)

    if workload == "output":
        return jax.jit(lambda X, Y, ps: apply(X, ps))
    if workload == "jacobian":
        return jax.jit(lambda X, Y, ps: jax.vmap(jax.jacfwd(lambda x: apply(x, ps)))(X))

    def loss(ps, x, y):
        return jnp.sum((apply(x, ps) - y) ** 2)
    return jax.jit(lambda X, Y, ps: jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(ps, X, Y))


def structured(net: Chain, workload: str):
    """A fresh structured kernel, built from SymPy: returns a callable (X, Y, ps)."""
    snn = StructuredNetwork(net)
    if workload == "output":
        kernel = build_structured_function(snn.output, snn, dtype="float32")
        return lambda X, Y, ps: kernel(X, ps)
    if workload == "jacobian":
        kernel = build_structured_function(snn.output.jacobian(snn.input), snn, dtype="float32")
        return lambda X, Y, ps: kernel(X, ps)
    y = sp.Matrix(8, 1, lambda i, _: sp.Symbol(f"y{i}"))
    loss = sum((snn.output[i] - y[i]) ** 2 for i in range(8))
    kernel = build_structured_function(snn.parameter_gradient(loss), snn, y, dtype="float32")
    return lambda X, Y, ps: kernel(X, Y, ps)


def build_time(make, net: Chain, workload: str, X, Y, ps) -> float:
    start = time.perf_counter()
    block(make(net, workload)(X, Y, ps))
    return time.perf_counter() - start


def throughputs(functions, X, Y, ps, repeats: int) -> list[float]:
    """Samples/s of each function: calls interleaved, median of `repeats` each (a shared,
    loaded machine slows both alike; a best-of would reward whichever got a quiet moment)."""
    times: list[list[float]] = [[] for _ in functions]
    for function in functions:
        block(function(X, Y, ps))
    for _ in range(repeats):
        for k, function in enumerate(functions):
            start = time.perf_counter()
            block(function(X, Y, ps))
            times[k].append(time.perf_counter() - start)
    return [X.shape[0] / statistics.median(t) for t in times]


def gradient_batch(width: int) -> int:
    per_sample = 4 * (8 * width + width + width * width + width + width * 8 + 8)
    return int(min(BATCH_RUN, GRADIENT_BYTES // (2 * per_sample)))


def run(widths: list[int], repeats: int) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    jax.jit(lambda x: x + 1)(1.0).block_until_ready()  # JAX's own start-up, outside every figure
    for width in widths:
        net = network(width)
        ps = params32(net)
        for workload in ("output", "jacobian", "gradient"):
            Xb = rng.normal(size=(BATCH_BUILD, 8)).astype(np.float32)
            Yb = rng.normal(size=(BATCH_BUILD, 8)).astype(np.float32)
            built_s, built_h = [], []
            for _ in range(repeats):  # interleaved, so machine load hits both alike
                built_h.append(build_time(handwritten, net, workload, Xb, Yb, ps))
                built_s.append(build_time(structured, net, workload, Xb, Yb, ps))
            batch = gradient_batch(width) if workload == "gradient" else BATCH_RUN
            X = jnp.asarray(rng.normal(size=(batch, 8)).astype(np.float32))
            Y = jnp.asarray(rng.normal(size=(batch, 8)).astype(np.float32))
            hand, ours = handwritten(net, workload), structured(net, workload)
            check = jax.tree_util.tree_map(
                lambda a, b: float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30)),
                ours(X[:256], Y[:256], ps), hand(X[:256], Y[:256], ps))
            rate_h, rate_s = throughputs([hand, ours], X, Y, ps, 3 * repeats)
            row = {
                "width": width, "workload": workload, "batch": batch,
                "build_hand": statistics.median(built_h), "build_ours": statistics.median(built_s),
                "rate_hand": rate_h, "rate_ours": rate_s,
                "max_rel_diff": max(jax.tree_util.tree_leaves(check)),
            }
            row["build_ratio"] = row["build_ours"] / row["build_hand"]
            row["rate_ratio"] = row["rate_ours"] / row["rate_hand"]
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


HEADER = ("| width | workload | build: ours / hand (s) | build ratio (≤ 2) | batch | "
          "throughput: ours / hand (samples/s) | throughput ratio (≥ 0.67) | max rel. diff |\n"
          "|---:|---|---|---:|---:|---|---:|---:|")


def _rate(value: float) -> str:
    return f"{value / 1e6:.2f} M" if value >= 1e6 else f"{value / 1e3:.0f} k"


def format_row(row: dict) -> str:
    return (f"| {row['width']} | {row['workload']} | {row['build_ours']:.3f} / {row['build_hand']:.3f} | "
            f"{row['build_ratio']:.2f} | {row['batch']:,} | {_rate(row['rate_ours'])} / "
            f"{_rate(row['rate_hand'])} | {row['rate_ratio']:.2f} | {row['max_rel_diff']:.1e} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[8, 32, 128, 256])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    print(HEADER)
    rows = run(args.widths, args.repeats)
    if args.write:
        lines = [
            "## Structured networks against hand-written jax.jit",
            "",
            f"`python benchmarks/structured.py` — {platform.machine()}, {jax.__version__=}, "
            f"{sp.__version__=}, float32, 8 → w → w → 8 tanh, build at batch {BATCH_BUILD} "
            f"(median of {args.repeats} fresh builds, first call incl. compile), throughput median of "
            f"{3 * args.repeats} interleaved calls. Gradients are per sample (batch + (out, in)), "
            f"so their batch is capped at {GRADIENT_BYTES >> 20} MiB of output.",
            "",
            HEADER,
            *(format_row(row) for row in rows),
            "",
        ]
        args.write.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
