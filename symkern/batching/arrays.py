"""batching: build_array_function — matrix and array expressions as batched kernels.

Imports every other part of symkern (the top of the import direction), as build.py does.
`build_function` hands an equation set here when a leaf is a matrix expression, an array
expression or a scalar of whole matrices (`symkern.codegen.arrays.needs_array_program`);
the kernel is a `StructuredKernel` over the array program `generate_arrays` prints.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import sympy as sp

from symkern.batching.build import resolve_dtype
from symkern.batching.c_loop import refuse
from symkern.batching.program import KernelSignature
from symkern.batching.structured import StructuredKernel, array_program_kernel
from symkern.codegen.arrays import (
    ArrayLeaf,
    array_leaf,
    generate_arrays,
    needs_array_program,
    use_c_solve,
)
from symkern.codegen.passes import BuildOptions, refuse_c_loop_option, refuse_unbatched_outputs
from symkern.codegen.pipeline import print_source
from symkern.codegen.structured import StructuredCode
from symkern.errors import BuildError
from symkern.kernels.c_loop import compiler
from symkern.kernels.constants import origin_of
from symkern.symbolic.arguments import (
    ArgumentSpec,
    EquationSet,
    check_unique_symbols,
    data_argument,
    equation_set,
    is_symbolic_leaf,
    parameter_arguments,
)


def _leaf_shape(leaf: ArrayLeaf) -> tuple[int, ...]:
    rows_cols = tuple(int(d) for d in leaf.expr.shape)
    if leaf.kind == "matrix" and rows_cols[1] == 1:
        return rows_cols[:1]  # an m×1 matrix leaf is (m,), as for an explicit Matrix
    return rows_cols


def _matrix_symbol_spec(symbol: sp.MatrixSymbol, label: str, path: tuple, *,
                        vector_rows: bool) -> ArgumentSpec:
    """A MatrixSymbol argument without its entries: the array code reads it whole, and
    writing out the entries of a 1,024×1,024 one took 39 s (SymPy builds each `W[i, j]`)."""
    if not all(isinstance(d, (int, sp.Integer)) for d in symbol.shape):
        raise BuildError(f"{label}: expected a MatrixSymbol of integer shape, got {symbol} of "
                         f"shape {symbol.shape}")
    rows, cols = (int(d) for d in symbol.shape)
    if cols == 1:
        shape: tuple[int, ...] = (rows,)
    elif rows == 1 and vector_rows:
        shape = (cols,)
    else:
        shape = (rows, cols)
    return ArgumentSpec(label, shape, (), (symbol,), path, (rows, cols))


def _parameter_specs(params: Any) -> tuple[list[ArgumentSpec], Any]:
    """`parameter_arguments(params)`, with MatrixSymbol leaves described without entries."""
    if params is None:
        return parameter_arguments(None)
    flat, treedef = jax.tree_util.tree_flatten(params, is_leaf=is_symbolic_leaf)
    stand_ins = [sp.Symbol(f"_parameter{k}") if isinstance(leaf, sp.MatrixSymbol) else leaf
                 for k, leaf in enumerate(flat)]
    specs, treedef = parameter_arguments(jax.tree_util.tree_unflatten(treedef, stand_ins))
    return [_matrix_symbol_spec(leaf, spec.label, spec.path, vector_rows=False)
            if isinstance(leaf, sp.MatrixSymbol) else spec
            for leaf, spec in zip(flat, specs, strict=True)], treedef


def _check_unique_matrix_symbols(specs: list[ArgumentSpec]) -> None:
    seen: dict[sp.MatrixSymbol, str] = {}
    for spec in specs:
        for symbol in spec.matrix_symbols:
            if symbol in seen:
                raise BuildError(f"MatrixSymbol {symbol} is declared twice: as {seen[symbol]} "
                                 f"and as {spec.label}")
            seen[symbol] = spec.label


def array_equation_set(eqs: Any) -> tuple[EquationSet, tuple[ArrayLeaf, ...]]:
    """The equations' structure and leaves, each matrix or array leaf kept whole.

    The other leaves are checked and shaped by `equation_set` as in a scalar build.
    """
    flat, treedef = jax.tree_util.tree_flatten(eqs, is_leaf=is_symbolic_leaf)
    whole = [needs_array_program(leaf) for leaf in flat]
    stand_ins = [sp.Symbol(f"_array{k}") if is_whole else leaf
                 for k, (leaf, is_whole) in enumerate(zip(flat, whole, strict=True))]
    checked = equation_set(jax.tree_util.tree_unflatten(treedef, stand_ins))
    leaves, shapes = [], []
    for leaf, is_whole, printed, shape in zip(flat, whole, checked.leaves, checked.shapes,
                                              strict=True):
        if not is_whole:
            leaves.append(ArrayLeaf(printed, shape, "scalar"))
            shapes.append(shape)
            continue
        described = array_leaf(leaf, ())
        shape = () if described.kind == "scalar" else _leaf_shape(described)
        leaves.append(ArrayLeaf(leaf, shape, described.kind))
        shapes.append(shape)
    equations = EquationSet(tuple(leaf.expr for leaf in leaves), tuple(shapes), checked.treedef,
                            checked.labels)
    return equations, tuple(leaves)


def build_array_function(eqs: Any, *data_args: Any, params: Any = None,
                         options: BuildOptions, functions: dict | None = None
                         ) -> StructuredKernel:
    """`build_function` for equations with matrix or array expression leaves.

    >>> W, x = sp.MatrixSymbol("W", 2, 2), sp.MatrixSymbol("x", 2, 1)
    >>> k = build_array_function(W * x, x, params={"W": W}, options=BuildOptions())
    >>> print(k.source)
    def kernel(x1, ps):
        return x1 @ jnp.swapaxes(ps['W'], -1, -2),
    <BLANKLINE>
    """
    if functions:
        raise BuildError("functions: user functions are not available in equations with matrix "
                         f"expressions (given: {sorted(functions)}); write the matrix parts "
                         "as explicit matrices (.as_explicit())")
    # equations holding I are a complex kernel by default, as in build_function
    imaginary = options.dtype is None and any(
        leaf.has(sp.I) for leaf in jax.tree_util.tree_leaves(
            eqs, is_leaf=lambda node: isinstance(node, (sp.Basic, sp.MatrixBase)))
        if isinstance(leaf, (sp.Basic, sp.MatrixBase)))
    resolved_dtype = resolve_dtype(options.dtype, imaginary)
    chosen = options.resolved(resolved_dtype)
    refuse_unbatched_outputs(chosen, "a kernel of matrix expressions")
    start = time.perf_counter()
    data = [_matrix_symbol_spec(arg, f"x{k + 1}", (), vector_rows=True)
            if isinstance(arg, sp.MatrixSymbol) else data_argument(arg, k + 1)
            for k, arg in enumerate(data_args)]
    parameters, treedef = _parameter_specs(params)
    check_unique_symbols(data + parameters)
    _check_unique_matrix_symbols(data + parameters)
    equations, leaves = array_equation_set(eqs)
    code = generate_arrays(leaves, data, parameters, cse=chosen.cse,
                           embed_max_bytes=chosen.embed_max_bytes, dtype=resolved_dtype)
    signature = KernelSignature(tuple(data), tuple(parameters), treedef, resolved_dtype,
                                params is not None)
    portable = None
    if chosen.cpu_loop == "c":
        portable, code = code, _c_solves(code, chosen, resolved_dtype)
    return array_program_kernel(
        code, signature, equations, chosen, start, "<symkern array kernel>",
        lambda literal: origin_of(literal.used_by, equations.label_of_entry,
                                  "numeric matrix in a matrix expression (generate_arrays)"),
        portable=portable)


def _c_solves(code: StructuredCode, options: BuildOptions, dtype: Any) -> StructuredCode:
    """`code` with its linear solves run by the C solve (`cpu_loop="c"`), or a BuildError
    naming what stands in the way."""
    if jax.default_backend() != "cpu":
        refuse(f"the C solve runs on the CPU, and JAX's default backend is "
               f"{jax.default_backend()}")
    if dtype.name not in ("float32", "float64"):
        refuse(f"the C solve computes float32 or float64, and the kernel's dtype is {dtype.name}")
    module, changed = use_c_solve(code.generated.module)
    if not changed:
        refuse_c_loop_option(options, "a kernel of matrix expressions")
    if compiler() is None:
        refuse("no C++ compiler found (set $CXX, or install g++)")
    generated = dataclasses.replace(code.generated, module=module, source=print_source(module))
    return dataclasses.replace(code, generated=generated)
