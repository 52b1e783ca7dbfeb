"""Python's cyclic garbage collector paused while symkern builds SymPy expressions and code.

Imports gc and threading only. `collection_paused()` is a context manager and a decorator;
the derivatives (`symbolic.derivatives`), `build_function`, `build_structured_function` and
the code pipeline (`codegen.pipeline`, `codegen.passes`) run inside it.

Why: a derivative or a build allocates SymPy and `ast` objects by the hundred thousand, and
CPython's collector walks the objects allocated since its last run every few hundred
allocations, and the whole heap in each older generation's collection: the larger the
caller's heap (a mechanics model, JAX, SymPy's caches), the longer each walk. None of the
objects a build makes form reference cycles, so what it frees goes by reference counting;
cycles it leaves (if any) are collected once the collector runs again. Measured: the cosine
sum of 20,000 terms (1.1 * 10^5 operations) built in 10.5 s collected and 7.6 s paused
(peak memory 503 and 518 MiB); the 4-16-16-4 network's input Jacobian 0.15-0.17 s
collected, 0.05-0.09 s paused (docs/design/derivatives.md).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0  # pauses running, in this thread or others
_was_enabled = False


@contextmanager
def collection_paused() -> Iterator[None]:
    """The collector disabled inside, and enabled again when the last pause leaves, if it
    was enabled when the first came in (nested and concurrent pauses count; a collector the
    caller disabled stays so)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
