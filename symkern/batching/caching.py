"""batching: the one option behind both caches — symkern's code-generation cache on disk and
JAX's persistent compilation cache. Imports jax, astor, sympy and symkern.codegen.
"""

from __future__ import annotations

import os
from pathlib import Path

import astor
import jax
import sympy

from symkern.codegen.cache import CodegenCache

#: environment variable that enables the caches at import, with their directory
CACHE_DIR_VARIABLE = "SYMKERN_CACHE_DIR"

_cache: CodegenCache | None = None


def enable_cache(directory: str | os.PathLike | None = None) -> Path:
    """Cache generated code and compiled executables on disk, across processes.

    A second process that builds the same equations with the same arguments, options and
    library versions skips emit, CSE and rewrite (symkern's cache, `<dir>/codegen`) and
    XLA's compile (JAX's persistent compilation cache, `<dir>/xla`); a kernel compiled as
    pieces loads the compiled pieces themselves (`<dir>/executables`), skipping tracing
    and lowering too. The directory defaults
    to `$SYMKERN_CACHE_DIR`, else `~/.cache/symkern`. The cache holds code that is run:
    point it only at a directory you trust, as with JAX's own cache.

    >>> import tempfile
    >>> enable_cache(tempfile.mkdtemp()).is_dir()
    True
    >>> disable_cache()
    """
    global _cache
    path = Path(directory or os.environ.get(CACHE_DIR_VARIABLE)
                or Path.home() / ".cache" / "symkern").expanduser()
    (path / "xla").mkdir(parents=True, exist_ok=True)
    _cache = CodegenCache(path)
    jax.config.update("jax_compilation_cache_dir", str(path / "xla"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def disable_cache() -> None:
    """Stop using both caches (files already written stay on disk)."""
    global _cache
    _cache = None
    jax.config.update("jax_compilation_cache_dir", None)


def active_cache() -> CodegenCache | None:
    """The code-generation cache in use, if any."""
    return _cache


def library_versions() -> dict[str, str]:
    from symkern import __version__

    return {"symkern": __version__, "sympy": sympy.__version__, "jax": jax.__version__,
            "astor": astor.__version__}


if os.environ.get(CACHE_DIR_VARIABLE):
    enable_cache()
