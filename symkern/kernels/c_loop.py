"""kernels: a printed C loop (symkern.codegen.c_loop) compiled, registered with XLA's FFI, and
called from a JAX program.

Imports jax, numpy, symkern.codegen.c_loop, symkern.codegen.c_solve, symkern.errors,
symkern.kernels.memory and symkern.kernels.threads.

`compile_loop` writes the source into a directory this process created (mode 0700; removed
once the library is loaded, and at exit), compiles it with the C++ compiler (`$CXX`, else
`g++`, else `c++`) against the FFI headers jaxlib ships (`jax.ffi.include_dir()`), loads the
library and registers its handler as an FFI target named after the source's digest; a
source compiled once is not compiled again in the process. Nothing is read back from a file
this process did not write in that call.
`call_loop` is the `jax.ffi.ffi_call` of it: one custom call in the kernel's program, which
splits the batch between `cpu_threads()` threads, each taking at least `GRAIN` samples,
first advises the kernel to back the outputs with huge pages (`huge_page_bytes()`), and
writes outputs as large as the last-level cache past the caches (`streams`).
`solve` is `jnp.linalg.solve` with each sample's system solved by the loop of
symkern.codegen.c_solve, compiled the same way on the first call that needs it.
"""

from __future__ import annotations

import atexit
import ctypes
import math
import os
import shutil
import subprocess
import tempfile
import threading
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from symkern.codegen.c_loop import CLoopSource
from symkern.codegen.c_solve import CSolveSource, c_solve_source
from symkern.errors import BuildError
from symkern.kernels.memory import huge_page_bytes
from symkern.kernels.threads import cpu_threads

#: the environment variable naming the C++ compiler (else g++, else c++ on the PATH)
COMPILER_ENV = "CXX"
#: -ffp-contract=off: no fused multiply-adds, so a sample's value does not depend on whether it
#: fell in a vectorized block or in the sample-by-sample loop (symkern.codegen.c_loop);
#: -fopenmp-simd: the blocks' `#pragma omp simd`; -fno-math-errno: the C library's functions
#: may be inlined (sqrt) since errno is never read; -mprefer-vector-width=512: a block is one
#: 512-bit vector of samples, and GCC's tuning for most Intel cores with AVX-512 otherwise
#: computes it as two 256-bit halves -- float32 blocks ran 0.69-0.97x the time, the network's
#: Jacobian 0.69x, float64 blocks within 0.98-1.09x, the same bits
#: (benchmarks/experiments/c_loop_vector_width.py; no effect without AVX-512)
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-fno-math-errno",
         "-ffp-contract=off", "-fopenmp-simd", "-std=c++17", "-shared", "-fPIC", "-w")
#: the fewest samples a thread of the loop takes, so a batch below twice this runs on the
#: calling thread alone: starting and joining a second thread cost 50-70 us; at 8,192 samples
#: two threads ran the pendulum, nlink-2 and nlink-8 (float64) at 0.60, 1.00 and 1.05x one
#: thread's speed, at 16,384 at 0.94, 1.52 and 1.35x (docs/design/cpu-throughput.md, "A C
#: loop per sample")
GRAIN = 8192
#: the most unknowns a system solved by the C solve has (`solve`); larger systems are
#: `jnp.linalg.solve`'s. Elimination one column at a time over the whole matrix falls behind
#: LAPACK's blocked factorization as the matrix outgrows the caches: in float64 the C solve
#: took 683 ms against `jnp.linalg.solve`'s 871 for 200 systems of 384 unknowns, and 1,717
#: against 1,138 at 512 (benchmarks/experiments/c_solve.py)
SOLVE_UP_TO = 384
#: seconds a compilation may take
COMPILE_TIMEOUT = 600

_lock = threading.Lock()
_targets: dict[str, str] = {}
_libraries: list[Any] = []  # loaded libraries stay loaded: XLA holds their handlers
_directory: Path | None = None


