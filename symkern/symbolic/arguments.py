"""symbolic: data arguments, parameter trees and equation sets, described by shape and entries.

Imports sympy, numpy, jax.tree_util and symkern.errors; nothing else of symkern.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import sympy as sp
from sympy.core.function import AppliedUndef
from sympy.logic.boolalg import BooleanAtom, BooleanFunction
from sympy.matrices.expressions.matexpr import MatrixElement
from sympy.utilities.exceptions import SymPyDeprecationWarning

from symkern.errors import BuildError

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ArgumentSpec:
    """One positional argument of a kernel: a data argument or one parameter leaf.

    `label` is how the argument is named in generated code and in error messages
    (`x1`, `ps["L1"]["W"]`); `entries` are the user's symbols in row-major order;
    `shape` is the per-sample shape the caller passes (a batch shape leads for data).
    """

    label: str
    shape: Shape
    entries: tuple[sp.Basic, ...]
    matrix_symbols: tuple[sp.MatrixSymbol, ...] = ()
    path: tuple[Any, ...] = ()
    #: the (rows, cols) of a Matrix leaf, also accepted for a column leaf: `W` of a
    #: `Dense(1, k)` is a k×1 Matrix whose values naturally come as (k, 1)
    declared_shape: Shape | None = None

    @property
    def is_data(self) -> bool:
        return not self.label.startswith("ps")

    def __repr__(self) -> str:
        return f"ArgumentSpec({self.label}: shape {self.shape})"


def _matrix_shape(rows: int, cols: int, *, vector_rows: bool) -> Shape:
    if cols == 1:
        return (rows,)
    if rows == 1 and vector_rows:
        return (cols,)
    return (rows, cols)


def is_applied_function(entry: Any) -> bool:
    """An undefined function of symbols, `q(t)`, or its derivative in them, `q(t).diff(t)`:
    the coordinates and speeds of sympy.physics.mechanics (`dynamicsymbols`), which an
    argument binds by position like a symbol.

    >>> t = sp.Symbol("t")
    >>> q = sp.Function("q")(t)
    >>> is_applied_function(q), is_applied_function(q.diff(t, 2)), is_applied_function(q + 1)
    (True, True, False)
    """
    if isinstance(entry, sp.Derivative):
        return (is_applied_function(entry.expr) and not isinstance(entry.expr, sp.Derivative)
                and all(isinstance(v, sp.Symbol) for v in entry.variables))
    return isinstance(entry, AppliedUndef) and all(isinstance(a, sp.Symbol) for a in entry.args)


def is_indexed_entry(entry: Any) -> bool:
    """An entry of an IndexedBase at integer indices, `x[0]` or `A[1, 2]`."""
    return (isinstance(entry, sp.Indexed) and isinstance(entry.base.label, sp.Symbol)
            and all(isinstance(i, sp.Integer) for i in entry.indices))


def is_bound_entry(entry: Any) -> bool:
    """What an argument binds by position besides symbols and MatrixSymbol entries: a
    function of time or its derivative, or an Indexed entry (replaced by a placeholder
    symbol before printing)."""
    return is_applied_function(entry) or is_indexed_entry(entry)


def _check_entry(entry: Any, where: str) -> sp.Basic:
    if isinstance(entry, (sp.Symbol, MatrixElement)) or is_bound_entry(entry):
        return entry
    raise BuildError(
        f"{where}: expected a SymPy Symbol, got {type(entry).__name__} {entry!r}; arguments "
        "must be symbols (or functions of time such as q(t) and their derivatives, or "
        "IndexedBase entries x[0]), not expressions"
    )


def _indexed_base_spec(obj: sp.IndexedBase, label: str, path: tuple[Any, ...], *,
                       vector_rows: bool) -> ArgumentSpec:
    shape = obj.shape
    if shape is None or len(shape) not in (1, 2) or not all(
            isinstance(d, (int, sp.Integer)) for d in shape):
        raise BuildError(f"{label}: expected an IndexedBase of one or two integer dimensions "
                         f"(sp.IndexedBase({str(obj.label)!r}, shape=(3,))), got {obj} of shape "
                         f"{shape}")
    if len(shape) == 1:
        entries = tuple(obj[i] for i in range(int(shape[0])))
        return ArgumentSpec(label, (len(entries),), entries, (), path)
    rows, cols = (int(d) for d in shape)
    entries = tuple(obj[i, j] for i in range(rows) for j in range(cols))
    return ArgumentSpec(label, _matrix_shape(rows, cols, vector_rows=vector_rows), entries, (),
                        path, (rows, cols))


def _nested_spec(obj: list | tuple, label: str, path: tuple[Any, ...]) -> ArgumentSpec:
    """A list of equally long lists of symbols: a matrix argument, row by row."""
    rows, cols = len(obj), len(obj[0])
    if cols == 0 or any(not isinstance(row, (list, tuple)) or len(row) != cols for row in obj):
        raise BuildError(f"{label}: expected rows of symbols of one length, got rows of lengths "
                         f"{[len(row) if isinstance(row, (list, tuple)) else 1 for row in obj]}")
    entries = tuple(_check_entry(e, f"{label}[{i}][{j}]")
                    for i, row in enumerate(obj) for j, e in enumerate(row))
    return ArgumentSpec(label, (rows, cols), entries, (), path, (rows, cols))


def _leaf_spec(obj: Any, label: str, path: tuple[Any, ...], *, vector_rows: bool) -> ArgumentSpec:
    if isinstance(obj, sp.Symbol) or is_bound_entry(obj):
        return ArgumentSpec(label, (), (obj,), (), path)
    if isinstance(obj, sp.IndexedBase):
        return _indexed_base_spec(obj, label, path, vector_rows=vector_rows)
    if isinstance(obj, sp.MatrixSymbol):
        if not all(isinstance(d, (int, sp.Integer)) for d in obj.shape):
            raise BuildError(f"{label}: expected a MatrixSymbol of integer shape, got {obj} of "
                             f"shape {obj.shape}")
        rows, cols = (int(d) for d in obj.shape)
        entries = tuple(obj[i, j] for i in range(rows) for j in range(cols))
        return ArgumentSpec(label, _matrix_shape(rows, cols, vector_rows=vector_rows), entries,
                            (obj,), path, (rows, cols))
    if isinstance(obj, sp.MatrixBase):
        rows, cols = obj.shape
        entries = tuple(_check_entry(e, f"{label}[{k}]") for k, e in enumerate(obj))
        return ArgumentSpec(label, _matrix_shape(rows, cols, vector_rows=vector_rows), entries,
                            (), path, (rows, cols))
    if vector_rows and isinstance(obj, (list, tuple)):
        if not obj:
            raise BuildError(f"{label}: expected at least one symbol, got an empty {type(obj).__name__}")
        if isinstance(obj[0], (list, tuple)):
            return _nested_spec(obj, label, path)
        entries = tuple(_check_entry(e, f"{label}[{k}]") for k, e in enumerate(obj))
        return ArgumentSpec(label, (len(entries),), entries, (), path)
    expected = ("a Symbol, a MatrixSymbol, a Matrix of symbols or a list/tuple of symbols"
                if vector_rows else "a Symbol, a MatrixSymbol or a Matrix of symbols")
    raise BuildError(f"{label}: expected {expected}, got {type(obj).__name__} {obj!r}")


def data_argument(obj: Any, position: int) -> ArgumentSpec:
    """Describe data argument number `position` (1-based), named `x{position}` in code.

    >>> x0, x1 = sp.symbols("x0 x1")
    >>> data_argument([x0, x1], 1)
    ArgumentSpec(x1: shape (2,))
    """
    return _leaf_spec(obj, f"x{position}", (), vector_rows=True)


def format_path(path: Sequence[Any]) -> str:
    """`("L1", "W")` → `ps["L1"]["W"]`; list positions print as `ps[0]`."""
    return "ps" + "".join("[" + (json.dumps(key) if isinstance(key, str) else repr(key)) + "]"
                          for key in path)


def _flatten(tree: Any, argument: str) -> tuple[list, Any]:
    try:
        return jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_symbolic_leaf)
    except (TypeError, ValueError) as error:
        raise BuildError(f"{argument}: expected dicts whose keys can be sorted together "
                         f"(all strings, or all numbers), got {error}") from error


def _key_value(key: Any) -> Any:
    for attribute in ("key", "idx", "name"):
        if hasattr(key, attribute):
            return getattr(key, attribute)
    raise BuildError(f"params: unsupported pytree node key {key!r}")


def _unprintable_key(key: Any) -> Any:
    """The part of a dict key that generated code cannot write in `ps[key]`, or None:
    keys are Python's own literals (or tuples of them), not SymPy or NumPy numbers
    (`ast.Constant` takes no others)."""
    if type(key) is tuple:
        return next((bad for bad in map(_unprintable_key, key) if bad is not None), None)
    return None if type(key) in (str, int, float, bool, type(None)) else key


def is_symbolic_leaf(obj: Any) -> bool:
    return isinstance(obj, (sp.Basic, sp.MatrixBase, sp.NDimArray))


def parameter_arguments(params: Any) -> tuple[list[ArgumentSpec], Any]:
    """Flatten a parameter pytree into leaf specs in argument order, and its treedef.

    The order is JAX's pytree order (dict keys sorted), so the caller's tree of arrays
    flattens into the same order.

    >>> a, b = sp.symbols("a b")
    >>> specs, _ = parameter_arguments({"L1": {"W": sp.Matrix([[a, b]])}, "c": a + 1})
    Traceback (most recent call last):
    ...
    symkern.errors.BuildError: ps["c"]: expected a Symbol, a MatrixSymbol or a Matrix of ..., got Add a + 1
    """
    if params is None:
        return [], jax.tree_util.tree_structure(None)
    flat, treedef = _flatten(params, "params")
    specs: list[ArgumentSpec] = []
    for key_path, leaf in flat:
        path = tuple(_key_value(k) for k in key_path)
        label = format_path(path)
        for key in path:
            bad = _unprintable_key(key)
            if bad is not None:
                raise BuildError(f"params: key {bad!r} of {label} is a {type(bad).__name__}; "
                                 "expected str, int, float, bool or None keys (str(key) or "
                                 "int(key) converts it)")
        if not (isinstance(leaf, (sp.Symbol, sp.MatrixSymbol, sp.MatrixBase, sp.IndexedBase))
                or is_bound_entry(leaf)):
            raise BuildError(
                f"{label}: expected a Symbol, a MatrixSymbol or a Matrix of symbols, "
                f"got {type(leaf).__name__} {leaf}"
            )
        specs.append(_leaf_spec(leaf, label, path, vector_rows=False))
    return specs, treedef


def check_unique_symbols(specs: Sequence[ArgumentSpec]) -> None:
    """Each symbol may be declared once, across all data arguments and parameter leaves."""
    seen: dict[sp.Basic, str] = {}
    for spec in specs:
        for k, entry in enumerate(spec.entries):
            where = f"{spec.label}[{k}]" if spec.shape else spec.label
            if entry in seen:
                raise BuildError(f"symbol {entry} is declared twice: as {seen[entry]} and as {where}")
            seen[entry] = where


@dataclass(frozen=True)
class EquationSet:
    """A pytree of equations, flattened: one leaf per equation, each with its shape.

    `leaves` are SymPy objects ready to print: an `Expr` for a scalar equation, an
    `ImmutableMatrix` or `ImmutableDenseNDimArray` for array ones; `shapes` are the
    result shapes a caller sees after the batch shape (`m×1` Matrix → `(m,)`).
    """

    leaves: tuple[sp.Basic, ...]
    shapes: tuple[Shape, ...]
    treedef: Any
    labels: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        total = 0
        for shape in self.shapes:
            count = 1
            for dim in shape:
                count *= dim
            total += count
        return total

    def label_of_entry(self, position: int) -> str:
        """Which equation flat entry `position` belongs to, as `eqs["key"][0]`."""
        start = 0
        for label, shape in zip(self.labels, self.shapes, strict=True):
            count = 1
            for dim in shape:
                count *= dim
            if position < start + count:
                return label
            start += count
        raise IndexError(position)

    @property
    def boolean(self) -> tuple[bool, ...]:
        """Per leaf, whether it is a condition or an array of conditions only (a bool
        result); a Matrix mixing conditions and numbers is numeric, as NumPy's array of
        both is."""
        return tuple(all(map(is_boolean, _leaf_entries(leaf))) for leaf in self.leaves)

    @property
    def imaginary(self) -> bool:
        """Whether an equation holds the imaginary unit `I` (a complex kernel by default)."""
        return any(leaf.has(sp.I) for leaf in self.leaves)

    def entries(self) -> list[sp.Basic]:
        """Every scalar entry of every equation, in row-major order."""
        out: list[sp.Basic] = []
        for leaf in self.leaves:
            if isinstance(leaf, (sp.MatrixBase, sp.NDimArray)):
                out.extend(sp.flatten(leaf.tolist()) if isinstance(leaf, sp.NDimArray) else list(leaf))
            else:
                out.append(leaf)
        return out


def _leaf_entries(leaf: sp.Basic) -> list[sp.Basic]:
    if isinstance(leaf, sp.NDimArray):
        return list(sp.flatten(leaf.tolist()))
    if isinstance(leaf, sp.MatrixBase):
        return list(leaf)
    return [leaf]


def _equation_leaf(leaf: Any, where: str) -> tuple[sp.Basic, Shape]:
    if isinstance(leaf, sp.MatrixExpr) and not isinstance(leaf, sp.MatrixBase):
        try:
            leaf = leaf.as_explicit()
        except NotImplementedError as error:
            raise BuildError(
                f"eqs{where}: the matrix expression {type(leaf).__name__} ({leaf}) cannot be "
                f"written entry by entry (SymPy: {error}); write it with explicit matrices, "
                "e.g. sp.Matrix(M).LUsolve(sp.Matrix(v)) for MatrixSolve(M, v), or "
                "M.inv() * v"
            ) from error
    if isinstance(leaf, sp.MatrixBase):
        rows, cols = leaf.shape
        if rows == 0 or cols == 0:
            raise BuildError(f"eqs{where}: expected a non-empty Matrix, got shape {leaf.shape}")
        with matrices_of_conditions():
            matrix = sp.ImmutableMatrix(leaf)
        return matrix, _matrix_shape(rows, cols, vector_rows=False)
    if isinstance(leaf, sp.NDimArray):
        if leaf.rank() == 0:  # Array(expr): one value, a scalar equation
            return _equation_leaf(leaf[()], where)
        if 0 in leaf.shape:
            raise BuildError(f"eqs{where}: expected a non-empty Array, got shape {leaf.shape}")
        return sp.ImmutableDenseNDimArray(leaf), tuple(int(d) for d in leaf.shape)
    try:
        expr = sp.sympify(leaf, strict=True)
    except (sp.SympifyError, TypeError) as error:
        raise BuildError(
            f"eqs{where}: expected a SymPy expression, Matrix or Array, got "
            f"{type(leaf).__name__}"
        ) from error
    if is_boolean(expr):
        return expr, ()
    if not isinstance(expr, sp.Expr):
        raise BuildError(
            f"eqs{where}: expected a SymPy expression, a condition (x > 0, Eq, And, ...), a "
            f"Matrix or an Array, got {type(expr).__name__} {expr}"
        )
    return expr, ()


@contextlib.contextmanager
def matrices_of_conditions() -> Iterator[None]:
    """SymPy's deprecation warning for a Matrix holding conditions (`Matrix([x > 0])`) kept
    quiet while symkern copies and rewrites one: the user's Matrix warned once already."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"\s*non-Expr objects in a Matrix",
                                SymPyDeprecationWarning)
        yield


