"""codegen, stage 3 helper: sin and cos that XLA's CPU backend can vectorize.

Imports ast, jax and numpy.

XLA computes sin and cos on the CPU by calling the C library once per element: float32
~4-5 ns an element at 10^7 elements, float64 ~8.6-9.5 ns, where exp and tanh (polynomials
XLA vectorizes) cost ~0.5 ns over a multiply-add, and a call in a loop keeps the rest of
the loop's arithmetic from being vectorized too (`benchmarks/experiments/fast_trig.py`,
docs/design/trig.md). The `polynomial_trig` pass (symkern.codegen.passes) rewrites a
kernel's `jnp.sin(x)` and `jnp.cos(x)` to `trig.sin(x)` and `trig.cos(x)`, visibly in
`kernel.source`, which compute each element by itself:

- **|x| <= the dtype's `fast_up_to`** (float32 4,096, float64 2^20): a Cody-Waite reduction
  by pi/2 in four parts, the first three short enough that every k * part is exact for
  k = round(x * 2/pi) in the range, then Cephes' minimax polynomials on [-pi/4, pi/4]
  (sinf / cosf for float32, sin / cos for float64); within 2 ulps of the exact value
  (tests/codegen/test_trig.py checks against mpmath);
- **any other element** (larger, infinite or NaN): `jnp.sin` / `jnp.cos`, the library's value.

An element's value depends on that element alone, never on the other elements of its
batch. The library is evaluated only when some element of the call needs it
(`lax.cond(max |x| <= fast_up_to, polynomial, per element)`): the condition decides what
is computed, not what a sample gets (both branches compute an in-range element with the
same operations, and a test checks their bits agree).

Where it applies (`applies`): float32 and float64 kernels built for the CPU whose code calls
sin and cos at most POLYNOMIAL_UP_TO_CALLS times (each call compiles two branches: a
generated 10^3-operation expression with 194 calls took 6.4 s to compile instead of 1.1).
Derivatives are the other function at the same site (custom JVP).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


@dataclasses.dataclass(frozen=True)
class Reduction:
    """One dtype's polynomial: its argument range, pi/2 in parts, the minimax coefficients."""

    #: the range whose elements take the polynomial: every k = round(x * 2/pi) in it is
    #: small enough that k * part is exact for each part but the last
    fast_up_to: Any
    #: pi/2 = the sum of these parts (computed with mpmath at 200 bits, checked by a test)
    pi_over_two_parts: tuple
    #: sin(r) = r + r^3 * sine(r^2), highest power first
    sine: tuple
    #: cos(r) = 1 - r^2/2 + r^4 * cosine(r^2), highest power first
    cosine: tuple


#: float32: four parts, the first three of 12 significant bits, |x| <= 4,096 (k <= 2,608
#: < 2^12); Cephes' sinf / cosf coefficients; within 2 ulps
FLOAT32 = Reduction(
    np.float32(4096.0),
    (np.float32(1.5703125), np.float32(4.837512969970703e-04),
     np.float32(7.549533620476723e-08), np.float32(2.5633441e-12)),
    (np.float32(-1.9515295891e-4), np.float32(8.3321608736e-3), np.float32(-1.6666654611e-1)),
    (np.float32(2.443315711809948e-5), np.float32(-1.388731625493765e-3),
     np.float32(4.166664568298827e-2)))
