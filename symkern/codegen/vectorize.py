"""codegen, stage 2 (huge bodies): statements that repeat one template evaluated as vectors.

Imports ast, numpy, symkern.codegen.operations and symkern.codegen.rules. XLA's CPU
compile costs about a millisecond per scalar operation (docs/design/pieces.md), so a
10^5-operation body takes half a minute to compile however it is cut. But
big expressions repeat themselves: `sum_i p_a(i) * sin(p_b(i) * x_j(i) + x_k(i)) * ...` is
one template applied thousands of times to different inputs. This rule rewrites a
rewritten kernel body into one gather and one elementwise expression per (level, template):

- every value a statement computes is a row of one store `_R` (`(rows, *batch)`, batch
  last); data reads are the first rows, after a row of zeros and a row of ones;
- parameter-only values (parameters, constants, anything that reads no data) are entries
  of one vector `_S`, computed once per call, not per sample;
- a statement's template is its expression with every row read and every scalar replaced
  by a slot; sums and products are flattened and their terms grouped by template, so a
  sum of 312 terms of one shape is one reduction over a gathered `(members, 312)` block;
- a statement used once is inlined into its user's template (the CSE of the emitter names
  every term; materializing each would write every term to memory);
- statements whose inputs are all at lower levels and that share a template form one
  group: one line of code, their row and scalar indices const args `_v0, _v1, …`;
- the outputs all join the last level, and sums (products) at one level merge over the
  union of their operands' templates, so groups are wide;
- a reduction over more than SCAN_ABOVE operands is a loop (`vec.scan_reduce`);
- the levels run over `vec.CHUNK` samples at a time (`vec.chunked`), so the store stays in
  cache.

The result is the same function (same arguments, same outputs tuple), with far fewer
operations for XLA. `vectorize` returns None when a body does not shrink enough (every
statement its own template, much parameter-only code, many outputs) or holds a form it
does not know, and the kernel keeps its scalar body.
"""

from __future__ import annotations

import ast
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from symkern.codegen.callee import VECTORIZABLE_TARGETS, dotted_name
from symkern.codegen.operations import count_and_reads, operation_count, read_counts
from symkern.codegen.rules import (
    DATA_NAME,
    HoistedLiteral,
    kernel_function,
    literal_value,
    return_statement,
    returned_tuple,
)

ROW = ("r",)
SCALAR = ("s",)
#: rows 0 and 1 of the store, entries 0 and 1 of the scalars: the pads of sums and products
ZERO, ONE = 0, 1
#: elementwise calls a template may hold (all arguments per-sample or scalar values): the
#: callee table's vectorizable rows, and the calls the rules write themselves
ELEMENTWISE = VECTORIZABLE_TARGETS | {
    "jnp.cbrt", "jnp.power", "jnp.square", "jnp.reciprocal", "lax.integer_pow", "jsp.digamma",
    "jsp.expit"}
BINARY = {ast.Div: "/", ast.Pow: "**", ast.Mod: "%", ast.FloorDiv: "//"}
#: a statement used once is inlined into its user at most this many times over
INLINE_DEPTH = 3
#: sums and products over more instances than this run as a loop (`vec.scan_reduce`)
SCAN_ABOVE = 8


def _head(key: tuple) -> Any:
    """What groups merge by: sums (products) of any operands are one template."""
    return key[0] if key[0] in ("sum", "prod") else key


class _Unsupported(Exception):
    """A per-sample form the rule does not know: the kernel keeps its scalar body."""


class _Declined(Exception):
    """More groups than the body's operations allow: it cannot shrink enough."""


@dataclass
class VectorizedBody:
    """What `vectorize` found: the groups it emits and the operations they replace."""

    groups: int
    template_nodes: int
    rows: int
    levels: int



def _chain(node: ast.expr, ops: tuple[type, ...],
           names: Mapping[str, tuple[str, Any]]) -> list[tuple[ast.expr, bool]]:
    """Operands of a `+`/`-` (or `*`) chain with their signs, without recursion; through
    the statements inlined here (the emitter cuts long sums into statements)."""
    out: list[tuple[ast.expr, bool]] = []
    stack = [(node, False)]
    while stack:
        current, negative = stack.pop()
        if isinstance(current, ast.Name) and names.get(current.id, ("",))[0] == "inline":
            expanded = names[current.id][1]
            if isinstance(expanded, ast.BinOp) and isinstance(expanded.op, ops):
                current = expanded
        if isinstance(current, ast.BinOp) and isinstance(current.op, ops):
            stack.append((current.right, negative ^ isinstance(current.op, ast.Sub)))
            stack.append((current.left, negative))
        elif (ast.Sub in ops and isinstance(current, ast.UnaryOp)
              and isinstance(current.op, ast.USub)):
            stack.append((current.operand, not negative))
        else:
            out.append((current, negative))
    return out


