"""batching: the one option behind both caches — symkern's code-generation cache on disk and
JAX's persistent compilation cache. Imports jax, astor, sympy and symkern.codegen.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import astor
import jax
import sympy

from symkern.codegen.cache import CodegenCache, make_private_directory, trusted_directory
from symkern.errors import CacheWarning

#: environment variable that enables the caches at import, with their directory
CACHE_DIR_VARIABLE = "SYMKERN_CACHE_DIR"
#: the folders of a cache directory (symkern's code, compiled pieces, JAX's cache)
FOLDERS = ("codegen", "executables", "xla")

_cache: CodegenCache | None = None


def enable_cache(directory: str | os.PathLike | None = None) -> Path | None:
    """Cache generated code and compiled executables on disk, across processes.

    A second process that builds the same equations with the same arguments, options and
    library versions skips emit, CSE and rewrite (symkern's cache, `<dir>/codegen`) and
    XLA's compile (JAX's persistent compilation cache, `<dir>/xla`); a kernel compiled as
    pieces loads the compiled pieces themselves (`<dir>/executables`), skipping tracing
    and lowering too. The directory defaults to `$SYMKERN_CACHE_DIR`, else
    `~/.cache/symkern`, and is created readable and writable by its owner only.

    The cache holds code that is run. A directory (or one of its three folders) that is
    writable by its group or by others, that is not a directory or that cannot be
    written is refused: a `CacheWarning` says why, the caches stay off and None is
    returned. Each entry carries a digest of its key and content; a damaged entry is
    generated again (docs/errors.md).

    >>> import tempfile
    >>> enable_cache(tempfile.mkdtemp()).is_dir()
    True
    >>> disable_cache()
    """
    global _cache
    named = directory or os.environ.get(CACHE_DIR_VARIABLE)
    origin = CACHE_DIR_VARIABLE if named and not directory else "enable_cache"
    path = Path(named or "~/.cache/symkern")
    try:
        path = path.expanduser()  # RuntimeError where no home directory is known
        make_private_directory(path / "xla")
        reason = next((f"{folder} {why}" for folder in
                       [path] + [path / name for name in FOLDERS if (path / name).exists()]
                       if (why := trusted_directory(folder))), None)
    except (OSError, RuntimeError) as error:
        reason = f"{path} cannot be created ({getattr(error, 'strerror', None) or error})"
    if reason is not None:
        disable_cache()
        warnings.warn(f"{origin}: the cache directory is refused: {reason}; the cache holds "
                      "code that runs, so it must be a directory only its owner can write. "
                      "Caching is off.", CacheWarning, stacklevel=2)
        return None
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
