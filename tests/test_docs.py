"""The documentation is true: its code runs, its figures come from the results file, and it
describes the software, not the history of its making.

- Every ```python block of README.md and docs/**/*.md runs, the blocks of one file in order
  in one namespace. A block that cannot run here (it needs a package symkern does not
  install) is marked by the line `<!-- not run: why -->` right above its fence; listings of
  generated code and shell commands are ```text and ```sh blocks.
- README's speed summary is what `benchmarks/report.py` renders from
  benchmarks/results/full.json, and each of its figures is read or computed from that file;
  docs/benchmarks.md holds the tables rendered from the same file.
- README.md, CHANGELOG.md, docs/, benchmarks/ and symkern/ hold no wording of development
  history (rounds of work, numbered passes, lettered runs, issue numbers), and no file is
  named by one.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import report  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "full.json"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^(<!-- not run: [^>]+ -->\n)?```python\n(.*?)^```", re.M | re.S)

#: wording of development history; upstream issues (sympy#24673, "sympy issue 27216",
#: jax#18385) are references, not history
HISTORY = [
    re.compile(r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth) "
               r"(performance )?pass\b", re.I),
    re.compile(r"\bperformance pass", re.I),
    re.compile(r"\brun [A-I]\b"),
    re.compile(r"\bsessions?\b", re.I),
    re.compile(r"(?<!sympy )(?<!jax )(?<!SymPy )(?<!JAX )\bissues? #?\d+", re.I),
    re.compile(r"(?<![\w/&])#\d+\b"),
]
HISTORY_FILE_NAMES = re.compile(r"(^|_)(first|second|third|fourth|fifth|sixth|seventh|eighth|"
                                r"ninth)_pass\b|^full-run-|session")


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(line, code) of each ```python block of `path` that is meant to run."""
    text = path.read_text()
    return [(text.count("\n", 0, match.start(2)) + 1, match.group(2))
            for match in BLOCK.finditer(text) if not match.group(1)]


@pytest.mark.parametrize("path", [p for p in DOCUMENTS if python_blocks(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_of_the_docs_runs(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a reader runs them: in the repository root, with JAX's defaults (x64 off, which
    tests/conftest.py turns on for the rest of the suite)."""
    import jax

    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": "__docs__"}
    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    try:
        for line, code in python_blocks(path):
            exec(compile(code, f"{path.relative_to(ROOT)}:{line}", "exec"), namespace)  # noqa: S102
    finally:
        jax.config.update("jax_enable_x64", x64)
        _forget_compilation_cache()


def _forget_compilation_cache() -> None:
    """After a page that enabled symkern's cache: `disable_cache()` clears JAX's cache
    directory option, but JAX keeps the cache it initialized and goes on writing to the
    (deleted) directory, so the rest of the suite would warn on every compile."""
    from jax._src import compilation_cache

    import symkern

    symkern.disable_cache()
    compilation_cache.reset_cache()


def test_the_marker_for_blocks_not_run_is_used_sparingly() -> None:
    marked = [p for p in DOCUMENTS for m in BLOCK.finditer(p.read_text()) if m.group(1)]
    assert len(marked) <= 2, marked


def _speed_block() -> str:
    text = (ROOT / "README.md").read_text()
    begin, end = text.index(report.SPEED_BEGIN), text.index(report.SPEED_END)
    return text[begin + len(report.SPEED_BEGIN):end].strip("\n")


def test_readme_speed_summary_is_rendered_from_the_results_file() -> None:
    data = json.loads(RESULTS.read_text())
    assert _speed_block() == report.speed_summary(data)


def test_each_readme_speed_figure_comes_from_the_results_file() -> None:
    data = json.loads(RESULTS.read_text())
    rows = re.findall(r"^\| ([\w-]+) \| ([\d.]+ [kM]) \| ([\w-]+) ([\d.]+ [kM]) \| ([\d.]+)× \|$",
                      _speed_block(), re.M)
    assert len(rows) == len(data["workloads"])
    met = 0
    for name, ours, anchor, theirs, ratio in rows:
        entry = data["workloads"][name]
        mine = entry["tools"]["symkern"]["throughput"]
        best = entry["tools"][anchor]["throughput"]
        assert (anchor, best) == report.best_anchor(entry)
        assert ours == report._fmt_rate(mine) and theirs == report._fmt_rate(best)
        assert float(ratio) == pytest.approx(mine / best, abs=0.005)
        met += float(ratio) >= 1.0
    assert f"on {met} of {len(rows)} workloads" in _speed_block()
    assert f"batch {data['config']['batch']:,} on {data['machine']['cpus']} CPU cores" in _speed_block()


def test_benchmarks_page_holds_the_tables_of_the_results_file_within_its_length() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert report.tables(json.loads(RESULTS.read_text())) in page
    assert len(page.splitlines()) <= 350


def test_results_hold_one_full_run() -> None:
    full_runs = sorted(p.name for p in (ROOT / "benchmarks" / "results").glob("full*.json"))
    assert full_runs == ["full.json"]


def _history_scope() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    for folder, suffixes in (("docs", {".md"}), ("benchmarks", {".py", ".md"}),
                             ("symkern", {".py"})):
        files += [p for p in sorted((ROOT / folder).rglob("*"))
                  if p.suffix in suffixes and "results" not in p.relative_to(ROOT).parts]
    return files


def test_no_development_history_in_docs_benchmarks_or_code() -> None:
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in _history_scope()
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if any(pattern.search(line) for pattern in HISTORY)]
    assert not found, "\n".join(found)


def test_no_file_is_named_by_the_history() -> None:
    names = [p.relative_to(ROOT) for folder in ("docs", "benchmarks", "symkern")
             for p in (ROOT / folder).rglob("*") if HISTORY_FILE_NAMES.search(p.name)]
    assert not names, names


def test_docs_cited_by_the_code_and_the_docs_exist() -> None:
    """Every docs/… page that the code, the benchmarks and the docs cite (CHANGELOG may name
    a page that has moved since)."""
    cited = {match for path in _history_scope() if path.name != "CHANGELOG.md"
             for match in re.findall(r"docs/[\w/-]+\.md", path.read_text())}
    missing = sorted(c for c in cited if not c.startswith(("docs/_", "docs/internals/"))
                     and not (ROOT / c).exists())
    assert not missing, missing


def test_command_line_help_names_only_the_commands_it_has(capsys: pytest.CaptureFixture) -> None:
    import symkern.cli

    with pytest.raises(SystemExit):
        symkern.cli.main(["--help"])
    text = capsys.readouterr().out
    commands = set(re.search(r"\{([\w,]+)\}", text).group(1).split(","))
    promised = set(re.search(r"python -m symkern ([\w |]+)`", symkern.cli.__doc__).group(1)
                   .replace(" ", "").split("|"))
    assert promised == commands == {"demo", "inspect", "doctor"}


def test_the_guide_names_every_public_name() -> None:
    import symkern

    guide = (ROOT / "docs" / "guide.md").read_text()
    missing = [name for name in symkern.__all__ if not re.search(rf"\b{name}\b", guide)]
    assert not missing, missing
