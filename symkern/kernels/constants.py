"""kernels, stage 3: constants — const args, closed-over arrays of user functions, the warning.

Imports jax, numpy, symkern.codegen and symkern.errors. See docs/design/constants.md for the why.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from symkern.codegen.callee import callee_name
from symkern.codegen.rules import HoistedLiteral, literal_value, output_dependencies
from symkern.errors import BuildError, CapturedConstantsWarning

#: environment variable: total const-arg bytes above which a kernel build warns; -1 disables
WARN_BYTES_VARIABLE = "SYMKERN_CAPTURED_CONSTANTS_WARN_BYTES"
DEFAULT_WARN_BYTES = 100 * 2**20


@dataclass(frozen=True)
class ConstArg:
    """A constant passed to the executable before the data arguments, never embedded.

    `name` is its parameter in `kernel.source` (`_k0`), `value` the device-resident array,
    `origin` which equation it came from and which rule or function put it there.
    """

    name: str
    value: Any
    origin: str

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.value.dtype)

    @property
    def nbytes(self) -> int:
        return int(self.value.size) * self.dtype.itemsize

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.value, dtype=dtype)

    def __repr__(self) -> str:
        return (f"ConstArg({self.name}: {self.dtype.name}{list(self.shape)}, {self.nbytes:,} bytes, "
                f"{self.origin})")


class PerSampleFunction:
    """A user's function, evaluated one sample at a time from its jaxpr.

    The arrays it closes over come in as leading arguments (const args) instead of being
    embedded in the program; the per-sample evaluation is vmapped over the batch.
    """

    def __init__(self, name: str, jaxpr: Any, consts: Sequence[Any], hoisted_positions: Sequence[int],
                 sample_shapes: Sequence[tuple[int, ...]]) -> None:
        self.name = name
        self.jaxpr = jaxpr
        self.consts = list(consts)
        self.hoisted_positions = tuple(hoisted_positions)
        self.sample_shapes = tuple(sample_shapes)

    def __call__(self, *inputs: Any) -> Any:
        count = len(self.hoisted_positions)
        hoisted, arguments = inputs[:count], inputs[count:]
        consts = list(self.consts)
        for position, value in zip(self.hoisted_positions, hoisted, strict=True):
            consts[position] = value
        batched = [k for k, (a, shape) in enumerate(zip(arguments, self.sample_shapes, strict=True))
                   if np.ndim(a) > len(shape)]
        if not batched:
            return jax.core.eval_jaxpr(self.jaxpr, consts, *arguments)[0]
        batch_shape = jax.lax.broadcast_shapes(
            *(tuple(np.shape(arguments[k]))[: np.ndim(arguments[k]) - len(self.sample_shapes[k])]
              for k in batched))
        broadcast = [jnp.broadcast_to(a, tuple(batch_shape) + shape) if k in batched else a
                     for k, (a, shape) in enumerate(zip(arguments, self.sample_shapes, strict=True))]
        axes = [0 if k in batched else None for k in range(len(broadcast))]

        def one_sample(*values: Any) -> Any:
            return jax.core.eval_jaxpr(self.jaxpr, consts, *values)[0]

        # one vmap per batch dimension: no reshape, so symbolic (exported) batch shapes work
        evaluate = one_sample
        for _ in batch_shape:
            evaluate = jax.vmap(evaluate, in_axes=axes)
        return evaluate(*broadcast)

    def __repr__(self) -> str:
        return f"PerSampleFunction({self.name}, {len(self.hoisted_positions)} const arg(s))"


@dataclass(frozen=True)
class CapturedConstant:
    """An array a user's function closed over, hoisted as const arg `name`."""

    name: str
    value: Any
    functions: tuple[str, ...]
    used_by: tuple[int, ...]


def _identity(value: Any) -> tuple:
    """Deduplicate by identity of the underlying buffer (the same array, captured twice)."""
    if isinstance(value, jax.Array):
        return ("device", value.unsafe_buffer_pointer(), value.shape, str(value.dtype))
    array = np.asarray(value)
    return ("host", array.__array_interface__["data"][0], array.shape, str(array.dtype))


