"""set_cpu_threads: XLA's CPU pool started on n cores of the affinity mask, the caller's mask
restored, its arguments checked, and refused once JAX's backend runs. The pool is sized once
per process, so the effect is checked in fresh interpreters, by the cores each thread may run
on (Linux)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import pytest

import symkern as sk
from symkern.kernels import threads

LINUX_AFFINITY = hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")

PROBE = r"""
import json, os, sys
import numpy as np, sympy as sp, symkern as sk
n = int(sys.argv[1])
if n:
    sk.set_cpu_threads(n)
x, y = sp.symbols("x y")
k = sk.build_function(sp.sin(x) * sp.exp(-y**2) + sp.tanh(x - y), [x, y])
X = np.random.default_rng(0).uniform(-1, 1, (200_000, 2)).astype(np.float32)
out = np.asarray(k(X))
ref = np.sin(X[:, 0]) * np.exp(-X[:, 1]**2) + np.tanh(X[:, 0] - X[:, 1])
masks = {}
for t in os.listdir("/proc/self/task"):
    status = open(f"/proc/self/task/{t}/status").read()
    allowed = [line.split()[1] for line in status.splitlines() if line.startswith("Cpus_allowed_list")][0]
    masks.setdefault(allowed, 0)
    masks[allowed] += 1
print(json.dumps({"error": float(np.max(np.abs(out - ref))), "masks": masks,
                  "main": sorted(os.sched_getaffinity(0))}))
"""


def _probe(n: int) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, str(n)], capture_output=True, text=True,
                          timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not LINUX_AFFINITY, reason="needs Linux CPU affinity")
def test_one_thread_pins_the_pool_and_restores_the_callers_mask():
    cores = threads.available_cores()
    one = _probe(1)
    assert one["error"] < 1e-5
    assert one["main"] == cores  # the caller keeps every core
    # the threads XLA started while the mask was narrowed run on the first core only
    assert one["masks"].get(str(cores[0]), 0) >= 1
    if len(cores) > 1:
        default = _probe(0)
        assert default["error"] < 1e-5
        assert str(cores[0]) not in default["masks"]  # no thread narrowed without the call


def test_the_jax_hook_it_reads_exists():
    """`set_cpu_threads` refuses once JAX's backend has started, read from xla_bridge: an
    upgrade that renames it would make the refusal silent."""
    from jax._src import xla_bridge

    assert callable(xla_bridge.backends_are_initialized)


def test_after_the_backend_started_it_is_refused():
    jax.devices("cpu")
    with pytest.raises(sk.BuildError, match="set_cpu_threads: JAX's backend has already started"):
        sk.set_cpu_threads(1)


@pytest.mark.parametrize("n", [0, -1, True, 1.0, "2", 10**6])
def test_n_must_be_an_int_within_the_cores(n):
    with pytest.raises(sk.BuildError, match=r"set_cpu_threads: n: expected an int from 1 to \d+"):
        sk.set_cpu_threads(n)
