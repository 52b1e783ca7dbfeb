"""codegen, stages 1–2 for structured networks: the array program printed as matrix products.

Imports ast, sympy, symkern.codegen (emit's printer, rules, pipeline), symkern.symbolic, errors.

The kernel is one function `kernel(<const args>, x1, …, ps)` over batch-leading arrays:
a line per layer (`h1 = jnp.tanh(x1 @ ps['L1']['W'].T + ps['L1']['b'])`), activations and
their derivatives printed by SymPy's JAX printer and resolved through the callee table, and
any scalar SymPy formula around the network (a loss, `H = net[0] + V(q)`) printed by the
ordinary pipeline (`pipeline.generate`) with the network's arrays as extra data arguments,
then spliced in. It returns a flat tuple of *pieces*: whole arrays (an output, a Jacobian, a
gradient) and scalar entries; `StructuredLayout` says how pieces make the equation leaves.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import sympy as sp
from sympy.utilities.lambdify import _EvaluatorPrinter

from symkern.codegen import rules
from symkern.codegen.callee import ELEMENTWISE_TARGETS, dotted_name, target_node
from symkern.codegen.emit import (
    CSE_PREFIX,
    FUNCTION_NAME,
    EmittedCode,
    check_functions,
    jax_printer,
    without_dirac_delta,
)
from symkern.codegen.pipeline import FLOAT32, GeneratedCode, generate, print_source
from symkern.errors import CodegenDriftError
from symkern.symbolic.arguments import ArgumentSpec, equation_set
from symkern.symbolic.structured import (
    Activate,
    ActivationForms,
    Add,
    Assign,
    Binary,
    Index,
    MatMul,
    Mul,
    NetworkProgram,
    Ones,
    Param,
    Ref,
    Stack,
    StructuredPlan,
    Sum,
    SwapLast,
    Transpose,
    Zeros,
    input_data_position,
)

DATA_NAME = re.compile(r"x\d+$")
#: names the scalar pipeline generates inside a body (CSE, Piecewise values and branches)
SCALAR_LOCAL = re.compile(r"_[cwbd]\d+$")
CONST_NAME = re.compile(r"_k\d+$")
#: callees that are not elementwise: a data argument passed to them would mix samples


def _load(name: str) -> ast.Name:
    return ast.Name(name, ast.Load())


def _store(name: str) -> ast.Name:
    return ast.Name(name, ast.Store())


def _drift(rule: str, expected: str, found: str) -> CodegenDriftError:
    return CodegenDriftError(f"{rule}: expected {expected}, found {found}")


# ---- activations, printed by SymPy -----------------------------------------------------------


@dataclass(frozen=True)
class ActivationTemplate:
    """σ, σ', σ'' printed once by SymPy's JAX printer (with CSE), callees resolved.

    `statements` assign CSE temporaries; `outputs[k]` is σ⁽ᵏ⁾; all read `argument`.
    """

    upstream: str
    argument: str
    statements: tuple[ast.stmt, ...]
    outputs: tuple[ast.expr, ...]

    def __repr__(self) -> str:
        return f"ActivationTemplate({', '.join(ast.unparse(o) for o in self.outputs)})"


@lru_cache(maxsize=256)
def activation_template(forms: ActivationForms, orders: int) -> ActivationTemplate:
    """Print σ … σ⁽ᵒʳᵈᵉʳˢ⁾ of `forms` as SymPy would for `lambdify(_a0, …, modules="jax")`."""
    argument = sp.Symbol("_a0")  # a generated name: the user's activation never names code
    exprs = [forms.derivative(k) for k in range(orders + 1)]
    exprs = without_dirac_delta([e.xreplace({forms.variable: argument}) for e in exprs])
    check_functions(list(rules_walk(exprs)), {})
    replacements, reduced = sp.cse(exprs, symbols=sp.numbered_symbols(CSE_PREFIX), list=True)
    source = _EvaluatorPrinter(jax_printer({}), False).doprint(
        FUNCTION_NAME, [argument], tuple(reduced), cses=replacements)
    module = rules.use_integer_pow(rules.resolve_callees(
        rules.unfold_reductions(ast.parse(source)), {}))  # relu: Max prints as reduce(...)
    function = module.body[0]
    returned = function.body[-1]
    if not isinstance(returned, ast.Return) or not isinstance(returned.value, ast.Tuple):
        raise _drift("activation_template", "return (σ, …)", ast.unparse(returned))
    return ActivationTemplate(source, "_a0", tuple(function.body[:-1]), tuple(returned.value.elts))


def rules_walk(exprs: Sequence[sp.Basic]) -> list[sp.Basic]:
    return list(sp.preorder_traversal(sp.Tuple(*exprs)))


class _Rename(ast.NodeTransformer):
    def __init__(self, names: Mapping[str, ast.expr | str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.expr:
        target = self.names.get(node.id)
        if target is None:
            return node
        if isinstance(target, str):
            return ast.Name(target, node.ctx)
        return copy.deepcopy(target)


def instantiate(template: ActivationTemplate, source: str,
                targets: Sequence[str | None]) -> list[ast.stmt]:
    """The template applied to array `source`, its outputs assigned to `targets`.

    A CSE temporary that *is* an output takes the output's name (`h1 = jnp.tanh(z1)`,
    `d1 = 1 - lax.integer_pow(h1, 2)`); other temporaries become `<source>_c<k>`.
    """
    names: dict[str, str] = {template.argument: source}
    temporaries = [s.targets[0].id for s in template.statements]
    for output, target in zip(template.outputs, targets, strict=False):
        if (target and isinstance(output, ast.Name) and output.id in temporaries
                and output.id not in names):
            names[output.id] = target
    for temporary in temporaries:
        names.setdefault(temporary, f"{source}_{temporary.lstrip('_')}")
    renamer = _Rename(names)
    statements = [renamer.visit(copy.deepcopy(s)) for s in template.statements]
    for output, target in zip(template.outputs, targets, strict=False):
        if not target:
            continue
        value = renamer.visit(copy.deepcopy(output))
        if isinstance(value, ast.Name) and value.id == target:
            continue
        if not any(isinstance(n, ast.Name) for n in ast.walk(value)):
            # a constant derivative (σ(z) = 2z): it must still be an array of z's shape
            value = ast.Call(target_node("jnp.full_like"), [_load(source), value], [])
        statements.append(ast.Assign([_store(target)], value))
    return statements


# ---- the array IR as code -----------------------------------------------------------------------


def _index_item(item: Any) -> ast.expr:
    if item == ":":
        return ast.Slice()
    return ast.Constant(item)


#: each binary IR node's Python operator
_OPERATORS: dict[type, type[ast.operator]] = {MatMul: ast.MatMult, Mul: ast.Mult, Add: ast.Add}


def array_expr(node: Any) -> ast.expr:
    """One IR node → its expression (`x1 @ ps['L1']['W'].T + ps['L1']['b']`)."""
    if isinstance(node, Ref):
        return _load(node.name)
    if isinstance(node, Param):
        result: ast.expr = _load("ps")
        for key in node.path:
            result = ast.Subscript(result, ast.Constant(key), ast.Load())
        return result
    if isinstance(node, Transpose):
        return ast.Attribute(array_expr(node.operand), "T", ast.Load())
    if isinstance(node, Binary):
        return ast.BinOp(array_expr(node.left), _OPERATORS[type(node)](), array_expr(node.right))
    if isinstance(node, Index):
        items = [ast.Constant(Ellipsis)] + [_index_item(i) for i in node.items]
        return ast.Subscript(array_expr(node.operand), ast.Tuple(items, ast.Load()), ast.Load())
    if isinstance(node, SwapLast):
        return ast.Call(target_node("jnp.swapaxes"),
                        [array_expr(node.operand), ast.Constant(-1), ast.Constant(-2)], [])
    if isinstance(node, Zeros):
        return ast.Call(target_node("jnp.zeros"),
                        [ast.Tuple([ast.Constant(d) for d in node.shape], ast.Load())], [])
    if isinstance(node, Ones):
        return ast.Call(target_node("jnp.ones_like"), [ast.Subscript(
            array_expr(node.source), ast.Tuple([ast.Constant(Ellipsis), ast.Slice(None, ast.Constant(1))],
                                               ast.Load()), ast.Load())], [])
    if isinstance(node, Sum):
        return ast.Call(target_node("jnp.sum"), [array_expr(node.operand)], [
            ast.keyword("axis", ast.Tuple([ast.Constant(a) for a in node.axes], ast.Load())),
            *([ast.keyword("keepdims", ast.Constant(True))] if node.keepdims else [])])
    if isinstance(node, Stack):
        present = next(o for o in node.operands if o is not None)
        zeros = ast.Call(target_node("jnp.zeros_like"), [array_expr(present)], [])
        items = [copy.deepcopy(zeros) if o is None else array_expr(o) for o in node.operands]
        return ast.Call(target_node("jnp.stack"), [ast.List(items, ast.Load())],
                        [ast.keyword("axis", ast.Constant(node.axis))])
    raise TypeError(f"array_expr: not an array IR node: {node!r}")


def step_statements(steps: Sequence[Any], orders: int, upstream: list[str]) -> list[ast.stmt]:
    statements: list[ast.stmt] = []
    for step in steps:
        if isinstance(step, Assign):
            statements.append(ast.Assign([_store(step.target)], array_expr(step.value)))
        elif isinstance(step, Activate):
            template = activation_template(step.forms, orders)
            if template.upstream not in upstream:
                upstream.append(template.upstream)
            statements.extend(instantiate(template, step.source, step.targets))
        else:
            raise TypeError(f"step_statements: not a step: {step!r}")
    return statements


# ---- rules for array code -------------------------------------------------------------------------


def index_by_batch_structured(module: ast.Module, data_ranks: Mapping[str, int],
                              scalar_parameters: Sequence[str] = ()) -> ast.Module:
    """Check that every read of a vector or matrix data argument keeps its batch dimension.

    Accepted: `x1[..., i]` and any subscript that starts with `...`; `x1` as the LEFT
    operand of `@` (the batch dimensions lead, the contraction is over the last axis);
    `x1` elementwise (`+ - * / **`) with another batch-leading array or a number; `x1` as
    the argument of an elementwise callee (`jnp.tanh`); `x1.shape`. Rejected, since the
    batch dimension would silently be ignored or mixed in: `x1[0]`, `W @ x1`, `x1.T`,
    `jnp.sum(x1)`, assigning or returning `x1` whole. Parameters that are scalars
    (`scalar_parameters`, as printed: `ps['c']`) and parameter entries (`ps['W'][0, 1]`)
    count as numbers. Returns the module unchanged.
    """
    rule = "index_by_batch_structured"
    scalars = set(scalar_parameters)
    function = next((n for n in module.body if isinstance(n, ast.FunctionDef)), None)
    if function is None:
        raise _drift(rule, "a function definition", "none")
    batched = {name for name, rank in data_ranks.items() if rank > 0}
    # locals that depend on a data argument carry the batch dimensions first
    leading = set(batched) | {n for n in data_ranks}
    for statement in function.body:
        if isinstance(statement, ast.Assign) and any(
                isinstance(n, ast.Name) and n.id in leading for n in ast.walk(statement.value)):
            leading.update(n.id for t in statement.targets for n in ast.walk(t) if isinstance(n, ast.Name))
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(function):
        for child in ast.iter_child_nodes(node):
            parents[child] = node

    def batch_leading(node: ast.expr) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
        if isinstance(node, ast.Name):
            return node.id in leading
        if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
            return batch_leading(node.operand)  # -2
        if _scalar_parameter(node, scalars):
            return True  # broadcasts against anything, mixes no samples
        if isinstance(node, ast.Subscript):
            return _ellipsis_led(node) and batch_leading(node.value)
        if isinstance(node, (ast.BinOp, ast.Call, ast.UnaryOp)):
            return any(isinstance(n, ast.Name) and n.id in leading for n in ast.walk(node))
        return False

    for node in ast.walk(function):
        if not (isinstance(node, ast.Name) and node.id in batched):
            continue
        name, parent = node.id, parents.get(node)
        where = ast.unparse(parent) if parent is not None else name
        if not isinstance(node.ctx, ast.Load):
            raise _drift(rule, f"{name} only read", f"an assignment to it in {where}")
        if isinstance(parent, ast.Subscript) and parent.value is node:
            if _ellipsis_led(parent):
                continue
            raise _drift(rule, f"{name} indexed after its batch dimensions as {name}[..., i]",
                         f"{where}, which indexes the batch")
        if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.MatMult):
            if parent.left is node:
                continue
            raise _drift(rule, f"{name} only as the left operand of @ (batch-leading)",
                         f"{where}, which contracts its batch dimension")
        if isinstance(parent, ast.BinOp) and isinstance(
                parent.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)):
            other = parent.right if parent.left is node else parent.left
            if batch_leading(other):
                continue
            raise _drift(rule, f"{name} elementwise only with batch-leading arrays or numbers",
                         where)
        if isinstance(parent, ast.UnaryOp):
            continue
        if isinstance(parent, ast.Attribute) and parent.attr == "shape":
            continue
        if (isinstance(parent, ast.Call) and node in parent.args and len(parent.args) == 1
                and dotted_name(parent.func) in ELEMENTWISE_TARGETS):
            continue
        raise _drift(rule, f"{name} read with its batch dimensions leading", f"{where}")
    return module


def _scalar_parameter(node: ast.expr, scalars: set[str]) -> bool:
    """`ps['c']` for a scalar leaf, or an entry `ps['W'][0, 1]` / `ps['b'][2]`."""
    if not isinstance(node, ast.Subscript):
        return False
    if ast.unparse(node) in scalars:
        return True
    index = node.slice
    items = index.elts if isinstance(index, ast.Tuple) else [index]
    if not all(isinstance(i, ast.Constant) and type(i.value) is int for i in items):
        return False
    root = node.value
    while isinstance(root, ast.Subscript) and isinstance(root.slice, ast.Constant) \
            and isinstance(root.slice.value, str):
        root = root.value
    return isinstance(root, ast.Name) and root.id == "ps"


def _ellipsis_led(node: ast.Subscript) -> bool:
    index = node.slice
    first = index.elts[0] if isinstance(index, ast.Tuple) and index.elts else index
    return isinstance(first, ast.Constant) and first.value is Ellipsis


def _reads(node: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]


def prune_unused(module: ast.Module) -> ast.Module:
    """Drop assignments nothing returned depends on (a σ' no quantity reads, …)."""
    function = module.body[0]
    live = set(_reads(function.body[-1]))
    kept: list[ast.stmt] = [function.body[-1]]
    for statement in reversed(function.body[:-1]):
        if isinstance(statement, ast.Assign):
            targets = {n.id for t in statement.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if not targets & live:
                continue
            live |= set(_reads(statement.value))
        kept.append(statement)
    function.body = list(reversed(kept))
    return module


def merge_subscripts(module: ast.Module) -> ast.Module:
    """`H[..., 0, :, :][..., i, j]` → `H[..., 0, i, j]`: a placeholder read folded into one index."""

    class Merge(ast.NodeTransformer):
        def visit_Subscript(self, node: ast.Subscript) -> ast.expr:
            self.generic_visit(node)
            inner = node.value
            if not (isinstance(inner, ast.Subscript) and _ellipsis_led(inner) and _ellipsis_led(node)
                    and isinstance(inner.slice, ast.Tuple) and isinstance(node.slice, ast.Tuple)):
                return node
            outer_items = list(node.slice.elts[1:])
            inner_items = list(inner.slice.elts[1:])
            open_axes = [k for k, item in enumerate(inner_items) if isinstance(item, ast.Slice)]
            if (len(open_axes) != len(outer_items) or open_axes != list(
                    range(len(inner_items) - len(outer_items), len(inner_items)))
                    or any(isinstance(i, ast.Constant) and i.value is None for i in inner_items)):
                return node
            for k, item in zip(open_axes, outer_items, strict=True):
                inner_items[k] = item
            return ast.Subscript(inner.value, ast.Tuple([inner.slice.elts[0], *inner_items], ast.Load()),
                                 ast.Load())

    return ast.fix_missing_locations(Merge().visit(module))


def inline_single_use(module: ast.Module, stems: tuple[str, ...] = ("z", "u")) -> ast.Module:
    """`z1 = x1 @ W.T + b; h1 = tanh(z1)` → `h1 = tanh(x1 @ W.T + b)` where z1 is read once.

    Only pre-activations and tangents (names `z<k>`, `u<k>`): a line per layer, and the
    shared values (h, d, t, a) stay named, so XLA sees them materialised once.
    """
    function = module.body[0]
    pattern = re.compile(rf"({'|'.join(stems)})\d+(_\d+)?$")
    counts: dict[str, int] = {}
    for name in _reads(function):
        counts[name] = counts.get(name, 0) + 1
    values: dict[str, ast.expr] = {}
    body: list[ast.stmt] = []
    for statement in function.body:
        statement = _Rename(values).visit(statement)
        if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
                and pattern.match(statement.targets[0].id)
                and counts.get(statement.targets[0].id, 0) == 1):
            values[statement.targets[0].id] = statement.value
            continue
        body.append(statement)
    function.body = body
    return ast.fix_missing_locations(module)


def _parameter_path(node: ast.AST) -> bool:
    """`ps['L1']['W']`: a subscript chain of string keys on `ps`."""
    while isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
            and isinstance(node.slice.value, str):
        node = node.value
        if isinstance(node, ast.Name):
            return node.id == "ps"
    return False


def share_weight_transposes(module: ast.Module) -> ast.Module:
    """`WT1 = ps['L1']['W'].T` once, read as `WT1` and `WT1.T`, for a weight used both ways.

    A weight read as `W.T` (a layer, a tangent) and as `W` (a reverse row `r @ W`) gives
    `jax.grad` through the kernel two cotangents, one per orientation; XLA folds each
    transpose into its dot, and the `W`-shaped one is an (in, out) output with few columns:
    for the 2-40-1 HNN field at batch 4,096 a (40, 2)-output dot took 0.19 ms against
    0.08 ms for (2, 40), and the training step 0.80 → 0.60 ms with the transpose shared
    (one cotangent, summed before a single transpose, as JAX's own autodiff of `h @ W.T`).
    Only operands of `@` are rewritten; other reads (`ps['L1']['W'][0, 1]`) are left alone.
    """
    function = module.body[0]
    transposed: dict[str, ast.expr] = {}
    plain: set[str] = set()
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(function):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    for node in ast.walk(function):
        if not _parameter_path(node) or _parameter_path(parents.get(node)):
            continue
        parent = parents.get(node)
        key = ast.unparse(node)
        if isinstance(parent, ast.Attribute) and parent.attr == "T":
            transposed.setdefault(key, node)
        elif isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.MatMult):
            plain.add(key)
    shared = {key: f"WT{k + 1}" for k, key in enumerate(k for k in transposed if k in plain)}
    if not shared:
        return module

    class Share(ast.NodeTransformer):
        def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
            if node.attr == "T" and _parameter_path(node.value) and ast.unparse(node.value) in shared:
                return _load(shared[ast.unparse(node.value)])
            return self.generic_visit(node)

        def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
            self.generic_visit(node)
            if isinstance(node.op, ast.MatMult):
                for side in ("left", "right"):
                    operand = getattr(node, side)
                    if _parameter_path(operand) and ast.unparse(operand) in shared:
                        setattr(node, side, ast.Attribute(_load(shared[ast.unparse(operand)]), "T",
                                                          ast.Load()))
            return node

    function.body = [Share().visit(s) for s in function.body]
    function.body[:0] = [ast.Assign([_store(name)], ast.Attribute(copy.deepcopy(transposed[key]), "T",
                                                                  ast.Load()))
                         for key, name in shared.items()]
    return ast.fix_missing_locations(module)


