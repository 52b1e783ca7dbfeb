"""Python's cyclic garbage collector paused while symkern builds SymPy expressions.

A derivative or a build allocates SymPy objects by the hundred thousand, and CPython's
collector walks every tracked object of the process each time enough allocations pile up:
the larger the caller's heap (a mechanics model, JAX, SymPy's caches), the longer each walk.
On the 4-16-16-4 network's input Jacobian 0.15-0.17 s of which half was collections; the
build of a 3,000-operation wide sum 1.16 s, 0.46 s without them
(docs/design/derivatives.md). SymPy's expressions hold no reference cycles, so what the
work frees goes by reference counting; cycles it leaves (if any) are collected once the
collector runs again.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused_collection() -> Iterator[None]:
    """The block (or the decorated function) runs with `gc` disabled, then it is enabled
    again if it was; a collector already disabled by the caller stays so."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
