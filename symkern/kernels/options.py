"""kernels: the XLA compiler options symkern's executables are compiled with.

Imports jax, numpy and symkern.errors.

XLA's CPU backend prefers 256-bit vectors, also on CPUs with AVX-512: 512-bit instructions
lower the clock of many Intel cores. AMD's Zen 4 and later run them at full clock, and there
`xla_cpu_prefer_vector_width=512` ran symkern's kernels 1.0-1.35x as fast (the 4-16-16-4
Jacobian 1.14x, the 3-link pendulum on a cart 1.13x; `benchmarks/experiments/
vector_width.py`, docs/design/vector-width.md). So kernels running on the
CPU prefer 512-bit vectors where the host is an AMD CPU with AVX-512, unless
`SYMKERN_CPU_VECTOR_WIDTH` says otherwise (`256`, `512`; empty or `0`: XLA's default).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from symkern.errors import BuildError

#: the XLA debug option (a field of DebugOptions), checked to exist before it is used
VECTOR_WIDTH_OPTION = "xla_cpu_prefer_vector_width"
#: environment variable overriding the choice: a width in bits, or 0 / empty for XLA's own
VECTOR_WIDTH_ENV = "SYMKERN_CPU_VECTOR_WIDTH"


def _full_clock_avx512(cpuinfo: str) -> bool:
    """Whether /proc/cpuinfo's text describes an AMD CPU with AVX-512 (full-clock 512-bit)."""
    vendor = flags = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = value
    return vendor == "AuthenticAMD" and "avx512f" in flags.split()


@functools.cache
def _host_has_full_clock_avx512() -> bool:
    """`_full_clock_avx512` of this host's /proc/cpuinfo, read once per process (every
    kernel asks, for each of its top-level jits); False where there is none."""
    try:
        return _full_clock_avx512(Path("/proc/cpuinfo").read_text())
    except OSError:
        return False


def vector_width() -> int | None:
    """The preferred CPU vector width in bits, or None for XLA's default."""
    setting = os.environ.get(VECTOR_WIDTH_ENV, None)
    if setting is not None:
        if setting.strip() in ("", "0"):
            return None
        if setting.strip() not in ("128", "256", "512"):
            raise BuildError(f"{VECTOR_WIDTH_ENV}: expected 128, 256, 512, or 0 for XLA's "
                             f"default, got {setting!r}")
        return int(setting)
    return 512 if _host_has_full_clock_avx512() else None


@functools.cache
def _accepted(width: int) -> bool:
    """Whether this jaxlib compiles with the option (an unknown one is an error there)."""
    try:
        jax.jit(lambda x: x + 1, compiler_options={VECTOR_WIDTH_OPTION: width}).lower(
            np.zeros(1, np.float32)).compile()
    except Exception:  # noqa: BLE001 - any failure: compile without the option
        return False
    return True


def cpu_compiler_options() -> dict[str, Any] | None:
    """The compiler options of kernels that run on the CPU, or None (XLA's defaults)."""
    if jax.default_backend() != "cpu":
        return None
    width = vector_width()
    if width is None or not _accepted(width):
        return None
    return {VECTOR_WIDTH_OPTION: width}


def kernel_jit(function: Callable[..., Any]) -> Any:
    """`jax.jit(function)` with `cpu_compiler_options()`: how symkern jits the programs it
    runs itself (a kernel called inside a user's `jax.jit` compiles with the user's)."""
    options = cpu_compiler_options()
    return jax.jit(function, compiler_options=options) if options else jax.jit(function)