# ---- splicing scalar parts from the ordinary pipeline --------------------------------------------


@dataclass
class ScalarBlock:
    """Scalar SymPy entries printed by `pipeline.generate`, ready to splice into the body."""

    statements: list[ast.stmt]
    entries: list[ast.expr]
    literals: list[rules.HoistedLiteral]
    upstream: str


def scalar_block(entries: Sequence[sp.Expr], data: Sequence[ArgumentSpec],
                 extra: Sequence[tuple[ArgumentSpec, ast.expr]], parameters: Sequence[ArgumentSpec],
                 tag: str, const_offset: int, *, cse: bool, embed_max_bytes: int,
                 dtype: np.dtype) -> ScalarBlock:
    """Print `entries` through stages 1–2 with `extra` arrays as more data arguments.

    `extra` pairs a spec (its entries are the placeholder symbols) with the expression the
    generated name must read (`y`, `J`, `H0`). Generated locals get `tag` so two blocks
    never clash; const args are renumbered from `const_offset`.
    """
    # built by hand, not with data_argument: a 1×n Jacobian must stay (1, n), not become (n,)
    placeholders = [ArgumentSpec(f"x{len(data) + k + 1}", spec.shape, spec.entries)
                    for k, (spec, _) in enumerate(extra)]
    specs = list(data) + placeholders + list(parameters)
    generated = generate(equation_set(list(entries)), specs, len(data) + len(placeholders),
                         cse=cse, embed_max_bytes=embed_max_bytes, dtype=dtype)
    function = generated.module.body[0]
    names: dict[str, ast.expr | str] = {
        f"x{len(data) + k + 1}": value for k, (_, value) in enumerate(extra)}
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and SCALAR_LOCAL.match(node.id):
            names[node.id] = f"_{tag}{node.id.lstrip('_')}"
    literals = []
    for k, literal in enumerate(generated.literals):
        new = f"_k{const_offset + k}"
        names[literal.name] = new
        literals.append(rules.HoistedLiteral(new, literal.value, literal.used_by))
    renamer = _Rename(names)
    statements = [renamer.visit(s) for s in function.body[:-1]]
    returned = renamer.visit(function.body[-1])
    values = returned.value.elts if isinstance(returned.value, ast.Tuple) else [returned.value]
    return ScalarBlock(statements, list(values), literals, generated.upstream.source)


