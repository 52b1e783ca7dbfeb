"""codegen, stages 1–2 for matrix and array expressions: MatrixSymbol algebra printed as arrays.

Imports ast, jax.tree_util, numpy, sympy, symkern.codegen (rules, pipeline, structured),
symkern.symbolic, errors.

An equation written as a SymPy matrix expression (`W*x + b`, `MatrixSolve(A, v)`,
`Trace(P*H.T)`, an `ArrayContraction`) is printed as whole-array operations over
batch-leading arrays: a MatrixSymbol data argument is an array `(..., n, m)` (a vector one
`(..., n)`, read as `x1[..., :, None]`), a parameter is `(n, m)`, and every operation used
is batch-polymorphic (`@`, `jnp.linalg.solve`, `jnp.swapaxes(a, -1, -2)`, `jnp.einsum`
with `...`), so the batch stays leading and no entry is ever written out. Scalar parts (a
coefficient `a` in `a*W*x`, the function of an `ElementwiseApplyFunction`, a scalar
equation around a `Determinant`) are printed by the ordinary pipeline through
`structured.scalar_block` and broadcast. Numeric matrices become const args. The kernel
has the structured form (`generate_structured`): it returns pieces, whole array leaves and
scalar entries, described by a `StructuredLayout`.
"""

from __future__ import annotations

import ast
import copy
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import sympy as sp
from sympy.codegen.matrix_nodes import MatrixSolve
from sympy.matrices.expressions.applyfunc import ElementwiseApplyFunction
from sympy.matrices.expressions.hadamard import HadamardPower
from sympy.matrices.expressions.matexpr import MatrixElement
from sympy.tensor.array.expressions import (
    ArrayAdd,
    ArrayContraction,
    ArrayDiagonal,
    ArrayTensorProduct,
    PermuteDims,
)

from symkern.codegen import rules
from symkern.codegen.callee import ELEMENTWISE_TARGETS, dotted_name, target_node
from symkern.codegen.emit import EmittedCode
from symkern.codegen.pipeline import FLOAT32, GeneratedCode, print_source
from symkern.codegen.structured import (
    PieceLeaf,
    StructuredCode,
    StructuredLayout,
    scalar_block,
)
from symkern.errors import BuildError, CodegenDriftError
from symkern.symbolic.arguments import ArgumentSpec
from symkern.symbolic.nodes import walk

#: matrix-expression classes printed as arrays (an explicit Matrix is one too, as a leaf)
MATRIX_OPERATIONS = (
    sp.MatMul, sp.MatAdd, sp.MatPow, sp.Transpose, sp.Inverse, MatrixSolve, sp.HadamardProduct,
    HadamardPower, sp.KroneckerProduct, sp.BlockMatrix, sp.Identity, sp.ZeroMatrix,
    sp.OneMatrix, ElementwiseApplyFunction,
)
#: scalar-valued nodes computed from whole matrices
MATRIX_SCALARS = (sp.Trace, sp.Determinant, sp.DotProduct)
#: SymPy's array expressions (arbitrary rank)
ARRAY_OPERATIONS = (ArrayTensorProduct, ArrayContraction, PermuteDims, ArrayDiagonal, ArrayAdd)

#: callees through which a data argument may be read whole: each treats the leading axes
#: as batch axes (the axis arguments are checked by `check_batch_polymorphic`)
BATCH_POLYMORPHIC = frozenset({
    "jnp.linalg.solve", "clinalg.solve", "jnp.linalg.inv", "jnp.linalg.det", "jnp.linalg.matrix_power",
    "jnp.swapaxes", "jnp.trace", "jnp.einsum", "jnp.expand_dims", "jnp.sum", "jnp.concatenate",
})
#: the axis keywords a callee must be given (without them it reduces or joins the batch)
REQUIRED_AXES = {"jnp.sum": ("axis",), "jnp.concatenate": ("axis",),
                 "jnp.trace": ("axis1", "axis2")}

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def needs_array_program(leaf: Any) -> bool:
    """Whether an equation leaf is printed as array operations: a matrix expression that is
    not an explicit Matrix (nor a lone MatrixSymbol), a SymPy array expression, or a scalar
    expression that reads a Trace, Determinant, DotProduct or an entry of a matrix product.

    >>> W, x = sp.MatrixSymbol("W", 3, 3), sp.MatrixSymbol("x", 3, 1)
    >>> needs_array_program(W * x), needs_array_program(sp.Matrix([1, 2])), needs_array_program(W)
    (True, False, False)
    """
    if isinstance(leaf, ARRAY_OPERATIONS):
        return True
    if isinstance(leaf, sp.MatrixExpr) and not isinstance(leaf, sp.MatrixBase):
        return not isinstance(leaf, sp.MatrixSymbol)
    if isinstance(leaf, sp.Expr):
        return any(_array_valued_scalar(node) for node in walk([leaf]))  # depth-safe
    return False


def any_needs_array_program(eqs: Any) -> bool:
    """Whether any leaf of an equation pytree `needs_array_program`; False for a tree that
    does not flatten (its error is `equation_set`'s to report)."""
    try:
        leaves = jax.tree_util.tree_leaves(
            eqs, is_leaf=lambda obj: isinstance(obj, (sp.Basic, sp.MatrixBase, sp.NDimArray)))
    except (TypeError, ValueError):
        return False
    return any(map(needs_array_program, leaves))


def _array_valued_scalar(node: sp.Basic) -> bool:
    if isinstance(node, MATRIX_SCALARS):
        return True
    return isinstance(node, MatrixElement) and not isinstance(node.parent, sp.MatrixSymbol)


def _drift(rule: str, expected: str, found: str) -> CodegenDriftError:
    return CodegenDriftError(f"{rule}: expected {expected}, found {found}")


def _load(name: str) -> ast.Name:
    return ast.Name(name, ast.Load())


def _call(callee: str, *arguments: ast.expr, **keywords: Any) -> ast.Call:
    return ast.Call(target_node(callee), list(arguments),
                    [ast.keyword(k, v if isinstance(v, ast.AST) else ast.Constant(v))
                     for k, v in keywords.items()])


