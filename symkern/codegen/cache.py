"""codegen: the on-disk code-generation cache, so a second process skips emit, CSE and rewrite.

Imports ast, hashlib, json, numpy, sympy and the rest of symkern.codegen / symkern.symbolic.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import sympy as sp

from symkern.codegen.emit import EmittedCode
from symkern.codegen.namespace import NAMESPACE_ROOTS
from symkern.codegen.pipeline import GeneratedCode
from symkern.codegen.rules import KERNEL_NAME, HoistedLiteral
from symkern.errors import CacheWarning, CodegenDriftError
from symkern.symbolic.arguments import ArgumentSpec, EquationSet

#: bump when the cached layout or any rule's output changes meaning
CACHE_FORMAT = 7  # 7: which equations are unbatched (6: entries carry their key and a digest)
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


#: attributes no generated kernel reads: they reach files, callbacks or the host
EFFECTFUL_ATTRIBUTES = frozenset({
    "load", "save", "savez", "savez_compressed", "savetxt", "loadtxt", "genfromtxt",
    "fromfile", "tofile", "fromregex", "memmap", "DataSource", "callback", "io_callback",
    "pure_callback", "debug", "experimental", "config", "device_put", "device_get",
})


def verify_kernel_module(module: ast.Module) -> None:
    """Refuse a cached tree that is not the shape of a kernel this package generates.

    An entry's digest (CodegenCache) catches a damaged or swapped entry; this check keeps
    what still runs to what the rules produce: one function, no imports, no names but
    arguments, locals and the namespace, namespace paths one attribute deep (`jnp.sin`)
    and no attribute that reaches files or callbacks (`jnp.load`, `jnp.save`).
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
        if isinstance(node, ast.Attribute) and (
                node.attr.startswith("_") or node.attr in EFFECTFUL_ATTRIBUTES
                or not isinstance(node.value, (ast.Name, ast.Subscript))
                or isinstance(node.value, ast.Subscript) and not isinstance(
                    node.value.value, (ast.Name, ast.Subscript))):
            raise CodegenDriftError(f"codegen cache: unexpected attribute {ast.unparse(node)[:80]}")
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Lambda, ast.ClassDef, ast.Global,
                             ast.Nonlocal, ast.AsyncFunctionDef)):
            raise CodegenDriftError("codegen cache: unexpected definition or import")


def trusted_directory(path: Path) -> str | None:
    """Why `path` may not hold code that runs (None when it may): not a directory, not
    writable by this user, or writable by its group or by others."""
    try:
        mode = path.lstat().st_mode
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    if not stat.S_ISDIR(mode):
        return "is not a directory"
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by its group or by others (mode {stat.S_IMODE(mode):o})"
    if not os.access(path, os.W_OK | os.X_OK):
        return "is not writable by this user"
    return None


def make_private_directory(path: Path) -> None:
    """`path` and its missing parents, each created readable and writable by its owner only."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)


def write_atomically(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """`write(handle)` into a temporary file beside `path`, then rename it to `path`:
    a concurrent reader sees the old file or the whole new one, never half of it. New
    folders are private to their owner, the file too (tempfile's mode 0600)."""
    make_private_directory(path.parent)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=path.suffix, delete=False) as handle:
        try:
            write(handle)
        except BaseException:
            handle.close()
            os.unlink(handle.name)
            raise
    os.replace(handle.name, path)


def _literals_digest(names: Sequence[str], values: Sequence[np.ndarray]) -> bytes:
    digest = hashlib.sha256()
    for name, value in zip(names, values, strict=True):
        array = np.ascontiguousarray(value)
        digest.update(json.dumps([name, array.dtype.str, list(array.shape)]).encode())
        digest.update(array.tobytes())
    return digest.digest()


def entry_digest(key: str, meta: Mapping[str, Any], literal_names: Sequence[str],
                 literal_values: Sequence[np.ndarray]) -> str:
    """The digest over (key, meta.json's fields but the digest, each literal's name, dtype,
    shape and bytes) written with an entry and checked when it is read back."""
    digest = hashlib.sha256(b"symkern codegen cache entry\0")
    digest.update(key.encode() + b"\0")
    fields = {name: value for name, value in meta.items() if name != "digest"}
    digest.update(json.dumps(fields, sort_keys=True).encode() + b"\0")
    digest.update(_literals_digest(literal_names, literal_values))
    return digest.hexdigest()


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{what}: expected a list of strings")
    return value


