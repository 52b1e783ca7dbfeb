"""kernels: where XLA's CPU backend gets the memory of a call's buffers.

Imports ctypes and symkern.errors (and symkern.kernels.threads for the backend's state).

XLA's CPU runtime allocates every buffer of a call — its outputs and the intermediates it
keeps — with the C library's `malloc` and frees it when it is done. glibc serves a block
above its mmap threshold (128 KiB, raised as blocks are freed up to 32 MiB) with a fresh
`mmap` and gives it back with `munmap`, gives back free memory at the top of its heap, and
gives each thread that allocates its own heap of at most 64 MiB: XLA's pool threads, which
allocate the outputs, get a fresh mapping for any output larger than that. A fresh mapping
is faulted in page by page on the call that writes it: on the development machine that costs
about 1 us a 4 KiB page, about 4 GB/s, and a kernel whose outputs are many per-sample
entries (a mass matrix) spends most of its time there (docs/design/cpu-throughput.md).

`reuse_cpu_memory(up_to_bytes)` tells glibc to keep that memory: one heap for every thread
(`M_ARENA_MAX` 1), blocks up to `up_to_bytes` from it (`M_MMAP_THRESHOLD`), and up to
`up_to_bytes` of free memory kept at its top (`M_TRIM_THRESHOLD`). The next call reuses the
pages the last one freed, once the heap has grown over the first calls to hold the pattern
of blocks they settle into. It is a setting of the process, and the price is memory that the
process keeps after freeing it: a few times what one call allocates (880 MiB resident against
563 MiB for a kernel allocating two 77 MB buffers a call); it is not on by default, as JAX
does not touch the C library's allocator.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
from pathlib import Path

from symkern.errors import BuildError
from symkern.kernels.threads import backend_started

#: where Linux says whether anonymous memory may be backed by transparent huge pages, and
#: their size
TRANSPARENT_HUGE_PAGES = Path("/sys/kernel/mm/transparent_hugepage")

#: glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
#: mallopt takes an int; below glibc's own starting threshold the setting would map more
SMALLEST = 128 * 1024
LARGEST = 2**31 - 1
DEFAULT_UP_TO = 2**30


def glibc() -> ctypes.CDLL | None:
    """The process's C library where it is glibc (the only one with these settings)."""
    if platform.system() != "Linux":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc


def reuse_cpu_memory(up_to_bytes: int = DEFAULT_UP_TO) -> None:
    """Keep the memory of freed CPU buffers in the process so that the next kernel call
    reuses it instead of faulting in fresh pages: glibc's malloc gets one heap for every
    thread, serves blocks up to `up_to_bytes` from it and keeps up to `up_to_bytes` of free
    memory. Call it before the first JAX computation of the process (XLA's threads take
    their heaps then). The process keeps the memory it frees (its heap grows over the first
    calls to a few times what one call allocates).

    Raises BuildError for an `up_to_bytes` that is not an int from 128 KiB to 2^31 - 1, on a
    C library other than glibc (start the process with another allocator instead), and once
    JAX's backend has started.
    """
    if isinstance(up_to_bytes, bool) or not isinstance(up_to_bytes, int) \
            or not SMALLEST <= up_to_bytes <= LARGEST:
        raise BuildError(f"reuse_cpu_memory: up_to_bytes: expected an int from {SMALLEST} to "
                         f"{LARGEST}, got {up_to_bytes!r}")
    libc = glibc()
    if libc is None:
        raise BuildError(f"reuse_cpu_memory: the C library of this process is not glibc "
                         f"({platform.system()}); its allocator has other settings (or start "
                         "the process with jemalloc or tcmalloc preloaded)")
    if backend_started():
        raise BuildError("reuse_cpu_memory: JAX's backend has already started, and XLA's "
                         "threads have their heaps; call reuse_cpu_memory before the first JAX "
                         f"computation (or start the process with MALLOC_ARENA_MAX=1 "
                         f"MALLOC_MMAP_THRESHOLD_={up_to_bytes} MALLOC_TRIM_THRESHOLD_={up_to_bytes})")
    for name, parameter, value in (("M_ARENA_MAX", M_ARENA_MAX, 1),
                                   ("M_MMAP_THRESHOLD", M_MMAP_THRESHOLD, up_to_bytes),
                                   ("M_TRIM_THRESHOLD", M_TRIM_THRESHOLD, up_to_bytes)):
        if libc.mallopt(parameter, value) != 1:
            raise BuildError(f"reuse_cpu_memory: glibc refused mallopt({name}, {value})")


#: where Linux describes the CPU's caches
CPU_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")
#: the last-level cache's size taken where the system does not say (this size's order on
#: the desktop and server CPUs of the last years)
LAST_LEVEL_CACHE_DEFAULT = 32 * 2**20


@functools.cache
def last_level_cache_bytes() -> int:
    """The size of the CPU's last-level cache in bytes, from sysfs, else
    LAST_LEVEL_CACHE_DEFAULT.

    The C loop writes a call's outputs past the caches (non-temporal stores) when they are
    at least this large: written through the caches, they would be evicted before anyone
    read them (docs/design/cpu-throughput.md, "Outputs past the caches").
    """
    best_level, best_size = 0, 0
    try:
        for index in CPU_CACHES.glob("index*"):
            if (index / "type").read_text().strip() not in ("Data", "Unified"):
                continue
            level = int((index / "level").read_text().strip())
            text = (index / "size").read_text().strip().upper()
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            size = int(text.rstrip("KMG")) * scale
            if level > best_level:
                best_level, best_size = level, size
    except (OSError, ValueError):
        return LAST_LEVEL_CACHE_DEFAULT
    return best_size if best_size > 0 else LAST_LEVEL_CACHE_DEFAULT


#: the most output bytes the C loop writes through the caches, whatever the last-level
#: cache's size: a virtual machine's sysfs reports its host's whole cache, shared with the
#: host's other cores (480 MiB on a 2-core Intel Xeon guest), and there outputs of 32-84 MiB
#: (nlink-2 and nlink-4 in both dtypes at 100,000 samples) ran 1.6-2.4x faster past the
#: caches, while nlink-2's 16 MiB in float32 ran 0.75x past them; 32 MiB is also the
#: last-level cache of the AMD EPYC where the threshold was first measured
STREAM_FROM_AT_MOST = 32 * 2**20


def stream_from_bytes() -> int:
    """The output bytes of a call from which the C loop writes past the caches: the
    last-level cache's size (`last_level_cache_bytes`), at most `STREAM_FROM_AT_MOST`."""
    return min(last_level_cache_bytes(), STREAM_FROM_AT_MOST)


@functools.cache
def huge_page_bytes() -> int:
    """The size of the kernel's transparent huge pages where memory a process advises
    (`madvise(MADV_HUGEPAGE)`) may be backed by them; 0 where it may not (not Linux, huge
    pages off, or the setting unreadable).

    The C loop (symkern.kernels.c_loop) advises the huge-page-aligned part of each output
    buffer, which it writes whole: a fresh mapping is then faulted in once every huge page
    instead of once every 4 KiB page (docs/design/cpu-throughput.md, "Fresh pages").
    """
    try:
        enabled = (TRANSPARENT_HUGE_PAGES / "enabled").read_text()
        size = int((TRANSPARENT_HUGE_PAGES / "hpage_pmd_size").read_text().strip())
    except (OSError, ValueError):
        return 0
    if "[never]" in enabled or size <= 0 or size & (size - 1):
        return 0
    return size