def compiler() -> str | None:
    """The C++ compiler the loop is built with, or None when there is none."""
    named = os.environ.get(COMPILER_ENV, "").strip()
    if named:
        return shutil.which(named)
    return shutil.which("g++") or shutil.which("c++")


def _private_directory() -> Path:
    global _directory
    if _directory is None:
        _directory = Path(tempfile.mkdtemp(prefix="symkern-c-loop-"))
        atexit.register(shutil.rmtree, _directory, True)
    return _directory


def compile_loop(printed: CLoopSource | CSolveSource) -> str:
    """Compile and register `printed` (once per process); the FFI target's name."""
    with _lock:
        if printed.digest in _targets:
            return _targets[printed.digest]
        found = compiler()
        if found is None:
            raise BuildError("cpu_loop='c': no C++ compiler found (set $CXX, or install g++); "
                             "build with the default cpu_loop='xla'")
        directory = Path(tempfile.mkdtemp(prefix=f"{printed.digest}-", dir=_private_directory()))
        source = directory / "loop.cc"
        library = directory / "loop.so"
        source.write_text(printed.source)
        command = [found, *FLAGS, "-I", jax.ffi.include_dir(), str(source), "-o", str(library),
                   "-lpthread"]
        try:
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=COMPILE_TIMEOUT, check=False)
        except subprocess.TimeoutExpired as error:
            raise BuildError(f"cpu_loop='c': {found} took over {COMPILE_TIMEOUT} s to compile "
                             "the loop; build with the default cpu_loop='xla'") from error
        if done.returncode != 0:
            raise BuildError(f"cpu_loop='c': {found} failed on the generated loop "
                             f"({source}):\n{done.stderr[-2000:]}")
        loaded = ctypes.cdll.LoadLibrary(str(library))
        _libraries.append(loaded)
        shutil.rmtree(directory, ignore_errors=True)  # the loaded library stays mapped
        jax.ffi.register_ffi_target(printed.symbol, jax.ffi.pycapsule(getattr(loaded, printed.symbol)),
                                    platform="cpu")
        _targets[printed.digest] = printed.symbol
        return printed.symbol


def streams(results: Sequence[Any], from_bytes: int) -> bool:
    """Whether the loop writes `results` (shapes and dtypes) past the caches, with
    non-temporal stores: when they are at least `from_bytes` together, the last-level
    cache's size when the kernel was built, at most 32 MiB
    (`symkern.kernels.memory.stream_from_bytes()`).

    Written through the caches, such outputs are evicted before anyone reads them, and every
    line is read from memory before it is written. Measured on nlink-4 in float64 with freed
    memory reused (110 entries, 880 bytes a sample; 32 MiB last-level cache), the call and a
    sum over its result's batch took 0.66 / 0.89 ms (through the caches / past them) at
    4.4 MB of output, 0.95 / 1.25 at 8.8 MB, 2.63 / 2.61 at 17.6 MB, 5.58 / 4.90 at 35 MB and
    12.0 / 9.6 at 88 MB; the call alone, 7.7 / 4.9 ms at 88 MB, and nlink-8's 20.8 / 11.8 ms
    (docs/design/cpu-throughput.md, "Outputs past the caches").
    """
    total = sum(math.prod(r.shape) * np.dtype(r.dtype).itemsize for r in results)
    return total >= from_bytes


