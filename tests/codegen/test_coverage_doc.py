"""docs/coverage.md is generated from the callee table and cannot drift from it."""

from __future__ import annotations

from pathlib import Path

from symkern.codegen.callee import CALLEE_TABLE, REFUSED_SYMPY
from symkern.codegen.coverage import PAGE, coverage_page

ROOT = Path(__file__).resolve().parents[2]


def test_committed_coverage_page_is_the_generated_one():
    committed = (ROOT / PAGE).read_text()
    assert committed == coverage_page(), (
        "docs/coverage.md differs from the table: run "
        "`python -m symkern.codegen.coverage > docs/coverage.md`")


def test_coverage_page_lists_every_row_and_every_refusal():
    page = coverage_page()
    for row in CALLEE_TABLE.values():
        if row.target not in ("jnp.array", "jnp.asarray"):
            assert f"`{row.target}`" in page
    for name in REFUSED_SYMPY:
        assert f"| `{name}` |" in page