def uniform_template(entries: Sequence[sp.Expr],
                     vectors: Sequence[Sequence[sp.Symbol]]) -> sp.Expr | None:
    """`entries[0]` if entry `i` is it with every vector's entry 0 replaced by entry `i`.

    Such entries are one elementwise formula over whole vectors (a squared loss's seed
    `g_i = 2 (h_i - y_i)`), printed once on the arrays instead of `m` times on their
    entries and stacked (XLA compile 0.22 → 0.13 s on a width-8 gradient). None when
    the entries are not of that form, when the formula reads another entry of a vector, or
    when it is not built from arithmetic and one-argument functions (elementwise for sure).
    """
    m = len(entries)
    vectors = [v for v in vectors if len(v) == m]
    if m < 2 or not vectors:
        return None
    template = sp.sympify(entries[0])
    free = template.free_symbols
    firsts = {v[0] for v in vectors}
    if not free & firsts or any(s in free for v in vectors for s in v[1:]):
        return None
    for node in sp.preorder_traversal(template):
        if isinstance(node, (sp.Symbol, sp.Number, sp.Add, sp.Mul, sp.Pow)):
            continue
        if isinstance(node, sp.Function) and len(node.args) == 1:
            continue
        return None
    for i in range(1, m):
        if template.xreplace({v[0]: v[i] for v in vectors}) != entries[i]:
            return None
    return template