def call_loop(printed: CLoopSource, data: Sequence[Any], data_shapes: Sequence[tuple],
              parameters: Any, leaf_shapes: Sequence[tuple], batch_shape: tuple,
              grain: int, stream_from: int) -> list[Any]:
    """The loop's results for one batch: each equation's array shaped `batch_shape + shape`.

    `data`: the data arrays (batch shapes broadcasting to `batch_shape`), each sample shaped
    as in `data_shapes`; `parameters`: every parameter value in one flat array (None without
    parameters); `grain`: the fewest samples a thread takes; `stream_from`: the output bytes
    from which the loop writes past the caches (`streams`).
    """
    dtype = np.dtype(printed.dtype)
    samples = math.prod(batch_shape)
    flat = [jnp.reshape(jnp.broadcast_to(jnp.asarray(array, dtype), batch_shape + tuple(shape)),
                        (samples, size))
            for array, shape, size in zip(data, data_shapes, printed.data_sizes, strict=True)]
    buffer = (jnp.zeros((1,), dtype) if parameters is None
              else jnp.reshape(jnp.asarray(parameters, dtype), (-1,)))
    results = [jax.ShapeDtypeStruct((samples, size), dtype) for size in printed.leaf_sizes]
    outputs = jax.ffi.ffi_call(printed.symbol, results, vmap_method="sequential")(
        *flat, buffer, threads=np.int64(cpu_threads()), grain=np.int64(grain),
        huge_page=np.int64(huge_page_bytes()), stream=np.int64(streams(results, stream_from)))
    return [jnp.reshape(out, batch_shape + tuple(shape))
            for out, shape in zip(outputs, leaf_shapes, strict=True)]


def _solved(a: Any, b: Any) -> Any:
    """x with `a @ x = b` for every sample: `a` `(samples, n, n)`, `b` `(samples, n, k)`,
    by the C solve (symkern.codegen.c_solve) of `a`'s size and dtype, compiled once."""
    printed = c_solve_source(a.dtype.name)
    compile_loop(printed)
    result = jax.ShapeDtypeStruct(b.shape, b.dtype)
    return jax.ffi.ffi_call(printed.symbol, result, vmap_method="broadcast_all")(
        a, b, threads=np.int64(cpu_threads()), grain=np.int64(GRAIN))


@jax.custom_jvp
def _solve_batch(a: Any, b: Any) -> Any:
    return _solved(a, b)


@_solve_batch.defjvp
def _solve_batch_jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    # d(A^-1 B) = A^-1 (dB - dA x): a tangent JAX can transpose (jnp.linalg.solve's own),
    # so jax.grad and jax.hessian differentiate through the C solve's value
    a, b = primals
    da, db = tangents
    x = _solve_batch(a, b)
    return x, jnp.linalg.solve(a, db - da @ x)


def solve(a: Any, b: Any) -> Any:
    """`jnp.linalg.solve(a, b)`, each sample's system solved by the C solve
    (symkern.codegen.c_solve) on the CPU: `a` `(..., n, n)`, `b` `(..., n)` when it has one
    axis, else `(..., n, k)`, their batch axes broadcast together, float32 or float64.

    A matrix without batch axes (one factorization for every sample), a system of more than
    `SOLVE_UP_TO` unknowns, another dtype or another backend is `jnp.linalg.solve`'s.
    Derivatives are `jnp.linalg.solve`'s rule applied at the C solve's value.
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    dtype = jnp.result_type(a, b)
    if (a.ndim < 3 or a.shape[-1] > SOLVE_UP_TO or dtype.name not in ("float32", "float64")
            or jax.default_backend() != "cpu"):
        return jnp.linalg.solve(a, b)
    vector = b.ndim == 1
    rhs = b[:, None] if vector else b
    if a.shape[-1] != a.shape[-2] or rhs.shape[-2] != a.shape[-1]:
        return jnp.linalg.solve(a, b)  # its own error names the shapes
    batch = jnp.broadcast_shapes(a.shape[:-2], rhs.shape[:-2])
    a = jnp.broadcast_to(a.astype(dtype), batch + a.shape[-2:])
    rhs = jnp.broadcast_to(rhs.astype(dtype), batch + rhs.shape[-2:])
    x = _solve_batch(a, rhs)
    return x[..., 0] if vector else x


#: what a kernel's code reaches as `clinalg` (symkern.codegen.namespace): `clinalg.solve`
C_LINALG = types.SimpleNamespace(solve=solve)


__all__ = ["C_LINALG", "COMPILER_ENV", "FLAGS", "GRAIN", "SOLVE_UP_TO", "call_loop", "compile_loop",
           "compiler", "solve", "streams"]