def _index(value: ast.expr, *items: Any) -> ast.Subscript:
    """`value[..., items]`; an item ":" is a slice, None a new axis."""
    nodes: list[ast.expr] = [ast.Constant(Ellipsis)]
    nodes += [ast.Slice() if item == ":" else ast.Constant(item) for item in items]
    return ast.Subscript(value, ast.Tuple(nodes, ast.Load()), ast.Load())


def _shape(expr: Any) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in expr.shape)
    except TypeError as error:
        raise BuildError(f"{expr}: expected a matrix of integer shape, got shape {expr.shape}") from error


@dataclass
class Printed:
    """An array value in the kernel: its expression and whether it reads a data argument."""

    node: ast.expr
    batched: bool


class ArrayPrinter:
    """Prints matrix and array expressions as batch-polymorphic array code.

    `matrix(expr)` is a `(..., n, m)` value, `tensor(expr)` one of the expression's rank
    after the batch, `scalar(expr)` a batch-shaped one; statements and const args collect
    in `body` and `literals`. A subexpression that occurs more than once is computed once,
    into a local `m<k>`.
    """

    def __init__(self, data: Sequence[ArgumentSpec], parameters: Sequence[ArgumentSpec], *,
                 cse: bool, embed_max_bytes: int, dtype: np.dtype,
                 occurrences: Counter) -> None:
        self.data = list(data)
        self.parameters = list(parameters)
        self.scalar_parameters = [spec for spec in parameters if spec.entries]
        self.options = {"cse": cse, "embed_max_bytes": embed_max_bytes, "dtype": dtype}
        self.dtype = np.dtype(dtype)
        self.embed_max_bytes = embed_max_bytes
        self.occurrences = occurrences
        self.body: list[ast.stmt] = []
        self.literals: list[rules.HoistedLiteral] = []
        self.upstream: list[str] = []
        self.memo: dict[sp.Basic, Printed] = {}
        self.blocks = 0
        #: the flat entry position of the leaf being printed (`HoistedLiteral.used_by`)
        self.used_by: tuple[int, ...] = ()
        self.data_names = {f"x{k + 1}" for k in range(len(data))}
        #: the whole-matrix reading of each MatrixSymbol and Matrix argument
        self.arguments: dict[sp.Basic, Printed] = {}
        #: each argument's array and its shape per sample, by MatrixSymbol or Matrix of symbols
        self.symbol_arrays: dict[sp.Basic, tuple[ast.expr, tuple[int, ...]]] = {}
        #: the read of each scalar entry of a data argument (`x2`, `x1[..., 0]`)
        self.entry_reads: dict[sp.Basic, ast.expr] = {}
        for k, spec in enumerate(self.data):
            self._declare(spec, _load(f"x{k + 1}"), True)
            for position, entry in enumerate(spec.entries):
                index = np.unravel_index(position, spec.shape) if spec.shape else ()
                self.entry_reads[entry] = (_index(_load(f"x{k + 1}"), *map(int, index))
                                           if spec.shape else _load(f"x{k + 1}"))
        for spec in self.parameters:
            value: ast.expr = _load("ps")
            for key in spec.path:
                value = ast.Subscript(value, ast.Constant(key), ast.Load())
            self._declare(spec, value, False)

    def _declare(self, spec: ArgumentSpec, value: ast.expr, batched: bool) -> None:
        """The whole-matrix reading of an argument, for each MatrixSymbol or Matrix it is."""
        rows_cols = spec.declared_shape
        if rows_cols is None and len(spec.shape) == 1 and spec.entries:
            rows_cols = (spec.shape[0], 1)  # a list of symbols: a column, as a Matrix of them
        if rows_cols is None:
            return
        if spec.shape == rows_cols:
            whole = value
        elif rows_cols[1] == 1:
            whole = _index(value, ":", None)
        else:
            whole = _index(value, None, ":")
        for symbol in spec.matrix_symbols:
            self.arguments[symbol] = Printed(whole, batched)
            self.symbol_arrays[symbol] = (value, spec.shape)
        if spec.entries:  # a Matrix of symbols: the matrix itself reads the argument whole
            matrix = sp.ImmutableMatrix(*rows_cols, list(spec.entries))
            self.arguments[matrix] = Printed(whole, batched)
            self.symbol_arrays[matrix] = (value, spec.shape)

    def batched(self, node: ast.expr) -> bool:
        """Whether printed code reads a data argument."""
        return bool(_names(node) & self.data_names)

    # ---- values -----------------------------------------------------------------------
    def _local(self, expr: sp.Basic, printed: Printed) -> Printed:
        if self.occurrences[expr] < 2 or isinstance(printed.node, ast.Name):
            return printed
        name = f"m{len(self.memo) + 1}"
        self.body.append(ast.Assign([ast.Name(name, ast.Store())], printed.node))
        return Printed(_load(name), printed.batched)

    def _assign(self, stem: str, node: ast.expr) -> ast.Name:
        name = f"{stem}{len(self.body) + 1}"
        self.body.append(ast.Assign([ast.Name(name, ast.Store())], node))
        return _load(name)

    def matrix(self, expr: sp.Basic) -> Printed:
        """`expr` (a matrix expression or Matrix) as a `(..., rows, cols)` value."""
        if expr in self.memo:
            return self.memo[expr]
        if expr in self.arguments:
            return self.arguments[expr]
        if isinstance(expr, sp.MatrixSymbol):
            raise BuildError(f"{expr}: a MatrixSymbol that is neither a data argument nor a "
                             "parameter; pass it as one of them")
        if _is_column_product(expr):
            row = self.row(expr)
            printed = Printed(_swap(row.node), row.batched)
            self.memo[expr] = printed
            return printed
        handler = _MATRIX_HANDLERS.get(type(expr))
        if handler is None:
            if isinstance(expr, sp.MatrixBase):
                handler = ArrayPrinter._explicit
            else:
                raise BuildError(
                    f"{type(expr).__name__} ({expr}): not a matrix operation symkern prints as "
                    f"arrays (it prints {', '.join(c.__name__ for c in MATRIX_OPERATIONS)}); "
                    "write it with those, or as an explicit Matrix (.as_explicit())")
        printed = self._local(expr, handler(self, expr))
        self.memo[expr] = printed
        return printed

    def row(self, expr: sp.MatrixExpr) -> Printed:
        """The transpose of a column `expr`, `(..., 1, n)`: `W*x + b` as
        `x1[..., None, :] @ swapaxes(W) + b[..., None, :]`. A batch of columns multiplied
        from the left (`W @ x1[..., :, None]`) ran 3.7× slower than the same product on
        rows at n = 64, batch 10,000 (XLA transposes the batch behind the matrix), and as
        fast as `x @ W.T` on rows (benchmarks/matrix.py)."""
        key = ("row", expr)
        if key in self.memo:
            return self.memo[key]
        if expr in self.symbol_arrays and len(self.symbol_arrays[expr][1]) == 1:
            value = _index(self.symbol_arrays[expr][0], None, ":")
            printed = Printed(value, self.batched(value))
        elif isinstance(expr, sp.MatAdd):
            printed = _summed([self.row(a) if isinstance(a, sp.MatrixExpr)
                               else self._broadcast_scalar(a) for a in expr.args])
        elif isinstance(expr, sp.MatMul) and _is_column_product(expr):
            scalars = [a for a in expr.args if not isinstance(a, sp.MatrixExpr)]
            matrices = [a for a in expr.args if isinstance(a, sp.MatrixExpr)]
            value = self.row(matrices[-1])
            node, batched = value.node, value.batched
            for operand in reversed(matrices[:-1]):
                right = self._transposed(operand)
                node, batched = ast.BinOp(node, ast.MatMult(), right.node), batched or right.batched
            if scalars:
                scaled = self._scaled(sp.Mul(*scalars), Printed(node, batched), axes=2)
                node, batched = scaled.node, scaled.batched
            printed = Printed(node, batched)
        else:
            value = self.matrix(expr)
            printed = Printed(_swap(value.node), value.batched)
        self.memo[key] = printed
        return printed

    def _transposed(self, expr: sp.MatrixExpr) -> Printed:
        if isinstance(expr, sp.Transpose):
            return self.matrix(expr.arg)
        if _shape(expr)[1] == 1 and _is_column_product(expr):
            return self.row(expr)
        value = self.matrix(expr)
        return Printed(_swap(value.node), value.batched)

    def column(self, expr: sp.MatrixExpr) -> ast.expr:
        """A column `expr` as the `(..., n)` array a caller sees."""
        vector = self.vector(expr)
        if vector is not None:
            return vector.node
        if _is_column_product(expr):
            return _index(self.row(expr).node, 0, ":")
        return _index(self.tensor(expr).node, 0)

    def vector(self, expr: sp.MatrixExpr) -> Printed | None:
        """A column `expr` as a batch of vectors `(..., n)`, where every matrix it is
        multiplied by is the same for all samples: `x1 @ jnp.swapaxes(ps['W'], -1, -2) +
        ps['b']`, the hand-written `x @ W.T + b` (the row form with its axis of one ran
        0.86-0.93× that at n = 64, batch 10,000: benchmarks/matrix.py). None where a
        factor differs by sample (`(..., n) @ (..., n, m)` would not keep the batch)."""
        key = ("vector", expr)
        if key in self.memo:
            return self.memo[key]
        printed: Printed | None = None
        if expr in self.symbol_arrays and len(self.symbol_arrays[expr][1]) == 1:
            value = self.symbol_arrays[expr][0]
            printed = Printed(value, self.batched(value))
        elif isinstance(expr, sp.MatAdd):
            terms = []
            for term in expr.args:
                if isinstance(term, sp.MatrixExpr):
                    terms.append(self.vector(term))
                else:
                    value = self.scalar(term)
                    terms.append(Printed(_call("jnp.expand_dims", value.node, ast.Constant(-1))
                                         if value.batched else value.node, value.batched))
            if all(t is not None for t in terms):
                printed = _summed(terms)
        elif isinstance(expr, sp.MatMul) and _is_column_product(expr):
            scalars = [a for a in expr.args if not isinstance(a, sp.MatrixExpr)]
            matrices = [a for a in expr.args if isinstance(a, sp.MatrixExpr)]
            value = self.vector(matrices[-1])
            factors = [self._transposed(m) for m in reversed(matrices[:-1])]
            if value is not None and not any(f.batched for f in factors):
                node = value.node
                for factor in factors:
                    node = ast.BinOp(node, ast.MatMult(), factor.node)
                batched = value.batched
                if scalars:
                    scaled = self._scaled(sp.Mul(*scalars), Printed(node, batched), axes=1)
                    node, batched = scaled.node, scaled.batched
                printed = Printed(node, batched)
        if printed is not None:
            self.memo[key] = printed
        return printed

    def scalar(self, expr: sp.Expr) -> Printed:
        """A scalar expression, batch-shaped, printed by the ordinary pipeline."""
        expr = sp.sympify(expr)
        if expr in self.memo:
            return self.memo[expr]
        if isinstance(expr, sp.Number):
            return Printed(ast.Constant(float(expr)), False)
        value = self.block([expr])[0]
        printed = self._local(expr, Printed(value, self.batched(value)))
        self.memo[expr] = printed
        return printed

    def block(self, entries: Sequence[sp.Expr],
              extra: Sequence[tuple[ArgumentSpec, ast.expr]] = ()) -> list[ast.expr]:
        """`entries` printed by the ordinary pipeline (`structured.scalar_block`) into the body.

        What they read of the data (an entry `x1[..., 0]`, a scalar `x2`) and their array
        parts (a Trace, a Determinant, an entry of a matrix `W[..., 0, 1]`) are printed here
        and become rank-0 placeholders, so the pipeline never sees a matrix argument's
        entries (a 1,024×1,024 MatrixSymbol has a million); parameters that are symbols
        or Matrices of symbols are its parameters.
        """
        reads: dict[sp.Basic, ast.expr] = {}
        for entry in entries:
            for node in sp.preorder_traversal(entry):
                if node in reads:
                    continue
                if _array_valued_scalar(node) or isinstance(node, MatrixElement):
                    reads[node] = self._array_scalar(node).node
                elif node in self.entry_reads:
                    reads[node] = self.entry_reads[node]
        placeholders = {node: sp.Dummy("read") for node in reads}
        entries = [sp.sympify(entry).xreplace(placeholders) for entry in entries]
        extra = [(ArgumentSpec("placeholder", (), (placeholders[node],)), value)
                 for node, value in reads.items()] + list(extra)
        self.blocks += 1
        block = scalar_block(entries, [], extra, self.scalar_parameters,
                             f"s{self.blocks}", len(self.literals), **self.options)
        self.body.extend(block.statements)
        self.literals.extend(block.literals)
        self.upstream.append(block.upstream)
        return block.entries

    def _array_scalar(self, node: sp.Basic) -> Printed:
        if isinstance(node, sp.Trace):
            value = self.matrix(node.arg)
            return Printed(_call("jnp.trace", value.node, axis1=-2, axis2=-1), value.batched)
        if isinstance(node, sp.Determinant):
            value = self.matrix(node.arg)
            return Printed(_call("jnp.linalg.det", value.node), value.batched)
        if isinstance(node, sp.DotProduct):
            left, right = (self._column(a) for a in node.args)
            product = ast.BinOp(left.node, ast.Mult(), right.node)
            return Printed(_call("jnp.sum", product, axis=ast.Tuple(
                [ast.Constant(-2), ast.Constant(-1)], ast.Load())), left.batched or right.batched)
        if isinstance(node, MatrixElement):
            i, j = int(node.i), int(node.j)
            if node.parent in self.symbol_arrays:  # read as the caller passes it
                value, shape = self.symbol_arrays[node.parent]
                index = (i, j) if len(shape) == 2 else (i if _shape(node.parent)[1] == 1 else j,)
                read = _index(value, *index)
                return Printed(read, self.batched(read))
            whole = self.matrix(node.parent)
            return Printed(_index(whole.node, i, j), whole.batched)
        raise _drift("ArrayPrinter", "a Trace, Determinant, DotProduct or MatrixElement",
                     type(node).__name__)

    def _column(self, expr: sp.MatrixExpr) -> Printed:
        value = self.matrix(expr)
        if _shape(expr)[0] == 1:
            return Printed(_call("jnp.swapaxes", value.node, ast.Constant(-1), ast.Constant(-2)),
                           value.batched)
        return value

    def _broadcast_scalar(self, expr: sp.Expr) -> Printed:
        """A scalar factor of a matrix, shaped `(..., 1, 1)` to broadcast against it."""
        value = self.scalar(expr)
        if isinstance(value.node, ast.Constant):
            return value
        # () becomes (1, 1) and a batch-shaped value (..., 1, 1); the scalar pipeline
        # broadcasts a constant output to the batch, so a value's shape is not its symbols'
        return Printed(_call("jnp.expand_dims", value.node,
                             ast.Tuple([ast.Constant(-2), ast.Constant(-1)], ast.Load())), True)

    def const(self, value: np.ndarray) -> ast.expr:
        """A numeric array: embedded when it is at most `embed_max_bytes`, else a const arg."""
        value = np.asarray(value, self.dtype)
        if value.nbytes <= self.embed_max_bytes:
            return _call("jnp.array", ast.parse(repr(value.tolist()), mode="eval").body,
                         dtype=target_node(f"jnp.{self.dtype.name}"))
        name = f"_k{len(self.literals)}"
        self.literals.append(rules.HoistedLiteral(name, value, self.used_by))
        return _load(name)

    # ---- matrix operations (one method per SymPy class: _MATRIX_HANDLERS) --------------
    def _explicit(self, expr: sp.MatrixBase) -> Printed:
        rows, cols = expr.shape
        if all(entry.is_number for entry in expr):
            try:
                value = np.array(expr.tolist(), dtype=self.dtype)
            except TypeError as error:
                raise BuildError(f"{expr}: a numeric Matrix with entries that are not real "
                                 "numbers") from error
            return Printed(self.const(value), False)
        entries = self.block(list(expr))
        stacked = self._assign("e", _call("jnp.stack", _call(
            "jnp.broadcast_arrays", *entries, ), axis=-1))
        shape = ast.BinOp(ast.Subscript(ast.Attribute(stacked, "shape", ast.Load()),
                                        ast.Slice(None, ast.Constant(-1)), ast.Load()),
                          ast.Add(), ast.Tuple([ast.Constant(rows), ast.Constant(cols)], ast.Load()))
        return Printed(_call("jnp.reshape", stacked, shape), self.batched(stacked)
                       or any(self.batched(e) for e in entries))

    def _matmul(self, expr: sp.MatMul) -> Printed:
        scalars = [a for a in expr.args if not isinstance(a, sp.MatrixExpr)]
        matrices = [a for a in expr.args if isinstance(a, sp.MatrixExpr)]
        if not matrices:
            raise _drift("ArrayPrinter", "a MatMul of at least one matrix", str(expr))
        product = self._product(matrices)
        if scalars:
            product = self._scaled(sp.Mul(*scalars), product, axes=2)
        return product

    def _scaled(self, factor: sp.Expr, value: Printed, axes: int) -> Printed:
        """`factor * value` (`-value` for -1), the factor given `axes` axes of one when it is
        per sample (`jnp.expand_dims(s, -1)` before a vector, `(-2, -1)` before a matrix)."""
        if factor == -1:
            return Printed(ast.UnaryOp(ast.USub(), value.node), value.batched)
        scale = self.scalar(factor)
        node = scale.node
        if scale.batched:  # read from the data (or broadcast to its batch by the pipeline)
            where = ast.Constant(-1) if axes == 1 else ast.Tuple(
                [ast.Constant(-2), ast.Constant(-1)], ast.Load())
            node = _call("jnp.expand_dims", node, where)
        return Printed(ast.BinOp(node, ast.Mult(), value.node), value.batched or scale.batched)

    def _product(self, matrices: Sequence[sp.MatrixExpr]) -> Printed:
        """`A @ B @ …` from the left. An inverse used once, `Inverse(A) @ B`, is
        `jnp.linalg.solve(A, B)`; one used more than once is computed once (a solve
        factorizes its matrix at each use: the Kalman update's two solves against S ran
        0.9× a hand-written single `inv`, benchmarks/matrix.py). A prefix shared by two
        products (`P Hᵀ S⁻¹` in `K (z − H x)` and `K H`) is computed once, into a local."""
        if len(matrices) == 1:
            return self.matrix(matrices[0])
        first, rest = matrices[0], matrices[1:]
        if _is_inverse(first) and self.occurrences[first] < 2:
            right = self._product(rest)
            left = self.matrix(first.args[0])
            return Printed(_call("jnp.linalg.solve", left.node, right.node),
                           left.batched or right.batched)
        length = next((k for k in range(len(matrices) - 1, 1, -1)
                       if (_PREFIX, tuple(matrices[:k])) in self.memo), 1)
        value = (self.memo[(_PREFIX, tuple(matrices[:length]))] if length > 1
                 else self.matrix(first))
        for k in range(length, len(matrices)):
            operand = matrices[k]
            if _is_inverse(operand) and k < len(matrices) - 1 and self.occurrences[operand] < 2:
                right = self._product(matrices[k:])
                return Printed(ast.BinOp(value.node, ast.MatMult(), right.node),
                               value.batched or right.batched)
            right = self.matrix(operand)
            value = Printed(ast.BinOp(value.node, ast.MatMult(), right.node),
                            value.batched or right.batched)
            key = (_PREFIX, tuple(matrices[:k + 1]))
            if k < len(matrices) - 1 and self.occurrences[key] > 1:
                value = Printed(self._assign("p", value.node), value.batched)
                self.memo[key] = value
        return value

    def _matadd(self, expr: sp.MatAdd) -> Printed:
        return _summed([self.matrix(a) if isinstance(a, sp.MatrixExpr)
                        else self._broadcast_scalar(a) for a in expr.args])

    def _transpose(self, expr: sp.Transpose) -> Printed:
        value = self.matrix(expr.arg)
        return Printed(_swap(value.node), value.batched)

    def _inverse(self, expr: sp.Inverse) -> Printed:
        value = self.matrix(expr.arg)
        return Printed(_call("jnp.linalg.inv", value.node), value.batched)

    def _matpow(self, expr: sp.MatPow) -> Printed:
        base, exp = expr.args
        if not (isinstance(exp, sp.Integer)):
            raise BuildError(f"{expr}: a matrix power needs an integer exponent, got {exp}")
        value = self.matrix(base)
        return Printed(_call("jnp.linalg.matrix_power", value.node, ast.Constant(int(exp))),
                       value.batched)

    def _solve(self, expr: MatrixSolve) -> Printed:
        matrix, vector = (self.matrix(a) for a in expr.args)
        return Printed(_call("jnp.linalg.solve", matrix.node, vector.node),
                       matrix.batched or vector.batched)

    def _hadamard(self, expr: sp.HadamardProduct) -> Printed:
        factors = [self.matrix(a) for a in expr.args]
        node = factors[0].node
        for factor in factors[1:]:
            node = ast.BinOp(node, ast.Mult(), factor.node)
        return Printed(node, any(f.batched for f in factors))

    def _hadamard_power(self, expr: HadamardPower) -> Printed:
        base, exp = expr.args
        value = self.matrix(base)
        power = self._broadcast_scalar(exp)
        return Printed(ast.BinOp(value.node, ast.Pow(), power.node), value.batched or power.batched)

    def _kronecker(self, expr: sp.KroneckerProduct) -> Printed:
        value = self.matrix(expr.args[0])
        (rows, cols), batched = _shape(expr.args[0]), value.batched
        for operand in expr.args[1:]:
            right = self.matrix(operand)
            r, c = _shape(operand)
            outer = self._assign("t", _call("jnp.einsum", ast.Constant("...ij,...kl->...ikjl"),
                                            value.node, right.node))
            rows, cols, batched = rows * r, cols * c, batched or right.batched
            value = Printed(_call("jnp.reshape", outer, _batch_shape(outer, 4, (rows, cols))),
                            batched)
        return value

    def _block_matrix(self, expr: sp.BlockMatrix) -> Printed:
        blocks = [[self.matrix(block) for block in row] for row in expr.blocks.tolist()]
        batched = [p for row in blocks for p in row if p.batched]
        reference = None
        if batched and len(batched) < sum(map(len, blocks)):
            first = batched[0]
            if not isinstance(first.node, ast.Name):
                first.node = self._assign("b", first.node)
            reference = first.node
        rows = []
        for row, symbols in zip(blocks, expr.blocks.tolist(), strict=True):
            parts = []
            for printed, symbol in zip(row, symbols, strict=True):
                node = printed.node
                if reference is not None and not printed.batched:
                    node = _call("jnp.broadcast_to", node, _batch_shape(reference, 2, _shape(symbol)))
                parts.append(node)
            rows.append(_call("jnp.concatenate", ast.List(parts, ast.Load()), axis=-1))
        return Printed(_call("jnp.concatenate", ast.List(rows, ast.Load()), axis=-2), bool(batched))

    def _identity(self, expr: sp.Identity) -> Printed:
        n = _shape(expr)[0]
        return Printed(_call("jnp.eye", ast.Constant(n), dtype=target_node(f"jnp.{self.dtype.name}")),
                       False)

    def _zeros(self, expr: sp.ZeroMatrix) -> Printed:
        return Printed(_call("jnp.zeros", ast.Constant(_shape(expr)),
                             dtype=target_node(f"jnp.{self.dtype.name}")), False)

    def _ones(self, expr: sp.OneMatrix) -> Printed:
        return Printed(_call("jnp.ones", ast.Constant(_shape(expr)),
                             dtype=target_node(f"jnp.{self.dtype.name}")), False)

    def _apply(self, expr: ElementwiseApplyFunction) -> Printed:
        function = expr.function
        if not isinstance(function, sp.Lambda) or len(function.variables) != 1:
            raise _drift("ArrayPrinter", "ElementwiseApplyFunction of a one-variable Lambda",
                         repr(function))
        value = self.matrix(expr.expr)
        placeholder = sp.Dummy("entry")
        formula = function.expr.xreplace({function.variables[0]: placeholder})
        entry = self.block([formula], [(ArgumentSpec("placeholder", (), (placeholder,)),
                                        value.node)])[0]
        batched = value.batched or self.batched(entry)
        if not any(isinstance(n, ast.Name) and n.id in _names(value.node) for n in ast.walk(entry)):
            # a constant function (f(d) = 2): still an array of the matrix's shape
            entry = _call("jnp.full_like", value.node, entry)
        return Printed(entry, batched)

    # ---- array expressions ------------------------------------------------------------
    def tensor(self, expr: sp.Basic) -> Printed:
        """An array expression (or a matrix one) as a value of its rank after the batch."""
        if expr in self.memo:
            return self.memo[expr]
        if isinstance(expr, sp.MatrixExpr):
            return self.matrix(expr)
        if isinstance(expr, ArrayAdd):
            printed = _summed([self.tensor(a) for a in expr.args])
        elif isinstance(expr, (ArrayTensorProduct, ArrayContraction, PermuteDims, ArrayDiagonal)):
            printed = self._einsum(expr)
        else:
            raise BuildError(
                f"{type(expr).__name__} ({expr}): not an array expression symkern prints "
                f"(it prints {', '.join(c.__name__ for c in ARRAY_OPERATIONS)} of matrix "
                "expressions)")
        printed = self._local(expr, printed)
        self.memo[expr] = printed
        return printed

    def _einsum(self, expr: sp.Basic) -> Printed:
        """A tensor product, contraction, permutation or diagonal as one `jnp.einsum`."""
        letters = iter(_LETTERS)
        operands, inputs, output = self._einsum_terms(expr, letters)
        printed = [self.tensor(o) for o in operands]
        spec = ",".join("..." + "".join(i) for i in inputs) + "->..." + "".join(output)
        return Printed(_call("jnp.einsum", ast.Constant(spec), *(p.node for p in printed)),
                       any(p.batched for p in printed))

    def _einsum_terms(self, expr: sp.Basic, letters: Any
                      ) -> tuple[list[sp.Basic], list[list[str]], list[str]]:
        """Operands, their index letters and the output's, for `expr` folded into one einsum."""
        if isinstance(expr, ArrayTensorProduct):
            operands, inputs, output = [], [], []
            for arg in expr.args:
                o, i, out = self._einsum_terms(arg, letters)
                operands += o
                inputs += i
                output += out
            return operands, inputs, output
        if isinstance(expr, ArrayContraction):
            operands, inputs, output = self._einsum_terms(expr.expr, letters)
            renamed: dict[str, str] = {}
            for group in expr.contraction_indices:
                shared = output[group[0]]
                for axis in group[1:]:
                    renamed[output[axis]] = shared
            dropped = {axis for group in expr.contraction_indices for axis in group}
            inputs = [[renamed.get(c, c) for c in i] for i in inputs]
            return operands, inputs, [c for k, c in enumerate(output) if k not in dropped]
        if isinstance(expr, PermuteDims):
            operands, inputs, output = self._einsum_terms(expr.expr, letters)
            permutation = expr.permutation.array_form
            return operands, inputs, [output[k] for k in permutation]
        if isinstance(expr, ArrayDiagonal):
            operands, inputs, output = self._einsum_terms(expr.expr, letters)
            renamed = {}
            for group in expr.diagonal_indices:
                for axis in group[1:]:
                    renamed[output[axis]] = output[group[0]]
            inputs = [[renamed.get(c, c) for c in i] for i in inputs]
            on_diagonal = {axis for group in expr.diagonal_indices for axis in group}
            kept = [c for k, c in enumerate(output) if k not in on_diagonal]
            return operands, inputs, kept + [output[group[0]] for group in expr.diagonal_indices]
        rank = len(_shape(expr))
        try:
            own = [next(letters) for _ in range(rank)]
        except StopIteration as error:
            raise BuildError(f"{expr}: an array expression of more than {len(_LETTERS)} "
                             "axes in one product") from error
        return [expr], [own], list(own)


