"""The mechanics models' solved right-hand side, M(q)^-1 f(q, u), against a batched solve.

Usage: python benchmarks/solved_rhs.py [--models 2,4,8] [--batch 100000] [--rounds 15]
                                       [--dtypes float64,float32] [--cpu-memory system|reuse]
                                       [--out benchmarks/results/solved_rhs.json]

`n_link_pendulum_on_cart(n)`'s `mass_matrix_full` M and `forcing_full` f (the same
equations as `compare.py --peers`' nlink-n workloads). A user of symkern writes the solve as
a matrix expression, `MatMul(Inverse(M), f)`: the kernel computes M's and f's entries for
every sample and solves the batch of systems with `jnp.linalg.solve` (the matrix expression
stays an array operation, docs/design/matrix-expressions.md); `symkern-c`, built with
`BuildOptions(cpu_loop="c")`, solves each sample's system in a C loop instead. The peers compute the same
entries and solve as their users would:

  numpy-solve   lambdify (NumPy, `cse=True`) of M's and f's entries, stacked into
                `(batch, k, k)` and `(batch, k, 1)` arrays, `np.linalg.solve`
  jax-solve     lambdify (JAX) of the same entries, stacked and solved with
                `jnp.linalg.solve`, the whole function under `jax.jit`

each in float64 and float32 (data, parameters and the solve in that dtype). All tools run in
one process, interleaved: the median of `--rounds` calls at `--batch` samples, as samples/s,
and each tool's build (to its first result at 1,024 samples). Every result is checked against
NumPy's float64 solve. The ratios are symkern's and symkern-c's over the best peer of the
same dtype.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

DTYPES = ("float64", "float32")
TOLERANCE = {"float64": 1e-9, "float32": 2e-3}


def equations(n: int) -> tuple[Any, Any, list, dict, dict]:
    """M, f, the states, the parameter symbols and their values of nlink-n."""
    import workloads

    wl = workloads.nlink_pendulum(n)
    mass, forcing = wl.eqs
    return mass, forcing, wl.inputs, wl.params, wl.param_values


class Symkern:
    """`MatMul(Inverse(M), f)` as one kernel (the default XLA program)."""

    cpu_loop = "xla"

    def __init__(self, mass, forcing, states, params, dtype: str) -> None:
        import sympy as sp

        import symkern as sk

        self.dtype = dtype
        expr = sp.MatMul(sp.Inverse(sp.ImmutableMatrix(mass)), sp.ImmutableMatrix(forcing))
        self.kernel = sk.build_function(expr, states, params=params, dtype=dtype,
                                        options=sk.BuildOptions(cpu_loop=self.cpu_loop))

    def prepare(self, X, values) -> tuple:
        import jax
        import numpy as np

        return (jax.device_put(X.astype(self.dtype)),
                {k: np.asarray(v, self.dtype) for k, v in values.items()})

    def __call__(self, X, ps) -> Any:
        return self.kernel(X, ps)


class SymkernC(Symkern):
    """The same kernel with `BuildOptions(cpu_loop="c")`: each sample's system solved by a
    C loop (symkern.codegen.c_solve)."""

    cpu_loop = "c"


class NumpySolve:
    """lambdify (NumPy) of the entries, stacked and solved with `np.linalg.solve`."""

    modules = "numpy"

    def __init__(self, mass, forcing, states, params, dtype: str) -> None:
        import sympy as sp

        self.dtype = dtype
        self.k = mass.rows
        self.symbols = [params[name] for name in sorted(params)]
        # a list of entries, not the Matrix: a Matrix with constant entries builds a ragged
        # array (sympy#5642)
        self.f = sp.lambdify((states, self.symbols), list(mass) + list(forcing),
                             modules=self.modules, cse=True)

    def prepare(self, X, values) -> tuple:
        import numpy as np

        return (np.ascontiguousarray(X.T.astype(self.dtype)),
                np.asarray([values[s.name] for s in self.symbols], self.dtype))

    def __call__(self, columns, ps) -> Any:
        import numpy as np

        entries = self.f(columns, ps)
        n, k = columns.shape[1], self.k
        matrices = np.empty((n, k * k), self.dtype)
        vectors = np.empty((n, k), self.dtype)
        for index, entry in enumerate(entries[:k * k]):
            matrices[:, index] = entry
        for index, entry in enumerate(entries[k * k:]):
            vectors[:, index] = entry
        return np.linalg.solve(matrices.reshape(n, k, k), vectors[..., None])[..., 0]


class JaxSolve(NumpySolve):
    """lambdify (JAX) of the entries, stacked and solved with `jnp.linalg.solve`, jitted."""

    modules = "jax"

    def __init__(self, mass, forcing, states, params, dtype: str) -> None:
        import jax
        import jax.numpy as jnp

        super().__init__(mass, forcing, states, params, dtype)
        entries, k = self.f, self.k

        def solve(columns, ps):
            values = entries(columns, ps)
            n = columns.shape[1]
            stacked = jnp.stack([jnp.broadcast_to(jnp.asarray(v, columns.dtype), (n,))
                                 for v in values], axis=1)
            return jnp.linalg.solve(stacked[:, :k * k].reshape(n, k, k),
                                    stacked[:, k * k:, None])[..., 0]

        self.jitted = jax.jit(solve)

    def prepare(self, X, values) -> tuple:
        import jax

        return tuple(jax.device_put(a) for a in super().prepare(X, values))

    def __call__(self, columns, ps) -> Any:
        return self.jitted(columns, ps)


TOOLS = {"symkern": Symkern, "symkern-c": SymkernC, "numpy-solve": NumpySolve,
         "jax-solve": JaxSolve}
#: the tools whose ratio over the best peer is reported
OURS = ("symkern", "symkern-c")


def block(value: Any) -> Any:
    import jax

    return jax.block_until_ready(value)


def measure(n: int, batch: int, rounds: int, dtypes: tuple[str, ...] = DTYPES) -> dict:
    import numpy as np

    mass, forcing, states, params, values = equations(n)
    rng = np.random.default_rng(0)
    X = rng.uniform(-1.5, 1.5, (batch, len(states)))
    reference = NumpySolve(mass, forcing, states, params, "float64")
    want = reference(*reference.prepare(X, values))
    tools, arguments, rows = {}, {}, {}
    from symkern.kernels.c_loop import compiler

    chosen = {name: cls for name, cls in TOOLS.items()
              if name != "symkern-c" or compiler() is not None}  # the C solve needs g++
    for dtype in dtypes:
        for name, cls in chosen.items():
            label = f"{name}-{dtype}"
            began = time.perf_counter()
            tool = cls(mass, forcing, states, params, dtype)
            block(tool(*tool.prepare(X[:1024], values)))
            build = time.perf_counter() - began
            args = tool.prepare(X, values)
            got = np.asarray(block(tool(*args)), np.float64)
            error = float(np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))))
            if not error <= TOLERANCE[dtype]:
                raise AssertionError(f"{label}: relative error {error:.2e} from NumPy's float64 "
                                     f"solve, above {TOLERANCE[dtype]:.0e}")
            tools[label], arguments[label] = tool, args
            rows[label] = {"tool": name, "dtype": dtype, "build_s": round(build, 3),
                           "max_rel_error": error}
    times: dict[str, list[float]] = {label: [] for label in tools}
    for _ in range(rounds):
        for label, tool in tools.items():
            began = time.perf_counter()
            block(tool(*arguments[label]))
            times[label].append(time.perf_counter() - began)
    for label, row in rows.items():
        row["samples_per_s"] = batch / statistics.median(times[label])
    ratios = {}
    for dtype in dtypes:
        peers = {label: row for label, row in rows.items()
                 if row["dtype"] == dtype and row["tool"] not in OURS}
        best = max(peers, key=lambda label: peers[label]["samples_per_s"])
        ratios[dtype] = {"best_peer": rows[best]["tool"]}
        for ours in (o for o in OURS if o in chosen):
            ratios[dtype][ours] = (rows[f"{ours}-{dtype}"]["samples_per_s"]
                                   / rows[best]["samples_per_s"])
    return {"model": f"nlink-{n}", "size": mass.rows, "tools": rows, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="2,4,8")
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--cpu-memory", choices=("system", "reuse"), default="system")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    import symkern as sk

    if args.cpu_memory == "reuse":
        sk.reuse_cpu_memory()  # before JAX's backend starts
    import jax

    jax.config.update("jax_enable_x64", True)
    results = {"platform": platform.platform(), "jax": jax.__version__, "batch": args.batch,
               "rounds": args.rounds, "cpu_memory": args.cpu_memory, "models": []}
    for n in map(int, args.models.split(",")):
        dtypes = tuple(args.dtypes.split(","))
        row = measure(n, args.batch, args.rounds, dtypes)
        results["models"].append(row)
        for dtype in dtypes:
            cells = "  ".join(f"{t['tool']} {t['samples_per_s'] / 1e6:.2f} M/s ({t['build_s']:.1f} s)"
                              for t in row["tools"].values() if t["dtype"] == dtype)
            ratio = row["ratios"][dtype]
            over = "  ".join(f"{ours} / {ratio['best_peer']} {ratio[ours]:.2f}"
                             for ours in OURS if ours in ratio)
            print(f"{row['model']} ({row['size']}x{row['size']}) {dtype}: {cells}  {over}",
                  flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
