"""Run tests/drift against the lowest and the newest SymPy and JAX that pyproject.toml admits.

A maintainer's tool, not part of the package: `python tools/drift_matrix.py` (needs PyPI).
Each combination gets a throwaway virtual environment under a temporary directory (or under
`--keep DIR`, reused on the next run); the repository is put on PYTHONPATH, never installed,
so nothing in the working tree changes. Exit status 0 only when every combination passes.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
#: the distributions whose range the matrix spans; everything else installs unpinned
SPANNED = ("sympy", "jax")


def _requirements() -> tuple[dict[str, Requirement], list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    spanned: dict[str, Requirement] = {}
    others: list[str] = []
    for line in project["dependencies"] + project["optional-dependencies"]["test"]:
        requirement = Requirement(line)
        if requirement.name in SPANNED:
            spanned[requirement.name] = requirement
        elif requirement.name != "ruff":
            others.append(line)
    return spanned, others


def _published(name: str) -> list[Version]:
    # `pip index versions` is how the registry is asked (one query per spanned package).
    output = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", name],
        check=True, capture_output=True, text=True,
    ).stdout
    match = re.search(r"Available versions: (.+)", output)
    if match is None:
        raise SystemExit(f"pip index versions {name}: no version list in\n{output}")
    return sorted(Version(v.strip()) for v in match.group(1).split(","))


def _admitted_extremes(requirement: Requirement) -> tuple[str, str]:
    admitted = [v for v in _published(requirement.name)
                if not v.is_prerelease and requirement.specifier.contains(v)]
    if not admitted:
        raise SystemExit(f"no published version of {requirement} exists")
    return str(admitted[0]), str(admitted[-1])


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, text=True, capture_output=True, **kwargs)


def _environment(base: Path, sympy: str, jax: str, others: list[str], extras: str) -> Path:
    venv = base / f"sympy-{sympy}_jax-{jax}"
    stamp = venv / ".installed"
    if stamp.exists():
        return venv
    _run([sys.executable, "-m", "venv", "--clear", str(venv)]).check_returncode()
    python = str(venv / "bin" / "python")
    install = _run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    f"sympy=={sympy}", f"jax[{extras}]=={jax}", *others])
    if install.returncode:
        raise RuntimeError(f"pip install failed:\n{install.stdout}\n{install.stderr}")
    stamp.touch()
    return venv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="create (and reuse) the environments here")
    parser.add_argument("--sympy", action="append", help="test these SymPy versions instead")
    parser.add_argument("--jax", action="append", help="test these JAX versions instead")
    arguments = parser.parse_args(argv)

    spanned, others = _requirements()
    extras = ",".join(sorted(spanned["jax"].extras)) or "cpu"
    sympy_versions = arguments.sympy or sorted(set(_admitted_extremes(spanned["sympy"])), key=Version)
    jax_versions = arguments.jax or sorted(set(_admitted_extremes(spanned["jax"])), key=Version)

    with tempfile.TemporaryDirectory(prefix="symkern-drift-matrix-") as scratch:
        base = arguments.keep or Path(scratch)
        base.mkdir(parents=True, exist_ok=True)
        results: list[tuple[str, str, str, str]] = []
        for sympy in sympy_versions:
            for jax in jax_versions:
                print(f"sympy {sympy}, jax {jax}: ", end="", flush=True)
                try:
                    venv = _environment(base, sympy, jax, others, extras)
                except RuntimeError as error:
                    print("install failed")
                    results.append((sympy, jax, "install failed", str(error).strip()[-2000:]))
                    continue
                environment = dict(os.environ, PYTHONPATH=str(ROOT))
                test = _run([str(venv / "bin" / "python"), "-m", "pytest", "tests/drift", "-q",
                             "-p", "no:cacheprovider"], cwd=ROOT, env=environment)
                summary = (test.stdout.strip().splitlines() or ["(no output)"])[-1]
                status = "pass" if test.returncode == 0 else "FAIL"
                print(f"{status} ({summary})")
                results.append((sympy, jax, status, test.stdout[-4000:] if test.returncode else ""))

    print("\nsympy     jax       result")
    for sympy, jax, status, _ in results:
        print(f"{sympy:<9} {jax:<9} {status}")
    for sympy, jax, status, details in results:
        if status != "pass":
            print(f"\n--- sympy {sympy}, jax {jax}: {status}\n{details}")
    return 0 if all(status == "pass" for _, _, status, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