#: the key of a product's leading factors in `ArrayPrinter.memo` and the occurrence counts
_PREFIX = "prefix"


def _is_inverse(expr: sp.Basic) -> bool:
    return isinstance(expr, sp.Inverse) or (isinstance(expr, sp.MatPow) and expr.exp == -1)


def _summed(terms: Sequence[Printed]) -> Printed:
    """The sum of `terms`, left to right; batched when any term is."""
    node = terms[0].node
    for term in terms[1:]:
        node = ast.BinOp(node, ast.Add(), term.node)
    return Printed(node, any(term.batched for term in terms))


def _swap(node: ast.expr) -> ast.expr:
    """`jnp.swapaxes(node, -1, -2)`: a transpose that keeps the batch axes leading."""
    return _call("jnp.swapaxes", node, ast.Constant(-1), ast.Constant(-2))


def _is_column_product(expr: sp.Basic) -> bool:
    """A product or sum whose value is a column of more than one row: printed as a row."""
    if not (isinstance(expr, (sp.MatMul, sp.MatAdd)) and _shape(expr)[1] == 1
            and _shape(expr)[0] > 1):
        return False
    # a left inverse is a solve, which takes columns
    return not (isinstance(expr, sp.MatMul) and any(
        isinstance(a, (sp.Inverse, sp.MatPow)) for a in expr.args))


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _batch_shape(value: ast.expr, trailing: int, shape: Sequence[int]) -> ast.expr:
    """`value.shape[:-trailing] + shape`: the batch axes of `value` and a per-sample shape."""
    batch = ast.Subscript(ast.Attribute(value, "shape", ast.Load()),
                          ast.Slice(None, ast.Constant(-trailing)), ast.Load())
    return ast.BinOp(batch, ast.Add(), ast.Tuple([ast.Constant(d) for d in shape], ast.Load()))