def _read_entry(key: str, folder: Path) -> GeneratedCode:
    """The entry in `folder`, checked against `key` and its digest; ValueError or OSError
    (or what numpy and ast raise for a damaged file) when it is not a whole, true entry."""
    for path in (folder, folder / "meta.json"):
        mode = path.lstat().st_mode
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ValueError(f"{path.name} is writable by its group or by others")
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    if not isinstance(meta, dict):
        raise ValueError(f"meta.json holds a JSON {type(meta).__name__}, not an object")
    if meta.get("format") != CACHE_FORMAT or meta.get("key") != key:
        raise ValueError("meta.json was written for another key or cache format")
    for field in ("upstream", "source", "digest"):
        if not isinstance(meta.get(field), str):
            raise ValueError(f"meta.json: {field} is not a string")
    names = _strings(meta.get("argument_names"), "argument_names")
    functions = meta.get("user_functions")
    if not isinstance(functions, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in functions.items()):
        raise ValueError("meta.json: user_functions is not a mapping of strings")
    described = meta.get("literals")
    if not isinstance(described, list) or not all(
            isinstance(item, dict) and isinstance(item.get("name"), str)
            and item["name"].isidentifier() for item in described):
        raise ValueError("meta.json: literals is not a list of named entries")
    literal_names = [item["name"] for item in described]
    values: list[np.ndarray] = []
    if literal_names:
        with np.load(folder / "literals.npz", allow_pickle=False) as stored:
            if sorted(stored.files) != sorted(literal_names):
                raise ValueError("literals.npz holds other arrays than meta.json names")
            values = [stored[name] for name in literal_names]
    if meta["digest"] != entry_digest(key, meta, literal_names, values):
        raise ValueError("the digest does not match the entry's key and content")
    module = ast.parse(meta["source"])
    verify_kernel_module(module)
    literals = []
    for item, value in zip(described, values, strict=True):
        used_by = item.get("used_by")
        if not isinstance(used_by, list) or not all(type(k) is int for k in used_by):
            raise ValueError("meta.json: a literal's used_by is not a list of output indices")
        literals.append(HoistedLiteral(item["name"], value, tuple(used_by)))
    unbatched = meta.get("unbatched")
    if not isinstance(unbatched, list) or not all(type(flag) is bool for flag in unbatched):
        raise ValueError("meta.json: unbatched is not a list of flags")
    upstream = EmittedCode(meta["upstream"], tuple(names), dict(functions))
    return GeneratedCode(upstream, module, meta["source"], {"cache_load": 0.0}, tuple(literals),
                         unbatched=tuple(unbatched))


class CodegenCache:
    """Generated code on disk, one folder per key: meta.json, literals.npz.

    An entry holds code that runs. It is bound to its key and its content by a digest
    written with it: an entry whose digest, key, fields or files do not check out is a
    cache miss (a CacheWarning says why, and the build writes it again), never an error
    and never used.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def _folder(self, key: str) -> Path:
        return self.directory / "codegen" / key[:2] / key

    def get(self, key: str) -> GeneratedCode | None:
        folder = self._folder(key)
        if not os.path.lexists(folder / "meta.json"):
            return None  # never written, or a writer has not finished it
        try:
            return _read_entry(key, folder)
        except Exception as error:  # noqa: BLE001 - any damage to an entry is a cache miss
            reason = f"{type(error).__name__}: {error}"[:300]
            warnings.warn(f"codegen cache: the entry in {folder} is not used ({reason}); "
                          "the kernel is generated again and the entry rewritten",
                          CacheWarning, stacklevel=2)
            return None

    def put(self, key: str, generated: GeneratedCode) -> None:
        folder = self._folder(key)
        names = [h.name for h in generated.literals]
        values = [np.asarray(h.value) for h in generated.literals]
        meta: dict[str, Any] = {
            "format": CACHE_FORMAT,
            "key": key,
            "upstream": generated.upstream.source,
            "argument_names": list(generated.upstream.argument_names),
            "user_functions": dict(generated.upstream.user_functions),
            "source": generated.source,
            "literals": [{"name": h.name, "used_by": list(h.used_by)} for h in generated.literals],
            "unbatched": list(generated.unbatched),
        }
        meta["digest"] = entry_digest(key, meta, names, values)
        try:
            with _lock:
                for name in ("literals.npz", "meta.json"):
                    if (folder / name).is_dir() and not (folder / name).is_symlink():
                        shutil.rmtree(folder / name)  # a damaged entry, replaced
                if names:
                    write_atomically(folder / "literals.npz", lambda handle: np.savez(
                        handle, **dict(zip(names, values, strict=True))))
                write_atomically(folder / "meta.json",
                                 lambda handle: handle.write(json.dumps(meta).encode()))
        except OSError as error:
            warnings.warn(f"codegen cache: could not write the entry in {folder} ({error}); "
                          "the kernel is not cached", CacheWarning, stacklevel=2)
