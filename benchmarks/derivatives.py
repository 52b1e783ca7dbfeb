"""Building symbolic derivatives: symkern's DAG derivatives against CasADi's AD and SymPy.

Run: `python benchmarks/derivatives.py [--sizes 2-3-2 4-16-16-4 8-32-32-8] [--rounds 3]
[--sympy-timeout 120]`. For each tanh network (`workloads.network`, the scalarized output on
SymbolicNetwork's symbols) and each derivative

- `input-jacobian`: d output / d input (forward mode: 4 inputs, 4 outputs at 4-16-16-4),
- `parameter-gradient`: d (sum of the squared outputs) / d every weight and bias (reverse
  mode),

each tool runs in a fresh process (SymPy caches what it built, so a second derivative in one
process would be timed warm), `--rounds` times, and the best is kept:

- **symkern**: `symkern.symbolic.jacobian` / `gradient` of the SymPy expression;
- **CasADi**: the same SymPy expression translated to `SX` (`peers.translate`, the op
  mapping the peers benchmark uses), then `casadi.jacobian` / `casadi.gradient` and a
  `casadi.Function` of the result; both parts are reported, and the ratio is taken against
  their sum, the time from the same SymPy expression to a derivative that can be called;
- **SymPy**: `Matrix.jacobian` / `diff` per parameter, in a subprocess killed after
  `--sympy-timeout` seconds.

Every tool's timed region starts after `gc.collect()`: building the network leaves the heap
owing a full collection, which would otherwise be charged to whichever tool allocates first.
Every derivative is checked at one random point against `jax.jacfwd` / `jax.grad` of a
hand-written JAX network, evaluated in floats over its DAG (`peers.math_ops`; lambdify's
namespace walk does not finish on the 8-32-32-8 gradient). Writes
benchmarks/results/derivatives.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "derivatives.json"
DERIVATIVES = ("input-jacobian", "parameter-gradient")
TOOLS = ("symkern", "casadi", "sympy")


def _network(sizes: tuple[int, ...]):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import workloads

    return workloads.network(sizes, False)


def _reference(wl, derivative: str, x, p):
    """The derivative at (x, p) by JAX's own AD of a hand-written tanh network."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    shapes = []
    for name, layer in wl.make_net().named_layers():
        shapes.append((name, layer.n_out, layer.n_in))

    def unflatten(flat):
        # flat_param_symbols order: pytree order of {name: {"W", "b"}} (keys sorted)
        layers, k = {}, 0
        for name, n_out, n_in in sorted(shapes):
            layers[name] = {}
            for key, count, shape in sorted([("W", n_out * n_in, (n_out, n_in)), ("b", n_out, (n_out,))]):
                layers[name][key] = flat[k:k + count].reshape(shape)
                k += count
        return layers

    def forward(x, flat):
        layers, h = unflatten(flat), x
        for name, _, _ in shapes:
            h = jnp.tanh(layers[name]["W"] @ h + layers[name]["b"])
        return h

    x, p = jnp.asarray(x), jnp.asarray(p)
    if derivative == "input-jacobian":
        return jax.jacfwd(forward)(x, p)
    return jax.grad(lambda q: jnp.sum(forward(x, q) ** 2))(p)