def _stack(entries: Sequence[ast.expr]) -> ast.expr:
    return ast.Call(target_node("jnp.stack"), [ast.List(list(entries), ast.Load())],
                    [ast.keyword("axis", ast.Constant(-1))])


def _uniform_seed(seed: list[sp.Expr], a: int, plan: StructuredPlan,
                  data: Sequence[ArgumentSpec], quantities: Mapping[tuple[int, Any], ast.expr],
                  scalar_parameters: Sequence[ArgumentSpec],
                  ) -> tuple[sp.Expr, list[tuple[ArgumentSpec, ast.expr]]] | None:
    """The seed `∂loss/∂y` as one formula over whole vectors, when `uniform_template` finds one.

    Returns the formula and its placeholders for `scalar_block`: the template's vector
    symbols become rank-0 placeholders that read the whole vectors (the network output, a
    data vector of the same length), so the scalar pipeline prints one elementwise formula
    over batch-leading arrays.
    """
    output = plan.needs[a].placeholders.get("output")
    vectors: list[tuple[list[sp.Symbol], ast.expr]] = []
    if output is not None and (a, "output") in quantities:
        vectors.append((list(output), quantities[(a, "output")]))
    for position, spec in enumerate(data):
        if len(spec.shape) == 1:
            vectors.append((list(spec.entries), _load(f"x{position + 1}")))
    template = uniform_template(seed, [v for v, _ in vectors])
    if template is None:
        return None
    # anything else batched (a rank-0 or other-length data entry, another network
    # quantity) would not broadcast against (…, m): only parameters may join the vectors
    allowed = {v[0] for v, _ in vectors if len(v) == len(seed)}
    allowed.update(symbol for spec in scalar_parameters for symbol in spec.entries)
    if not template.free_symbols <= allowed:
        return None
    extra = []
    for k, (entries, value) in enumerate(vectors):
        if len(entries) == len(seed) and entries[0] in template.free_symbols:
            whole = sp.Dummy(f"whole{k}")
            template = template.xreplace({entries[0]: whole})
            extra.append((ArgumentSpec("placeholder", (), (whole,)), copy.deepcopy(value)))
    return template, extra