#: each SymPy matrix class's printer method
_MATRIX_HANDLERS: dict[type, Callable[[ArrayPrinter, Any], Printed]] = {
    sp.MatMul: ArrayPrinter._matmul,
    sp.MatAdd: ArrayPrinter._matadd,
    sp.Transpose: ArrayPrinter._transpose,
    sp.Inverse: ArrayPrinter._inverse,
    sp.MatPow: ArrayPrinter._matpow,
    MatrixSolve: ArrayPrinter._solve,
    sp.HadamardProduct: ArrayPrinter._hadamard,
    HadamardPower: ArrayPrinter._hadamard_power,
    sp.KroneckerProduct: ArrayPrinter._kronecker,
    sp.BlockMatrix: ArrayPrinter._block_matrix,
    sp.Identity: ArrayPrinter._identity,
    sp.ZeroMatrix: ArrayPrinter._zeros,
    sp.OneMatrix: ArrayPrinter._ones,
    ElementwiseApplyFunction: ArrayPrinter._apply,
}


# ---- the rule for array code --------------------------------------------------------------------


def check_batch_polymorphic(module: ast.Module, data_ranks: dict[str, int]) -> ast.Module:
    """Check that every read of a data argument keeps its batch dimensions leading.

    Accepted: a subscript that starts with `...` (`x1[..., 0, 1]`, `x1[..., :, None]`); a
    matrix data argument (two axes per sample) as an operand of `@` or elementwise
    arithmetic, or as an argument of a batch-polymorphic callee (`BATCH_POLYMORPHIC`:
    `jnp.linalg.solve`, `jnp.einsum` with `...` subscripts, `jnp.swapaxes(a, -1, -2)`, …,
    with negative axes only); a scalar or matrix data argument in an elementwise callee
    (`jnp.sin`), a scalar one (one value per sample) anywhere; any data argument in
    `jnp.expand_dims` (negative axes) or `jnp.broadcast_arrays`; `x1.shape`.
    Rejected: `x1.T`, `x1[0]`, a vector data argument read whole elsewhere, `x1 @ …` for
    a scalar or vector, any other callee. Returns the module unchanged.
    """
    rule = "check_batch_polymorphic"
    function = next((n for n in module.body if isinstance(n, ast.FunctionDef)), None)
    if function is None:
        raise _drift(rule, "a function definition", "none")
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(function):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and dotted_name(node.func) in BATCH_POLYMORPHIC:
            _check_axes(node, rule)
        if not (isinstance(node, ast.Name) and node.id in data_ranks):
            continue
        name, parent = node.id, parents.get(node)
        where = ast.unparse(parent) if parent is not None else name
        if not isinstance(node.ctx, ast.Load):
            raise _drift(rule, f"{name} only read", f"an assignment to it in {where}")
        if isinstance(parent, ast.Subscript) and parent.value is node:
            index = parent.slice
            first = index.elts[0] if isinstance(index, ast.Tuple) and index.elts else index
            if isinstance(first, ast.Constant) and first.value is Ellipsis:
                continue
            raise _drift(rule, f"{name} indexed after its batch dimensions ({name}[..., i])",
                         f"{where}, which indexes the batch")
        if isinstance(parent, ast.Attribute) and parent.attr == "shape":
            continue
        rank = data_ranks[name]
        if rank == 0:
            # one value per sample: read whole by the scalar pipeline's code, whose own
            # index_by_batch checked it, and broadcast by the array code
            continue
        if isinstance(parent, (ast.List, ast.Tuple)):
            parent = parents.get(parent)
        if isinstance(parent, ast.Call) and dotted_name(parent.func) in (
                "jnp.expand_dims", "jnp.broadcast_arrays"):
            continue  # new axes after the batch (negative axes, checked); same batch
        if rank == 1:
            if (isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.MatMult)
                    and parent.left is node and not _names(parent.right) & set(data_ranks)):
                continue  # a batch of vectors times one matrix for all samples
            if isinstance(parent, ast.UnaryOp):
                continue
            if isinstance(parent, ast.BinOp) and isinstance(parent.op, (ast.Add, ast.Sub, ast.Mult)):
                other = parent.right if parent.left is node else parent.left
                if not (isinstance(other, ast.Name) and data_ranks.get(other.id) == 0):
                    continue  # with a vector, a number, or a scalar given its axis of one
            raise _drift(rule, f"{name} (a vector per sample) read by entry, as "
                         f"{name}[..., :, None], or as the left operand of @ with a matrix "
                         "read from no data argument", where)
        elementwise = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)
        if isinstance(parent, ast.BinOp) and isinstance(
                parent.op, elementwise + ((ast.MatMult,) if rank == 2 else ())):
            continue
        if isinstance(parent, ast.UnaryOp):
            continue
        if isinstance(parent, ast.Call) and dotted_name(parent.func) in ELEMENTWISE_TARGETS:
            continue
        if rank == 2 and isinstance(parent, ast.Call) and dotted_name(parent.func) in BATCH_POLYMORPHIC:
            continue
        raise _drift(rule, f"{name} read whole only by batch-polymorphic operations", where)
    return module