def measure(tool: str, sizes: tuple[int, ...], derivative: str) -> dict:
    """One tool and derivative, in this process."""
    import numpy as np
    import sympy as sp

    wl = _network(sizes)
    outputs = wl.flat_entries()
    inputs, params = list(wl.inputs), wl.flat_param_symbols()
    loss = sp.Add(*[h ** 2 for h in outputs])
    rng = np.random.default_rng(0)
    x, p = rng.uniform(-1, 1, len(inputs)), wl.flat_param_values()
    result: dict = {}
    # a full collection the heap owes from building the network would otherwise land in
    # whichever timed region allocates first (measured: 0.075 s over ~145k objects), so
    # every tool starts from a collected heap, as timeit does
    gc.collect()
    if tool == "symkern":
        from symkern.symbolic import gradient, jacobian

        start = time.perf_counter()
        if derivative == "input-jacobian":
            d = jacobian(sp.Matrix(outputs), inputs)
        else:
            d = gradient(loss, params)
        result["derive_s"] = time.perf_counter() - start
        entries = list(d)
    elif tool == "sympy":
        start = time.perf_counter()
        if derivative == "input-jacobian":
            entries = list(sp.Matrix(outputs).jacobian(inputs))
        else:
            entries = [sp.diff(loss, s) for s in params]
        result["derive_s"] = time.perf_counter() - start
    else:
        import casadi as ca
        from peers import casadi_ops, translate

        start = time.perf_counter()
        xs, ps = ca.SX.sym("x", len(inputs)), ca.SX.sym("p", len(params))
        leaves = {s: xs[k] for k, s in enumerate(inputs)}
        leaves.update({s: ps[k] for k, s in enumerate(params)})
        out = ca.vertcat(*translate(outputs, leaves, casadi_ops(), lambda v: ca.SX(v)))
        translated = time.perf_counter()
        if derivative == "input-jacobian":
            d = ca.jacobian(out, xs)
        else:
            d = ca.gradient(ca.sumsqr(out), ps)
        f = ca.Function("d", [xs, ps], [d])
        result["translate_s"] = translated - start
        result["derive_s"] = time.perf_counter() - translated
        value = np.asarray(f(x, p))
        result["max_error"] = _error(value.reshape(-1), _reference(wl, derivative, x, p))
        return result
    from peers import math_ops, translate

    point = dict(zip(inputs + params, [*map(float, x), *map(float, p)], strict=True))
    value = np.asarray(translate(entries, point, math_ops(), float), float)
    result["max_error"] = _error(value.reshape(-1), _reference(wl, derivative, x, p))
    return result


def _error(value, reference) -> float:
    import numpy as np

    reference = np.asarray(reference, float).reshape(-1)
    return float(np.max(np.abs(value - reference)) / max(1.0, float(np.max(np.abs(reference)))))


def _in_subprocess(tool: str, sizes: str, derivative: str, timeout: float) -> dict:
    command = [sys.executable, __file__, "--one", tool, sizes, derivative]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _best(runs: list[dict]) -> dict:
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[0]
    total = lambda r: r["derive_s"] + r.get("translate_s", 0.0)  # noqa: E731
    best = min(good, key=total)
    return {**best, "rounds": len(good), "total_s": total(best)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["2-3-2", "4-16-16-4", "8-32-32-8"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sympy-timeout", type=float, default=120.0)
    parser.add_argument("--one", nargs=3, metavar=("TOOL", "SIZES", "DERIVATIVE"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.one:
        tool, sizes, derivative = args.one
        print(json.dumps(measure(tool, tuple(int(s) for s in sizes.split("-")), derivative)))
        return
    rows = []
    for sizes in args.sizes:
        for derivative in DERIVATIVES:
            row = {"network": sizes, "derivative": derivative}
            for tool in TOOLS:
                timeout = args.sympy_timeout if tool == "sympy" else 600.0
                rounds = 1 if tool == "sympy" else args.rounds
                # rounds interleaved across tools would need every tool per round; a fresh
                # process per round is what keeps SymPy's cache cold
                row[tool] = _best([_in_subprocess(tool, sizes, derivative, timeout)
                                   for _ in range(rounds)])
            if "error" not in row["symkern"] and "error" not in row["casadi"]:
                row["symkern_over_casadi"] = row["symkern"]["total_s"] / row["casadi"]["total_s"]
                row["symkern_over_casadi_ad"] = row["symkern"]["total_s"] / row["casadi"]["derive_s"]
            print(json.dumps(row), flush=True)
            rows.append(row)
    args.out.write_text(json.dumps({"machine": platform.platform(), "python": sys.version.split()[0],
                                    "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
