"""The same input gives byte-identical `kernel.source` and `kernel.upstream_source`.

Generated code must not depend on the process: set and dict iteration orders change with
PYTHONHASHSEED, and SymPy's own caches change with what was built before. The probe
(`_determinism_probe.py`) builds kernels with several symbols, a Piecewise (with an `Eq`
branch), a parameter tree with dict keys (given out of order, nested lists and tuples),
each with `cse=False` and `cse=True`, and prints every source as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("_determinism_probe.py")
SEEDS = ("0", "1", "12345")


@pytest.fixture(scope="module")
def sources_by_seed() -> dict[str, dict]:
    """The probe's output for each seed; the processes run side by side."""
    running = {
        seed: subprocess.Popen([sys.executable, str(PROBE)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONHASHSEED=seed, JAX_PLATFORMS="cpu"))
        for seed in SEEDS
    }
    sources = {}
    for seed, process in running.items():
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, f"PYTHONHASHSEED={seed}: {stderr[-4000:]}"
        sources[seed] = json.loads(stdout)
    return sources


def test_probe_covers_every_case_with_and_without_cse(sources_by_seed):
    keys = set(sources_by_seed[SEEDS[0]])
    assert keys == {f"{case}/cse={cse}" for case in ("several_symbols", "piecewise", "parameter_tree")
                    for cse in (False, True)}
    for entry in sources_by_seed[SEEDS[0]].values():
        assert entry["source"].startswith("def kernel(")
        assert "def _lambdifygenerated(" in entry["upstream_source"]


@pytest.mark.parametrize("seed", SEEDS[1:])
def test_sources_are_byte_identical_across_hash_seeds(sources_by_seed, seed):
    reference, other = sources_by_seed[SEEDS[0]], sources_by_seed[seed]
    for key in reference:
        for what in ("source", "upstream_source"):
            assert other[key][what] == reference[key][what], (
                f"{key} {what} differs between PYTHONHASHSEED={SEEDS[0]} and {seed}")


def test_sources_are_identical_when_rebuilt_in_one_process(sources_by_seed):
    """SymPy's caches (warm on the second build) do not change what is emitted."""
    sys.path.insert(0, str(PROBE.parent))
    try:
        import _determinism_probe as probe
    finally:
        sys.path.pop(0)
    import symkern as sk

    reference = sources_by_seed[SEEDS[0]]
    for _ in range(2):
        for name, (eqs, data, scalar, params) in probe.cases().items():
            data_args = [data] + ([scalar] if scalar is not None else [])
            for cse in (False, True):
                kernel = sk.build_function(eqs, *data_args, params=params, cse=cse, dtype="float64")
                assert kernel.source == reference[f"{name}/cse={cse}"]["source"]
                assert kernel.upstream_source == reference[f"{name}/cse={cse}"]["upstream_source"]


PENDULUM = """
import sys
import jax
import numpy as np
jax.config.update("jax_enable_x64", True)
import symkern as sk
from symkern.models import double_pendulum

model = double_pendulum()
kernel = sk.build_function(model.rhs, list(model.state), params=dict(model.params),
                           dtype="float32")
X = np.random.default_rng(0).uniform(-1.5, 1.5, (8192, 4)).astype(np.float32)
ps = {"g": 9.81, "l1": 1.0, "l2": 0.7, "m1": 1.0, "m2": 1.3}
ps = {key: np.float32(value) for key, value in ps.items()}
for n in map(int, sys.argv[1:]):
    print(np.asarray(kernel(X[:n], ps))[:8].tobytes().hex())
"""


def test_the_double_pendulum_gets_the_same_bits_in_every_batch_and_process():
    """The first 8 samples, computed in batches of 8, 1,000 and 8,192, in two processes."""
    runs = [subprocess.run([sys.executable, "-c", PENDULUM, "8", "1000", "8192"],
                           capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PYTHONHASHSEED=seed, JAX_PLATFORMS="cpu"))
            for seed in ("0", "1")]
    for run in runs:
        assert run.returncode == 0, run.stderr[-4000:]
    lines = [run.stdout.split() for run in runs]
    assert len(lines[0]) == 3 and len(set(lines[0])) == 1, "batches of 8, 1,000, 8,192 differ"
    assert lines[0] == lines[1], "two processes differ"
