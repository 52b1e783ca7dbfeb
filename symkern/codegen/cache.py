"""codegen: the on-disk code-generation cache, so a second process skips emit, CSE and rewrite.

Imports ast, hashlib, json, numpy, sympy and the rest of symkern.codegen / symkern.symbolic.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import sympy as sp

from symkern.codegen.emit import EmittedCode
from symkern.codegen.namespace import NAMESPACE_ROOTS
from symkern.codegen.pipeline import GeneratedCode
from symkern.codegen.rules import KERNEL_NAME, HoistedLiteral
from symkern.errors import CodegenDriftError
from symkern.symbolic.arguments import ArgumentSpec, EquationSet

#: bump when the cached layout or any rule's output changes meaning
CACHE_FORMAT = 5  # 5: linear forms contracted (4: no pair sharing up to 5,000 operations)
_lock = threading.Lock()


def structural_digest(roots: Iterable[sp.Basic]) -> str:
    """A digest of SymPy trees that is the same in every process (no `hash()` of strings).

    Iterative post-order over the DAG, each distinct node digested once: cheap next to CSE
    and safe at any depth.
    """
    memo: dict[sp.Basic, bytes] = {}
    roots = list(roots)
    stack: list[tuple[sp.Basic, bool]] = [(root, False) for root in reversed(roots)]
    while stack:
        node, expanded = stack.pop()
        if node in memo:
            continue
        args = node.args
        if args and not expanded:
            stack.append((node, True))
            stack.extend((arg, False) for arg in reversed(args))
            continue
        digest = hashlib.sha256(type(node).__name__.encode())
        if not args:
            digest.update(sp.srepr(node).encode())
            assumptions = node.assumptions0 if isinstance(node, sp.Symbol) else None
            if assumptions:
                digest.update(repr(sorted(assumptions.items())).encode())
        for arg in args:
            digest.update(memo[arg])
        memo[node] = digest.digest()
    total = hashlib.sha256()
    for root in roots:
        total.update(memo[root])
    return total.hexdigest()


def cache_key(equations: EquationSet, arguments: Sequence[ArgumentSpec], options: Mapping[str, Any],
              versions: Mapping[str, str]) -> str:
    """Everything that decides the generated code: equations, arguments, options, versions."""
    described = [(spec.label, spec.shape, structural_digest(spec.entries)) for spec in arguments]
    payload = json.dumps({
        "format": CACHE_FORMAT,
        "equations": structural_digest(equations.leaves),
        "shapes": [list(shape) for shape in equations.shapes],
        "arguments": described,
        "options": dict(options),
        "versions": dict(versions),
    }, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


def verify_kernel_module(module: ast.Module) -> None:
    """Refuse a cached tree that is not the shape of a kernel this package generates.

    The cache directory is trusted like JAX's compilation cache; this check still makes a
    corrupted or foreign file fail loudly instead of running: one function, no imports,
    no attribute but namespace paths, no names but arguments, locals and the namespace.
    """
    if len(module.body) != 1 or not isinstance(module.body[0], ast.FunctionDef) \
            or module.body[0].name != KERNEL_NAME:
        raise CodegenDriftError("codegen cache: expected one kernel function definition")
    function = module.body[0]
    allowed = set(NAMESPACE_ROOTS)
    # the kernel, and the local functions of a vectorized body (symkern.codegen.vectorize):
    # plain definitions holding assignments, returns and further such definitions
    definitions = [function]
    while definitions:
        definition = definitions.pop()
        if definition.decorator_list or definition.args.defaults or definition.args.vararg \
                or definition.args.kwarg or definition.args.kwonlyargs:
            raise CodegenDriftError(f"codegen cache: unexpected signature of {definition.name}")
        allowed.add(definition.name)
        allowed.update(arg.arg for arg in definition.args.args)
        for statement in definition.body:
            if isinstance(statement, ast.Assign):
                allowed.update(n.id for t in statement.targets for n in ast.walk(t)
                               if isinstance(n, ast.Name))
            elif isinstance(statement, ast.FunctionDef):
                definitions.append(statement)
            elif not isinstance(statement, ast.Return):
                raise CodegenDriftError(
                    f"codegen cache: unexpected statement {ast.unparse(statement)[:80]}")
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and node.id not in allowed:
            raise CodegenDriftError(f"codegen cache: unexpected name {node.id!r}")
        if isinstance(node, ast.Attribute) and (node.attr.startswith("_") or not isinstance(
                node.value, (ast.Name, ast.Attribute, ast.Subscript))):
            raise CodegenDriftError(f"codegen cache: unexpected attribute {ast.unparse(node)[:80]}")
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Lambda, ast.ClassDef, ast.Global,
                             ast.Nonlocal, ast.AsyncFunctionDef)):
            raise CodegenDriftError("codegen cache: unexpected definition or import")


def write_atomically(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """`write(handle)` into a temporary file beside `path`, then rename it to `path`:
    a concurrent reader sees the old file or the whole new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=path.suffix, delete=False) as handle:
        write(handle)
    os.replace(handle.name, path)


class CodegenCache:
    """Generated code on disk, one folder per key: meta.json, literals.npz."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def _folder(self, key: str) -> Path:
        return self.directory / "codegen" / key[:2] / key

    def get(self, key: str) -> GeneratedCode | None:
        folder = self._folder(key)
        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (OSError, ValueError):
            return None
        module = ast.parse(meta["source"])
        verify_kernel_module(module)
        literals = []
        if meta["literals"]:
            with np.load(folder / "literals.npz", allow_pickle=False) as stored:
                literals = [HoistedLiteral(item["name"], stored[item["name"]], tuple(item["used_by"]))
                            for item in meta["literals"]]
        upstream = EmittedCode(meta["upstream"], tuple(meta["argument_names"]),
                               dict(meta["user_functions"]))
        return GeneratedCode(upstream, module, meta["source"], {"cache_load": 0.0}, tuple(literals))

    def put(self, key: str, generated: GeneratedCode) -> None:
        folder = self._folder(key)
        meta = {
            "upstream": generated.upstream.source,
            "argument_names": list(generated.upstream.argument_names),
            "user_functions": dict(generated.upstream.user_functions),
            "source": generated.source,
            "literals": [{"name": h.name, "used_by": list(h.used_by)} for h in generated.literals],
        }
        with _lock:
            if generated.literals:
                write_atomically(folder / "literals.npz", lambda handle: np.savez(
                    handle, **{h.name: h.value for h in generated.literals}))
            write_atomically(folder / "meta.json",
                             lambda handle: handle.write(json.dumps(meta).encode()))
