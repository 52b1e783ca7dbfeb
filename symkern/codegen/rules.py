"""codegen, stage 2: the rewrite rules, one function per problem, applied in a fixed order.

Imports ast, numpy, symkern.codegen.callee and symkern.errors. Each rule is `ast.Module -> ast.Module`
and raises CodegenDriftError, naming itself, when the upstream form it matches is not there.
"""

from __future__ import annotations

import ast
import copy
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from symkern.codegen.callee import (
    CALLEE_TABLE,
    CONSTANT_TABLE,
    CalleeName,
    callee_name,
    target_node,
)
from symkern.codegen.namespace import NAMESPACE_ROOTS
from symkern.errors import CodegenDriftError

#: the name of the rewritten function
KERNEL_NAME = "kernel"
#: generated locals that carry values a Piecewise branch may read (CSE, hoisted data reads)
VALUE_NAME = re.compile(r"_[cd]\d+$")
DATA_NAME = re.compile(r"x\d+$")


def _drift(rule: str, expected: str, found: str) -> CodegenDriftError:
    return CodegenDriftError(f"{rule}: expected {expected}, found {found}")


def _callee(func: ast.expr, rule: str) -> CalleeName:
    """`callee_name`, with a failure reported as the calling rule's drift."""
    try:
        return callee_name(func)
    except CodegenDriftError as error:
        raise CodegenDriftError(f"{rule}: {str(error).removeprefix('callee_name: ')}") from error


def kernel_function(module: ast.Module, rule: str) -> ast.FunctionDef:
    functions = [node for node in module.body if isinstance(node, ast.FunctionDef)]
    if len(module.body) != 1 or len(functions) != 1:
        found = ", ".join(type(node).__name__ for node in module.body) or "nothing"
        raise _drift(rule, "a module holding exactly one function definition", found)
    return functions[0]


def return_statement(function: ast.FunctionDef, rule: str) -> ast.Return:
    last = function.body[-1]
    if not isinstance(last, ast.Return) or last.value is None:
        raise _drift(rule, "the function to end in `return <value>`", ast.unparse(last))
    return last


def single_assignments(function: ast.FunctionDef,
                        rule: str) -> tuple[list[ast.Assign], ast.Return] | None:
    """The statements before the return and the return, when each statement assigns one
    name and no name twice; None for any other body (vectorized, tiled, materialized)."""
    ret = return_statement(function, rule)
    statements = function.body[:-1]
    names = set()
    for statement in statements:
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)):
            return None
        names.add(statement.targets[0].id)
    if len(names) != len(statements):
        return None  # a name assigned twice: not the single-assignment form
    return statements, ret  # type: ignore[return-value]


def returned_entries(result: ast.expr) -> list[ast.expr]:
    """The returned entries: a tuple's elements, or the one value."""
    return list(result.elts) if isinstance(result, ast.Tuple) else [result]


def _located(statement: ast.stmt) -> ast.stmt:
    """A new statement with source positions (ast.unparse reads them; compile fixes the rest).

    Rules do not run ast.fix_missing_locations over the whole module (it was a quarter of
    a 10^4-op build, once per rule); compile_kernel runs it once.
    """
    return ast.fix_missing_locations(statement)


def _load(name: str) -> ast.Name:
    return ast.Name(name, ast.Load())


def _path_node(root: str, path: Sequence[object]) -> ast.expr:
    node: ast.expr = _load(root)
    for key in path:
        node = ast.Subscript(node, ast.Constant(key), ast.Load())
    return node


def _argument_targets(
    module: ast.Module,
    argument_names: Sequence[str],
    data_count: int,
    parameter_paths: Sequence[Sequence[object]],
) -> tuple[ast.FunctionDef, dict[str, tuple[object, ...] | str]]:
    """substitute_arguments' checks of the signature, and what each argument becomes: the
    data name `x<k>`, or a parameter's access path."""
    rule = "substitute_arguments"
    function = kernel_function(module, rule)
    found = [arg.arg for arg in function.args.args]
    arguments = function.args
    if (found != list(argument_names) or arguments.vararg or arguments.kwarg
            or arguments.kwonlyargs or arguments.defaults or arguments.posonlyargs):
        raise _drift(rule, f"positional arguments {list(argument_names)}",
                     f"def {function.name}({ast.unparse(arguments)})")
    if len(argument_names) != data_count + len(parameter_paths):
        raise _drift(rule, f"{data_count + len(parameter_paths)} arguments",
                     f"{len(argument_names)}")
    targets: dict[str, tuple[object, ...] | str] = {}
    for position, name in enumerate(argument_names):
        if position < data_count:
            targets[name] = f"x{position + 1}"
        else:
            targets[name] = tuple(parameter_paths[position - data_count])
    return function, targets