def _weight_specs(plan: StructuredPlan, parameters: Sequence[ArgumentSpec]) -> list[ArgumentSpec]:
    """The specs of the network's weights whose entries `plan.weights` reads, each entry
    its placeholder (a fresh symbol for the entries not read)."""
    specs = []
    for spec in parameters:
        if spec.entries or len(spec.path) != 2 or spec.path[0] not in plan.network.params:
            continue
        matrix = plan.network.params[spec.path[0]][spec.path[1]]
        entries = [plan.weights.get(matrix[i, j]) for i in range(matrix.rows)
                   for j in range(matrix.cols)]
        if any(entry is not None for entry in entries):
            specs.append(dataclasses.replace(spec, entries=tuple(
                entry if entry is not None else sp.Dummy("unread") for entry in entries)))
    return specs


def _uniform_weight_seed(partials: Mapping[tuple[int, ...], sp.Expr], path: Any,
                         plan: StructuredPlan, scalar_parameters: Sequence[ArgumentSpec],
                         ) -> tuple[sp.Expr, list[tuple[ArgumentSpec, ast.expr]]] | None:
    """∂loss/∂W as one elementwise formula of the whole weight (a penalty λ Σ w² gives
    2λ w), printed once on the array, when every entry's partial is the first's with its
    entry in place: as `uniform_template` does for the seeds of vectors."""
    shape = plan.network.parameter_shapes[path]
    indices = list(np.ndindex(*shape))
    if len(partials) != len(indices):
        return None
    matrix = plan.network.params[path[0]][path[1]]
    symbols = [plan.weights.get(matrix[index if len(index) == 2 else (index[0], 0)])
               for index in indices]
    if any(symbol is None for symbol in symbols):
        return None
    template = uniform_template([partials[index] for index in indices], [symbols])
    if template is None:
        return None
    allowed = {symbols[0]} | {symbol for spec in scalar_parameters for symbol in spec.entries}
    if not template.free_symbols <= allowed:
        return None
    whole = sp.Dummy("weight")
    return template.xreplace({symbols[0]: whole}), [
        (ArgumentSpec("placeholder", (), (whole,)), array_expr(Param(path)))]


