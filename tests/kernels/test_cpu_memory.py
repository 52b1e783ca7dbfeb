"""reuse_cpu_memory: freed CPU buffers are reused instead of faulted in again, its argument is
checked, and it is refused once JAX's backend runs. The allocator is set once per process, so
the effect is checked in fresh interpreters, by the page faults a call takes (a count, not a
time): without the setting every call faults its output in page by page, with it the next
call reuses the pages the last one freed. Which pages a call gets depends on the order in
which XLA's threads free the last call's buffers, so the heap grows over the first calls (more
of them on a loaded machine) until it holds what the calls need; the probe counts the faults
of each call after those and compares the median call."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import pytest

import symkern as sk
from symkern.kernels import memory

GLIBC = memory.glibc() is not None

PROBE = r"""
import json, resource, sys
import numpy as np, sympy as sp, symkern as sk
up_to = int(sys.argv[1])
if up_to:
    sk.reuse_cpu_memory(up_to)
x = sp.symbols("x0:4")
# 96 entries of a (B, 12, 8) float32 output: at 200,000 samples 77 MB, above the 64 MiB of
# a thread's own heap, so glibc's defaults map it afresh on every call
eqs = sp.Matrix(12, 8, lambda i, j: x[i % 4] * (i + 1) + x[j % 4] ** 2 - j)
k = sk.build_function(eqs, list(x))
X = np.random.default_rng(0).uniform(-1, 1, (200_000, 4)).astype(np.float32)
for _ in range(10):
    out = k(X); out.block_until_ready(); del out
faults = []
for _ in range(9):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    out = k(X); out.block_until_ready(); del out
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
out = np.asarray(k(X))
i, j = np.arange(12)[:, None], np.arange(8)[None, :]
ref = X[:, i % 4] * (i + 1) + X[:, j % 4] ** 2 - j
print(json.dumps({"faults": sorted(faults)[len(faults) // 2], "pages": out.nbytes / 4096,
                  "error": float(np.max(np.abs(out - ref)))}))
"""


def _probe(up_to: int) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, str(up_to)], capture_output=True,
                          text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="needs glibc")
def test_the_next_call_reuses_the_pages_the_last_one_freed():
    default, reused = _probe(0), _probe(memory.DEFAULT_UP_TO)
    assert default["error"] < 1e-5 and reused["error"] < 1e-5
    # glibc's defaults: the output's pages are faulted in on every call
    assert default["faults"] > 0.5 * default["pages"], default
    assert reused["faults"] < 0.1 * reused["pages"], reused


@pytest.mark.skipif(not GLIBC, reason="needs glibc")
def test_after_the_backend_started_it_is_refused():
    jax.devices("cpu")
    with pytest.raises(sk.BuildError, match="reuse_cpu_memory: JAX's backend has already started"):
        sk.reuse_cpu_memory()


@pytest.mark.parametrize("up_to", [0, 1024, -1, True, 1.5, "1G", 2**31, None])
def test_up_to_bytes_must_be_an_int_in_mallopts_range(up_to):
    with pytest.raises(sk.BuildError, match=r"reuse_cpu_memory: up_to_bytes: expected an int "
                                            r"from 131072 to 2147483647"):
        sk.reuse_cpu_memory(up_to)


def test_another_c_library_is_refused(monkeypatch):
    monkeypatch.setattr(memory, "glibc", lambda: None)
    with pytest.raises(sk.BuildError, match="reuse_cpu_memory: the C library of this process is "
                                            "not glibc"):
        sk.reuse_cpu_memory()


@pytest.mark.parametrize(("enabled", "size", "expected"), [
    ("always [madvise] never\n", "2097152\n", 2097152),
    ("[always] madvise never\n", "2097152\n", 2097152),
    ("always madvise [never]\n", "2097152\n", 0),
    ("always [madvise] never\n", "3000000\n", 0),  # not a power of two
    ("always [madvise] never\n", "huge\n", 0),
    ("always [madvise] never\n", None, 0),  # no size to read
])
def test_huge_page_bytes_reads_the_kernels_setting(monkeypatch, tmp_path, enabled, size,
                                                   expected):
    (tmp_path / "enabled").write_text(enabled)
    if size is not None:
        (tmp_path / "hpage_pmd_size").write_text(size)
    monkeypatch.setattr(memory, "TRANSPARENT_HUGE_PAGES", tmp_path)
    memory.huge_page_bytes.cache_clear()
    try:
        assert memory.huge_page_bytes() == expected
    finally:
        memory.huge_page_bytes.cache_clear()