def _check_axes(call: ast.Call, rule: str) -> None:
    """Axis arguments of a batch-polymorphic callee count from the end; einsum has `...`."""
    name = dotted_name(call.func)
    if name == "jnp.einsum":
        spec = call.args[0]
        if not (isinstance(spec, ast.Constant) and isinstance(spec.value, str)
                and all(part.startswith("...") for part in spec.value.replace("->", ",").split(","))):
            raise _drift(rule, "jnp.einsum subscripts that each start with ...", ast.unparse(call))
        return
    given = {k.arg for k in call.keywords}
    missing = [axis for axis in REQUIRED_AXES.get(name, ()) if axis not in given]
    if missing:
        raise _drift(rule, f"{name} with {', '.join(missing)} counted from the end",
                     ast.unparse(call))
    axes = [k.value for k in call.keywords if k.arg in ("axis", "axis1", "axis2")]
    if name in ("jnp.swapaxes", "jnp.expand_dims"):
        axes += call.args[1:]
    for axis in axes:
        values = axis.elts if isinstance(axis, ast.Tuple) else [axis]
        for value in values:
            number = ast.literal_eval(value) if isinstance(value, (ast.Constant, ast.UnaryOp)) else 0
            if not (isinstance(number, int) and number < 0):
                raise _drift(rule, "axes counted from the end (negative)", ast.unparse(call))


