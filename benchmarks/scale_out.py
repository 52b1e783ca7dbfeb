"""Scale-out figures for docs/scaling.md: streaming vs in-memory, sharded vs unsharded.

    python benchmarks/scale_out.py stream             # in-memory call vs stream() at several chunks
    python benchmarks/scale_out.py shard              # re-runs itself with 4 forced host devices
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import sympy as sp

ROWS = 1 << 24  # 16,777,216 samples of 2 float32: 128 MiB


def best(f, repeat: int = 3) -> float:
    f()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times)


def kernel():
    import symkern as sk

    x0, x1, a = sp.symbols("x0 x1 a")
    return sk.build_function(sp.sin(x0) * a + x1**2 + sp.exp(-x0 * x1), [x0, x1], params={"a": a})


def bench_stream() -> None:
    from symkern.batching.stream import stream

    k, ps = kernel(), {"a": 2.0}
    X = np.random.default_rng(0).uniform(size=(ROWS, 2)).astype(np.float32)
    out = np.zeros(ROWS, np.float32)  # touched once, so page faults are not timed
    seconds = best(lambda: np.asarray(k(X, ps)))
    print(f"in-memory k(X): {ROWS / seconds / 1e6:6.1f} M samples/s")
    for chunk in (16384, 65536, 262144, 1048576):
        seconds = best(lambda c=chunk: stream(k, X, ps, chunk=c, out=out, progress=False))
        print(f"stream chunk={chunk:>8}: {ROWS / seconds / 1e6:6.1f} M samples/s")


def bench_shard() -> None:
    if os.environ.get("XLA_FLAGS") is None:
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
        subprocess.run([sys.executable, __file__, "shard"], env=env, check=True)
        return
    import jax

    from symkern.batching.shard import shard

    k, ps = kernel(), {"a": 2.0}
    sharded = shard(k)
    print(f"{len(jax.devices())} devices, {os.cpu_count()} CPU cores")
    for rows in (1 << 16, 1 << 20, 1 << 23):
        X = np.random.default_rng(0).uniform(size=(rows, 2)).astype(np.float32)
        Xd = jax.device_put(X)
        plain = best(lambda X=Xd: jax.block_until_ready(k(X, ps)))
        Xs = sharded.place(X, ps)[1][0]
        split = best(lambda X=Xs: jax.block_until_ready(sharded(X, ps)))
        print(f"rows {rows:>8}: unsharded {rows / plain / 1e6:6.1f}, sharded {rows / split / 1e6:6.1f} "
              "M samples/s (inputs already on device)")


if __name__ == "__main__":
    {"stream": bench_stream, "shard": bench_shard}[sys.argv[1] if len(sys.argv) > 1 else "stream"]()