def is_boolean(expr: Any) -> bool:
    """A condition: a relational (`x > 0`, `Eq(x, y)`), a function of conditions (`And`,
    `Or`, `Not`, `Xor`, `ITE`) or `true`/`false`. A kernel returns it as a bool array.

    >>> x = sp.Symbol("x")
    >>> is_boolean(x > 0), is_boolean(sp.And(x > 0, x < 1)), is_boolean(x + 1)
    (True, True, False)
    """
    return isinstance(expr, (sp.Rel, BooleanFunction, BooleanAtom))


def equation_set(eqs: Any) -> EquationSet:
    """Flatten `eqs` (an Expr, Matrix, Array, or a pytree of them) into an `EquationSet`.

    >>> x = sp.Symbol("x")
    >>> equation_set({"v": x, "m": sp.Matrix([x, 2 * x])}).shapes
    ((2,), ())
    """
    flat, treedef = _flatten(eqs, "eqs")
    if not flat:
        raise BuildError("eqs: expected at least one equation, got an empty structure")
    leaves, shapes, labels = [], [], []
    for key_path, leaf in flat:
        keys = [_key_value(k) for k in key_path]
        where = "".join(f"[{key!r}]" for key in keys)
        for key in keys:
            bad = _unprintable_key(key)
            if bad is not None:
                raise BuildError(f"eqs: key {bad!r} of eqs{where} is a {type(bad).__name__}; "
                                 "expected str, int, float, bool or None keys: the keys of eqs "
                                 "are structure, never evaluated (str(key) converts it, or "
                                 "put the equations in a list)")
        printed, shape = _equation_leaf(leaf, where)
        leaves.append(printed)
        shapes.append(shape)
        labels.append(f"eqs{where}")
    return EquationSet(tuple(leaves), tuple(shapes), treedef, tuple(labels))
