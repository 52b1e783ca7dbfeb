"""kernels: a caller's argument values as real arrays of a kernel's dtype, and data arrays
broadcast to one batch shape, checked the same way for built, bound and loaded kernels.
Imports jax, numpy, sympy and symkern.errors.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import sympy as sp

from symkern.errors import ArgumentError


def real_dtype(dtype: np.dtype) -> bool:
    """Bool, integers and floats of any width, ml_dtypes' (bfloat16, float8) among them."""
    return dtype.kind in "biuf" or jnp.issubdtype(dtype, jnp.floating)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{type(value).__name__} of {len(text)} characters"


def _complex_number(value: Any, label: str) -> complex:
    """One element of an object array as a complex number (a complex kernel's input)."""
    if isinstance(value, sp.Basic):
        if not value.is_number:
            raise ArgumentError(f"{label}: expected numbers, got the SymPy expression "
                                f"{_shown(value)}, which has free symbols")
        try:
            return complex(value)
        except (TypeError, ValueError, OverflowError):
            raise ArgumentError(f"{label}: expected complex numbers, got {_shown(value)}, "
                                "which has no complex128 value") from None
    if not isinstance(value, numbers.Complex):
        raise ArgumentError(f"{label}: expected an array of complex numbers, got "
                            f"{type(value).__name__} {_shown(value)}")
    return complex(value)


def _real_number(value: Any, label: str) -> float:
    """One element of an object array as a float: Python and numpy numbers, SymPy numbers
    (Float, Rational, pi, E, sqrt(2)); an integer beyond float64, a complex number, an
    expression with symbols or anything else is an ArgumentError naming it."""
    if isinstance(value, sp.Basic):
        if not value.is_number:
            raise ArgumentError(f"{label}: expected numbers, got the SymPy expression "
                                f"{_shown(value)}, which has free symbols")
        if value.is_Integer:
            value = int(value)
        else:
            try:
                number = complex(value)
            except (TypeError, ValueError, OverflowError):
                raise ArgumentError(f"{label}: expected real numbers, got {_shown(value)}, "
                                    "which has no float64 value") from None
            if number.imag != 0:
                raise ArgumentError(f"{label}: expected real numbers, got {_shown(value)}")
            return number.real
    if not isinstance(value, numbers.Real):
        kind = "a complex number" if isinstance(value, numbers.Complex) else type(value).__name__
        raise ArgumentError(f"{label}: expected an array of real numbers, got {kind} "
                            f"{_shown(value)}")
    try:
        return float(value)
    except OverflowError:
        raise ArgumentError(f"{label}: expected numbers within float64's range, got an "
                            f"integer of {int(value).bit_length()} bits") from None


def as_real_array(value: Any, label: str, dtype: np.dtype) -> Any:
    """`value` as an array of `dtype`, or an ArgumentError that names `label`.

    Device arrays and tracers keep their kind (cast by JAX); everything else becomes a
    numpy array cast on the host (jit takes numpy arguments without a separate device
    conversion). Bool, integers and floats of any width are accepted, longdouble too
    (cast down to `dtype`); strings, None, objects, ragged lists and complex numbers are
    refused: `"2"` is not 2.0. A complex `dtype` (a complex kernel) takes complex numbers
    too.
    """
    complex_kernel = np.dtype(dtype).kind == "c"
    expected = "numbers" if complex_kernel else "real numbers"

    def allowed(kind: np.dtype) -> bool:
        return real_dtype(kind) or complex_kernel and np.dtype(kind).kind == "c"

    if isinstance(value, jax.Array):  # device arrays and tracers
        if not allowed(value.dtype):
            raise ArgumentError(f"{label}: expected {expected}, got dtype {value.dtype.name}")
        return value if value.dtype == dtype else value.astype(dtype)
    if isinstance(value, (list, tuple)) and any(
            isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(value)):
        # nested lists traced by a kernel's direct path (jit takes a list as a tree)
        return as_real_array(jnp.asarray(value), label, dtype)
    try:
        array = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as error:
        ragged = "a ragged " if isinstance(value, (list, tuple)) else ""
        raise ArgumentError(f"{label}: expected an array of numbers, got {ragged}"
                            f"{type(value).__name__}") from error
    if array.dtype.kind == "O":
        # SymPy numbers, Python ints beyond int64, None and other objects
        number, kind = (_complex_number, np.complex128) if complex_kernel else (_real_number,
                                                                                 np.float64)
        array = np.array([number(v, label) for v in array.flat], kind).reshape(array.shape)
    if not allowed(array.dtype):
        raise ArgumentError(f"{label}: expected {expected}, got dtype {array.dtype.name}")
    return array if array.dtype == dtype else array.astype(dtype)


def _shape_text(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _broadcasts(first: tuple[int, ...], second: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(first, second)
    except ValueError:
        return False
    return True


def broadcast_data(arrays: Sequence[Any], batches: Sequence[tuple[int, ...]],
                   labels: Sequence[str]) -> tuple[Any, ...]:
    """Data arrays broadcast to one batch shape, NumPy's broadcast of their batch shapes
    `batches` (`f(a, X)` with `a` one sample and `X` a batch); an ArgumentError naming two
    arguments whose batch shapes do not broadcast."""
    if all(shape == batches[0] for shape in batches):  # also symbolic sizes (jax.export)
        return tuple(arrays)
    batch: tuple[int, ...] = ()
    for k, shape in enumerate(batches):
        try:
            batch = np.broadcast_shapes(batch, shape)
        except ValueError:
            # the broadcast so far conflicts with `shape` where one earlier argument does
            other = next(j for j in range(k) if not _broadcasts(batches[j], shape))
            raise ArgumentError(
                f"{labels[k]}: batch shape {_shape_text(shape)} does not broadcast with "
                f"{labels[other]}'s {_shape_text(batches[other])}; the data arguments' batch "
                "shapes must broadcast together (NumPy's rules)") from None
    out = []
    for array, shape in zip(arrays, batches, strict=True):
        if shape != batch:
            full = batch + tuple(np.shape(array))[len(shape):]
            array = (jnp.broadcast_to(array, full) if isinstance(array, jax.Array)
                     else np.broadcast_to(array, full))
        out.append(array)
    return tuple(out)
