"""A vectorizable sin/cos against XLA's, measured.

Usage: python benchmarks/experiments/fast_trig.py [--batch 100000] [--repeats 15]
                                                  [--workloads pendulum,nlink-3,expr-1e3]
                                                  [--float64-workloads pendulum,nlink-2,...]

XLA's CPU backend computes sin and cos by calling the C library once per element, which
costs ~4 ns a float32 element (~9 a float64 one) and keeps the loop around it from being
vectorized; exp and tanh are polynomials it vectorizes. Part 1 times both kinds at 10^7
float32 and float64 elements, and a vectorizable sin/cos written in jax.numpy
(``symkern.codegen.trig.polynomial``: a Cody-Waite reduction by pi/2 in four parts,
Cephes' minimax polynomials) alone and behind a per-element fallback to jnp.sin; and
measures the polynomial's error in ulps against mpmath within its range.

The reduction is exact only for |x| <= FAST_UP_TO, so a kernel that uses the polynomial
needs a fallback. Part 2 builds symkern's kernel for each workload in a child process per
variant and prints M samples/s at the batch and the first call's seconds at 1,024 samples:

  xla         jnp.sin / jnp.cos (SYMKERN_VECTORIZED_TRIG=0), the library call per element
  polynomial  the polynomial everywhere and no fallback: wrong beyond FAST_UP_TO, so only
              an upper bound of what a fallback could keep
  per-site    each call is lax.cond(max |x| > FAST_UP_TO, jnp.sin, polynomial)
  whole       the polynomial returns NaN beyond FAST_UP_TO, and the whole kernel runs again
              with jnp.sin when an output is NaN (one lax.cond around the kernel)
  kept        what symkern does (symkern.codegen.trig): per-site, only for call sites
              of 4,096 elements or more and kernels with at most 32 calls

The first four replace jax.numpy's sin and cos in the child process, with symkern's own
vectorized sin and cos switched off.
"""

from __future__ import annotations

import argparse
import contextvars
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

from symkern.codegen.trig import REDUCTIONS, polynomial  # noqa: E402

#: the float32 polynomial's range (the variants of part 2 replace float32 call sites)
FAST_UP_TO = REDUCTIONS[np.dtype(np.float32)].fast_up_to

VARIANTS = ["xla", "polynomial", "per-site", "whole", "kept"]
XLA_SIN, XLA_COS = jnp.sin, jnp.cos


def polynomial_sin(x):
    """symkern's polynomial sin (symkern.codegen.trig), without its conditional."""
    return polynomial(x, 0)


def polynomial_cos(x):
    return polynomial(x, 1)


def _float32_array(x) -> bool:
    return hasattr(x, "dtype") and x.dtype == np.float32


def _per_site(polynomial, xla):
    def evaluate(x):
        if not _float32_array(x):
            return xla(x)
        return lax.cond(jnp.max(jnp.abs(x)) > FAST_UP_TO, xla, polynomial, x)
    return evaluate


_POISON = contextvars.ContextVar("poison", default=False)


def _poisoned(polynomial, xla):
    def evaluate(x):
        if not _POISON.get() or not _float32_array(x):
            return xla(x)
        return jnp.where(jnp.abs(x) <= FAST_UP_TO, polynomial(x), np.float32(np.nan))
    return evaluate


def _run_again_on_nan(function):
    def evaluate(*args):
        token = _POISON.set(True)
        try:
            out = function(*args)
        finally:
            _POISON.reset(token)
        leaves = jax.tree_util.tree_leaves(out)
        flag = functools.reduce(jnp.logical_or, [jnp.any(jnp.isnan(leaf)) for leaf in leaves])
        return lax.cond(flag, lambda: function(*args), lambda: out)
    return evaluate


def _install(variant: str) -> None:
    """Replace jax.numpy's sin and cos (and, for `whole`, wrap the kernel's body)."""
    if variant == "polynomial":
        jnp.sin, jnp.cos = polynomial_sin, polynomial_cos
    elif variant == "per-site":
        jnp.sin, jnp.cos = _per_site(polynomial_sin, XLA_SIN), _per_site(polynomial_cos, XLA_COS)
    elif variant == "whole":
        from symkern.batching.kernel import Kernel

        jnp.sin, jnp.cos = _poisoned(polynomial_sin, XLA_SIN), _poisoned(polynomial_cos, XLA_COS)
        compute = Kernel._compute  # one guard per program: the fused form's around both
        Kernel._evaluate = lambda self, *a: _run_again_on_nan(
            lambda *b: self.assemble(compute(self, *b)))(*a)
        Kernel._compute = lambda self, *a: _run_again_on_nan(
            lambda *b: compute(self, *b))(*a)


def _best_ns(function, x, repeats: int = 5) -> float:
    jitted = jax.jit(function)
    jitted(x).block_until_ready()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        jitted(x).block_until_ready()
        times.append(time.perf_counter() - began)
    return min(times) / x.size * 1e9