class _Builder:
    """Templates of a body's statements, their levels and their groups."""

    def __init__(self, uses: dict[str, int], data_names: set[str],
                 parameter_shapes: Mapping[str, tuple[int, ...]],
                 max_groups: float = math.inf) -> None:
        self.uses = uses
        self.data_names = data_names
        self.parameter_shapes = parameter_shapes
        #: parameter arrays whose entries are scalars of the body: read whole, raveled
        self.arrays: dict[str, int] = {}
        self.level: list[int] = []               # provisional row id -> level
        self.sources: list[ast.expr] = []        # level-0 rows: their expression
        self.source_ids: dict[str, int] = {}
        self.scalars: list[ast.expr] = []
        self.scalar_ids: dict[str, int] = {}
        self.names: dict[str, tuple[str, Any]] = {}   # local -> (kind, value)
        self.inline_depth: dict[str, int] = {}
        #: (template, instance, row, level) of every computed row, outputs last
        self.members: list[tuple[tuple, Any, int, int]] = []
        self.outputs: set[int] = set()
        #: every group costs at least one operation: past this many, stop (a nest 10^4 deep
        #: is 10^4 groups of one; building them all took 3 s of a 22 s build)
        self.max_groups = max_groups
        self.heads: set[tuple[int, Any]] = set()
        self.ranks: dict[tuple, int] = {}

    def order(self, key: tuple) -> int:
        """A template's rank in first-seen order: operands of sums and products, and groups,
        are sorted by it (deterministic, unlike hashes; `repr` of nested templates made a
        10^4-deep nest quadratic)."""
        return self.ranks.setdefault(key, len(self.ranks))

    # -- leaves --------------------------------------------------------------------------
    def _data_row(self, node: ast.expr) -> int:
        text = ast.dump(node)
        if text not in self.source_ids:
            self.source_ids[text] = self._new_row(0)
            self.sources.append(node)
        return self.source_ids[text]

    def _new_row(self, level: int) -> int:
        self.level.append(level)
        return len(self.level) - 1

    def scalar_id(self, node: ast.expr) -> int | tuple[int, int]:
        """A plain scalar's entry, or (array, flat offset) for an entry of a parameter
        array: the table then holds the array raveled, not one read per entry (1,400
        separate reads of a 8-32-32-8 net's weights took 18 s of XLA compile)."""
        entry = self._array_entry(node)
        if entry is not None:
            return entry
        text = node.id if isinstance(node, ast.Name) else ast.dump(node)
        if text not in self.scalar_ids:
            self.scalar_ids[text] = len(self.scalars) + 2
            self.scalars.append(node)
        return self.scalar_ids[text]

    def _array_entry(self, node: ast.expr) -> tuple[int, int] | None:
        if not isinstance(node, ast.Subscript):
            return None
        shape = self.parameter_shapes.get(ast.unparse(node.value))
        index = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if shape is None or len(index) != len(shape) or not all(
                isinstance(i, ast.Constant) and type(i.value) is int for i in index):
            return None
        where = tuple(i.value for i in index)
        if not all(0 <= i < n for i, n in zip(where, shape, strict=True)):
            return None
        array = self.arrays.setdefault(ast.unparse(node.value), len(self.arrays))
        return array, int(np.ravel_multi_index(where, shape))

    def reads_rows(self, node: ast.expr, reads: set[str] | None = None) -> bool:
        """Whether `node` reads a row (`reads`: the names it reads, when known)."""
        reads = count_and_reads(node)[1] if reads is None else reads
        return any(name in self.data_names or self.names.get(name, ("scalar",))[0] != "scalar"
                   for name in reads)

    # -- templates -----------------------------------------------------------------------
    def build(self, node: ast.expr) -> tuple[tuple, Any, int]:
        """(template, instance, highest level read); scalars come back as (SCALAR, node, -1)."""
        if isinstance(node, ast.Name):
            kind, value = self.names.get(node.id, ("data" if node.id in self.data_names
                                                   else "scalar", None))
            if kind == "row":
                return ROW, value, self.level[value]
            if kind == "inline":
                return self.build(value)
            if kind == "data":
                row = self._data_row(node)
                return ROW, row, 0
            return SCALAR, node, -1
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                and node.value.id in self.data_names:
            return ROW, self._data_row(node), 0
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            return self._reduction("sum", node, _chain(node, (ast.Add, ast.Sub), self.names))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return self._reduction("prod", node, _chain(node, (ast.Mult,), self.names))
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            return self._fixed(("bin", BINARY[type(node.op)]), node, [node.left, node.right])
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return self._fixed(("neg",), node, [node.operand])
        if isinstance(node, ast.Call) and not node.keywords:
            name = dotted_name(node.func)
            if name == "lax.integer_pow" and len(node.args) == 2 \
                    and isinstance(node.args[1], ast.Constant):
                return self._fixed(("ipow", node.args[1].value), node, [node.args[0]])
            if name in ELEMENTWISE:
                return self._fixed(("call", name), node, list(node.args))
        if self.reads_rows(node):
            raise _Unsupported(ast.unparse(node)[:200])
        return SCALAR, node, -1

    def _leaf_instance(self, key: tuple, instance: Any) -> Any:
        return self.scalar_id(instance) if key == SCALAR else instance

    def _fixed(self, head: tuple, node: ast.expr, operands: list[ast.expr]) -> tuple:
        built = [self.build(operand) for operand in operands]
        if all(key == SCALAR for key, _, _ in built):
            return SCALAR, node, -1
        keys = tuple(key for key, _, _ in built)
        instances = tuple(self._leaf_instance(key, inst) for key, inst, _ in built)
        level = max(lvl for _, _, lvl in built)
        if head[0] == "call":
            return (*head, keys), instances, level
        if head[0] == "bin":
            return (*head, *keys), instances, level
        return (*head, keys[0]), instances[0], level

    def _reduction(self, kind: str, node: ast.expr,
                   operands: list[tuple[ast.expr, bool]]) -> tuple:
        built = []
        for operand, negative in operands:
            key, instance, level = self.build(operand)
            if negative and key == SCALAR:
                instance = ast.UnaryOp(ast.USub(), instance)
            elif negative:
                key = ("neg", key)
            built.append((key, instance, level))
        if all(key == SCALAR for key, _, _ in built):
            return SCALAR, node, -1
        components: dict[tuple, list] = defaultdict(list)
        for key, instance, _ in built:
            components[key].append(self._leaf_instance(key, instance))
        keys = tuple(sorted(components, key=self.order))
        return ((kind, keys), tuple(components[key] for key in keys),
                max(lvl for _, _, lvl in built))

    # -- statements ----------------------------------------------------------------------
    def assign(self, name: str, value: ast.expr) -> ast.stmt | None:
        """Record `name = value`; returns the statement when it stays scalar code."""
        if isinstance(value, ast.Name) and value.id in self.names:
            self.names[name] = self.names[value.id]
            return None
        if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) \
                and value.value.id in self.data_names:
            self.names[name] = ("row", self._data_row(ast.Name(name, ast.Load())))
            return ast.Assign([ast.Name(name, ast.Store())], value)
        reads = count_and_reads(value)[1]  # one walk of the statement for both questions
        if not self.reads_rows(value, reads):
            self.names[name] = ("scalar", None)
            return ast.Assign([ast.Name(name, ast.Store())], value)
        depth = 1 + max((self.inline_depth.get(read, 0) for read in reads), default=0)
        if self.uses.get(name, 0) == 1 and depth <= INLINE_DEPTH:
            self.names[name] = ("inline", value)
            self.inline_depth[name] = depth
            return None
        self.names[name] = ("row", self.member(value))
        return None

    def member(self, value: ast.expr, output: bool = False) -> int:
        """The row holding `value`, computed by its (level, template) group."""
        key, instance, level = self.build(value)
        if key == ROW:
            return instance
        if key == SCALAR:
            raise _Unsupported("a scalar where a row was expected")  # guarded by reads_rows
        row = self._new_row(level + 1)
        self.members.append((key, instance, row, level + 1))
        self.heads.add((level + 1, _head(key)))
        if len(self.heads) > self.max_groups:
            raise _Declined
        if output:
            self.outputs.add(row)
        return row

    def _merged(self) -> dict[tuple[int, Any], list[tuple[tuple, Any, int]]]:
        last = max((level for _, _, row, level in self.members if row in self.outputs),
                   default=0)
        merged: dict[tuple[int, Any], list[tuple[tuple, Any, int]]] = defaultdict(list)
        for key, instance, row, level in self.members:
            level = last if row in self.outputs else level
            merged[(level, _head(key))].append((key, instance, row))
        return merged

    def template_floor(self) -> int:
        """The fewest template operations `groups()` can emit, known without building them:
        one per group, and one per component of a merged sum (product) that some member
        lacks (it is masked). Padding each member to the union of its group's components
        costs members times components: 3.7 s of a 10^5-operation body that then did not
        shrink enough, which this bound tells first."""
        floor = 0
        for members in self._merged().values():
            keys = {key for key, _, _ in members}
            floor += 1
            if len(keys) > 1:
                components = [set(key[1]) for key in keys]
                floor += len(set().union(*components) - set.intersection(*components))
        return floor

    def groups(self) -> dict[tuple[int, tuple], list[tuple[Any, int]]]:
        """Members grouped by (level, template).

        Outputs all join the last level (nothing reads them), and at each level the sums
        (products) of different component sets merge into one sum (product) over the union
        of their components, a member's missing components empty: the 40 outputs of a
        generated 10^5-operation body were four groups of 2-18 members, each a loop too
        narrow to pay for its steps.
        """
        groups: dict[tuple[int, tuple], list[tuple[Any, int]]] = {}
        for (level, head), members in self._merged().items():
            keys = {key for key, _, _ in members}
            if len(keys) == 1:
                groups[(level, members[0][0])] = [(inst, row) for _, inst, row in members]
                continue
            union = tuple(sorted({k for key in keys for k in key[1]}, key=self.order))
            # each member's components in the order of the union: where each key holds them
            where = {key: {k: i for i, k in enumerate(key[1])} for key in keys}
            groups[(level, (head, union))] = [
                (tuple(instance[where[key][k]] if k in where[key] else [] for k in union), row)
                for key, instance, row in members]
        return groups


