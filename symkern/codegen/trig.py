"""codegen, stage 3 helper: sin and cos that XLA's CPU backend can vectorize.

Imports ast, jax and numpy.

XLA computes float32 sin and cos on the CPU by calling the C library once per element:
~4-5 ns an element at 10^7 elements, where exp and tanh (polynomials XLA vectorizes) cost
~0.5 ns over a multiply-add, and a call in a loop keeps the rest of the loop's arithmetic
from being vectorized too (`benchmarks/experiments/fast_trig.py`, docs/design/trig.md).
The `polynomial_trig` pass (symkern.codegen.passes) rewrites a kernel's `jnp.sin(x)` and
`jnp.cos(x)` to `trig.sin(x)` and `trig.cos(x)`, visibly in `kernel.source`, which compute
each element by itself:

- **|x| <= FAST_UP_TO**: a Cody-Waite reduction by pi/2 in four float32 parts of 12
  significant bits (k = round(x * 2/pi) < 2^12, so every k * part is exact), then Cephes'
  sinf / cosf minimax polynomials on [-pi/4, pi/4]; within 2 ulps of the exact value
  (tests/codegen/test_trig.py checks against mpmath), where the C library is within 0.56;
- **any other element** (larger, infinite or NaN): `jnp.sin` / `jnp.cos`, the library's value.

An element's value depends on that element alone, never on the batch it is in or on its
size. The library is evaluated only when some element of the call needs it
(`lax.cond(max |x| <= FAST_UP_TO, polynomial, per element)`): the condition decides what
is computed, not what a sample gets (both branches compute an in-range element with the
same operations, and a test checks their bits agree). Measured at 100,000 samples: the
double pendulum 4.1x, the 3-link pendulum on a cart 1.7x.

Where it applies (`applies`): float32 kernels built for the CPU whose code calls sin and cos
at most POLYNOMIAL_UP_TO_CALLS times (each call compiles two branches: a generated
10^3-operation expression with 194 calls took 6.4 s to compile instead of 1.1).
Derivatives are the other function at the same site (custom JVP).
"""

from __future__ import annotations

import ast
import copy
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

#: the polynomial's argument range: k = round(x * 2/pi) <= 2608 < 2^12
FAST_UP_TO = np.float32(4096.0)
#: kernels whose code calls sin and cos more often than this keep jnp.sin / jnp.cos
POLYNOMIAL_UP_TO_CALLS = 32

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


def _per_element(x: Any, quarter_turns: int, library: Any) -> Any:
    # NaN compares False: it takes the library too
    return jnp.where(jnp.abs(x) <= FAST_UP_TO, polynomial(x, quarter_turns), library(x))


def _site(x: Any, quarter_turns: int, library: Any) -> Any:
    x = jnp.asarray(x)
    if x.dtype != np.float32:
        return library(x)
    # The condition is a float max (one vectorized reduction; `any` of a bool mask is a
    # cascade of reduce-windows on XLA's CPU backend, 0.8x the pendulum's throughput), and
    # each branch computes the polynomial in its own loop: computed once outside and passed
    # in, it is one more pass over the batch (0.8x). A NaN that the max skips takes the
    # polynomial, whose value at NaN (and at an infinity) is NaN, the library's value too.
    return lax.cond(jnp.max(jnp.abs(x)) <= FAST_UP_TO,
                    lambda v: polynomial(v, quarter_turns),
                    lambda v: _per_element(v, quarter_turns, library), x)


@jax.custom_jvp
def sin(x: Any) -> Any:
    """sin(x), each float32 element by the polynomial within FAST_UP_TO, else jnp.sin."""
    return _site(x, 0, jnp.sin)


@jax.custom_jvp
def cos(x: Any) -> Any:
    """cos(x), each float32 element by the polynomial within FAST_UP_TO, else jnp.cos."""
    return _site(x, 1, jnp.cos)


@sin.defjvp
def _sin_jvp(primals: tuple, tangents: tuple) -> tuple:
    (x,), (t,) = primals, tangents
    return sin(x), cos(x) * t


@cos.defjvp
def _cos_jvp(primals: tuple, tangents: tuple) -> tuple:
    (x,), (t,) = primals, tangents
    return cos(x), -sin(x) * t


class TrigNamespace:
    """What a kernel's code reads as `trig`: this module's `sin` and `cos`."""

    sin = staticmethod(sin)
    cos = staticmethod(cos)

    def __repr__(self) -> str:
        return "<sin and cos from symkern.codegen.trig>"


#: the one instance every kernel namespace holds as `trig` (no state)
NAMESPACE = TrigNamespace()


def _is_library_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("sin", "cos") and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "jnp")


def trig_calls(module: ast.Module) -> int:
    """How many `jnp.sin(...)` and `jnp.cos(...)` calls a kernel's code makes."""
    return sum(1 for node in ast.walk(module) if _is_library_call(node))


def applies(module: ast.Module, dtype: np.dtype, backend: str) -> bool:
    """Whether a kernel's code gets the polynomial sin and cos (see the module docstring)."""
    return (np.dtype(dtype) == np.float32 and backend == "cpu"
            and 0 < trig_calls(module) <= POLYNOMIAL_UP_TO_CALLS)


class _UsePolynomial(ast.NodeTransformer):
    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if _is_library_call(node):
            node.func = ast.Attribute(ast.Name("trig", ast.Load()), node.func.attr, ast.Load())
        return node


def use_polynomial(module: ast.Module) -> ast.Module:
    """A copy of `module` with `jnp.sin(...)` / `jnp.cos(...)` as `trig.sin(...)` / `trig.cos(...)`."""
    return ast.fix_missing_locations(_UsePolynomial().visit(copy.deepcopy(module)))
