"""symbolic: derivatives of equations w.r.t. data arguments and parameter trees.

Imports sympy, jax.tree_util (for the parameter tree order) and symkern.errors, plus
SymbolicNetwork and the DAG derivatives of symkern.symbolic.autodiff; nothing else of symkern.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import jax
import sympy as sp
from sympy.matrices.expressions.matexpr import MatrixElement

from symkern.collector import collection_paused
from symkern.errors import BuildError
from symkern.symbolic.autodiff import gradient_entries, hessian_rows, jacobian_rows
from symkern.symbolic.networks import SymbolicNetwork
from symkern.symbolic.nodes import holds

Shape = tuple[int, ...]


def _is_entry(obj: Any) -> bool:
    return isinstance(obj, (sp.Symbol, MatrixElement))


def _is_leaf(obj: Any) -> bool:
    return isinstance(obj, (sp.Basic, sp.MatrixBase))


def _data_symbols(wrt: Any) -> list[sp.Basic] | None:
    """The symbols of `wrt` if it is a data argument (a vector), else None.

    A data argument is a Symbol, a non-empty list/tuple of Symbols, or an n×1 Matrix or
    MatrixSymbol; anything else (a dict, a list of matrices, an m×n Matrix with n > 1) is
    a parameter tree.
    """
    if isinstance(wrt, sp.Symbol):
        return [wrt]
    if isinstance(wrt, (list, tuple)) and wrt and all(isinstance(e, sp.Symbol) for e in wrt):
        return list(wrt)
    if isinstance(wrt, sp.MatrixSymbol) and wrt.shape[1] == 1:
        return list(wrt.as_explicit())
    if isinstance(wrt, sp.MatrixBase) and wrt.shape[1] == 1 and wrt.shape[0] > 0:
        return [_checked_entry(e, f"wrt[{i}]") for i, e in enumerate(wrt)]
    return None


def _checked_entry(entry: Any, where: str) -> sp.Basic:
    if not _is_entry(entry):
        raise BuildError(f"{where}: expected a Symbol, got {type(entry).__name__} {entry}")
    return entry


def _format_path(key_path: tuple[Any, ...]) -> str:
    return "wrt" + jax.tree_util.keystr(key_path)


def _leaf_entries(leaf: Any, key_path: tuple[Any, ...]) -> tuple[Shape, list[sp.Basic]]:
    """A parameter leaf's shape (Symbol: (), m×1: (m,), m×n: (m, n)) and row-major entries."""
    where = _format_path(key_path)
    if isinstance(leaf, sp.Symbol):
        return (), [leaf]
    if isinstance(leaf, sp.MatrixSymbol):
        leaf = leaf.as_explicit()
    if isinstance(leaf, sp.MatrixBase) and 0 not in leaf.shape:
        rows, cols = leaf.shape
        shape = (rows,) if cols == 1 else (rows, cols)
        return shape, [_checked_entry(e, f"{where}[{k}]") for k, e in enumerate(leaf)]
    raise BuildError(
        f"{where}: expected a Symbol, a MatrixSymbol or a non-empty Matrix of Symbols, "
        f"got {type(leaf).__name__} {leaf}"
    )


def _reject_structured(exprs: Any) -> None:
    """A structured network's weights are not symbols in its output: SymPy would answer 0."""
    from symkern.symbolic.structured import network_nodes  # structured builds on this module

    roots = list(exprs) if isinstance(exprs, (list, tuple)) else [exprs]
    flat = [entry for root in roots
            for entry in (list(root) if isinstance(root, sp.MatrixBase) else [root])]
    if network_nodes([sp.sympify(e) for e in flat]):
        raise BuildError("wrt: derivatives of a structured network's output w.r.t. its "
                         "parameters go through parameter_gradient(loss, snn)")


