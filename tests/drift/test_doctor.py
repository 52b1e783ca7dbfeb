"""`python -m symkern doctor`: the drift checks as a table, exit code 0 only when none drifted."""

from symkern import cli
from symkern.codegen import drift


def test_doctor_reports_every_check_and_the_versions(capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    results = drift.run_checks()
    assert f"{len(results)} checks: {len(results)} ok, 0 drifted" in out
    assert "ok      function_shape [cse=True]" in out
    assert "callee:sin [cse=False]" in out
    for name, version in drift.versions().items():
        assert f"{name} {version}" in out


def test_doctor_exits_1_and_shows_expected_and_found_for_a_drift(capsys, monkeypatch):
    def renamed_constructor(cse: bool) -> drift.Observation:
        return drift.observe("array((2, 1))", "matrix((2, 1))")

    forced = drift.DriftCheck("array_constructor", "array outputs print as array(...)",
                              renamed_constructor)
    healthy = next(c for c in drift.CHECKS if c.name == "jax_printer_settings")
    monkeypatch.setattr(drift, "CHECKS", [forced, healthy])
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "DRIFT   array_constructor [cse=False]" in out
    assert "expected: array((2, 1))" in out and "found:    matrix((2, 1))" in out
    assert "ok      jax_printer_settings" in out
    assert "3 checks: 1 ok, 2 drifted" in out