def use_c_solve(module: ast.Module) -> tuple[ast.Module, int]:
    """A copy of an array kernel's module with each `jnp.linalg.solve(A, B)` a
    `clinalg.solve(A, B)` (`BuildOptions(cpu_loop="c")`: each sample's system solved by a C
    loop, symkern.kernels.c_loop.solve), and how many calls it changed."""
    copied = copy.deepcopy(module)
    changed = 0
    for node in ast.walk(copied):
        if isinstance(node, ast.Call) and dotted_name(node.func) == "jnp.linalg.solve":
            node.func = ast.Attribute(ast.Name("clinalg", ast.Load()), "solve", ast.Load())
            changed += 1
    return ast.fix_missing_locations(copied), changed


# ---- the whole kernel ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrayLeaf:
    """An equation leaf of an array kernel: the SymPy object and the shape a caller sees."""

    expr: sp.Basic
    shape: tuple[int, ...]
    kind: str  # "matrix", "tensor" or "scalar"


def array_leaf(leaf: sp.Basic, shape: tuple[int, ...]) -> ArrayLeaf:
    if isinstance(leaf, ARRAY_OPERATIONS):
        return ArrayLeaf(leaf, shape, "tensor")
    if isinstance(leaf, sp.MatrixExpr) and not isinstance(leaf, sp.MatrixBase):
        return ArrayLeaf(leaf, shape, "matrix")
    return ArrayLeaf(leaf, shape, "scalar")