def _parameter_leaves(wrt: Any) -> tuple[list[tuple[Shape, list[sp.Basic]]], Any]:
    """Flatten a parameter tree in JAX's pytree order (the kernels' argument order)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(wrt, is_leaf=_is_leaf)
    if not flat:
        raise BuildError("wrt: expected at least one symbol, got an empty structure")
    return [_leaf_entries(leaf, key_path) for key_path, leaf in flat], treedef


def _scalar(scalar: Any) -> sp.Expr:
    if isinstance(scalar, sp.MatrixBase):
        if scalar.shape != (1, 1):
            raise BuildError(
                f"scalar: expected a scalar expression or a 1×1 Matrix, got a "
                f"{scalar.shape[0]}×{scalar.shape[1]} Matrix"
            )
        scalar = scalar[0, 0]
    try:
        expr = sp.sympify(scalar, strict=True)
    except (sp.SympifyError, TypeError) as error:
        raise BuildError(
            f"scalar: expected a SymPy expression, got {type(scalar).__name__}"
        ) from error
    if not isinstance(expr, sp.Expr):
        raise BuildError(f"scalar: expected a SymPy expression, got {type(expr).__name__} {expr}")
    return expr


#: functions whose derivative SymPy writes through re/im unless their argument is real
_COMPLEX_AWARE = (sp.Abs, sp.sign, sp.re, sp.im, sp.arg, sp.conjugate)


def _over_the_reals(derivative: Any) -> Any:
    """`derivative(eqs, wrt)` with every symbol of `eqs` taken as real, as kernels compute.

    SymPy differentiates `Abs(u)` of symbols not declared real through `re(u)`, `im(u)`
    and their unevaluated derivatives, which no kernel evaluates; over the reals it is
    `sign(u)·u'`, what JAX's derivative of `abs` gives. Equations without such functions
    are differentiated as they are.
    """
    signature = inspect.signature(derivative)

    @functools.wraps(derivative)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        eqs, wrt = signature.bind(*args, **kwargs).arguments.values()
        if not isinstance(eqs, (sp.Basic, sp.MatrixBase)) or not holds(
                list(eqs) if isinstance(eqs, sp.MatrixBase) else [eqs], _COMPLEX_AWARE):
            return derivative(eqs, wrt)
        real = {s: sp.Dummy(s.name, real=True) for s in eqs.free_symbols
                if isinstance(s, sp.Symbol) and not s.is_real}
        if not real:
            return derivative(eqs, wrt)
        back = {dummy: s for s, dummy in real.items()}
        result = derivative(eqs.xreplace(real), _replace_in_tree(wrt, real))
        return _replace_in_tree(result, back)

    return wrapped


def _replace_in_tree(tree: Any, mapping: dict) -> Any:
    return jax.tree_util.tree_map(
        lambda leaf: leaf.xreplace(mapping) if isinstance(leaf, (sp.Basic, sp.MatrixBase)) else leaf,
        tree, is_leaf=_is_leaf)


def _equations(eqs: Any) -> tuple[Shape, list[sp.Expr]]:
    """The shape (Expr: (), m×1: (m,), m×n: (m, n)) and row-major entries of `eqs`."""
    if isinstance(eqs, sp.MatrixBase):
        if 0 in eqs.shape:
            raise BuildError(f"eqs: expected a non-empty Matrix, got shape {eqs.shape}")
        rows, cols = eqs.shape
        return ((rows,) if cols == 1 else (rows, cols)), list(eqs)
    return (), [_scalar(eqs)]


@collection_paused()
@_over_the_reals
def jacobian(eqs: sp.Expr | sp.MatrixBase, wrt: Any) -> sp.Matrix | Any:
    """Derivative of `eqs` w.r.t. a data argument or each leaf of a parameter tree.