#: float64: four parts, the first three of 33 significant bits, |x| <= 2^20 (k <= 667,544
#: < 2^20); Cephes' sin / cos coefficients; within 2 ulps. The C library costs 8.6-9.5 ns an
#: element at 10^7 elements on the CPU, the polynomial 3.0, a multiply-add 2.4.
FLOAT64 = Reduction(
    np.float64(2.0 ** 20),
    (np.float64(float.fromhex("0x1.921fb54400000p+0")), np.float64(float.fromhex("0x1.0b4611a600000p-34")),
     np.float64(float.fromhex("0x1.3198a2e000000p-69")), np.float64(float.fromhex("0x1.b839a252049c1p-104"))),
    (np.float64(1.58962301576546568060e-10), np.float64(-2.50507477628578072866e-8),
     np.float64(2.75573136213857245213e-6), np.float64(-1.98412698295895385996e-4),
     np.float64(8.33333333332211858878e-3), np.float64(-1.66666666666666307295e-1)),
    (np.float64(-1.13585365213876817300e-11), np.float64(2.08757008419747316778e-9),
     np.float64(-2.75573141792967388112e-7), np.float64(2.48015872888517045348e-5),
     np.float64(-1.38888888888730564116e-3), np.float64(4.16666666666665929218e-2)))
#: the dtypes that have a polynomial, and theirs
REDUCTIONS = {np.dtype(np.float32): FLOAT32, np.dtype(np.float64): FLOAT64}
#: kernels whose code calls sin and cos more often than this keep jnp.sin / jnp.cos
POLYNOMIAL_UP_TO_CALLS = 32


def _horner(coefficients: tuple, z: Any) -> Any:
    value = coefficients[0]
    for c in coefficients[1:]:
        value = value * z + c
    return value


def polynomial(x: Any, quarter_turns: int) -> Any:
    """sin(x + quarter_turns * pi/2) for |x| <= its dtype's `fast_up_to` (0: sin, 1: cos)."""
    reduction = REDUCTIONS[np.dtype(x.dtype)]
    one = reduction.fast_up_to.dtype.type
    k = jnp.round(x * one(2 / np.pi))
    r = x
    for part in reduction.pi_over_two_parts:
        r = r - k * part
    r = jnp.where(k == 0, x, r)  # x - 0 * part is +0.0 for x = -0.0
    r2 = r * r
    sine = r + r * r2 * _horner(reduction.sine, r2)
    sine = jnp.where(r == 0, r, sine)  # sin(-0.0) is -0.0
    cosine = one(1) - one(0.5) * r2 + r2 * r2 * _horner(reduction.cosine, r2)
    quadrant = (k.astype(jnp.int32) + quarter_turns) & 3
    value = jnp.where((quadrant & 1) == 0, sine, cosine)
    return jnp.where(quadrant >= 2, -value, value)


def _per_element(x: Any, quarter_turns: int, library: Any) -> Any:
    # NaN compares False: it takes the library too
    limit = REDUCTIONS[np.dtype(x.dtype)].fast_up_to
    return jnp.where(jnp.abs(x) <= limit, polynomial(x, quarter_turns), library(x))


def _site(x: Any, quarter_turns: int, library: Any) -> Any:
    x = jnp.asarray(x)
    if np.dtype(x.dtype) not in REDUCTIONS:
        return library(x)
    # The condition is a float max (one vectorized reduction; `any` of a bool mask is a
    # cascade of reduce-windows on XLA's CPU backend, 0.8x the pendulum's throughput), and
    # each branch computes the polynomial in its own loop: computed once outside and passed
    # in, it is one more pass over the batch (0.8x). A NaN that the max skips takes the
    # polynomial, whose value at NaN (and at an infinity) is NaN, the library's value too.
    # (`initial`: an empty batch has no maximum.)
    return lax.cond(jnp.max(jnp.abs(x), initial=0) <= REDUCTIONS[np.dtype(x.dtype)].fast_up_to,
                    lambda v: polynomial(v, quarter_turns),
                    lambda v: _per_element(v, quarter_turns, library), x)


@jax.custom_jvp
def sin(x: Any) -> Any:
    """sin(x), each element by its dtype's polynomial within its range, else jnp.sin."""
    return _site(x, 0, jnp.sin)


@jax.custom_jvp
def cos(x: Any) -> Any:
    """cos(x), each element by its dtype's polynomial within its range, else jnp.cos."""
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
    return (np.dtype(dtype) in REDUCTIONS and backend == "cpu"
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
