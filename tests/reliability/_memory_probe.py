"""Build many small kernels in one process and report RSS and cache sizes (JSON on stdout).

Run by test_memory.py in a fresh process: `python _memory_probe.py BUILDS CALL_EVERY MARK...`.
Every kernel is different (a new constant and a new symbol name each time, so no cache of
SymPy or JAX can serve it twice); one in `CALL_EVERY` is also called, which traces, lowers
and compiles an XLA executable for it (0: never called). At each MARK (a build count) the
probe collects garbage and records VmRSS, linecache's size and the time elapsed.
"""

from __future__ import annotations

import gc
import json
import linecache
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
import sympy as sp  # noqa: E402

import symkern as sk  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def build(k: int) -> sk.Kernel:
    x0, x1, a = sp.symbols(f"x0 x1_{k} a")
    eqs = [sp.sin(x0) * a + x1**2 + sp.Rational(k, 7), sp.Matrix([x0 * x1, x1 + k])]
    return sk.build_function(eqs, [x0, x1], params={"a": a}, cse=bool(k % 2))


def main() -> None:
    builds, call_every = int(sys.argv[1]), int(sys.argv[2])
    marks = sorted(int(m) for m in sys.argv[3:])
    X = np.linspace(0.0, 1.0, 8).reshape(4, 2)
    report = {"builds": builds, "call_every": call_every, "marks": {}}
    start = time.perf_counter()
    for k in range(1, builds + 1):
        kernel = build(k)
        if call_every and k % call_every == 0:
            scalar, vector = kernel(X, {"a": 0.5})
            assert np.isfinite(np.asarray(vector)).all()
            del scalar, vector
        del kernel
        if k in marks:
            gc.collect()
            report["marks"][k] = {
                "rss_mb": round(rss_mb(), 2),
                "linecache": len(linecache.cache),
                "live_arrays": len(jax.live_arrays()),
                "seconds": round(time.perf_counter() - start, 2),
            }
            print(json.dumps({"mark": k, **report["marks"][k]}), file=sys.stderr, flush=True)
    report["sympy_cache"] = str(getattr(sp.core.cache, "SYMPY_CACHE_SIZE", "?"))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