def _count(leaves: Sequence[ArrayLeaf]) -> Counter:
    """How often each matrix or array subexpression occurs across the leaves."""
    counts: Counter = Counter()

    def visit(node: sp.Basic) -> None:
        # every occurrence, below repeated ones too: `Inverse(S)` printed as a solve
        # prints S at each occurrence (matrix expressions are small trees)
        counts[node] += 1
        if isinstance(node, sp.MatMul):
            matrices = tuple(a for a in node.args if isinstance(a, sp.MatrixExpr))
            for k in range(2, len(matrices)):
                counts[(_PREFIX, matrices[:k])] += 1
        for arg in node.args:
            if isinstance(arg, (sp.MatrixExpr, *ARRAY_OPERATIONS, sp.Expr)) \
                    and not isinstance(arg, (sp.Symbol, sp.Number, sp.MatrixSymbol)):
                visit(arg)

    for leaf in leaves:
        visit(leaf.expr)
    return counts


def _check_derivatives(expr: sp.Basic) -> None:
    """A derivative with respect to a matrix that SymPy left unevaluated is refused by name."""
    for node in sp.preorder_traversal(expr):
        if isinstance(node, sp.Derivative) and any(
                isinstance(v, sp.MatrixExpr) for v in node.variables):
            raise BuildError(
                f"eqs: SymPy leaves the derivative {node} unevaluated (its matrix calculus "
                "does not cover it, and the derivative of a scalar with respect to a matrix "
                "has no array form here); write the derivative out, e.g. with the entries "
                "of an explicit Matrix (.as_explicit()) and sympy.diff")


