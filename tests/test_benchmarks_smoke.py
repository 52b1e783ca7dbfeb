"""Smoke run of the side-by-side benchmark: `benchmarks/compare.py --quick` finishes and
its JSON names every tool for every quick workload, each measured, skipped (with a
reason) or failed (with a reason), so a broken adapter or workload shows up in CI.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from symkern.kernels.c_loop import compiler

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "compare.py"), "--quick", "--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=85, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_quick_profile_has_every_tool_and_workload(quick_results: dict) -> None:
    import compare

    assert set(quick_results["workloads"]) == set(compare.QUICK["workloads"])
    for name, entry in quick_results["workloads"].items():
        assert set(entry["tools"]) == set(compare.TOOLS), name
        for tool, result in entry["tools"].items():
            assert result["status"] in {"ok", "skipped", "error"}, (name, tool)
            if result["status"] != "ok":
                assert result["reason"], (name, tool)
        # symkern and the float64 reference must always work on the quick profile
        symkern = entry["tools"]["symkern"]
        assert symkern["status"] == "ok", symkern
        assert symkern["max_rel_error"] < 1e-4
        assert symkern["recompiles_on_new_params"] == 0
        assert symkern["throughput"] > 0 and symkern["hlo_chars"] > 0
        assert entry["copy_equivalent_throughput"] > 0
        _assert_interleaved(entry, compare.QUICK["rounds"])


def _assert_interleaved(entry: dict, rounds: int) -> None:
    """Every tool that measured fine was timed in the interleaved rounds: `throughput` is
    that median, the tool's own process's median is kept beside it."""
    import statistics

    rounds_run = entry["interleaved"]["rounds"]
    assert rounds <= rounds_run <= 101
    for result in entry["tools"].values():
        if result["status"] != "ok":
            continue
        assert result["throughput_source"] == "interleaved"
        times = result["interleaved_times_s"]
        assert len(times) == rounds_run and result["throughput_isolated"] > 0
        assert result["throughput"] == pytest.approx(entry["interleaved"]["batch"]
                                                     / statistics.median(times), rel=1e-3)


def test_full_profile_interleaves_the_tools_of_a_workload(tmp_path: Path) -> None:
    """The full profile's path: a process per tool, then one process timing them in turn, each
    with freed memory reused (`--cpu-memory reuse`: set before anything runs, or it is
    refused and every tool fails)."""
    out = tmp_path / "full.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "compare.py"), "--workloads", "net-2-3-2",
               "--tools", "symkern,jax-hand,symengine", "--batch", "5000", "--out", str(out),
               "--cpu-memory", "reuse"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import compare

    report = json.loads(out.read_text())
    assert report["config"]["cpu_memory"] == "reuse"
    entry = report["workloads"]["net-2-3-2"]
    assert re.search(r"interleaved \((\d+) rounds\)", proc.stdout)
    assert entry["tools"]["symkern"]["status"] == "ok"
    _assert_interleaved(entry, compare.FULL["rounds"])


def test_skipped_tools_say_why(quick_results: dict) -> None:
    for entry in quick_results["workloads"].values():
        hand = entry["tools"]["jax-hand"]
        if hand["status"] == "skipped":
            assert "hand-written" in hand["reason"]


@pytest.mark.slow  # runs the script in a child process; its mechanism is tests/codegen/test_vectorize.py
def test_scale_vectorize_smoke_run(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "scale_vectorize.py"), "--sizes", "300",
               "--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [(row["size"], row["vectorize"]) for row in rows] == [(300, True), (300, False)]
    for row in rows:
        assert "status" not in row, row
        assert row["vectorized"] == row["vectorize"] and row["throughput"] > 0
        assert row["first_result_s"] > 0 and "xla_compile" in row["timings"]


def test_memory_bound_experiment_smoke_run() -> None:
    """`experiments/memory_bound.py` (the copy-bandwidth target's figures) still runs, and
    prints a row per tool and reference with a positive rate."""
    command = [sys.executable, str(ROOT / "benchmarks" / "experiments" / "memory_bound.py"),
               "--batches", "2000", "--rounds", "3", "--tools", "symkern,lambdify-jax"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = re.findall(r"^\| 2,000 \| (.+?) \| ([\d,]+) \| ([\d.]+) \|$", proc.stdout, re.M)
    assert [name for name, _, _ in rows] == ["symkern", "lambdify-jax", "jnp.copy (reference)",
                                             "-b, XLA elementwise (reference)"]
    assert all(float(rate.replace(",", "")) > 0 for _, rate, _ in rows)
    assert dict((name, ratio) for name, _, ratio in rows)["jnp.copy (reference)"] == "1.00"


def test_solved_rhs_smoke_run(tmp_path: Path) -> None:
    """`benchmarks/solved_rhs.py` runs every tool (symkern-c where there is a C++ compiler),
    checks each against NumPy's float64 solve, and records symkern's ratios; in float64
    here (the float32 tools are the same classes)."""
    out = tmp_path / "solved.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "solved_rhs.py"), "--models", "2",
               "--batch", "2000", "--rounds", "2", "--dtypes", "float64", "--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (model,) = json.loads(out.read_text())["models"]
    assert model["model"] == "nlink-2" and model["size"] == 6
    ours = ("symkern", "symkern-c") if compiler() is not None else ("symkern",)
    assert {(row["tool"], row["dtype"]) for row in model["tools"].values()} == {
        (tool, "float64") for tool in (*ours, "numpy-solve", "jax-solve")}
    for row in model["tools"].values():
        assert row["samples_per_s"] > 0 and row["max_rel_error"] <= 1e-9
    assert set(model["ratios"]) == {"float64"}
    assert all(r["best_peer"] in ("numpy-solve", "jax-solve")
               and all(r[tool] > 0 for tool in ours)
               for r in model["ratios"].values())