def _sample_shape(node: ast.expr, literal_shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    if isinstance(node, ast.Name) and node.id in literal_shapes:
        return literal_shapes[node.id]
    if isinstance(node, ast.Call) and callee_name(node.func).name == "array" and node.args:
        literal = literal_value(node.args[0])
        if literal is not None:
            return np.shape(literal)
    return ()


def _trace_user_function(function: Callable, name: str, shapes: tuple, dtype: np.dtype) -> Any:
    """`jax.make_jaxpr` of a user function on per-sample arguments of `shapes`; what it
    raises becomes a BuildError naming the function and how it was called."""
    try:
        return jax.make_jaxpr(function)(*(jax.ShapeDtypeStruct(shape, dtype) for shape in shapes))
    except Exception as error:  # noqa: BLE001 - the user's code: any exception, re-raised named
        described = ", ".join(f"{np.dtype(dtype).name}{list(shape)}" for shape in shapes)
        hint = ""
        if isinstance(error, (jax.errors.ConcretizationTypeError,
                              jax.errors.TracerArrayConversionError, TypeError)):
            # math.sin(v) and numpy.sin(v) ask a traced value for a concrete number
            hint = ("; an implementation is traced by JAX: write it with jax.numpy "
                    "(jnp.sin, not math.sin or numpy.sin)")
        raise BuildError(
            f'functions["{name}"]: raised {type(error).__name__} when traced with '
            f"{len(shapes)} argument(s) ({described}), as the equations call it{hint}: {error}"
        ) from error


def hoist_captured_constants(
    module: ast.Module,
    functions: Mapping[str, Callable],
    dtype: np.dtype,
    embed_max_bytes: int,
    literals: Sequence[HoistedLiteral],
) -> tuple[ast.Module, dict[str, PerSampleFunction], list[CapturedConstant]]:
    """Trace each user function once per call signature; hoist the arrays it closes over.

    Every call `functions["f"](args)` becomes `functions["f"](_kN, …, args)`, the kernel
    gains those `_kN` parameters after the array-literal ones, and `functions["f"]` in the
    kernel namespace becomes a `PerSampleFunction`.
    """
    function = next(node for node in module.body if isinstance(node, ast.FunctionDef))
    literal_shapes = {literal.name: literal.value.shape for literal in literals}
    next_index = len(literals)
    wrapped: dict[str, PerSampleFunction] = {}
    signatures: dict[tuple, tuple[str, list[str]]] = {}
    by_identity: dict[tuple, str] = {}
    captured: list[CapturedConstant] = []

    class Rewrite(ast.NodeTransformer):
        def visit_Call(self, node: ast.Call) -> ast.expr:
            nonlocal next_index
            self.generic_visit(node)
            if not (isinstance(node.func, ast.Subscript) and isinstance(node.func.slice, ast.Constant)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "functions"):
                return node
            name = node.func.slice.value
            shapes = tuple(_sample_shape(argument, literal_shapes) for argument in node.args)
            key = (name, shapes)
            if key not in signatures:
                closed = _trace_user_function(functions[name], name, shapes, dtype)
                if len(closed.out_avals) != 1 or closed.out_avals[0].shape != ():
                    raise BuildError(
                        f'functions["{name}"]: expected one scalar per sample, got '
                        f"{[tuple(a.shape) for a in closed.out_avals]} for arguments of shapes "
                        f"{list(shapes)}"
                    )
                hoisted_positions, names = [], []
                for position, const in enumerate(closed.consts):
                    if np.ndim(const) == 0 or np.asarray(const).nbytes <= embed_max_bytes:
                        continue
                    identity = _identity(const)
                    if identity not in by_identity:
                        by_identity[identity] = f"_k{next_index}"
                        next_index += 1
                        captured.append(CapturedConstant(by_identity[identity], const, (), ()))
                    index = next(k for k, c in enumerate(captured) if c.name == by_identity[identity])
                    if name not in captured[index].functions:
                        captured[index] = dataclasses.replace(
                            captured[index], functions=captured[index].functions + (name,))
                    hoisted_positions.append(position)
                    names.append(by_identity[identity])
                entry = name if name not in wrapped else f"{name}/{len(signatures)}"
                wrapped[entry] = PerSampleFunction(name, closed.jaxpr, closed.consts,
                                                   hoisted_positions, shapes)
                signatures[key] = (entry, names)
            entry, names = signatures[key]
            node.func.slice = ast.Constant(entry)
            node.args = [ast.Name(n, ast.Load()) for n in names] + node.args
            return node

    function.body = [Rewrite().visit(statement) for statement in function.body]
    if captured:
        dependencies = output_dependencies(function, {c.name for c in captured})
        captured = [dataclasses.replace(c, used_by=tuple(sorted(dependencies[c.name])))
                    for c in captured]
        position = len(literals)
        function.args.args[position:position] = [ast.arg(c.name) for c in captured]
    return ast.fix_missing_locations(module), wrapped, captured


def warn_bytes() -> int:
    """The warning threshold: SYMKERN_CAPTURED_CONSTANTS_WARN_BYTES, or the default."""
    raw = os.environ.get(WARN_BYTES_VARIABLE)
    if raw is None:
        return DEFAULT_WARN_BYTES
    try:
        return int(raw)
    except ValueError as error:
        raise BuildError(f"{WARN_BYTES_VARIABLE}: expected an integer number of bytes or -1, "
                         f"got {raw!r}") from error


def warn_if_large(const_args: Sequence[ConstArg]) -> None:
    """One warning listing every const arg, its size and its origin, above the threshold."""
    threshold = warn_bytes()
    total = sum(c.nbytes for c in const_args)
    if threshold < 0 or total <= threshold:
        return
    lines = "\n".join(f"  {c.name}: {c.dtype.name}{list(c.shape)}, {c.nbytes:,} bytes, {c.origin}"
                      for c in const_args)
    warnings.warn(
        f"this kernel holds {total:,} bytes of constants as const args (above "
        f"{WARN_BYTES_VARIABLE}={threshold:,}):\n{lines}\nThey are passed to the executable, "
        f"never embedded; set {WARN_BYTES_VARIABLE}=-1 to silence this.",
        CapturedConstantsWarning,
        stacklevel=3,
    )


def origin_of(used_by: Sequence[int], labels: Callable[[int], str], how: str) -> str:
    used = sorted({labels(position) for position in used_by})
    return f"{how}, used by {', '.join(used) if used else 'no output'}"
