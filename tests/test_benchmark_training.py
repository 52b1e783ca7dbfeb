"""Smoke run of benchmarks/training.py at tiny sizes: it finishes, and its JSON has a row per
formulation with a positive time and results that agree (timings are never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def _run(tmp_path: Path, workloads: str) -> dict:
    out = tmp_path / "training.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "training.py"), "--rounds", "2",
               "--ensemble", "8", "--hnn", "8", "--pinn", "8", "--workloads", workloads,
               "--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def _check(entry: dict) -> None:
    assert entry["batch"] == 8 and entry["rounds"] == 2 and entry["ratio"] > 0
    names = [row["formulation"] for row in entry["rows"]]
    assert entry["fastest_plain"] in names and entry["best_symkern"].startswith("symkern")
    for row in entry["rows"]:
        assert row["median_s"] > 0, row
        assert row["max_difference"] < 1e-4, row  # one float32 step of every formulation agrees


def test_training_benchmark_runs_its_symbolic_gradient_workloads(tmp_path: Path) -> None:
    results = _run(tmp_path, "hnn,pinn-per-sample")
    assert [e["workload"] for e in results["workloads"]] == ["hnn", "pinn-per-sample"]
    for entry in results["workloads"]:
        _check(entry)
    assert results["workloads"][1]["symbolic_over_grad_through_kernel"] > 0


@pytest.mark.slow  # every workload: about 20 s on two cores
def test_training_benchmark_runs_every_workload(tmp_path: Path) -> None:
    import training

    results = _run(tmp_path, ",".join(training.WORKLOADS))
    assert [e["workload"] for e in results["workloads"]] == list(training.WORKLOADS)
    for entry in results["workloads"]:
        _check(entry)