def elementwise(dtype: type) -> None:
    import mpmath

    limit = REDUCTIONS[np.dtype(dtype)].fast_up_to
    x = jnp.asarray(np.random.default_rng(0).uniform(-3, 3, 10_000_000).astype(dtype))
    rows = [("jnp.sin", XLA_SIN), ("jnp.cos", XLA_COS), ("jnp.exp", jnp.exp),
            ("jnp.tanh", jnp.tanh), ("1.5 * x + 0.2", lambda v: v * 1.5 + 0.2),
            ("polynomial sin", polynomial_sin), ("polynomial cos", polynomial_cos),
            ("polynomial sin, jnp.sin beyond the range (select)",
             lambda v: jnp.where(jnp.abs(v) > limit, XLA_SIN(v), polynomial_sin(v)))]
    print(f"ns per {np.dtype(dtype).name} element at 10^7 elements (best of 5):")
    for name, function in rows:
        print(f"  {name:52s} {_best_ns(function, x):6.2f}")
    rng = np.random.default_rng(1)
    samples = np.concatenate([rng.uniform(-limit, limit, 5000),
                              rng.uniform(-10, 10, 5000)]).astype(dtype)
    mpmath.mp.prec = 120
    for name, mine, xla, reference in [("sin", polynomial_sin, XLA_SIN, mpmath.sin),
                                       ("cos", polynomial_cos, XLA_COS, mpmath.cos)]:
        want = np.array([float(reference(mpmath.mpf(float(v)))) for v in samples])
        ulp = np.spacing(np.abs(want).astype(dtype)).astype(np.float64)
        errors = {label: float(np.max(np.abs(np.asarray(f(jnp.asarray(samples)), np.float64)
                                             - want) / ulp))
                  for label, f in (("polynomial", jax.jit(mine)), ("jnp", jax.jit(xla)))}
        print(f"  max error of {name} on |x| <= {limit:g}, in ulps: polynomial "
              f"{errors['polynomial']:.2f}, jnp {errors['jnp']:.2f}")


def child(name: str, variant: str, batch: int, repeats: int, tool_name: str) -> dict:
    import workloads
    from compare import ADAPTERS, _block

    _install(variant)
    wl = workloads.build(name)
    tool = ADAPTERS[tool_name](wl)
    tool.build()
    ps = tool.params(wl.param_values)
    began = time.perf_counter()
    first = _block(tool.call(tool.prepare(wl.sample(1024, seed=2)), ps))
    first_call = time.perf_counter() - began
    big = tool.prepare(wl.sample(batch, seed=1))
    for _ in range(3):
        _block(tool.call(big, ps))
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        _block(tool.call(big, ps))
        times.append(time.perf_counter() - began)
    leaves = [np.asarray(leaf, np.float64) for leaf in jax.tree_util.tree_leaves(first)]
    return {"throughput": batch / statistics.median(times), "first_call_s": first_call,
            "checksum": float(sum(np.nansum(leaf) for leaf in leaves))}


def kernels(names: list[str], batch: int, repeats: int, tool_name: str = "symkern") -> None:
    # float64 kernels: the library and what symkern does (the other variants replace float32
    # call sites only)
    variants = VARIANTS if tool_name == "symkern" else ["xla", "kept"]
    print(f"\n{tool_name} kernels, M samples/s at {batch} (median of {repeats}) and first call "
          "at 1,024 samples, a child process per variant:")
    for name in names:
        row = {}
        for variant in variants:
            env = dict(os.environ)
            env.pop("SYMKERN_VECTORIZED_TRIG", None)
            if variant != "kept":
                env["SYMKERN_VECTORIZED_TRIG"] = "0"
            out = subprocess.run([sys.executable, __file__, "--child", name, variant,
                                  "--batch", str(batch), "--repeats", str(repeats),
                                  "--tool", tool_name],
                                 capture_output=True, text=True, check=True, env=env)
            row[variant] = json.loads(out.stdout.strip().splitlines()[-1])
        cells = "  ".join(f"{v} {row[v]['throughput'] / 1e6:.3g} ({row[v]['first_call_s']:.2f} s)"
                          for v in variants)
        print(f"  {name:9s} {cells}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--workloads", default="pendulum,nlink-3,expr-1e3")
    parser.add_argument("--float64-workloads", default="pendulum,nlink-2,nlink-4-nonconstant")
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "VARIANT"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--tool", default="symkern", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.tool == "symkern-f64":
            jax.config.update("jax_enable_x64", True)
        print(json.dumps(child(*args.child, args.batch, args.repeats, args.tool)))
        return 0
    jax.config.update("jax_enable_x64", True)
    elementwise(np.float32)
    elementwise(np.float64)
    kernels(args.workloads.split(","), args.batch, args.repeats)
    kernels(args.float64_workloads.split(","), args.batch, args.repeats, "symkern-f64")
    return 0


if __name__ == "__main__":
    sys.exit(main())