class _Emitter:
    """Source for each group: index tables as const args, one expression per group."""

    def __init__(self, positions: dict[int, int], scalar_position: Any, first_name: int) -> None:
        self.positions = positions
        self.scalar_position = scalar_position
        self.tables: list[np.ndarray] = []
        self.first_name = first_name
        self.nodes = 0
        #: loop bodies of the wide reductions, emitted before the group that uses them
        self.functions: list[str] = []
        self.loops = 0
        #: loops enclosing the expression being emitted
        self.sliced = 0

    def table(self, values: np.ndarray) -> str:
        self.tables.append(values)
        return f"_v{self.first_name + len(self.tables) - 1}"

    def _indices(self, instances: np.ndarray, key: tuple, pad: int) -> str:
        if key == ROW:
            flat = [pad if i is None else self.positions[i] for i in instances.ravel()]
        else:
            flat = [pad if i is None else self.scalar_position(i) for i in instances.ravel()]
        return self.table(np.asarray(flat, np.int32).reshape(instances.shape))

    def expression(self, key: tuple, instances: np.ndarray, pad: int = ZERO) -> str:
        """Code evaluating template `key` at every position of `instances` (None: a pad)."""
        if key == ROW:
            return f"_R[{self._indices(instances, key, pad)}]"
        if key == SCALAR:
            return f"vec.take_scalars(_S, {self._indices(instances, key, pad)}, _R)"
        self.nodes += 1
        kind = key[0]
        if kind in ("sum", "prod"):
            return self._reduction(kind, key[1], instances)
        if kind == "neg":
            return f"(-{self.expression(key[1], instances)})"
        if kind == "ipow":
            return f"lax.integer_pow({self.expression(key[2], instances)}, {key[1]!r})"
        parts = [self.expression(k, _map(instances, lambda i, j=j: i[j]))
                 for j, k in enumerate(key[2] if kind == "call" else key[2:])]
        if kind == "call":
            return f"{key[1]}({', '.join(parts)})"
        return f"({parts[0]} {key[1]} {parts[1]})"

    def _reduction(self, kind: str, keys: Sequence[tuple], instances: np.ndarray) -> str:
        terms = []
        pad = ZERO if kind == "sum" else ONE
        for j, key in enumerate(keys):
            lists = [None if i is None else i[j] for i in instances.ravel()]
            width = max(len(items) for items in lists if items is not None)
            # positions that are pads themselves (None) are masked by the enclosing reduction
            full = all(items is None or len(items) == width for items in lists)
            if width == 1 and full:
                terms.append(self.expression(key, _map(instances, lambda i, j=j: i[j][0])))
                continue
            block = np.empty(instances.shape + (width,), dtype=object)
            mask = np.zeros(block.shape, dtype=bool)
            for position, items in zip(np.ndindex(instances.shape), lists, strict=True):
                for t, item in enumerate(items or ()):
                    block[position + (t,)] = item
                    mask[position + (t,)] = True
            first_table = len(self.tables)
            scan = width > SCAN_ABOVE
            self.sliced += scan
            inner = self.expression(key, block, pad)
            self.sliced -= scan
            self.nodes += 1
            # enclosing loops have sliced their axes (all before this one) off the tables
            axis = instances.ndim - self.sliced
            unmasked = key in (ROW, SCALAR) or full
            if scan:
                used = [f"_v{self.first_name + t}" for t in range(first_table, len(self.tables))]
                term = f"_t{self.loops}"
                self.loops += 1
                self.functions.append(f"def {term}({', '.join(used)}):\n    return {inner}")
                masked = "" if unmasked else f", {self.table(mask)}"
                terms.append(f"vec.scan_reduce({kind!r}, {term}, ({', '.join(used)},), "
                             f"{axis}{masked})")
            elif unmasked:
                terms.append(f"jnp.sum({inner}, axis={axis})" if kind == "sum"
                             else f"vec.prod({inner}, {axis})")
            else:
                terms.append(f"vec.masked_{kind}({inner}, {self.table(mask)})")
        return "(" + (" + " if kind == "sum" else " * ").join(terms) + ")"


