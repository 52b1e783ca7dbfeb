"""Loops over the batch in C, called from an XLA program through JAX's FFI, beside symkern's
kernels and numba's loop.

Usage: python benchmarks/experiments/c_loop.py [--batch 100000] [--rounds 31]
                                               [--workloads pendulum,nlink-2,...]

Three forms of a loop that writes a sample's entries in one pass (as numba's `prange` loop
over lambdify's source does) against XLA's program of one pass per fusion. For each
workload, float64, in one process with freed memory reused (`symkern.reuse_cpu_memory`):

- ``c-loop``: SymPy's C99 printer over the entries after `sympy.cse`, the body of a loop over
  samples that writes row i of a `(batch, entries)` result, the batch halved between two
  threads; compiled with `g++ -O3 -march=native -fno-math-errno` into a handler of XLA's FFI
  (`xla/ffi/api/ffi.h` from jaxlib), registered with `jax.ffi.register_ffi_target` and
  called as `jax.ffi.ffi_call` inside `jax.jit`;
- ``c-blocked``: the same, 8 samples at a time: the body over the 8 as one `#pragma omp
  simd` loop (sin and cos as the float64 polynomial of `symkern.codegen.trig`, the C
  library for a block with an angle outside its range), its entries stored row by row;
- ``symkern-c``: `build_function(..., options=BuildOptions(cpu_loop="c"))`, whose loop
  (symkern.codegen.c_loop) computes blocks of 8 samples as one vectorized loop too, but
  writes each entry straight into its place in the result;
- ``symkern``: `build_function(...)(X, ps)`; ``numba``: `benchmarks/peers.py`'s NumbaTool.

Each is checked against symkern's values, then called in interleaved rounds: median ms a
call and numba's time over each one's (above 1: faster than numba). Needs g++ and the peers
extra (numba). The generated sources stay in a temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

from one_pass import interleaved_ms, start_process  # noqa: E402  (the same timing)

DEFAULT = "pendulum,nlink-2,nlink-fixed-2,nlink-4,nlink-8"
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fopenmp-simd")
#: samples a block of the `c-blocked` form computes together (one 512-bit vector of float64)
BLOCK = 8

TEMPLATE = r"""
#include <cmath>
#include <thread>
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;

static void loop(const double* X, const double* P, double* O, long lo, long hi) {
  @PARAMETERS@
  for (long i = lo; i < hi; ++i) {
    @SCALAR@
  }
}

// symkern.codegen.trig's float64 polynomial: Cody-Waite by pi/2 in four parts, Cephes' sin/cos
static inline double turned(double x, int quarter_turns) {
  const double k = __builtin_rint(x * 0.63661977236758134308);
  double r = x - k * 0x1.921fb54400000p+0;
  r = r - k * 0x1.0b4611a600000p-34;
  r = r - k * 0x1.3198a2e000000p-69;
  r = r - k * 0x1.b839a252049c1p-104;
  r = (k == 0) ? x : r;
  const double z = r * r;
  double s = (((((1.58962301576546568060e-10 * z - 2.50507477628578072866e-8) * z
      + 2.75573136213857245213e-6) * z - 1.98412698295895385996e-4) * z
      + 8.33333333332211858878e-3) * z - 1.66666666666666307295e-1);
  s = (r == 0) ? r : r + r * z * s;
  double c = (((((-1.13585365213876817300e-11 * z + 2.08757008419747316778e-9) * z
      - 2.75573141792967388112e-7) * z + 2.48015872888517045348e-5) * z
      - 1.38888888888730564116e-3) * z + 4.16666666666665929218e-2);
  c = 1.0 - 0.5 * z + z * z * c;
  const int quadrant = ((int)k + quarter_turns) & 3;
  const double v = (quadrant & 1) == 0 ? s : c;
  return quadrant >= 2 ? -v : v;
}
static inline double polynomial_sin(double x) { return turned(x, 0); }
static inline double polynomial_cos(double x) { return turned(x, 1); }

static void blocked(const double* X, const double* P, double* O, long lo, long hi) {
  @PARAMETERS@
  long i0 = lo;
  for (; i0 + @BLOCK@ <= hi; i0 += @BLOCK@) {
    bool in_range = true;
    for (int j = 0; j < @BLOCK@; ++j) { @IN_RANGE@ }
    if (!in_range) { loop(X, P, O, i0, i0 + @BLOCK@); continue; }
    double o[@ENTRIES@][@BLOCK@];
    #pragma omp simd
    for (int j = 0; j < @BLOCK@; ++j) {
      @BLOCKED@
    }
    for (int j = 0; j < @BLOCK@; ++j)
      for (int e = 0; e < @ENTRIES@; ++e) O[(i0 + j) * @ENTRIES@ + e] = o[e][j];
  }
  loop(X, P, O, i0, hi);
}

template <void (*Body)(const double*, const double*, double*, long, long)>
static ffi::Error Run(ffi::Buffer<ffi::F64> x, ffi::Buffer<ffi::F64> p,
                      ffi::ResultBuffer<ffi::F64> out) {
  const long n = x.dimensions()[0];
  const long half = n / 2;
  std::thread second(Body, x.typed_data(), p.typed_data(), out->typed_data(), half, n);
  Body(x.typed_data(), p.typed_data(), out->typed_data(), 0, half);
  second.join();
  return ffi::Error::Success();
}

#define BIND ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F64>>().Arg<ffi::Buffer<ffi::F64>>() \
    .Ret<ffi::Buffer<ffi::F64>>()