def _argument_node(target: tuple[object, ...] | str) -> ast.expr:
    return _load(target) if isinstance(target, str) else _path_node("ps", target)


def _rebound_argument(node: ast.Name, targets: Mapping[str, tuple[object, ...] | str]) -> ast.expr:
    if not isinstance(node.ctx, ast.Load):
        raise _drift("substitute_arguments", f"argument {node.id} only read", "an assignment to it")
    return _argument_node(targets[node.id])


class _Rebind(ast.NodeTransformer):
    def __init__(self, targets: Mapping[str, tuple[object, ...] | str]) -> None:
        self.targets = targets

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return _rebound_argument(node, self.targets) if node.id in self.targets else node


def _kernel_signature(function: ast.FunctionDef, data_count: int, parameters: bool) -> None:
    new_arguments = [ast.arg(f"x{k + 1}") for k in range(data_count)]
    if parameters:
        new_arguments.append(ast.arg("ps"))
    function.args = ast.arguments(posonlyargs=[], args=new_arguments, kwonlyargs=[],
                                  kw_defaults=[], defaults=[])
    function.name = KERNEL_NAME


def substitute_arguments(
    module: ast.Module,
    argument_names: Sequence[str],
    data_count: int,
    parameter_paths: Sequence[Sequence[object]],
) -> ast.Module:
    """Rebind the generated argument names *by position* to `x1`, `x2`, … and `ps[...]`.

    The function becomes `kernel(x1, …, ps)` (no `ps` without parameters); a parameter
    leaf `k` is read as its access path `ps["L1"]["W"]`.
    """
    function, targets = _argument_targets(module, argument_names, data_count, parameter_paths)
    rebind = _Rebind(targets)
    function.body = [rebind.visit(statement) for statement in function.body]
    _kernel_signature(function, data_count, bool(parameter_paths))
    return module


def _balanced(func: ast.expr, items: list[ast.expr]) -> ast.expr:
    while len(items) > 1:
        paired = [ast.Call(copy.deepcopy(func), [items[k], items[k + 1]], [])
                  for k in range(0, len(items) - 1, 2)]
        if len(items) % 2:
            paired.append(items[-1])
        items = paired
    return items[0]


class _Unfold(ast.NodeTransformer):
    def visit_Call(self, node: ast.Call) -> ast.expr:
        self.generic_visit(node)
        # only SymPy's own form, a bare `reduce`; any other spelling is left for
        # resolve_callees to report, since no table row matches it
        if isinstance(node.func, ast.Name) and node.func.id == "reduce":
            if (len(node.args) != 2 or node.keywords
                    or not isinstance(node.args[1], (ast.List, ast.Tuple))
                    or not node.args[1].elts):
                raise _drift("unfold_reductions", "reduce(function, [arguments, ...])",
                             ast.unparse(node))
            return _balanced(node.args[0], list(node.args[1].elts))
        return node


def unfold_reductions(module: ast.Module) -> ast.Module:
    """`reduce(maximum, [a, b, c])` (how Min/Max print) → `maximum(maximum(a, b), c)`.

    Pairwise, so the nesting depth grows with the logarithm of the number of arguments.
    """
    return _Unfold().visit(module)


def _local_names(function: ast.FunctionDef) -> set[str]:
    names = {arg.arg for arg in function.args.args}
    for statement in function.body:
        if isinstance(statement, ast.Assign):
            for target in statement.targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _resolved_call(node: ast.Call, callee: CalleeName,
                   user_functions: Mapping[str, str]) -> ast.Call:
    """`node`, its arguments and receiver already resolved, with its callee from the table."""
    rule = "resolve_callees"
    if callee.name in user_functions and callee.receiver is None:
        node.func = ast.Subscript(_load("functions"),
                                  ast.Constant(user_functions[callee.name]), ast.Load())
        return node
    row = CALLEE_TABLE.get(callee.name)
    if row is None:
        raise _drift(rule, "a callee in CALLEE_TABLE", f"{callee.name!r} in {ast.unparse(node)}")
    arguments = ([callee.receiver] if callee.receiver is not None else []) + node.args
    if row.arity is not None and len(arguments) != row.arity:
        raise _drift(rule, f"{callee.name}() with {row.arity} argument(s) "
                     f"(as printed for SymPy {', '.join(row.sympy)})", ast.unparse(node))
    return ast.Call(target_node(row.target), arguments, node.keywords)