def _stack_entries(entries: Sequence[ast.expr], shape: tuple[int, ...]) -> ast.expr:
    """Scalar entries (row-major) stacked into batch + `shape`."""
    if len(shape) == 1:
        return _stack(entries)
    rows = [_stack(entries[r * shape[1]:(r + 1) * shape[1]]) for r in range(shape[0])]
    return ast.Call(target_node("jnp.stack"), [ast.List(rows, ast.Load())],
                    [ast.keyword("axis", ast.Constant(-2))])


# ---- the whole kernel ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PieceLeaf:
    """Equation leaf `k`: pieces `start … start+count` of the kernel's returned tuple.

    `count == 1` and `stacked` False: the piece is the whole leaf (shaped batch + `shape`);
    `stacked`: `count` scalar entries, stacked and reshaped outside the kernel body.
    """

    start: int
    count: int
    shape: tuple[int, ...]
    stacked: bool


@dataclass(frozen=True)
class StructuredLayout:
    leaves: tuple[PieceLeaf, ...]

    @property
    def needs_assembly(self) -> bool:
        return any(leaf.stacked for leaf in self.leaves)

    def __repr__(self) -> str:
        return f"StructuredLayout({len(self.leaves)} leaves, assembly={self.needs_assembly})"


@dataclass
class StructuredCode:
    """Stages 1–2 for a structured kernel: the code, how its pieces make the leaves."""

    generated: GeneratedCode
    layout: StructuredLayout
    data_ranks: dict[str, int] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"StructuredCode({self.layout!r})"


