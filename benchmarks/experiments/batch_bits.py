"""Does a sample get the same bits whatever the batch it is computed in?

Usage: python benchmarks/experiments/batch_bits.py [--target 150] [--seeds 2]
                                                   [--settings default,O0,rows-256,...]
                                                   [--dtypes float64,float32] [--timing]

Kernels of the expression generator's five profiles (`benchmarks/shapes.py`, `--seeds`
seeds each, about `--target` operations) and `atan(x)*y + x` are built and each program is
evaluated on 8,192 samples and on windows of the same samples: `SIZES` rows starting at
sample 0 and at sample 5. A window's sample counts as differing when any of its entries
has other bits than in the 8,192-sample batch. Settings:

  default      the kernel's program as symkern compiles it (XLA's CPU defaults)
  O0           the same program with `xla_backend_optimization_level=0`
  rows-256     the default program on the window padded to a multiple of 256 rows (copies of
               its last sample), the padding dropped after
  interpreted  `BuildOptions(interpret=True)`: one program of a row table, a tile at a time
  c-loop       `BuildOptions(cpu_loop="c")`: one C++ loop over the batch

A line per setting and dtype: kernels with a differing sample, the sizes where one differed,
and the largest difference in units in the last place of the batch's largest entry.
`--timing` also times the default program against `O0` on the mechanics models and networks
at 102,400 samples (median of 11 interleaved calls, freed memory reused).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

from one_pass import built, interleaved_ms, start_process  # noqa: E402  (the same inputs and timing)

SIZES = (1, 2, 3, 5, 8, 15, 17, 31, 33, 49, 63, 65, 127, 300, 333, 334, 500, 1000, 4095)
BATCH = 8192
SETTINGS = ("default", "O0", "rows-256", "interpreted", "c-loop")
OPTIONS = {"O0": {"xla_backend_optimization_level": 0}}
TIMED = ("pendulum:float64", "pendulum:float32", "nlink-2:float64", "nlink-4:float64",
         "nlink-8:float32", "net-4-16-16-4:float64", "net-4-16-16-4:float32",
         "jac-4-16-16-4:float32", "shape-products-1e3:float32")


def kernels(setting: str, dtype: str, target: int, seeds: int) -> list[tuple]:
    """`(name, kernel, inputs, parameter arguments)` of every case, built for `setting`."""
    import sympy as sp
    from shapes import PROFILES, generate

    import symkern as sk

    options = sk.BuildOptions(interpret=setting == "interpreted",
                              cpu_loop="c" if setting == "c-loop" else "xla")
    x, y = sp.symbols("x y")
    cases = [("atan", sk.build_function(sp.Matrix([sp.atan(x) * y + x]), [x, y], dtype=dtype,
                                        options=options), 2, ())]
    for profile in PROFILES:
        for seed in range(seeds):
            shape = generate(profile, target, seed)
            kernel = sk.build_function(shape.eqs, shape.inputs, params=shape.params, dtype=dtype,
                                       options=options)
            cases.append((shape.name, kernel, len(shape.inputs), (shape.param_values,)))
    return cases


def evaluate(kernel, setting: str, X, parameters: tuple, compiled: dict):
    """The kernel's program on the rows of `X` (one executable per row count)."""
    import numpy as np

    rows = len(X)
    if setting == "rows-256":
        padded = -(-rows // 256) * 256
        X = np.concatenate([X, np.repeat(X[-1:], padded - rows, axis=0)])
    prepared = kernel.prepare((X,) + parameters)
    if len(X) not in compiled:
        compiled[len(X)] = kernel._jitted.lower(*prepared).compile(OPTIONS.get(setting))
    return np.asarray(compiled[len(X)](*prepared))[:rows]


def scaled(a, b) -> float:
    """The largest difference between `a` and `b` in units of the float spacing at the largest
    magnitude of `b` (an entry's rounding error is of the order of its largest terms, not of
    a small value they cancel to)."""
    import numpy as np

    scale = np.spacing(np.max(np.abs(b[np.isfinite(b)]), initial=np.finfo(b.dtype).tiny))
    difference = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return float(np.max(difference[np.isfinite(difference)], initial=0.0) / scale)


def measure(setting: str, dtype: str, target: int, seeds: int) -> str:
    import numpy as np

    differing, sizes, worst = [], set(), 0.0
    cases = kernels(setting, dtype, target, seeds)
    for name, kernel, inputs, parameters in cases:
        X = np.random.default_rng(0).uniform(-1, 1, (BATCH, inputs)).astype(dtype)
        compiled: dict = {}
        whole = evaluate(kernel, setting, X, parameters, compiled)
        found = False
        for n in SIZES:
            for offset in (0, 5):
                part = evaluate(kernel, setting, X[offset:offset + n], parameters, compiled)
                want = whole[offset:offset + n]
                if not np.array_equal(part, want, equal_nan=True):
                    found = True
                    sizes.add(n)
                    worst = max(worst, scaled(part, want))
        if found:
            differing.append(name)
    listed = ", ".join(map(str, sorted(sizes))) or "none"
    return (f"  {setting} {dtype}: {len(differing)} of {len(cases)} kernels with a differing "
            f"sample (rows {listed}; at most {worst:.3g} ulps of the largest entry)")


def timing(rounds: int) -> list[str]:
    import jax

    lines = []
    for item in TIMED:
        name, dtype = item.split(":")
        program, consts, X, leaves = built(name, dtype, 102_400)

        def run(data, parameters, program=program, consts=consts):
            return program.evaluate(consts, (data,), parameters)

        compiled = {label: jax.jit(run).lower(X, leaves).compile(OPTIONS.get(label))
                    for label in ("default", "O0")}
        ms = interleaved_ms(compiled, (X, leaves), rounds)
        lines.append(f"  {name} {dtype}: default {ms['default']:.2f} ms  O0 {ms['O0']:.2f} ms  "
                     f"O0/default {ms['O0'] / ms['default']:.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=int, default=150)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--dtypes", default="float64,float32")
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args(argv)

    start_process()
    print(f"samples against a batch of {BATCH:,}, windows of {len(SIZES)} sizes at 0 and 5")
    for setting in args.settings.split(","):
        for dtype in args.dtypes.split(","):
            print(measure(setting, dtype, args.target, args.seeds), flush=True)
    if args.timing:
        print(f"ms a call at 102,400 samples, median of {args.rounds} interleaved calls")
        print("\n".join(timing(args.rounds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