def generate_arrays(
    leaves: Sequence[ArrayLeaf],
    data: Sequence[ArgumentSpec],
    parameters: Sequence[ArgumentSpec],
    *,
    cse: bool = True,
    embed_max_bytes: int = 32,
    dtype: np.dtype = FLOAT32,
) -> StructuredCode:
    """Print `leaves` as one kernel `kernel(<const args>, x1, …, ps)` returning pieces."""
    start = time.perf_counter()
    for leaf in leaves:
        _check_derivatives(leaf.expr)
    printer = ArrayPrinter(data, parameters, cse=cse, embed_max_bytes=embed_max_bytes,
                           dtype=dtype, occurrences=_count(leaves))
    pieces: list[ast.expr | int] = []
    scalar_entries: list[sp.Expr] = []
    offset = 0
    for leaf in leaves:
        printer.used_by = (offset,)  # a const arg's origin: the leaf that first reads it
        offset += int(np.prod(leaf.shape, dtype=int))
        if leaf.kind == "scalar" and not needs_array_program(leaf.expr):
            if isinstance(leaf.expr, sp.NDimArray):
                entries = sp.flatten(leaf.expr.tolist())
            elif isinstance(leaf.expr, sp.MatrixBase):
                entries = list(leaf.expr)
            else:
                entries = [leaf.expr]
            pieces += list(range(len(scalar_entries), len(scalar_entries) + len(entries)))
            scalar_entries += entries
        elif leaf.kind == "scalar":
            pieces.append(printer.scalar(leaf.expr).node)
        else:
            if leaf.kind == "matrix" and len(leaf.shape) == 1:
                pieces.append(printer.column(leaf.expr))  # an m×1 matrix: a caller's (m,)
            else:
                pieces.append(printer.tensor(leaf.expr).node)
    scalar_values = printer.block(scalar_entries) if scalar_entries else []
    returned = [scalar_values[p] if isinstance(p, int) else p for p in pieces]
    layout, position = [], 0
    for leaf in leaves:
        if leaf.kind == "scalar" and not needs_array_program(leaf.expr) and leaf.shape:
            count = int(np.prod(leaf.shape, dtype=int))
            layout.append(PieceLeaf(position, count, leaf.shape, True))
        else:
            count = 1
            layout.append(PieceLeaf(position, 1, leaf.shape, False))
        position += count

    arguments = [ast.arg(literal.name) for literal in printer.literals]
    arguments += [ast.arg(f"x{k + 1}") for k in range(len(data))]
    if parameters:
        arguments.append(ast.arg("ps"))
    function = ast.FunctionDef(
        name=rules.KERNEL_NAME,
        args=ast.arguments(posonlyargs=[], args=arguments, kwonlyargs=[], kw_defaults=[],
                           defaults=[]),
        body=printer.body + [ast.Return(ast.Tuple(returned, ast.Load()))],
        decorator_list=[], returns=None, type_params=[],
    )
    module = ast.fix_missing_locations(ast.Module([function], type_ignores=[]))
    emitted_at = time.perf_counter()
    data_ranks = {f"x{k + 1}": len(spec.shape) for k, spec in enumerate(data)}
    module = check_batch_polymorphic(module, data_ranks)
    source = print_source(module)
    generated = GeneratedCode(EmittedCode("\n".join(printer.upstream), ()), module, source,
                              {"emit": emitted_at - start,
                               "rewrite": time.perf_counter() - emitted_at},
                              tuple(printer.literals), form="structured")
    return StructuredCode(generated, StructuredLayout(tuple(layout)), data_ranks)