def generate_structured(
    plan: StructuredPlan,
    data: Sequence[ArgumentSpec],
    parameters: Sequence[ArgumentSpec],
    *,
    cse: bool = True,
    embed_max_bytes: int = 32,
    dtype: np.dtype = FLOAT32,
) -> StructuredCode:
    """Print `plan` as one kernel: scalar input blocks, array programs, scalar blocks, backprops."""
    start = time.perf_counter()
    upstream: list[str] = []
    literals: list[rules.HoistedLiteral] = []
    body: list[ast.stmt] = []
    data_entries = [spec.entries for spec in data]
    scalar_parameters = [spec for spec in parameters if spec.entries]
    # weights whose entries formulas read (a penalty) are parameters of the scalar blocks,
    # their entries the plan's placeholders: printed as ps['L1']['W'][i, j], never batched
    scalar_parameters += _weight_specs(plan, parameters)
    options = {"cse": cse, "embed_max_bytes": embed_max_bytes, "dtype": dtype}

    def splice(entries: Sequence[sp.Expr], extra: Sequence[tuple[ArgumentSpec, ast.expr]],
               tag: str) -> list[ast.expr]:
        """Print `entries` as a scalar block into the body; the expressions of its entries."""
        block = scalar_block(entries, data, extra, scalar_parameters, tag, len(literals),
                             **options)
        body.extend(block.statements)
        literals.extend(block.literals)
        upstream.append(block.upstream)
        return block.entries

    programs: list[NetworkProgram] = []
    for a, (application, needs) in enumerate(zip(plan.applications, plan.needs, strict=True)):
        suffix = "" if a == 0 else f"_{a + 1}"
        position = input_data_position(application.inputs, data_entries)
        if position is not None:
            source: Any = Ref(f"x{position + 1}")
        else:  # the network reads expressions of the data: print them, stack them
            inputs = splice(application.inputs, [], f"v{a + 1}")
            body.append(ast.Assign([_store(f"v{suffix}")], _stack(inputs)))
            source = Ref(f"v{suffix}")
        programs.append(NetworkProgram(plan.network, source, suffix, needs.orders))

    # forward: every array quantity any leaf or scalar formula reads
    quantities: dict[tuple[int, Any], ast.expr] = {}
    extra: list[tuple[ArgumentSpec, ast.expr]] = []
    m = plan.network.net.output_dim
    for a, (program, needs) in enumerate(zip(programs, plan.needs, strict=True)):
        if needs.output:
            quantities[(a, "output")] = array_expr(program.output())
        if needs.jacobian:
            quantities[(a, "jacobian")] = array_expr(program.jacobian())
        if needs.hessian:
            quantities[(a, "hessian")] = array_expr(program.hessian())
        output = needs.placeholders.get("output")
        if output is not None:
            extra.append((ArgumentSpec("placeholder", (output.rows,), tuple(output)),
                          copy.deepcopy(quantities[(a, "output")])))
        reverse = needs.reverse_entries(m)
        for (k, directions), symbol in needs.derivatives.items():
            entry = program.derivative_entry(k, directions, reverse)
            extra.append((ArgumentSpec("placeholder", (), (symbol,)), array_expr(entry)))
    for program in programs:
        body += step_statements(program.steps, program.orders, upstream)

    # scalar formulas around the network, and the seeds (∂loss/∂y, ∂loss/∂(∂_S y_k),
    # ∂loss/∂W read directly), in one block (one CSE)
    scalar_leaves = [leaf for leaf in plan.leaves if leaf.kind == "scalar"]
    entries: list[sp.Expr] = []
    for leaf in scalar_leaves:
        entries += list(leaf.expr) if isinstance(leaf.expr, sp.MatrixBase) else [leaf.expr]
    # per (group, application): the output seed (its first entry in the block, or its
    # whole-vector value, or None), and each derivative entry's seed position in the block
    seed_slots: list[tuple[int, int, int | ast.expr | None, dict[tuple, int]]] = []
    weight_slots: list[tuple[int, Any, Any]] = []
    for g, group in enumerate(plan.groups):
        for a in group.applications:
            seed = group.seeds.get(a)
            first: int | ast.expr | None = None
            if seed is not None and any(e != 0 for e in seed):
                uniform = _uniform_seed(list(seed), a, plan, data, quantities, scalar_parameters)
                if uniform is not None:
                    first = splice([uniform[0]], uniform[1], f"q{g + 1}a{a + 1}")[0]
                else:
                    first = len(entries)
                    entries += seed
            positions = {}
            for key, partial in group.derivative_seeds.get(a, {}).items():
                positions[key] = len(entries)
                entries.append(partial)
            seed_slots.append((g, a, first, positions))
        for path, partials in group.weight_seeds.items():
            uniform = _uniform_weight_seed(partials, path, plan, scalar_parameters)
            if uniform is not None:
                weight_slots.append((g, path, splice([uniform[0]], uniform[1],
                                                     f"p{g + 1}{path[0]}{path[1]}")[0]))
            else:
                shape = plan.network.parameter_shapes[path]
                indices = list(np.ndindex(*shape))
                weight_slots.append((g, path, (len(entries), indices)))
                entries += [partials.get(index, sp.S.Zero) for index in indices]
    scalar_values = splice(entries, extra, "s") if entries else []

    # reverse passes: one per (loss, application), summed over applications
    gradients: dict[tuple[int, Any], Any] = {}
    single = len(seed_slots) == 1
    for g, a, first, positions in seed_slots:
        program = programs[a]
        tag = "" if single else f"_g{g + 1}a{a + 1}"
        reverse = plan.needs[a].reverse_entries(m)
        cotangents = []
        if first is not None:
            seed_name = f"g{program.suffix}" if single else f"g{tag}"
            seed_value = (first if isinstance(first, ast.expr)
                          else _stack(scalar_values[first:first + m]))
            body.append(ast.Assign([_store(seed_name)], seed_value))
            cotangents.append((program.output(), Ref(seed_name)))
        for (k, directions), position in positions.items():
            seed_name = f"g{k}x{'x'.join(map(str, directions))}{program.suffix}{tag}"
            body.append(ast.Assign([_store(seed_name)], scalar_values[position]))
            cotangents.append((program.derivative_entry(k, directions, reverse), Ref(seed_name)))
        steps_before = len(program.steps)
        grads = program.vjp(cotangents, tag)
        body += step_statements(program.steps[steps_before:], program.orders, upstream)
        for path, value in grads.items():
            key = (g, path)
            gradients[key] = value if key not in gradients else Add(gradients[key], value)
    for g, path, value in weight_slots:
        if isinstance(value, tuple):  # entries of the block, stacked to the weight's shape
            start, indices = value
            value = _stack_entries([scalar_values[start + k] for k in range(len(indices))],
                                   plan.network.parameter_shapes[path])
        name = f"gp{g + 1}{path[0]}{path[1]}"
        body.append(ast.Assign([_store(name)], value))
        key = (g, path)
        gradients[key] = Ref(name) if key not in gradients else Add(gradients[key], Ref(name))

    # the returned pieces
    pieces: list[ast.expr] = []
    layout: list[PieceLeaf] = []
    scalar_position = 0
    for leaf in plan.leaves:
        if leaf.kind == "array":
            if isinstance(leaf.quantity, tuple):  # ("hessian", k)
                value = array_expr(Index(Ref(programs[leaf.application].local_name("H")),
                                         (leaf.quantity[1], ":", ":")))
            else:
                value = copy.deepcopy(quantities[(leaf.application, leaf.quantity)])
            net = plan.network.net
            natural = {"output": (net.output_dim,), "jacobian": (net.output_dim, net.input_dim)}.get(
                leaf.quantity, (net.input_dim, net.input_dim))
            if tuple(leaf.shape) != natural:
                # an m×1 Jacobian or a 1×1 Hessian is a Matrix column: shape (m,), not (m, 1)
                value = ast.Subscript(value, ast.Tuple(
                    [ast.Constant(Ellipsis), ast.Constant(0)], ast.Load()), ast.Load())
            layout.append(PieceLeaf(len(pieces), 1, leaf.shape, False))
            pieces.append(value)
        elif leaf.kind == "gradient":
            layout.append(PieceLeaf(len(pieces), 1, leaf.shape, False))
            pieces.append(array_expr(gradients[(leaf.group, leaf.path)]))
        else:
            count = int(np.prod(leaf.shape, dtype=int))
            layout.append(PieceLeaf(len(pieces), count, leaf.shape, bool(leaf.shape)))
            pieces += scalar_values[scalar_position:scalar_position + count]
            scalar_position += count

    arguments = [ast.arg(literal.name) for literal in literals]
    arguments += [ast.arg(f"x{k + 1}") for k in range(len(data))]
    if parameters:
        arguments.append(ast.arg("ps"))
    function = ast.FunctionDef(
        name=rules.KERNEL_NAME,
        args=ast.arguments(posonlyargs=[], args=arguments, kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=body + [ast.Return(ast.Tuple(pieces, ast.Load()))],
        decorator_list=[], returns=None, type_params=[],
    )
    module = ast.fix_missing_locations(ast.Module([function], type_ignores=[]))
    emitted_at = time.perf_counter()
    data_ranks = {f"x{k + 1}": len(spec.shape) for k, spec in enumerate(data)}
    scalar_reads = [ast.unparse(array_expr(Param(spec.path)))
                    for spec in parameters if spec.shape == ()]
    module = index_by_batch_structured(module, data_ranks, scalar_reads)
    module = prune_unused(module)
    module = inline_single_use(module)
    module = merge_subscripts(module)
    module = share_weight_transposes(module)
    module = index_by_batch_structured(module, data_ranks, scalar_reads)
    source = print_source(module)
    upstream_source = "\n".join(upstream)
    emitted = EmittedCode(upstream_source, ())
    generated = GeneratedCode(emitted, module, source,
                              {"emit": emitted_at - start, "rewrite": time.perf_counter() - emitted_at},
                              tuple(literals), form="structured")
    return StructuredCode(generated, StructuredLayout(tuple(layout)), data_ranks)

