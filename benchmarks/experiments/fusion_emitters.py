"""XLA's two CPU code generators for loop fusions, on the same kernel programs.

Usage: python benchmarks/experiments/fusion_emitters.py [--batch 102400] [--rounds 21]
                                                        [--workloads pendulum:float64,...]

jaxlib 0.10.2 emits a loop fusion through its MLIR fusion emitters by default;
`compiler_options={"xla_cpu_use_fusion_emitters": False}` selects the older LLVM IR emitters.
Each workload's kernel program (the one a call runs) is compiled both ways in one process
with freed memory reused (`symkern.reuse_cpu_memory`), the results compared, and the two
executables called in alternation: median ms a call (loop fusions in the optimized HLO),
and the ratio older / default (below 1: the older emitters are faster). `--operations`
times single elementwise operations over 409,600 elements the same way instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

from one_pass import built, interleaved_ms, start_process  # noqa: E402  (the same inputs and timing)

DEFAULT = ("pendulum:float64,pendulum:float32,nlink-2:float64,nlink-2:float32,"
           "nlink-2-nonconstant:float64,nlink-4:float64,nlink-fixed-2:float64,"
           "net-4-16-16-4:float64,net-4-16-16-4:float32,jac-4-16-16-4:float32")
EMITTERS = {"default": None, "older": {"xla_cpu_use_fusion_emitters": False}}


def measure(name: str, dtype: str, batch: int, rounds: int) -> str:
    import jax
    import numpy as np

    program, consts, X, leaves = built(name, dtype, batch)

    def run(data, parameters):
        return program.evaluate(consts, (data,), parameters)

    compiled, fusions = {}, {}
    for label, options in EMITTERS.items():
        compiled[label] = jax.jit(run, compiler_options=options).lower(X, leaves).compile()
        text = compiled[label].as_text()
        fusions[label] = text[text.index("ENTRY"):].count(" fusion(")
    tolerance = 1e-5 if dtype == "float32" else 1e-12
    for want, got in zip(jax.tree_util.tree_leaves(compiled["default"](X, leaves)),
                         jax.tree_util.tree_leaves(compiled["older"](X, leaves)), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tolerance,
                                   atol=tolerance)
    ms = interleaved_ms(compiled, (X, leaves), rounds)
    cells = "  ".join(f"{label} {ms[label]:.2f} ({fusions[label]})" for label in compiled)
    return f"  {name} {dtype}: {cells}  older/default {ms['older'] / ms['default']:.2f}"


def operations(dtype: str, rounds: int) -> list[str]:
    """Single elementwise operations compiled both ways: a line each."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    x = jnp.asarray(np.random.default_rng(0).random(409_600), dtype) + 0.01
    cases = {"arithmetic": lambda v: v * v * v + 3 * v - 1, "division": lambda v: 1 / (1 + v * v),
             "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt, "cbrt": jnp.cbrt, "exp": jnp.exp,
             "log": jnp.log, "tanh": jnp.tanh, "atan": jnp.arctan, "sin": jnp.sin,
             "integer_pow -2": lambda v: lax.integer_pow(v, -2)}
    lines = []
    for name, f in cases.items():
        compiled = {label: jax.jit(f, compiler_options=options).lower(x).compile()
                    for label, options in EMITTERS.items()}
        ms = interleaved_ms(compiled, (x,), rounds)
        lines.append(f"  {name} {dtype}: default {ms['default']:.3f}  older {ms['older']:.3f}"
                     f"  older/default {ms['older'] / ms['default']:.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=102_400)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--workloads", default=DEFAULT, help="WORKLOAD:DTYPE, comma-separated")
    parser.add_argument("--operations", action="store_true",
                        help="single elementwise operations instead of kernels")
    args = parser.parse_args(argv)

    start_process()
    if args.operations:
        print(f"ms a call over 409,600 elements, median of {args.rounds} interleaved rounds")
        for dtype in ("float64", "float32"):
            print("\n".join(operations(dtype, args.rounds)), flush=True)
        return 0
    print(f"ms a call at {args.batch} samples, median of {args.rounds} interleaved rounds "
          "(loop fusions in the optimized HLO)")
    for item in args.workloads.split(","):
        name, dtype = item.split(":")
        print(measure(name, dtype, args.batch, args.rounds), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