Data argument (a Symbol, a list/tuple of Symbols, or an n×1 Matrix): what SymPy's
    `Matrix.jacobian` gives, an m×n Matrix for an m×1 (or 1×m) `eqs`; an Expr counts as
    the 1×1 Matrix `[eqs]` and gives 1×n. Every derivative here is taken over the
    expression's DAG, each distinct sub-expression once (symkern.symbolic.autodiff).

    Parameter tree (dict/list/tuple nesting of Symbol, MatrixSymbol or Matrix leaves):
    the same tree with each leaf replaced by a `sympy.Array` of shape
    `eq_shape + leaf_shape`, where an Expr has shape (), an m×1 Matrix (m,), an m×n
    Matrix (m, n). So for an m×1 `eqs`, d/dW (out×in) has shape (m, out, in) and
    d/db (out×1) has shape (m, out). A bare n×1 Matrix is a data argument; wrap it
    (`{"b": b}`) to get the tree form.

    >>> x, y = sp.symbols("x y")
    >>> jacobian(sp.Matrix([x * y, x + y]), [x, y])
    Matrix([
    [y, x],
    [1, 1]])
    >>> jacobian(sp.Matrix([x * y, x + y]), {"a": x, "W": sp.Matrix([[x, y]])})
    {'W': [[[y, x]], [[1, 1]]], 'a': [y, 1]}
    """
    symbols = _data_symbols(wrt)
    if symbols is not None:
        if isinstance(eqs, sp.MatrixBase):
            if 1 not in eqs.shape:
                raise BuildError(
                    f"eqs: expected an Expr or an m×1 Matrix, got a "
                    f"{eqs.shape[0]}×{eqs.shape[1]} Matrix; differentiate w.r.t. a "
                    "parameter tree for a higher-rank result"
                )
            return sp.Matrix(jacobian_rows(list(eqs), symbols))
        return sp.Matrix(jacobian_rows([_scalar(eqs)], symbols))
    eq_shape, entries = _equations(eqs)
    _reject_structured(eqs)
    leaves, treedef = _parameter_leaves(wrt)
    rows = jacobian_rows(entries, [s for _, leaf_symbols in leaves for s in leaf_symbols])
    derivatives, start = [], 0
    for leaf_shape, leaf_symbols in leaves:
        stop = start + len(leaf_symbols)
        derivatives.append(sp.Array([d for row in rows for d in row[start:stop]],
                                    eq_shape + leaf_shape))
        start = stop
    return jax.tree_util.tree_unflatten(treedef, derivatives)


@collection_paused()
@_over_the_reals
def gradient(scalar: sp.Expr | sp.MatrixBase, wrt: Any) -> sp.Matrix | Any:
    """Gradient of a scalar (an Expr or a 1×1 Matrix) w.r.t. data or a parameter tree.

    Data argument: an n×1 Matrix. Parameter tree: the same tree, each leaf replaced by
    its gradient of the same kind and shape (a Matrix for a Matrix or MatrixSymbol leaf,
    an Expr for a Symbol leaf), as SymbolicNeuralNetworks.jl's `Gradient`.

    >>> x, y = sp.symbols("x y")
    >>> gradient(x**2 * y, [x, y]).T
    Matrix([[2*x*y, x**2]])
    >>> gradient(x**2 * y, {"W": sp.Matrix([[x, y]]), "c": y})
    {'W': Matrix([[2*x*y, x**2]]), 'c': x**2}
    """
    expr = _scalar(scalar)
    symbols = _data_symbols(wrt)
    if symbols is not None:
        return sp.Matrix(gradient_entries(expr, symbols))
    _reject_structured(scalar)
    leaves, treedef = _parameter_leaves(wrt)
    flat = gradient_entries(expr, [s for _, leaf_symbols in leaves for s in leaf_symbols])
    gradients, start = [], 0
    for leaf_shape, leaf_symbols in leaves:
        entries = flat[start:start + len(leaf_symbols)]
        start += len(leaf_symbols)
        if leaf_shape == ():
            gradients.append(entries[0])
        else:
            rows, cols = (*leaf_shape, 1)[:2]
            gradients.append(sp.Matrix(rows, cols, entries))
    return jax.tree_util.tree_unflatten(treedef, gradients)


@collection_paused()
@_over_the_reals
def hessian(scalar: sp.Expr | sp.MatrixBase, wrt: Any) -> sp.Matrix:
    """Hessian of a scalar w.r.t. data (n×n, laid out as SymPy's `hessian`) or a parameter tree.

    For a parameter tree it is an N×N Matrix over all N scalar entries of its leaves,
    flattened leaf by leaf in JAX's pytree order (for `snn.params`, the order of
    `snn.parameter_paths()`) and row-major within a leaf.

    >>> x, y = sp.symbols("x y")
    >>> hessian(x**2 * y, [x, y])
    Matrix([
    [2*y, 2*x],
    [2*x,   0]])
    """
    expr = _scalar(scalar)
    symbols = _data_symbols(wrt)
    if symbols is None:
        _reject_structured(scalar)
        leaves, _ = _parameter_leaves(wrt)
        symbols = [s for _, leaf_symbols in leaves for s in leaf_symbols]
    return sp.Matrix(hessian_rows(expr, symbols))


def parameter_gradient(loss: sp.Expr | sp.MatrixBase, snn: SymbolicNetwork) -> Any:
    """`gradient(loss, snn.params)`: a tree like `snn.params` of Matrices.

    >>> from symkern.symbolic.networks import Linear
    >>> snn = SymbolicNetwork(Linear(1, 1))
    >>> parameter_gradient(snn.output[0] ** 2, snn)["L1"]["b"]
    Matrix([[2*_L1_W_1_1*_x_1 + 2*_L1_b_1]])
    """
    if getattr(snn, "structured", False):
        return snn.parameter_gradient(loss)
    if not isinstance(snn, SymbolicNetwork):
        raise BuildError(f"snn: expected a SymbolicNetwork, got {type(snn).__name__}")
    return gradient(loss, snn.params)
