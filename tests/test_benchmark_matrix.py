"""Smoke run of benchmarks/matrix.py --quick: it finishes, and its JSON has every workload
with the figures docs/design/matrix-expressions.md reads (accuracy checked, never timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_matrix_benchmark_runs_and_reports_every_workload(tmp_path: Path) -> None:
    out = tmp_path / "matrix.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "matrix.py"), "--quick", "--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(out.read_text())
    assert [row["n"] for row in results["affine"]] == [64]
    assert results["affine"][0]["source_products"] == 1
    assert results["affine"][0]["max_difference_from_jit"] < 1e-4
    assert results["numeric_matrix"]["4096"]["const_args"] == 1
    assert results["kalman"]["max_relative_difference_from_numpy"] < 1e-10
    assert max(results["linear_algebra"].values()) < 1e-10
