"""Modules share through public names: no module of symkern/ imports another's underscore
name or reads an underscore attribute of an object another module defines.

An attribute `obj._name` read on anything but `self` or `cls` is allowed only where the
module itself defines `_name` (a method, or `self._name = ...`): then it is its own object's.
The few upstream attributes of that spelling that are public API are listed with why.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "symkern"
#: upstream names spelled with an underscore that are their libraries' public API
UPSTREAM = {
    "_fields": "ast.AST._fields, documented in the ast module",
    "_hashable_content": "sympy.Basic._hashable_content, the key SymPy's own caches use",
    "_asdict": "namedtuple._asdict, documented in collections",
    "_replace": "namedtuple._replace, documented in collections",
    "_default_settings": "sympy's Printer._default_settings, the settings a printer takes "
                         "(the drift check of emit's printer settings reads them)",
    "_from_args": "sympy's AssocOp._from_args, the constructor SymPy documents for "
                  "arguments already in canonical order (tests/symbolic/test_autodiff.py "
                  "compares its nodes with Mul's and Add's by srepr)",
    "_constructor_postprocessor_mapping": "sympy's Basic._constructor_postprocessor_mapping, "
                                          "where a class registers its postprocessors (SymPy's "
                                          "experimental extension point, read to honour it)",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_here(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    own = _defined_here(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("symkern"):
            found += [f"{path.name}:{node.lineno}: imports {node.module}.{alias.name}"
                      for alias in node.names if _private(alias.name)]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            receiver = node.value
            if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
                continue
            if node.attr in own or node.attr in UPSTREAM:
                continue
            found.append(f"{path.name}:{node.lineno}: reads {ast.unparse(node)}")
    return found


def test_no_module_reaches_into_another_modules_private_names():
    violations = [v for path in sorted(PACKAGE.rglob("*.py")) for v in _violations(path)]
    assert not violations, "\n".join(violations)


def test_the_check_finds_a_private_import_and_a_foreign_private_attribute(tmp_path):
    module = tmp_path / "example.py"
    module.write_text("from symkern.codegen.rules import _hidden\n"
                      "def f(kernel):\n    return kernel._compute\n")
    assert len(_violations(module)) == 2
    module.write_text("class A:\n    def _own(self):\n        return 1\n"
                      "def f(a):\n    return a._own()\n")
    assert _violations(module) == []
