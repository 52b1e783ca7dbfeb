"""A batch of small linear systems: the C solve against `jnp.linalg.solve` and NumPy's solve.

Usage: python benchmarks/experiments/c_solve.py [--sizes 2,6,10,18,32,64,128]
                                                [--batch 100000] [--rounds 7]
                                                [--dtypes float64,float32] [--general]

For each size n and dtype: `--batch` random systems `A x = b` (A standard normal, b one
column), solved by symkern.kernels.c_loop.solve (the loop symkern.codegen.c_solve prints,
jitted; sizes above `SOLVE_UP_TO` are measured with the bound lifted), by `jnp.linalg.solve`
(jitted) and by `np.linalg.solve`, interleaved: the median of `--rounds` calls each, in ms,
the C solve's first call (compiling its library), and its largest error relative to NumPy's
float64 solve, scaled by 1 + |x|. `--general` also times the C solve's general loop (sizes
read at run time) on the sizes it otherwise unrolls (`UNROLLED_UP_TO`), as `c-general`.
docs/design/matrix-expressions.md, "A solve per sample", quotes it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,6,10,18,32,64,128")
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dtypes", default="float64,float32")
    parser.add_argument("--general", action="store_true")
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    from symkern.codegen import c_solve as printer
    from symkern.kernels import c_loop

    c_loop.SOLVE_UP_TO = max(map(int, args.sizes.split(",")))  # measured past the bound too
    c_solve, jax_solve = jax.jit(c_loop.solve), jax.jit(jnp.linalg.solve)

    def general_solve(a, b):
        # the same handler printed without its unrolled copies (its own library and
        # target), for every trace of this function
        unrolled, printer.UNROLLED_UP_TO = printer.UNROLLED_UP_TO, 0
        try:
            return c_loop.solve(a, b)
        finally:
            printer.UNROLLED_UP_TO = unrolled

    general = jax.jit(general_solve) if args.general else None
    for dtype in args.dtypes.split(","):
        for n in map(int, args.sizes.split(",")):
            rng = np.random.default_rng(n)
            a = rng.standard_normal((args.batch, n, n)).astype(dtype)
            b = rng.standard_normal((args.batch, n, 1)).astype(dtype)
            device = (jax.device_put(a), jax.device_put(b))
            began = time.perf_counter()
            x = np.asarray(jax.block_until_ready(c_solve(*device)))
            first = time.perf_counter() - began
            want = np.linalg.solve(a.astype(np.float64), b.astype(np.float64))
            error = float(np.max(np.abs(x - want) / (1 + np.abs(want))))
            jax.block_until_ready(jax_solve(*device))
            tools = {"c": (c_solve, device), "jnp": (jax_solve, device),
                     "numpy": (np.linalg.solve, (a, b))}
            if general is not None:
                tools["c-general"] = (general, device)
            times: dict[str, list[float]] = {name: [] for name in tools}
            for _ in range(args.rounds):
                for name, (tool, inputs) in tools.items():
                    began = time.perf_counter()
                    jax.block_until_ready(tool(*inputs))
                    times[name].append(time.perf_counter() - began)
            cells = "  ".join(f"{name} {statistics.median(t) * 1e3:.1f} ms"
                              for name, t in times.items())
            print(f"{dtype} {n}x{n}: {cells}  (C first call {first:.1f} s, error {error:.1e})",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
