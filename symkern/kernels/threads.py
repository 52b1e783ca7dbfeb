"""kernels: how many threads XLA's CPU backend runs kernels on.

Imports jax and symkern.errors.

XLA's CPU backend runs each executable on one thread pool, sized when the backend starts
from the cores the process may run on (its CPU affinity mask; JAX's answer in jax#1539):
by default every core of the mask. A fusion over the batch is partitioned across the pool,
so a kernel on a large batch uses every core (cpu/wall 1.47-1.73 on 2 cores, 1.0 with one
core; docs/design/cpu-throughput.md). JAX has no option for the pool's size,
so `set_cpu_threads(n)` starts the backend with the calling thread's mask narrowed to n of
its cores and then restores the mask: the pool's threads inherit the narrowed mask and stay
on those cores, as under `taskset`; the caller's own thread and everything it starts later
keep the whole mask.
"""

from __future__ import annotations

import os

import jax

from symkern.errors import BuildError


def backend_started() -> bool:
    """Whether JAX has started its backends (after which the pool's size is fixed)."""
    from jax._src import xla_bridge

    started = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(started()) if callable(started) else False


def available_cores() -> list[int]:
    """The cores this process may run on, in order (every core where the platform has no
    affinity mask)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


#: the count set_cpu_threads started the backend with (None: every core of the mask)
_configured: int | None = None


def cpu_threads() -> int:
    """How many threads CPU kernels run on: set_cpu_threads' count, else every core the
    process may run on."""
    return _configured if _configured is not None else len(available_cores())


def set_cpu_threads(n: int) -> None:
    """Run XLA's CPU kernels on `n` threads, pinned to the first `n` cores of this process's
    affinity mask. Call it before the first JAX computation of the process (the pool is
    sized when JAX's backend starts); without it, kernels use every core of the mask.

    Raises BuildError for an `n` that is not an int from 1 to the number of cores the
    process may run on, on a platform without CPU affinity (start the process under the
    platform's own CPU limit instead), and once JAX's backend has started.
    """
    cores = available_cores()
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(cores):
        raise BuildError(f"set_cpu_threads: n: expected an int from 1 to {len(cores)} (the cores "
                         f"this process may run on), got {n!r}")
    if not hasattr(os, "sched_setaffinity"):
        raise BuildError("set_cpu_threads: this platform has no CPU affinity "
                         "(os.sched_setaffinity); limit the process's cores when starting it")
    if backend_started():
        raise BuildError("set_cpu_threads: JAX's backend has already started, and its CPU "
                         "thread pool was sized then; call set_cpu_threads before the first "
                         f"JAX computation (or start the process under `taskset -c 0-{n - 1}`)")
    global _configured
    whole = set(cores)
    os.sched_setaffinity(0, set(cores[:n]))
    try:
        jax.devices("cpu")
        _configured = n
    finally:
        os.sched_setaffinity(0, whole)
