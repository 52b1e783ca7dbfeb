"""kernels: the XLA compiler options symkern's executables are compiled with.

Imports jax, numpy and symkern.errors.

Kernels compile with XLA's default CPU vector width (256 bits) unless
`SYMKERN_CPU_VECTOR_WIDTH` asks for another (`128`, `256`, `512`; empty or `0`: XLA's
default). 512-bit vectors ran some kernels 1.0-1.35x as fast on AMD CPUs with AVX-512
(docs/design/vector-width.md), but jaxlib 0.10.2 computes `atan` wrongly at that width
(errors up to 2.3 in float32 and float64, on some batch sizes), so the width is not chosen
for the caller (tests/drift/test_vector_width.py watches the error).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from symkern.errors import BuildError

#: the XLA debug option (a field of DebugOptions), checked to exist before it is used
VECTOR_WIDTH_OPTION = "xla_cpu_prefer_vector_width"
#: environment variable overriding the choice: a width in bits, or 0 / empty for XLA's own
VECTOR_WIDTH_ENV = "SYMKERN_CPU_VECTOR_WIDTH"


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
    return None


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