XLA_FFI_DEFINE_HANDLER_SYMBOL(CLoop, Run<loop>, BIND);
XLA_FFI_DEFINE_HANDLER_SYMBOL(CBlocked, Run<blocked>, BIND);
"""


def c_source(wl) -> tuple[str, int]:
    """The workload's entries as the C++ of both handlers, and the number of entries."""
    import sympy as sp
    from sympy.printing.c import C99CodePrinter

    inputs = [sp.Symbol(f"x_{k}") for k in range(len(wl.inputs))]
    parameters = [sp.Symbol(f"p_{k}") for k in range(len(wl.flat_param_symbols()))]
    renamed = dict(zip(wl.inputs, inputs, strict=True))
    renamed.update(zip(wl.flat_param_symbols(), parameters, strict=True))
    shared, entries = sp.cse([sp.sympify(e).xreplace(renamed) for e in wl.flat_entries()],
                             symbols=sp.numbered_symbols("s_"))
    library = C99CodePrinter()
    polynomial = C99CodePrinter({"user_functions": {"sin": "polynomial_sin",
                                                    "cos": "polynomial_cos"}})

    def body(printer, load, store) -> str:
        lines = [f"const double {s} = {load(k)};" for k, s in enumerate(inputs)]
        lines += [f"const double {s} = {printer.doprint(v)};" for s, v in shared]
        lines += [f"{store(k)} = {printer.doprint(v)};" for k, v in enumerate(entries)]
        return "\n    ".join(lines)

    angles = sorted({call.args[0] for e in [*entries, *(v for _, v in shared)]
                     for call in e.atoms(sp.sin, sp.cos)}, key=str)
    if not all(a in inputs for a in angles):
        raise SystemExit(f"{wl.name}: c-blocked checks only angles that are inputs, got {angles}")
    n_in, n_out = len(inputs), len(entries)
    replacements = {
        "@PARAMETERS@": " ".join(f"const double {s} = P[{k}];" for k, s in enumerate(parameters)),
        "@SCALAR@": body(library, lambda k: f"X[i * {n_in} + {k}]",
                         lambda k: f"O[i * {n_out} + {k}]"),
        "@BLOCKED@": body(polynomial, lambda k: f"X[(i0 + j) * {n_in} + {k}]",
                          lambda k: f"o[{k}][j]"),
        "@IN_RANGE@": " ".join(
            f"in_range = in_range && __builtin_fabs(X[(i0 + j) * {n_in} + {inputs.index(a)}])"
            " <= 1048576.0;" for a in angles),
        "@BLOCK@": str(BLOCK), "@ENTRIES@": str(n_out)}
    source = TEMPLATE
    for placeholder, text in replacements.items():
        source = source.replace(placeholder, text)
    return source, n_out


def c_calls(wl, directory: Path) -> dict:
    """`{"c-loop": f, "c-blocked": f}`, each `f(X, P) -> (batch, entries)` jitted."""
    import jax
    import jax.numpy as jnp

    source, n_out = c_source(wl)
    stem = directory / wl.name.replace("-", "_")
    stem.with_suffix(".cc").write_text(source)
    subprocess.run(["g++", *FLAGS, "-w", "-shared", "-fPIC", "-std=c++17",
                    "-I", jax.ffi.include_dir(), str(stem.with_suffix(".cc")),
                    "-o", str(stem.with_suffix(".so")), "-lpthread"], check=True)
    library = ctypes.cdll.LoadLibrary(str(stem.with_suffix(".so")))
    calls = {}
    for label, symbol in (("c-loop", "CLoop"), ("c-blocked", "CBlocked")):
        target = f"c_loop_{stem.name}_{symbol}"
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)),
                                    platform="cpu")
        calls[label] = jax.jit(lambda X, P, t=target: jax.ffi.ffi_call(
            t, jax.ShapeDtypeStruct((X.shape[0], n_out), jnp.float64))(X, P))
    return calls


def measure(name: str, batch: int, rounds: int, directory: Path) -> str:
    import compare
    import jax
    import numpy as np
    import workloads

    wl = workloads.build(name)
    tools = {label: compare.ADAPTERS[tool](wl) for label, tool in
             (("symkern", "symkern-f64"), ("symkern-c", "symkern-c-f64"), ("numba", "numba"))}
    for tool in tools.values():
        tool.build()
    X = wl.sample(batch, seed=1)
    arguments = {label: (tool.prepare(X), tool.params(wl.param_values))
                 for label, tool in tools.items()}
    reference = tools["symkern"].entries(tools["symkern"].call(*arguments["symkern"]), batch)
    X_device = jax.device_put(np.ascontiguousarray(X, np.float64))
    P_device = jax.device_put(np.asarray(wl.flat_param_values(), np.float64))
    calls = {label: (lambda f=f: f(X_device, P_device))
             for label, f in c_calls(wl, directory).items()}
    calls.update({label: (lambda t=tool, a=arguments[label]: t.call(*a))
                  for label, tool in tools.items()})
    for label, call in calls.items():
        got = (np.asarray(call()) if label.startswith("c-")
               else tools[label].entries(call(), batch))
        np.testing.assert_allclose(got, reference, rtol=1e-11, atol=1e-11, err_msg=label)
    ms = interleaved_ms(calls, (), rounds)
    cells = "  ".join(f"{label} {ms[label]:.2f} ({ms['numba'] / ms[label]:.2f})"
                      for label in calls)
    return f"  {name} float64: {cells}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--workloads", default=DEFAULT, help="comma-separated")
    args = parser.parse_args(argv)

    start_process()
    print(f"ms a call at {args.batch} samples, median of {args.rounds} interleaved rounds "
          f"(numba's time over each one's), threads {len(os.sched_getaffinity(0))}")
    with tempfile.TemporaryDirectory(prefix="symkern-c-loop-") as directory:
        for name in args.workloads.split(","):
            print(measure(name, args.batch, args.rounds, Path(directory)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
