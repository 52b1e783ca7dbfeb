"""What assembling many computed entries into one (batch, n) array costs on XLA's CPU backend.

Usage: python benchmarks/experiments/many_entries.py [--entries 32,100,324] [--batch N]

n entries, each a few multiply-adds of 4 inputs (`a*(i+1) + b*c - d*i`), returned six ways
in one process (each variant's best of 11 calls, ns per entry and sample):
- ``tuple``: the n arrays as they are (what lambdify, sympy2jax and PyTensor hand back);
- ``stack-last``: ``jnp.stack(entries, -1)``, the (batch, n) array a kernel returns;
- ``stack-lead``: ``jnp.stack(entries, 0)``, (n, batch);
- ``lead-in-8s``: stacks of 8 on a leading axis, then one concatenate of the stacks;
- ``update-lead``: each entry written into an (n, batch) buffer with ``.at[i].set``;
- ``tiled-1024``: ``stack-last`` a tile of 1,024 samples at a time (``lax.map``).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _entries(X, n):
    a, b, c, d = X[:, 0], X[:, 1], X[:, 2], X[:, 3]
    return [a * (i + 1) + b * c - d * i for i in range(n)]


def variants(n: int, batch: int) -> dict:
    def update_lead(X):
        out = jnp.zeros((n, X.shape[0]), X.dtype)
        for i, e in enumerate(_entries(X, n)):
            out = out.at[i].set(e)
        return out

    def tiled(X):
        tile = 1024
        out = lax.map(lambda t: jnp.stack(_entries(t, n), -1), X.reshape(-1, tile, 4))
        return out.reshape(-1, n)

    return {
        "tuple": lambda X: tuple(_entries(X, n)),
        "stack-last": lambda X: jnp.stack(_entries(X, n), -1),
        "stack-lead": lambda X: jnp.stack(_entries(X, n), 0),
        "lead-in-8s": lambda X: jnp.concatenate(
            [jnp.stack(_entries(X, n)[i:i + 8], 0) for i in range(0, n, 8)], 0),
        "update-lead": update_lead,
        "tiled-1024": tiled,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", default="32,100,324")
    parser.add_argument("--batch", type=int, default=102_400)
    args = parser.parse_args()
    X = jax.device_put(np.random.default_rng(0).random((args.batch, 4), np.float32))
    for n in map(int, args.entries.split(",")):
        row = []
        for name, f in variants(n, args.batch).items():
            f = jax.jit(f)
            jax.block_until_ready(f(X))
            best = float("inf")
            for _ in range(11):
                start = time.perf_counter()
                jax.block_until_ready(f(X))
                best = min(best, time.perf_counter() - start)
            row.append(f"{name} {best * 1e9 / n / args.batch:.2f}")
        print(f"n={n}: " + ", ".join(row), flush=True)


if __name__ == "__main__":
    main()