def _resolved_name(node: ast.Name, local: set[str]) -> ast.expr:
    if node.id in CONSTANT_TABLE:
        return target_node(CONSTANT_TABLE[node.id])
    if node.id in local or node.id in NAMESPACE_ROOTS or DATA_NAME.match(node.id):
        return node
    raise _drift("resolve_callees", "only arguments, generated locals and printed constants as names",
                 repr(node.id))


def _attribute_drift(node: ast.Attribute) -> CodegenDriftError:
    return _drift("resolve_callees", "attributes only as callees", ast.unparse(node))


def resolve_callees(module: ast.Module, user_functions: Mapping[str, str]) -> ast.Module:
    """Rebind every callee, whatever form it was printed in, to the kernel namespace.

    All forms go through `callee_name`, then through one table (`CALLEE_TABLE`); printed
    constants (`pi`, `e`, `nan`) go to `jnp`; generated names of undefined functions go to
    `functions["name"]`. Anything else is drift, reported with the SymPy functions that
    print that way.
    """
    rule = "resolve_callees"
    function = kernel_function(module, rule)
    local = _local_names(function)

    class Resolve(ast.NodeTransformer):
        def visit_Call(self, node: ast.Call) -> ast.expr:
            # the callee itself is resolved here, not visited as a name
            node.args = [self.visit(argument) for argument in node.args]
            node.keywords = [self.visit(keyword) for keyword in node.keywords]
            callee = _callee(node.func, rule)
            if callee.receiver is not None:
                callee = type(callee)(callee.name, self.visit(callee.receiver))
            return _resolved_call(node, callee, user_functions)

        def visit_Name(self, node: ast.Name) -> ast.expr:
            return _resolved_name(node, local)

        def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
            raise _attribute_drift(node)

    function.body = [Resolve().visit(statement) for statement in function.body]
    return module


def _integer_exponent(node: ast.expr) -> int | None:
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        sign, node = -1, node.operand
    if (isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool) and float(node.value).is_integer()):
        return sign * int(node.value)
    return None


