"""The examples in symkern's docstrings are true: every module's doctests run."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import symkern

MODULES = sorted(m.name for m in pkgutil.walk_packages(symkern.__path__, "symkern.")
                 if not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS,
                             report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"
