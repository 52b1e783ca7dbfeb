"""Every upstream form the rules depend on, asserted against the installed SymPy, astor, JAX.

The checks live in symkern.codegen.drift (shared with `python -m symkern doctor`); a failure
here reports the drift at its source, with the form expected and the form found.
"""

import pytest

from symkern.codegen import drift
from symkern.codegen.callee import CALLEE_TABLE, COMPOSITE_SYMPY


@pytest.mark.parametrize(
    ("check", "cse"), drift.cases(),
    ids=[check.name if cse is None else f"{check.name}-cse={cse}" for check, cse in drift.cases()],
)
def test_upstream_form_holds(check, cse):
    result = check.run(cse)
    assert result.ok, result.message()


def test_every_callee_table_row_has_an_example_for_each_sympy_name():
    needed = {name for row in CALLEE_TABLE.values() for name in row.sympy} | set(COMPOSITE_SYMPY)
    missing = sorted(needed - set(drift.CALLEE_EXAMPLES))
    assert not missing, f"add an example to drift.CALLEE_EXAMPLES for: {', '.join(missing)}"


def test_callee_examples_name_only_functions_in_the_table():
    known = {name for row in CALLEE_TABLE.values() for name in row.sympy} | set(COMPOSITE_SYMPY)
    stale = sorted(set(drift.CALLEE_EXAMPLES) - known)
    assert not stale, f"examples for functions the table no longer has: {', '.join(stale)}"


def test_there_is_one_callee_check_per_table_row():
    names = {check.name for check in drift.CHECKS}
    assert {f"callee:{key}" for key in CALLEE_TABLE} <= names


def test_a_failing_probe_is_reported_with_expected_and_found():
    check = drift.DriftCheck("broken", "an assumption", lambda cse: drift.observe("a", "b"))
    message = check.run(True).message()
    assert "broken [cse=True]: an assumption" in message
    assert "expected: a" in message and "found:    b" in message


def test_an_upstream_exception_is_a_drift_not_a_crash():
    def probe(cse):
        raise AttributeError("module 'sympy' has no attribute 'gone'")

    result = drift.DriftCheck("raises", "an API exists", probe, depends_on_cse=False).run()
    assert not result.ok and result.cse is None
    assert "AttributeError: module 'sympy' has no attribute 'gone'" in result.found


def test_versions_names_every_library_the_checks_ask():
    assert set(drift.versions()) == {"python", "sympy", "jax", "jaxlib", "astor", "numpy"}