def _map(instances: np.ndarray, function: Any) -> np.ndarray:
    out = np.empty(instances.shape, dtype=object)
    for position in np.ndindex(instances.shape):
        item = instances[position]
        out[position] = None if item is None else function(item)
    return out




#: the local function a vectorized body runs its levels in
LEVELS = "_levels"


def is_vectorized(module: ast.Module) -> bool:
    """Whether `module` is a kernel this rule rewrote."""
    function = module.body[0]
    return isinstance(function, ast.FunctionDef) and any(
        isinstance(statement, ast.FunctionDef) and statement.name == LEVELS
        for statement in function.body)


def parameter_shapes(paths: Sequence[tuple[Any, ...]],
                     shapes: Sequence[tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """`ps['L1']['W']` (as the rules print a parameter leaf) → its shape, for array leaves."""
    return {"ps" + "".join(f"[{key!r}]" for key in path): tuple(shape)
            for path, shape in zip(paths, shapes, strict=True) if len(shape)}


def vectorize(module: ast.Module, dtype: np.dtype, hoisted: list[HoistedLiteral],
              operations: int, min_shrink: float,
              parameter_shapes: Mapping[str, tuple[int, ...]] | None = None,
              ) -> VectorizedBody | None:
    """The body as vector groups, when they and the scalar code left beside them hold
    `min_shrink` times fewer operations than the body's `operations`.

    Rewrites `module` in place; `hoisted` receives the index tables as const args (`_v0,
    _v1, …`, after the array literals). Returns what it built, or None, leaving `module` and
    `hoisted` untouched, when the body holds a form the rule does not know or does not
    shrink enough.
    """
    rule = "vectorize"
    function = kernel_function(module, rule)
    returned = return_statement(function, rule)
    if not isinstance(returned.value, ast.Tuple):
        return None
    data_names = {a.arg for a in function.args.args if DATA_NAME.match(a.arg)}
    if not data_names:
        return None
    builder = _Builder(read_counts(function), data_names, parameter_shapes or {},
                       operations / min_shrink if min_shrink else math.inf)
    prologue: list[ast.stmt] = []
    try:
        for statement in function.body[:-1]:
            if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                    and isinstance(statement.targets[0], ast.Name)):
                return None
            kept = builder.assign(statement.targets[0].id, statement.value)
            if kept is not None:
                prologue.append(kept)
        outputs: list[ast.expr | int] = []
        for value in returned.value.elts:
            if not builder.reads_rows(value) or dotted_name(getattr(value, "func", value)) \
                    == "jnp.broadcast_to":
                outputs.append(value)
            else:
                outputs.append(builder.member(value, output=True))
    except (_Unsupported, _Declined):
        return None
    # what stays scalar code counts too, and each output is a slice and a place in the
    # assembly: n_link_pendulum_on_cart(14)'s 1,365 entries over 56 template operations
    # compiled as long as its scalar body and ran half as fast
    scalar_operations = sum(operation_count(node) for node in [*prologue, *builder.scalars])
    fixed = scalar_operations + 2 * len(outputs)
    if (builder.template_floor() + fixed) * min_shrink > operations:
        return None  # the test below, on fewer template operations than it would count
    groups = builder.groups()
    if not groups:
        return None

    # layout: zeros, ones, data rows, then each level's groups in order
    positions = {row: 2 + k for k, row in enumerate(
        r for r in range(len(builder.level)) if builder.level[r] == 0)}
    ordered = sorted(groups.items(), key=lambda item: (item[0][0], builder.order(item[0][1])))
    for _group, members in ordered:
        for _, row in members:
            positions[row] = len(positions) + 2
    arrays = sorted(builder.arrays, key=builder.arrays.get)
    offsets = np.cumsum([0] + [math.prod(builder.parameter_shapes[a]) for a in arrays])
    plain = 2 + len(builder.scalars)

    def scalar_position(entry: int | tuple[int, int]) -> int:
        return entry if isinstance(entry, int) else plain + int(offsets[entry[0]]) + entry[1]

    emitter = _Emitter(positions, scalar_position, len(hoisted))
    levels: dict[int, list[str]] = defaultdict(list)
    lines = []
    for number, ((level, key), members) in enumerate(ordered):
        instances = np.empty(len(members), dtype=object)
        instances[:] = [instance for instance, _ in members]
        name = f"_g{number}"
        levels[level].append(name)
        expression = emitter.expression(key, instances)
        lines.extend((level, function) for function in emitter.functions)
        emitter.functions.clear()
        lines.append((level, f"{name} = {expression}"))
    if (emitter.nodes + fixed) * min_shrink > operations:
        return None
    output_rows = [positions[o] for o in outputs if isinstance(o, int)]
    out_table = emitter.table(np.asarray(output_rows, np.int32))

    body = [f"def {LEVELS}(_R):"]
    for level in sorted(levels):
        body += ["\n".join(f"    {part}" for part in line.split("\n"))
                 for lvl, line in lines if lvl == level]
        body.append(f"    _R = jnp.concatenate([_R, {', '.join(levels[level])}])")
    body.append(f"    return _R[{out_table}]")
    dtype_name = np.dtype(dtype).name
    row_list = ", ".join(ast.unparse(node) for node in builder.sources)
    array_list = ", ".join(f"({a}, {builder.parameter_shapes[a]!r})" for a in arrays)
    # the numbers among the scalars are one const arg (a template's coefficients, the
    # multipliers inside its functions): written as literals, each was a constant of the
    # program, and a 20,000-term sum of one template with distinct numbers compiled them
    # one by one; computed scalars (parameters, what reads only them) take their places
    numbers = [literal_value(node) for node in builder.scalars]
    if any(number is not None for number in numbers):
        table = emitter.table(np.asarray([0 if n is None else n for n in numbers],
                                         np.dtype(dtype)))
        computed = [k for k, number in enumerate(numbers) if number is None]
        scalar_list = ", ".join(ast.unparse(builder.scalars[k]) for k in computed)
        body.append(f"_S = vec.scalars([{scalar_list}], [{array_list}], {dtype_name!r}, "
                    f"numbers={table}, places={tuple(computed)!r})")
    else:
        scalar_list = ", ".join(ast.unparse(node) for node in builder.scalars)
        body.append(f"_S = vec.scalars([{scalar_list}], [{array_list}], {dtype_name!r})")
    body.append(f"_R = vec.store([{row_list}], {dtype_name!r})")
    body.append(f"_O = vec.chunked({LEVELS}, _R)")
    body.append(f"return {returned_tuple(outputs, '_O')}")
    generated = ast.parse("\n".join(body)).body

    names = [emitter.first_name + k for k in range(len(emitter.tables))]
    everything = tuple(range(len(outputs)))
    for number, table in zip(names, emitter.tables, strict=True):
        hoisted.append(HoistedLiteral(f"_v{number}", table, everything))
    literal_count = sum(1 for a in function.args.args if a.arg.startswith("_k"))
    function.args.args[literal_count:literal_count] = [ast.arg(f"_v{n}") for n in names]
    function.body = prologue + generated
    return VectorizedBody(len(ordered), emitter.nodes, len(positions) + 2, len(levels))