def _float_if_integer_literal(node: ast.expr) -> ast.expr:
    """`2` → `2.0`, `-3` → `-3.0`; any other node as it is."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return ast.Constant(float(node.value))
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant) and type(node.operand.value) is int):
        return ast.UnaryOp(ast.USub(), ast.Constant(float(node.operand.value)))
    return node


def use_integer_pow(module: ast.Module) -> ast.Module:
    """`a**2`, `a**(-1.0)` → `lax.integer_pow(a, 2)`, `lax.integer_pow(a, -1)`.

    SymPy prints negative integer powers with a float exponent; `integer_pow` lowers to
    multiplications instead of a `pow` call and differentiates without a `log`. An integer
    literal base (`Pow(2, -1, evaluate=False)` prints `2**(-1.0)`) becomes a float literal:
    `integer_pow` of an integer is an integer, and refuses a negative exponent.
    """

    class IntegerPow(ast.NodeTransformer):
        def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
            self.generic_visit(node)
            return _integer_pow(node)

    return IntegerPow().visit(module)


def _integer_pow(node: ast.BinOp) -> ast.expr:
    if isinstance(node.op, ast.Pow):
        exponent = _integer_exponent(node.right)
        if exponent is not None:
            return ast.Call(target_node("lax.integer_pow"),
                            [_float_if_integer_literal(node.left), ast.Constant(exponent)], [])
    return node


def _constant_indices(index: ast.expr) -> tuple[int, ...] | None:
    elements = index.elts if isinstance(index, ast.Tuple) else [index]
    values = []
    for element in elements:
        if not (isinstance(element, ast.Constant) and type(element.value) is int):
            return None
        values.append(element.value)
    return tuple(values)


def _batched(name: str, indices: tuple[int, ...]) -> ast.Subscript:
    elements: list[ast.expr] = [ast.Constant(Ellipsis)]
    elements += [ast.Constant(i) for i in indices]
    return ast.Subscript(_load(name), ast.Tuple(elements, ast.Load()), ast.Load())


def _batch_indices(node: ast.Subscript, name: str, rank: int) -> tuple[int, ...]:
    """The per-sample indices of a read `name[i]` / `name[i, j]` of a data argument."""
    indices = _constant_indices(node.slice)
    if rank == 1 and indices is not None and len(indices) == 2 and indices[1] == 0:
        indices = indices[:1]
    if rank == 0 or indices is None or len(indices) != rank:
        raise _drift("index_by_batch", f"{name} read one entry at a time as {name}[i"
                     f"{', j' if rank == 2 else ''}]", ast.unparse(node))
    return indices


def _whole_array_drift(name: str) -> CodegenDriftError:
    return _drift("index_by_batch", f"{name} read one entry at a time",
                  f"the whole array {name} used")


def index_by_batch(module: ast.Module, data_ranks: Mapping[str, int]) -> ast.Module:
    """`x1[i]`, `x1[i, 0]` → `x1[..., i]`; `x2[i, j]` → `x2[..., i, j]` for matrix data.

    The batch dimension leads. Any other use of a vector or matrix data argument (the whole
    array, a slice, a computed index) is rejected: the batch dimension would silently be
    ignored for it. A scalar data argument is read whole.
    """

    class Index(ast.NodeTransformer):
        def visit_Subscript(self, node: ast.Subscript) -> ast.expr:
            if isinstance(node.value, ast.Name) and node.value.id in data_ranks:
                name = node.value.id
                return _batched(name, _batch_indices(node, name, data_ranks[name]))
            self.generic_visit(node)
            return node

        def visit_Name(self, node: ast.Name) -> ast.expr:
            if data_ranks.get(node.id, 0) > 0:
                raise _whole_array_drift(node.id)
            return node

    return Index().visit(module)


def _batched_read(node: ast.AST) -> tuple[int, tuple] | None:
    """`x2[..., 1, 0]` → (2, (1, 0)); anything else → None."""
    if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
            and DATA_NAME.match(node.value.id) and isinstance(node.slice, ast.Tuple)
            and node.slice.elts and isinstance(node.slice.elts[0], ast.Constant)
            and node.slice.elts[0].value is Ellipsis
            and all(isinstance(e, ast.Constant) for e in node.slice.elts[1:])):
        return int(node.value.id[1:]), tuple(e.value for e in node.slice.elts[1:])
    return None


def hoist_data_reads(module: ast.Module) -> ast.Module:
    """Each distinct batched read `x1[..., i]` → one local `_dK = x1[..., i]` at the top.

    The printer re-indexes a data argument at every use; each index is a traced slice
    (about 0.5 ms of tracing apiece at scale) and a separate HLO op. Reading each entry
    once measured 25-30% less trace, lower and compile time at 3,000 operations. The
    locals are numbered in argument and index order, so the source reads top-down.
    """
    rule = "hoist_data_reads"
    function = kernel_function(module, rule)
    found = {}
    for node in ast.walk(function):
        read = _batched_read(node)
        if read is not None:
            found.setdefault(read, node)
    names = {read: f"_d{k}" for k, read in enumerate(sorted(found))}

    class Hoist(ast.NodeTransformer):
        def visit_Subscript(self, node: ast.Subscript) -> ast.expr:
            read = _batched_read(node)
            if read is not None:
                return _load(names[read])
            self.generic_visit(node)
            return node

    body = [Hoist().visit(statement) for statement in function.body]
    function.body = [_located(ast.Assign([ast.Name(names[read], ast.Store())],
                                         copy.deepcopy(found[read])))
                     for read in sorted(found)] + body
    return module


def _is_leaf_read(node: ast.expr) -> bool:
    """A read of an input value: a data entry, a parameter entry or a generated local."""
    if isinstance(node, ast.Name):
        return bool(DATA_NAME.match(node.id) or VALUE_NAME.match(node.id))
    if isinstance(node, ast.Subscript):
        root = node
        while isinstance(root, ast.Subscript):
            root = root.value
        return isinstance(root, ast.Name) and (root.id == "ps" or bool(DATA_NAME.match(root.id)))
    return False


class _Gate(ast.NodeTransformer):
    def __init__(self, taken: ast.expr) -> None:
        self.taken = taken

    def visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.expr) and _is_leaf_read(node):
            return ast.Call(_load("gate"), [copy.deepcopy(self.taken), node], [])
        return super().visit(node)


def _guarded_select(node: ast.Call, branches: Iterator[int], prelude: list[ast.stmt]) -> ast.expr:
    """A select whose conditions and choices are already guarded, with its branch index
    `_b<next(branches)>` appended to `prelude` and every input read of its choices gated."""
    rule = "guard_piecewise_gradients"
    if _callee(node.func, rule).name != "select":
        return node
    if (len(node.args) != 2 or not all(isinstance(a, ast.List) for a in node.args)
            or len(node.args[0].elts) != len(node.args[1].elts)):
        raise _drift(rule, "select([conditions], [choices], default=...)", ast.unparse(node))
    conditions, choices = node.args[0].elts, node.args[1].elts
    if not any(_is_leaf_read(n) for c in choices for n in ast.walk(c)):
        return node
    branch = f"_b{next(branches)}"
    prelude.append(_located(ast.Assign(
        [ast.Name(branch, ast.Store())],
        ast.Call(copy.deepcopy(node.func),
                 [ast.List(conditions, ast.Load()),
                  ast.List([ast.Constant(k) for k in range(len(choices))], ast.Load())],
                 [ast.keyword("default", ast.Constant(-1))]),
    )))
    taken = [ast.Compare(_load(branch), [ast.Eq()], [ast.Constant(k)])
             for k in range(len(choices))]
    gated = [_Gate(taken[k]).visit(choice) for k, choice in enumerate(choices)]
    return ast.Call(node.func, [ast.List(copy.deepcopy(taken), ast.Load()),
                                ast.List(gated, ast.Load())], node.keywords)


def guard_piecewise_gradients(module: ast.Module) -> ast.Module:
    """Make Piecewise gradient-safe: inputs of each branch go through `gate(taken, ·)`.

    `jnp.select(conditions, choices)` becomes a branch index `_bK` computed once from the
    conditions, a select on that index, and choices whose every input read is gated by
    `_bK == k`: an untaken branch then contributes an exact zero, never a NaN, to a gradient.
    """
    function = kernel_function(module, "guard_piecewise_gradients")
    branches = iter(range(1 << 30))
    new_body: list[ast.stmt] = []

    class Guard(ast.NodeTransformer):
        def __init__(self) -> None:
            self.prelude: list[ast.stmt] = []

        def visit_Call(self, node: ast.Call) -> ast.expr:
            self.generic_visit(node)
            return _guarded_select(node, branches, self.prelude)

    for statement in function.body:
        guard = Guard()
        statement = guard.visit(statement)
        new_body.extend(guard.prelude)
        new_body.append(statement)
    function.body = new_body
    return module


def _nested_entries(node: ast.expr, shape: Sequence[int], rule: str) -> list[ast.expr]:
    if not shape:
        return [node]
    if not isinstance(node, ast.List) or len(node.elts) != shape[0]:
        raise _drift(rule, f"a nested list of {shape[0]} entries", ast.unparse(node)[:200])
    entries: list[ast.expr] = []
    for element in node.elts:
        entries.extend(_nested_entries(element, shape[1:], rule))
    return entries


def stack_outputs(module: ast.Module, printed_shapes: Sequence[Sequence[int]]) -> ast.Module:
    """The printer's return (a tuple with one array constructor per array equation) → one
    flat tuple of scalar entries, row-major, each with the batch shape.

    Assembling them into `(..., m, n)` arrays is left to the caller, outside the fused
    body: a stack inside it measured 100× slower (ANCHORS.md).
    """
    rule = "stack_outputs"
    function = kernel_function(module, rule)
    returned = return_statement(function, rule)
    if not isinstance(returned.value, ast.Tuple) or len(returned.value.elts) != len(printed_shapes):
        raise _drift(rule, f"a tuple of {len(printed_shapes)} outputs", ast.unparse(returned.value)[:200])
    entries: list[ast.expr] = []
    for value, shape in zip(returned.value.elts, printed_shapes, strict=True):
        if not shape:
            entries.append(value)
            continue
        if not (isinstance(value, ast.Call) and _callee(value.func, rule).name == "array"
                and len(value.args) == 1 and not value.keywords):
            raise _drift(rule, "array([...]) around an array equation", ast.unparse(value)[:200])
        entries.extend(_nested_entries(value.args[0], shape, rule))
    returned.value = ast.Tuple(entries, ast.Load())
    return module


def _reads_data(node: ast.AST, data_locals: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and (DATA_NAME.match(n.id) or n.id in data_locals)
               for n in ast.walk(node))


def broadcast_constant_outputs(module: ast.Module, data_ranks: Sequence[int],
                               leaf_sizes: Sequence[int] = (),
                               unbatched: list[bool] | None = None) -> ast.Module:
    """An output that reads no data argument → `jnp.broadcast_to(value, <batch shape>)`.

    SymPy prints `x/x` as `1`: without this, a batch would come back as one number. The
    batch shape is read off `x1` (its shape less the per-sample dimensions).

    With `unbatched` (a list, `constant_outputs="unbatched"`), the entries of an equation
    none of whose `leaf_sizes[k]` entries reads data stay as they are, and `unbatched`
    receives one flag per equation: whether it was left so.
    """
    rule = "broadcast_constant_outputs"
    function = kernel_function(module, rule)
    returned = return_statement(function, rule)
    if not data_ranks:
        return module
    if not isinstance(returned.value, ast.Tuple):
        raise _drift(rule, "a flat tuple of outputs (stack_outputs first)", ast.unparse(returned))
    data_locals: set[str] = set()
    for statement in function.body[:-1]:
        if isinstance(statement, ast.Assign) and _reads_data(statement.value, data_locals):
            data_locals.update(n.id for t in statement.targets for n in ast.walk(t)
                               if isinstance(n, ast.Name))
    _broadcast_entries(returned.value, data_ranks, data_locals, leaf_sizes, unbatched)
    return module


def _broadcast_entries(returned: ast.Tuple, data_ranks: Sequence[int], data_locals: set[str],
                       leaf_sizes: Sequence[int] = (),
                       unbatched: list[bool] | None = None) -> None:
    shape: ast.expr = ast.Attribute(_load("x1"), "shape", ast.Load())
    if data_ranks[0]:
        shape = ast.Subscript(shape, ast.Slice(None, ast.Constant(-data_ranks[0]), None),
                              ast.Load())
    reads = [_reads_data(value, data_locals) for value in returned.elts]
    kept = [False] * len(reads)
    if unbatched is not None:
        if sum(leaf_sizes) != len(reads):
            raise _drift("broadcast_constant_outputs", f"{sum(leaf_sizes)} output entries",
                         f"{len(reads)}")
        start = 0
        for size in leaf_sizes:
            leaf = not any(reads[start:start + size])
            unbatched.append(leaf)
            kept[start:start + size] = [leaf] * size
            start += size
    returned.elts = [
        value if read or keep
        else ast.Call(target_node("jnp.broadcast_to"), [value, copy.deepcopy(shape)], [])
        for value, read, keep in zip(returned.elts, reads, kept, strict=True)
    ]


@dataclass(frozen=True)
class HoistedLiteral:
    """An array literal taken out of the code: its const-arg name, value and where it was."""

    name: str
    value: np.ndarray
    used_by: tuple[int, ...]
    #: what put it there, for `kernel.const_args`
    origin: str = "array literal (hoist_array_literals)"


def returned_tuple(outputs: Sequence[int | ast.expr], computed: str) -> str:
    """The return statement's tuple of a rewritten body: an int output is the next entry of
    the array `computed` (`_O[k]`), any other output its own expression."""
    returns, k = [], 0
    for output in outputs:
        if isinstance(output, int):
            returns.append(f"{computed}[{k}]")
            k += 1
        else:
            returns.append(ast.unparse(output))
    return f"({', '.join(returns)},)"


def literal_value(node: ast.expr) -> object | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = literal_value(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        # SymPy prints rationals as `1/3`
        left, right = literal_value(node.left), literal_value(node.right)
        return None if left is None or right is None else left / right
    if isinstance(node, (ast.List, ast.Tuple)):
        values = [literal_value(element) for element in node.elts]
        return None if any(v is None for v in values) else values
    return None


def output_dependencies(function: ast.FunctionDef, names: set[str]) -> dict[str, set[int]]:
    """For each name in `names`: the flat output positions whose value reads it."""
    reads: dict[str, set[str]] = {}
    for statement in function.body[:-1]:
        if isinstance(statement, ast.Assign):
            read = {n.id for n in ast.walk(statement.value) if isinstance(n, ast.Name)}
            for target in statement.targets:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        reads[n.id] = read
    returned = function.body[-1].value
    outputs = returned.elts if isinstance(returned, ast.Tuple) else [returned]
    found: dict[str, set[int]] = {name: set() for name in names}
    for position, output in enumerate(outputs):
        pending = [n.id for n in ast.walk(output) if isinstance(n, ast.Name)]
        seen: set[str] = set()
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in found:
                found[name].add(position)
            pending.extend(reads.get(name, ()))
    return found


def hoist_array_literals(
    module: ast.Module,
    embed_max_bytes: int,
    dtype: np.dtype,
    hoisted: list[HoistedLiteral],
) -> ast.Module:
    """Array literals larger than `embed_max_bytes` → const args `_k0, _k1, …`.

    Numeric `Matrix`/`Array` pieces and tables printed as `array([...])` leave the code and
    become leading parameters of the kernel, so the compiled program never embeds them
    (its size and compile time do not grow with theirs). Scalars and arrays of at most
    `embed_max_bytes` stay in the code, where XLA can fold them. The same literal used
    twice is one const arg. The values are appended to `hoisted`, in signature order.
    """
    function = kernel_function(module, "hoist_array_literals")
    _hoist_literals(function, range(len(function.body)), embed_max_bytes, dtype, hoisted)
    return module


def _hoist_literals(function: ast.FunctionDef, where: Iterable[int], embed_max_bytes: int,
                    dtype: np.dtype, hoisted: list[HoistedLiteral]) -> None:
    """hoist_array_literals on the statements at the positions `where` (in order): the
    others hold no array constructor."""
    rule = "hoist_array_literals"
    by_content: dict[tuple, str] = {}
    values: dict[str, np.ndarray] = {}

    class Hoist(ast.NodeTransformer):
        def visit_Call(self, node: ast.Call) -> ast.expr:
            self.generic_visit(node)
            if _callee(node.func, rule).name != "array" or len(node.args) != 1:
                return node
            literal = literal_value(node.args[0])
            if literal is None:
                return node
            value = np.asarray(literal, dtype=dtype)
            if value.ndim == 0 or value.nbytes <= embed_max_bytes:
                return node
            key = (value.shape, value.tobytes())
            if key not in by_content:
                name = f"_k{len(hoisted) + len(by_content)}"
                by_content[key] = name
                values[name] = value
            return _load(by_content[key])

    hoist = Hoist()
    for position in where:
        function.body[position] = hoist.visit(function.body[position])
    if not by_content:
        return
    dependencies = output_dependencies(function, set(values))
    for name, value in values.items():
        hoisted.append(HoistedLiteral(name, value, tuple(sorted(dependencies[name]))))
    function.args.args = [ast.arg(name) for name in values] + function.args.args


# ---- the whole sequence in one walk ------------------------------------------------------

#: the node types the walk passes through without looking inside (operators, contexts)
_PASSED_THROUGH = (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)


class _OneWalk:
    """The rules from substitute_arguments to hoist_data_reads and guard_piecewise_gradients,
    node by node, in one walk: each node is rewritten once its children are, by each rule in
    order, as the rules run one after the other over the whole tree (every rule a walk of
    its own was most of a 10^5-operation build's rewrite stage). Where the rules see a node
    in another order, the walk follows them: a `reduce` is unfolded before its arguments are
    resolved, a callee is resolved whole, a read of a data argument is indexed without
    looking at the argument as a name."""

    def __init__(self, targets: Mapping[str, tuple[object, ...] | str], local: set[str],
                 user_functions: Mapping[str, str], data_ranks: Mapping[str, int]) -> None:
        self.targets, self.local = targets, local
        self.user_functions, self.data_ranks = user_functions, data_ranks
        self.rebind = _Rebind(targets)
        self.rebound = False  # inside a reduce that substitute_arguments already rewrote
        self.branches = iter(range(1 << 30))
        self.reads: dict[tuple, ast.expr] = {}  # hoist_data_reads: each read's first node
        self.read_names: list[tuple[tuple, ast.Name]] = []
        # per statement: the prelude of branch indices, the names it reads, whether it
        # reads a hoisted data read, whether it calls an array constructor
        self.prelude: list[ast.stmt] = []
        self.names: set[str] = set()
        self.reads_data = False
        self.arrays = False

    def statement(self, node: ast.stmt) -> ast.stmt:
        self.prelude, self.names, self.reads_data, self.arrays = [], set(), False, False
        return self.generic(node)

    def expr(self, node: ast.AST) -> ast.AST:
        kind = type(node)
        if kind is ast.Name:
            return self.name(node)
        if kind is ast.Constant:
            return node
        if kind is ast.BinOp:
            node.left = self.expr(node.left)
            node.right = self.expr(node.right)
            return _integer_pow(node)
        if kind is ast.Call:
            return self.call(node)
        if kind is ast.Subscript:
            return self.subscript(node)
        if kind is ast.UnaryOp:
            node.operand = self.expr(node.operand)
            return node
        if kind is ast.Attribute:
            raise _attribute_drift(node if self.rebound else self.rebind.visit(node))
        return self.generic(node)

    def generic(self, node: ast.AST) -> ast.AST:
        for field_name in node._fields:
            value = getattr(node, field_name, None)
            if isinstance(value, list):
                value[:] = [self.expr(item) if isinstance(item, ast.AST)
                            and not isinstance(item, _PASSED_THROUGH) else item for item in value]
            elif isinstance(value, ast.AST) and not isinstance(value, _PASSED_THROUGH):
                setattr(node, field_name, self.expr(value))
        return node

    def name(self, node: ast.Name) -> ast.expr:
        if not self.rebound and node.id in self.targets:
            rebound = _rebound_argument(node, self.targets)
            if not isinstance(rebound, ast.Name):
                return rebound  # a parameter's path: `ps` and its keys, read as they are
            node = rebound
        resolved = _resolved_name(node, self.local)
        if resolved is node:
            if self.data_ranks.get(node.id, 0) > 0:
                raise _whole_array_drift(node.id)
            if isinstance(node.ctx, ast.Load):
                self.names.add(node.id)
        return resolved

    def subscript(self, node: ast.Subscript) -> ast.expr:
        value = node.value
        if isinstance(value, ast.Name):
            if not self.rebound and value.id in self.targets:
                value = _rebound_argument(value, self.targets)
            if isinstance(value, ast.Name) and value.id in self.data_ranks:
                if not _constant_indices(node.slice):
                    node.slice = self.expr(node.slice)
                node.value = value
                name = value.id
                batched = _batched(name, _batch_indices(node, name, self.data_ranks[name]))
                return self.hoisted_read(batched)
            node.value = value if not isinstance(value, ast.Name) else self.name(value)
        else:
            node.value = self.expr(value)
        node.slice = self.expr(node.slice)
        read = _batched_read(node)
        return node if read is None else self.hoisted_read(node)

    def hoisted_read(self, node: ast.Subscript) -> ast.Name:
        read = _batched_read(node)
        self.reads.setdefault(read, node)
        local = _load(f"_d{len(self.read_names)}")  # renamed in index order at the end
        self.read_names.append((read, local))
        self.reads_data = True
        return local

    def call(self, node: ast.Call) -> ast.expr:
        if not self.rebound and isinstance(node.func, ast.Name) and node.func.id == "reduce":
            # substitute_arguments and unfold_reductions run before resolve_callees looks
            # at the reduced function, an argument
            unfolded = _Unfold().visit(self.rebind.visit(node))
            self.rebound = True
            try:
                return self.expr(unfolded)
            finally:
                self.rebound = False
        node.args = [self.expr(argument) for argument in node.args]
        node.keywords = [self.generic(keyword) for keyword in node.keywords]
        callee = _callee(node.func, "resolve_callees")  # a receiver is rebound below
        if callee.receiver is not None:
            callee = CalleeName(callee.name, self.expr(callee.receiver))
        resolved = _resolved_call(node, callee, self.user_functions)
        if _callee(resolved.func, "hoist_array_literals").name == "array":
            self.arrays = True
        return _guarded_select(resolved, self.branches, self.prelude)


def apply_rules(
    module: ast.Module,
    *,
    argument_names: Sequence[str],
    data_count: int,
    parameter_paths: Sequence[Sequence[object]],
    user_functions: Mapping[str, str],
    data_ranks: Mapping[str, int],
    printed_shapes: Sequence[Sequence[int]],
    embed_max_bytes: int,
    dtype: np.dtype,
    hoisted: list[HoistedLiteral],
    unbatched: list[bool] | None = None,
) -> ast.Module:
    """Every rule, in the order of `symkern.codegen.pipeline.rule_sequence`, with one walk of
    the tree: the same tree, const args and errors as the rules one after the other, except
    that where a tree drifted in more than one way, the drift reported is the first in the
    tree rather than the one of the earliest rule. `unbatched`: broadcast_constant_outputs'.
    """
    function, targets = _argument_targets(module, argument_names, data_count, parameter_paths)
    _kernel_signature(function, data_count, bool(parameter_paths))
    walk = _OneWalk(targets, _local_names(function), user_functions, data_ranks)
    body: list[ast.stmt] = []
    reads: dict[int, tuple[set[str], bool]] = {}  # id(statement) -> (names, reads data)
    arrays: list[ast.stmt] = []
    for statement in function.body:
        rewritten = walk.statement(statement)
        body.extend(walk.prelude)
        body.append(rewritten)
        reads[id(rewritten)] = walk.names, walk.reads_data
        if walk.arrays:
            arrays.extend([*walk.prelude, rewritten])
    names = {read: f"_d{k}" for k, read in enumerate(sorted(walk.reads))}
    for read, local in walk.read_names:
        local.id = names[read]
    function.body = [_located(ast.Assign([ast.Name(names[read], ast.Store())],
                                         copy.deepcopy(walk.reads[read])))
                     for read in sorted(walk.reads)] + body
    stack_outputs(module, printed_shapes)
    ranks = list(data_ranks.values())
    if ranks:
        data_locals = set(names.values())
        for statement in function.body[len(names):-1]:
            if not isinstance(statement, ast.Assign):
                continue
            found = reads.get(id(statement))
            if found is None:  # a branch index: read as written
                data = _reads_data(statement.value, data_locals)
            else:
                data = found[1] or any(DATA_NAME.match(n) or n in data_locals for n in found[0])
            if data:
                data_locals.update(n.id for t in statement.targets for n in ast.walk(t)
                                   if isinstance(n, ast.Name))
        _broadcast_entries(function.body[-1].value, ranks, data_locals,  # type: ignore[attr-defined]
                           [math.prod(shape) for shape in printed_shapes], unbatched)
    if arrays:
        where = {id(statement) for statement in arrays}
        _hoist_literals(function, [k for k, s in enumerate(function.body) if id(s) in where],
                        embed_max_bytes, dtype, hoisted)
    return module
