"""codegen, stage 3 helper: sin and cos that XLA's CPU backend can vectorize.

Imports jax, numpy and symkern.errors.

XLA computes float32 sin and cos on the CPU by calling the C library once per element:
~4-5 ns an element at 10^7 elements, where exp and tanh (polynomials XLA vectorizes) cost
~0.5 ns over a multiply-add, and a call in a loop keeps the rest of the loop's arithmetic
from being vectorized too (`benchmarks/experiments/fast_trig.py`,
docs/design/trig.md). Here each call site of a large float32 batch computes

    lax.cond(max |x| <= FAST_UP_TO, polynomial, jnp.sin / jnp.cos, x)

- **polynomial**: a Cody-Waite reduction by pi/2 in four float32 parts of 12 significant bits
  (k = round(x * 2/pi) < 2^12, so every k * part is exact), then Cephes' sinf / cosf minimax
  polynomials on [-pi/4, pi/4]; within 2 ulps of the exact value on |x| <= FAST_UP_TO
  (tests/codegen/test_trig.py checks against mpmath), where the C library is within 0.56;
- **the fallback**: a batch with any |x| above FAST_UP_TO or an infinity at a call site takes
  jnp.sin / jnp.cos for that call: values are XLA's there, never the polynomial's outside
  its range (a NaN argument gives NaN either way, and XLA's CPU max may skip it);
- **its own fusion**: the conditional makes each call one small vectorized loop, and the rest of
  the body a loop without library calls. Measured at 100,000 samples: the double pendulum
  4.1x, the 3-link pendulum on a cart 1.7x (docs/design/trig.md).

Only where it pays and costs little to compile: a kernel's code with at most
VECTORIZED_UP_TO_CALLS sin/cos calls (each call compiles two branches: a generated
10^3-operation expression with 194 calls took 6.4 s instead of 1.1), call sites of at least
VECTORIZED_FROM float32 elements of a known size (smaller batches, a kernel's first call at
1,024 samples among them, and `kernel.export`'s symbolic batch compile and run as before),
the CPU backend, and unless
`SYMKERN_VECTORIZED_TRIG=0`. Derivatives are the other function at the same site (custom JVP).
"""

from __future__ import annotations

import ast
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from symkern.errors import BuildError

#: the polynomial's argument range: k = round(x * 2/pi) <= 2608 < 2^12
FAST_UP_TO = np.float32(4096.0)
#: call sites of fewer float32 elements keep jnp.sin / jnp.cos
VECTORIZED_FROM = 4096
#: kernels whose code calls sin and cos more often than this keep jnp.sin / jnp.cos
VECTORIZED_UP_TO_CALLS = 32
#: environment variable: "0" keeps jnp.sin / jnp.cos everywhere, "1" (or unset) chooses
VECTORIZED_TRIG_ENV = "SYMKERN_VECTORIZED_TRIG"

_TWO_OVER_PI = np.float32(2 / np.pi)
#: pi/2 = sum of these float32 parts, the first three of 12 significant bits (each k * part
#: is exact for k < 2^12); computed with mpmath at 200 bits and checked by a test
PI_OVER_TWO_PARTS = (np.float32(1.5703125), np.float32(4.837512969970703e-04),
                     np.float32(7.549533620476723e-08), np.float32(2.5633441e-12))
_SIN = (np.float32(-1.6666654611e-1), np.float32(8.3321608736e-3), np.float32(-1.9515295891e-4))
_COS = (np.float32(4.166664568298827e-2), np.float32(-1.388731625493765e-3),
        np.float32(2.443315711809948e-5))


def polynomial(x: Any, quarter_turns: int) -> Any:
    """sin(x + quarter_turns * pi/2) for float32 |x| <= FAST_UP_TO (0: sin, 1: cos)."""
    k = jnp.round(x * _TWO_OVER_PI)
    r = x
    for part in PI_OVER_TWO_PARTS:
        r = r - k * part
    r = jnp.where(k == 0, x, r)  # x - 0 * part is +0.0 for x = -0.0
    r2 = r * r
    sine = r + r * r2 * (_SIN[0] + r2 * (_SIN[1] + r2 * _SIN[2]))
    sine = jnp.where(r == 0, r, sine)  # sin(-0.0) is -0.0
    cosine = np.float32(1) - np.float32(0.5) * r2 + r2 * r2 * (
        _COS[0] + r2 * (_COS[1] + r2 * _COS[2]))
    quadrant = (k.astype(jnp.int32) + quarter_turns) & 3
    value = jnp.where((quadrant & 1) == 0, sine, cosine)
    return jnp.where(quadrant >= 2, -value, value)


def _vectorizes(x: Any) -> bool:
    """Whether a call site takes the conditional: a float32 array of VECTORIZED_FROM
    elements or more, traced for the CPU. A symbolic batch dimension (`kernel.export`)
    keeps the library: the size is not known until the exported kernel runs."""
    if getattr(x, "dtype", None) != np.float32 or jax.default_backend() != "cpu":
        return False
    shape = np.shape(x)
    return (all(isinstance(d, (int, np.integer)) for d in shape)
            and math.prod(shape) >= VECTORIZED_FROM)


def _site(x: Any, quarter_turns: int, library: Any) -> Any:
    if not _vectorizes(x):
        return library(x)
    return lax.cond(jnp.max(jnp.abs(x)) <= FAST_UP_TO,
                    lambda v: polynomial(v, quarter_turns), library, x)


@jax.custom_jvp
def sin(x: Any) -> Any:
    """jnp.sin, by the polynomial where a large float32 batch's arguments allow it."""
    return _site(x, 0, jnp.sin)


@jax.custom_jvp
def cos(x: Any) -> Any:
    """jnp.cos, by the polynomial where a large float32 batch's arguments allow it."""
    return _site(x, 1, jnp.cos)


@sin.defjvp
def _sin_jvp(primals: tuple, tangents: tuple) -> tuple:
    (x,), (t,) = primals, tangents
    return sin(x), cos(x) * t


@cos.defjvp
def _cos_jvp(primals: tuple, tangents: tuple) -> tuple:
    (x,), (t,) = primals, tangents
    return cos(x), -sin(x) * t


class VectorizedTrigNumpy:
    """jax.numpy as a kernel's code reads it, with `sin` and `cos` from this module."""

    sin = staticmethod(sin)
    cos = staticmethod(cos)

    def __getattr__(self, name: str) -> Any:
        return getattr(jnp, name)

    def __repr__(self) -> str:
        return "<jax.numpy, sin and cos from symkern.codegen.trig>"


#: the one instance every kernel namespace with vectorized sin and cos holds (no state)
NUMPY = VectorizedTrigNumpy()


def trig_calls(module: ast.Module) -> int:
    """How many `jnp.sin(...)` and `jnp.cos(...)` calls a kernel's code makes."""
    return sum(1 for node in ast.walk(module)
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr in ("sin", "cos") and isinstance(node.func.value, ast.Name)
               and node.func.value.id == "jnp")


def wanted(module: ast.Module) -> bool:
    """Whether a kernel's code gets the vectorized sin and cos (see the module docstring)."""
    setting = os.environ.get(VECTORIZED_TRIG_ENV, "").strip()
    if setting not in ("", "0", "1"):
        raise BuildError(f"{VECTORIZED_TRIG_ENV}: expected 1 (vectorized sin and cos where "
                         f"they pay) or 0 (jnp.sin and jnp.cos everywhere), got {setting!r}")
    if setting == "0":
        return False
    return 0 < trig_calls(module) <= VECTORIZED_UP_TO_CALLS
