"""symkern on an NVIDIA GPU: throughput at batch 10^7 and the fraction of HBM bandwidth.

Usage: python benchmarks/gpu.py [--batch 10000000] [--repeats 20] [--nominal-tbs 4.8]

Needs jax's CUDA build (``pip install -e .[cuda12]``). For the double pendulum and the
4-16-16-4 tanh network it measures, in float32 with device-resident inputs:

- ``throughput``: samples/s of ``kernel(X, ps)`` (median of timed calls after a warm-up);
- ``bytes_moved``: batch * (inputs + outputs) * 4, what a one-pass kernel reads and writes;
- ``fraction_of_copy``: achieved bytes/s over a device-to-device ``jnp.copy`` of a buffer
  that size (the copy reads and writes it, i.e. moves twice the bytes);
- ``fraction_of_nominal``: achieved bytes/s over the nominal HBM bandwidth (H200:
  4.8 TB/s), and the same for the copy;
- the same figures for the kernel's compute executable alone (entries, no assembly),
  and for hand-written ``jax.numpy`` on the network (``net.apply``).

Prints one JSON line. On a machine without a GPU it prints ``{"gpu": false, ...}`` and
exits 0, so it can run anywhere.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))


def _median_s(fn, repeats: int) -> float:
    import jax

    jax.block_until_ready(fn())
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(name: str, batch: int, repeats: int, nominal: float) -> dict:
    """Figures for one workload on the default (GPU) device."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import workloads

    import symkern as sk

    wl = workloads.build(name)
    t0 = time.perf_counter()
    kernel = sk.build_function(wl.eqs, wl.inputs, params=wl.params)
    ps = jax.tree_util.tree_map(lambda v: jnp.asarray(np.asarray(v, np.float32)), wl.param_values)
    key = jax.random.PRNGKey(0)
    X = jax.random.uniform(key, (batch, len(wl.inputs)), jnp.float32, -1.5, 1.5)
    jax.block_until_ready(kernel(X, ps))
    build_s = time.perf_counter() - t0
    n_out = len(wl.flat_entries())
    bytes_moved = batch * (len(wl.inputs) + n_out) * 4

    buffer = jnp.ones(bytes_moved // 4, jnp.float32)
    copy = jax.jit(jnp.copy)
    copy_s = _median_s(lambda: copy(buffer), repeats)
    copy_bw = 2 * bytes_moved / copy_s
    buffer = None  # free it before the kernels run

    def figures(seconds: float) -> dict:
        bw = bytes_moved / seconds
        return {"throughput": batch / seconds, "seconds": seconds, "bandwidth_gbs": bw / 1e9,
                "fraction_of_copy": bw / copy_bw, "fraction_of_nominal": bw / nominal}

    out = {"workload": name, "batch": batch, "build_s": build_s, "bytes_moved": bytes_moved,
           "copy_bandwidth_gbs": copy_bw / 1e9, "copy_fraction_of_nominal": copy_bw / nominal,
           "symkern": figures(_median_s(lambda: kernel(X, ps), repeats))}
    try:  # the compute executable alone: shows what assembly (stacking) costs on a GPU
        prepared = kernel.prepare((X, ps))
        out["symkern_entries_only"] = figures(_median_s(lambda: kernel._compute_jitted(*prepared), repeats))
    except Exception as exc:  # noqa: BLE001 - private API; a figure, not a failure
        out["symkern_entries_only"] = f"{type(exc).__name__}: {exc}"[:200]
    if wl.net_sizes:
        net = wl.make_net()
        apply = jax.jit(net.apply)
        out["jax_hand"] = figures(_median_s(lambda: apply(X, ps), repeats))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--nominal-tbs", type=float, default=4.8, help="nominal HBM bandwidth, TB/s")
    parser.add_argument("--workloads", default="pendulum,net-4-16-16-4")
    args = parser.parse_args()
    import jax

    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        print(json.dumps({"gpu": False, "reason": "no GPU visible to jax (install jax[cuda12] "
                          "and run on an NVIDIA machine)", "backend": jax.default_backend()}))
        return 0
    result = {"gpu": True, "device": str(gpus[0].device_kind), "jax": jax.__version__,
              "nominal_tbs": args.nominal_tbs, "results": []}
    for name in args.workloads.split(","):
        try:
            result["results"].append(measure(name, args.batch, args.repeats, args.nominal_tbs * 1e12))
        except Exception as exc:  # noqa: BLE001 - report the others anyway
            result["results"].append({"workload": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
