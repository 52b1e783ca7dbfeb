"""Memory stays bounded: many builds, no linecache growth, dropped kernels release everything.

The scale runs happen in a fresh process (`_memory_probe.py`), so this test process is
neither polluted nor measured. RSS is VmRSS from /proc/self/status after `gc.collect()`.
Figures measured on the 2-core development machine are in docs/reliability.md.

Bounds: growth after the warm-up is below `GROWTH_BOUND_MB` (SymPy's LRU caches hold at most
SYMPY_CACHE_SIZE=1000 entries per function, so they fill during the warm-up and then stay
flat); linecache stays empty (generated code is compiled from a tree under a `<...>` file
name, never registered with linecache — unlike `sympy.lambdify`, sympy issue 27216).
"""

from __future__ import annotations

import gc
import json
import linecache
import os
import subprocess
import sys
import weakref
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp

import symkern as sk

PROBE = Path(__file__).with_name("_memory_probe.py")
#: RSS growth allowed between the warm-up mark and the last mark
GROWTH_BOUND_MB = 50


def _probe(builds: int, call_every: int, *marks: int, timeout: int) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, str(PROBE), str(builds), str(call_every),
                             *map(str, marks)], env=env, capture_output=True, text=True,
                            timeout=timeout, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout)
    print(json.dumps(report, indent=1))
    return {int(k): v for k, v in report["marks"].items()}


def _check_bounded(marks: dict, warm: int, last: int) -> None:
    growth = marks[last]["rss_mb"] - marks[warm]["rss_mb"]
    assert growth < GROWTH_BOUND_MB, (
        f"RSS grew {growth:.1f} MB between build {warm} and build {last}: {marks}")
    assert all(m["linecache"] == 0 for m in marks.values()), marks
    assert all(m["live_arrays"] == 0 for m in marks.values()), marks


def test_many_builds_keep_memory_bounded():
    """The CI version: 500 builds, one in ten called (traced, lowered, compiled)."""
    marks = _probe(500, 10, 150, 500, timeout=240)
    _check_bounded(marks, 150, 500)


@pytest.mark.slow
def test_ten_thousand_builds_keep_memory_bounded():
    marks = _probe(10_000, 10, 1_000, 10_000, timeout=3600)
    _check_bounded(marks, 1_000, 10_000)


def test_building_and_calling_does_not_register_source_with_linecache():
    before = dict(linecache.cache)
    x, a = sp.symbols("x a")
    for k in range(5):
        kernel = sk.build_function(sp.sin(x) * a + k, x, params={"a": a}, dtype="float64")
        kernel(np.ones(3), {"a": 1.0})
    assert {k: v for k, v in linecache.cache.items() if k not in before} == {}


# ---- a dropped kernel releases its const args and executable -----------------------------

lookup = sp.Function("lookup")


def _table_kernel(table):
    x0, x1, a = sp.symbols("x0 x1 a")

    def implementation(v):
        return jnp.interp(v, jnp.linspace(0.0, 1.0, table.size), table)

    return sk.build_function(lookup(x0) * a + x1, [x0, x1], params={"a": a},
                             functions={"lookup": implementation}, dtype="float64")


def _live_bytes() -> int:
    return sum(int(a.nbytes) for a in jax.live_arrays())


def test_a_dropped_kernel_releases_its_const_args_and_executable():
    gc.collect()
    live_before, bytes_before = len(jax.live_arrays()), _live_bytes()
    # a host table: build_function puts it on the device as a const arg of its own
    kernel = _table_kernel(np.linspace(0.0, 1.0, 100_000))
    assert kernel.const_args[0].nbytes == 800_000
    X = np.random.default_rng(0).uniform(size=(8, 2))
    result = np.array(kernel(X, {"a": 2.0}))  # a copy: np.asarray would keep the output alive
    bound = kernel.bind({"a": 3.0})
    np.testing.assert_allclose(np.asarray(bound(X)), result + X[:, 0], rtol=1e-12)
    jitted = jax.jit(kernel)
    jitted(X, {"a": 2.0})
    gc.collect()
    assert _live_bytes() - bytes_before >= 800_000

    kernel_ref = weakref.ref(kernel)
    compiled_ref = weakref.ref(kernel._compute_jitted)
    const_ref = weakref.ref(kernel.const_args[0])
    del kernel, bound, jitted
    gc.collect()
    assert kernel_ref() is None, gc.get_referrers(kernel_ref())
    assert compiled_ref() is None
    assert const_ref() is None
    assert len(jax.live_arrays()) == live_before
    assert _live_bytes() == bytes_before


def test_a_dropped_kernel_does_not_keep_a_device_table_the_user_dropped():
    gc.collect()
    live_before = len(jax.live_arrays())
    table = jnp.linspace(0.0, 1.0, 50_000)
    kernel = _table_kernel(table)
    kernel(np.zeros((2, 2)), {"a": 1.0})
    table_ref = weakref.ref(kernel.const_args[0])
    del kernel, table
    gc.collect()
    assert table_ref() is None
    assert len(jax.live_arrays()) == live_before


def test_array_literal_const_args_are_released_with_the_kernel():
    gc.collect()
    live_before = len(jax.live_arrays())
    x = sp.Symbol("x")
    first = sp.Function("first")
    kernel = sk.build_function(first(sp.Array([0.5 + k for k in range(64)]), x), x,
                               functions={"first": lambda t, v: t[3] * v}, dtype="float64")
    assert [c.shape for c in kernel.const_args] == [(64,)]
    np.testing.assert_allclose(kernel(np.array([2.0])), [7.0])
    assert len(jax.live_arrays()) == live_before + 1
    ref = weakref.ref(kernel)
    del kernel
    gc.collect()
    assert ref() is None
    assert len(jax.live_arrays()) == live_before
