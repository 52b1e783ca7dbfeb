"""codegen, stage 3 helper: a scalar body as an instruction table that one loop runs.

Imports ast, jax, numpy and symkern.codegen. XLA compiles straight-line code at about
1.5 ms per operation on this project's 2-core machine (10^4 operations: 14-17 s; pieces
compiled in parallel only divide that by the cores), and no XLA option moves it
(docs/design/interpreter.md). A body past INTERPRET_ABOVE_OPERATIONS whose every
data-dependent operation is in the table below is therefore not compiled as code: the
`interpret` pass (symkern.codegen.passes) turns it into

- an instruction table `_i0` (int32, one row `(op, destination, a, b)` per operation, in the
  body's order), a const arg;
- the numbers the body's data-dependent expressions read, `_i1`, a const arg;
- what does not depend on the data (parameters and what is computed from them alone), left
  as the body's own statements and handed in as scalars;

and `kernel.source` shows the call `interp.run(_i0, _i1, columns, scalars, ops=..., ...)`.
`run` evaluates the table for a tile of samples at a time with one `lax.fori_loop` over the
rows, each a `lax.switch` over the operations the body uses on registers that hold one value
for every sample of the tile. Its program has the same size for 10^3 or 10^6 operations
(compiled in ~0.3 s); each operation costs ~1 µs per tile of 1,024 samples.

Every sample is computed by the same operations in the same order whatever the tile, the
batch or the other samples, on registers of a whole tile, or of a multiple of
REGISTER_QUANTUM samples for a batch shorter than a tile (padded with copies of the last
sample, as the last tile is), so a sample's value does not depend on its batch. Derivatives
are JAX's of the loop (`jax.grad` stores each operation's operands: memory grows with
operations × samples).
"""

from __future__ import annotations

import ast
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
from jax import lax

from symkern.codegen.callee import CALLEE_TABLE, dotted_name
from symkern.codegen.operations import reads_values_of

#: samples per tile: the registers of a tile stay in the cache (BuildOptions.tile_chunk
#: replaces it); measured per operation and sample at 1,024: 0.9 ns, at 100,000 in one
#: tile: 180-270 ns (docs/design/interpreter.md)
TILE = 1024
#: a batch smaller than a tile runs in registers of a multiple of this many samples: XLA's
#: CPU code computes atan otherwise below 50 samples (other bits than in a whole tile), and
#: every function the interpreter runs gives the same bits at 64, 128, ... samples as in a
#: tile (tests/codegen/test_interpret.py; docs/design/interpreter.md)
REGISTER_QUANTUM = 64

#: the loads: a data column (`a` its index among the columns), a scalar (`a` its index
#: among the scalars, then the numbers), a scalar parameter (`a` its entry of the packed
#: parameter buffer, symkern.batching.packing)
LOADS = ("data", "scalar", "parameter")
#: Python's operators as the table names them
BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.Pow: "pow"}
_BINARY_FUNCTIONS = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply,
                     "div": jnp.true_divide, "pow": jnp.power}
#: the callee table's elementwise functions of real values the interpreter runs, by target
#: (the `vectorizable` rows: the functions the vectorized templates are tested with)
FUNCTIONS: dict[str, int] = {row.target: row.arity for row in CALLEE_TABLE.values()
                             if row.vectorizable and row.arity in (1, 2)}
#: what `run` accepts as an operation name: LOADS, BINARY's names, "neg", "ipow:N", FUNCTIONS
INTEGER_POWER = "ipow:"


def _binary(op: str) -> bool:
    """Whether an operation of registers reads two of them."""
    return op in _BINARY_FUNCTIONS or FUNCTIONS.get(op) == 2


#: the modules the callee table's targets name (`jnp.sin`, `jsp.erf`)
_MODULES = {"jnp": jnp, "jsp": jsp}


def _operation(name: str) -> Any:
    """The function of registers an operation name stands for (never eval of a string)."""
    if name in _BINARY_FUNCTIONS:
        return _BINARY_FUNCTIONS[name]
    if name == "neg":
        return jnp.negative
    if name.startswith(INTEGER_POWER):
        exponent = int(name[len(INTEGER_POWER):])
        return lambda x: lax.integer_pow(x, exponent)
    if name in FUNCTIONS:
        module, function = name.split(".", 1)
        return getattr(_MODULES[module], function)
    raise ValueError(f"ops: {name!r} is not an operation of symkern.codegen.interpret")


def _branches(ops: Sequence[str]) -> list[Any]:
    branches = []
    for name in ops:
        if name == "data":
            branches.append(lambda x, y, D, S, P, a: lax.dynamic_index_in_dim(D, a, 0, False))
        elif name == "scalar":
            branches.append(lambda x, y, D, S, P, a: jnp.broadcast_to(
                lax.dynamic_index_in_dim(S, a, 0, False), x.shape))
        elif name == "parameter":
            branches.append(lambda x, y, D, S, P, a: jnp.broadcast_to(
                lax.dynamic_index_in_dim(P, a, 0, False), x.shape))
        else:
            function = _operation(name)
            two = _binary(name)
            branches.append((lambda x, y, D, S, P, a, f=function: f(x, y)) if two
                            else (lambda x, y, D, S, P, a, f=function: f(x)))
    return branches


def _evaluate_tile(table: Any, D: Any, S: Any, P: Any, ops: Sequence[str],
                   outputs: Sequence[int], registers: int) -> Any:
    """The outputs' registers after every row of `table`, for the samples of `D` (columns ×
    samples): registers × samples, each row one `lax.switch` over `ops`."""
    branches = _branches(ops)
    R = jnp.zeros((registers,) + D.shape[1:], D.dtype)

    def step(i: Any, R: Any) -> Any:
        row = table[i]
        x = lax.dynamic_index_in_dim(R, row[2], 0, False)
        y = lax.dynamic_index_in_dim(R, row[3], 0, False)
        value = lax.switch(row[0], branches, x, y, D, S, P, row[2])
        return lax.dynamic_update_index_in_dim(R, value, row[1], 0)

    R = lax.fori_loop(0, table.shape[0], step, R)
    return R[np.asarray(outputs, np.int32)]


def _padded(D: Any, rows: int) -> Any:
    """`D` (columns × samples) with `rows` copies of its last sample: real values, no NaN."""
    return jnp.pad(D, [(0, 0), (0, rows)], mode="edge") if rows else D


def run(table: Any, numbers: Any, columns: Sequence[Any], scalars: Sequence[Any], *,
        ops: Sequence[str], outputs: Sequence[int], registers: int, dtype: str,
        parameters: Any = None, tile: int = TILE) -> tuple[Any, ...]:
    """The values of `outputs` (registers) after the rows of `table`, each shaped like the
    batch: `columns` are the data the body reads (each shaped like the batch, or
    broadcasting to it), `scalars` the parameters and what the body computes from them
    outside the table, then `numbers`; `parameters` a packed parameter buffer; a batch of
    more than `tile` samples runs `tile` at a time."""
    dtype = np.dtype(dtype)
    P = jnp.zeros((1,), dtype) if parameters is None else jnp.asarray(parameters, dtype)
    if P.ndim != 1:
        raise ValueError(f"parameters: expected one packed buffer, got shape {P.shape}")
    batch = jnp.broadcast_shapes(*(jnp.shape(c) for c in columns))
    for scalar in scalars:
        if jnp.ndim(scalar) != 0:
            raise ValueError("scalars: the values the interpreted body reads apart from its "
                             f"data are one number each, got shape {jnp.shape(scalar)}")
    S = jnp.concatenate([jnp.asarray([jnp.asarray(s, dtype) for s in scalars], dtype).reshape(-1),
                         jnp.asarray(numbers, dtype)])
    size = math.prod(batch)
    D = jnp.stack([jnp.broadcast_to(jnp.asarray(c, dtype), batch).reshape(-1) for c in columns])
    concrete = all(isinstance(n, (int, np.integer)) for n in batch)
    if not concrete or size == 0:
        out = _evaluate_tile(table, D, S, P, ops, outputs, registers)
    else:
        # registers of whole tiles, or below a tile of a multiple of REGISTER_QUANTUM
        # samples (a whole tile where that is fewer): XLA's CPU code for a shorter register
        # computes some functions otherwise (atan below 50 samples), and a sample's bits
        # would depend on its batch (docs/design/interpreter.md)
        length = tile if size > tile else min(-(-size // REGISTER_QUANTUM) * REGISTER_QUANTUM,
                                              tile)
        count = -(-size // length)
        D = _padded(D, count * length - size)
        if count == 1:
            out = _evaluate_tile(table, D, S, P, ops, outputs, registers)
        else:
            tiles = jnp.moveaxis(D.reshape(len(columns), count, length), 1, 0)
            out = lax.map(lambda d: _evaluate_tile(table, d, S, P, ops, outputs, registers),
                          tiles)
            out = jnp.moveaxis(out, 0, 1).reshape(len(outputs), count * length)
        out = out[:, :size]
    return tuple(out[k].reshape(batch) for k in range(len(outputs)))


@dataclass
class InterpretedBody:
    """What `interpret_body` made of a body: its operations, registers and loads."""

    operations: int
    registers: int
    columns: int
    scalars: int
    numbers: int


class _NotInterpretable(Exception):
    pass


def _read(node: ast.expr) -> bool:
    """Whether `node` only reads a value: a name, or a name indexed by constants
    (`ps['W'][1, 2]`, `ps[0]`)."""
    while isinstance(node, ast.Subscript):
        if any(not isinstance(n, (ast.Constant, ast.Tuple, ast.Slice, ast.UnaryOp, ast.Load,
                                  ast.USub))
               for n in ast.walk(node.slice)):
            return False
        node = node.value
    return isinstance(node, ast.Name)


class _Translator:
    """A body's expressions → instructions on values (SSA), in the body's order.

    What depends on the data becomes instructions; so does what is computed from the
    parameters alone (XLA would compile it as code, ~1.5 ms an operation), down to the
    parameters' reads, which are the scalars; a data-free expression outside the table is
    a scalar the body's own statements compute."""

    def __init__(self, data_names: set[str], literal_value: Any, parameter_path: Any,
                 parameter_entries: dict[tuple, int], numbers_each: set[str]) -> None:
        self.data_names = data_names
        self.numbers_each = numbers_each
        self.literal_value = literal_value
        self.parameter_path = parameter_path
        self.parameter_entries = parameter_entries
        self.values: dict[str, int] = {}  # a local name → its value
        self.per_sample = set(data_names)  # the data arguments, and the locals read from them
        self.free_locals: dict[str, ast.expr] = {}  # the others, by their expressions
        self.rows: list[tuple[str, int, int]] = []  # (op, a, b); the row's value is its index
        self.columns: dict[str, int] = {}  # a data read's source → column
        self.column_nodes: list[ast.expr] = []
        self.scalars: dict[str, int] = {}  # a scalar's source → its index
        self.scalar_nodes: list[ast.expr] = []
        self.numbers: dict[float, int] = {}
        self.number_values: list[float] = []

    def depends(self, node: ast.AST) -> bool:
        """Whether `node` reads a sample's values: a data argument or a local read from one."""
        return reads_values_of(node, self.per_sample)

    def row(self, op: str, a: int = 0, b: int = 0) -> int:
        self.rows.append((op, a, b))
        return len(self.rows) - 1

    def scalar(self, node: ast.expr) -> int:
        text = ast.unparse(node)
        if text not in self.scalars:
            self.scalars[text] = len(self.scalar_nodes)
            self.scalar_nodes.append(node)
        return self.row("scalar", self.scalars[text])

    def value(self, node: ast.expr) -> int:
        number = self.literal_value(node)
        if isinstance(number, (int, float)):
            key = float(number)
            if key not in self.numbers:
                self.numbers[key] = len(self.number_values)
                self.number_values.append(float(number))
            return self.row("scalar", -1 - self.numbers[key])  # numbers follow the scalars
        if isinstance(node, ast.Name):
            if node.id in self.values:
                return self.values[node.id]
            if node.id in self.free_locals:
                try:
                    self.values[node.id] = self.value(self.free_locals[node.id])
                except _NotInterpretable:  # computed by the body's statement
                    self.values[node.id] = self.scalar(node)
                return self.values[node.id]
            if node.id in self.numbers_each:
                return self.column(node)
            if node.id in self.data_names:
                raise _NotInterpretable(f"a whole data argument ({node.id})")
            return self.scalar(node)
        if not self.depends(node):
            if _read(node):
                entry = self.parameter_entries.get(self.parameter_path(node))
                return self.scalar(node) if entry is None else self.row("parameter", entry)
            try:
                return self.operation(node)
            except _NotInterpretable:
                return self.scalar(node)
        if isinstance(node, ast.Subscript):
            if not (isinstance(node.value, ast.Name) and node.value.id in self.data_names
                    and not self.depends(node.slice)):
                raise _NotInterpretable("an indexed read by a data-dependent index")
            return self.column(node)
        return self.operation(node)

    def column(self, node: ast.expr) -> int:
        """A load of a data read (`x1[..., 3]`, or `x2` of one number a sample)."""
        text = ast.unparse(node)
        if text not in self.columns:
            self.columns[text] = len(self.column_nodes)
            self.column_nodes.append(node)
        return self.row("data", self.columns[text])

    def operation(self, node: ast.expr) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            left, right = self.value(node.left), self.value(node.right)
            return self.row(BINARY[type(node.op)], left, right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = self.value(node.operand)
            return self.row("neg", operand) if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.Call) and not node.keywords:
            name = dotted_name(node.func)
            if (name == "lax.integer_pow" and len(node.args) == 2
                    and isinstance(node.args[1], ast.Constant)
                    and type(node.args[1].value) is int):
                return self.row(f"{INTEGER_POWER}{node.args[1].value}", self.value(node.args[0]))
            if name in FUNCTIONS and len(node.args) == FUNCTIONS[name]:
                values = [self.value(a) for a in node.args]
                return self.row(name, *values)
            raise _NotInterpretable(f"a call of {ast.unparse(node.func)}")
        raise _NotInterpretable(f"a {type(node).__name__} expression")


def _allocate(rows: Sequence[tuple[str, int, int]], outputs: Sequence[int]) -> tuple[list[int], int]:
    """A register for each value: a value's register is free after its last reader (outputs
    are read at the end); the lowest free register is taken first."""
    last = list(range(len(rows)))  # a value nobody reads is free once written
    for index, (op, a, b) in enumerate(rows):
        if op in LOADS:
            continue
        last[a] = index
        if _binary(op):
            last[b] = index
    for value in outputs:
        last[value] = len(rows)
    ending: dict[int, list[int]] = {}
    for value, index in enumerate(last):
        ending.setdefault(index, []).append(value)
    register = [0] * len(rows)
    free: list[int] = []
    count = 0
    for index in range(len(rows)):
        for value in ending.get(index, ()):  # operands read by this row, then free
            if value != index:
                heapq.heappush(free, register[value])
        if free:
            register[index] = heapq.heappop(free)
        else:
            register[index], count = count, count + 1
        if last[index] == index:  # written and never read
            heapq.heappush(free, register[index])
    return register, max(count, 1)


def interpret_body(module: ast.Module, data_names: Sequence[str], numbers_each: set[str],
                   dtype: np.dtype,
                   hoisted: list, parameter_entries: dict[tuple, int] | None = None,
                   tile: int = TILE) -> InterpretedBody | str:
    """Rewrite the kernel function of `module` in place to the interpreted form (see the
    module docstring) and append its two tables to `hoisted` (HoistedLiteral); what it
    cannot run, and `module` unchanged, when a data-dependent expression is not in the
    table. `numbers_each` are the data arguments of one number a sample (read whole);
    `parameter_entries` maps a scalar parameter's path to its entry of the packed
    buffer, when the kernel packs its parameters: the table reads them there."""
    # imported here: the rules import the kernel namespace, which holds this module
    from symkern.codegen.packed_sums import parameter_path
    from symkern.codegen.rules import HoistedLiteral, literal_value, returned_tuple

    function = next(node for node in module.body if isinstance(node, ast.FunctionDef))
    translator = _Translator(set(data_names), literal_value, parameter_path,
                             dict(parameter_entries or {}), set(numbers_each))
    prologue: list[ast.stmt] = []
    returned: list[ast.expr] | None = None
    try:
        for statement in function.body:
            if isinstance(statement, ast.Return):
                value = statement.value
                returned = list(value.elts) if isinstance(value, ast.Tuple) else [value]
                break
            if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                    and isinstance(statement.targets[0], ast.Name)):
                raise _NotInterpretable(f"a {type(statement).__name__} statement")
            name = statement.targets[0].id
            if translator.depends(statement.value):
                translator.per_sample.add(name)
                translator.values[name] = translator.value(statement.value)
            else:  # kept: a constant output or a scalar may read it (else XLA drops it)
                translator.free_locals[name] = statement.value
                prologue.append(statement)
        if returned is None:
            return "a body without a return"
        results: list[int | ast.expr] = []
        for expression in returned:
            results.append(translator.value(expression) if translator.depends(expression)
                           else expression)
    except _NotInterpretable as reason:
        return str(reason)
    computed = [r for r in results if isinstance(r, int)]
    if not computed:
        return "a body whose outputs do not read the data"
    # drop what no output reads (a statement's value the rules kept for nothing)
    live = [False] * len(translator.rows)
    for value in computed:
        live[value] = True
    for index in range(len(translator.rows) - 1, -1, -1):
        op, a, b = translator.rows[index]
        if live[index] and op not in LOADS:
            live[a] = True
            if _binary(op):
                live[b] = True
    renumber, rows = {}, []
    for index, row in enumerate(translator.rows):
        if live[index]:
            op, a, b = row
            if op not in LOADS:
                a = renumber[a]
                b = renumber[b] if _binary(op) else 0
            renumber[index] = len(rows)
            rows.append((op, a, b))
    computed = [renumber[v] for v in computed]
    register, registers = _allocate(rows, computed)
    ops: list[str] = []
    op_index: dict[str, int] = {}
    scalar_count = len(translator.scalar_nodes)
    table = np.zeros((len(rows), 4), np.int32)
    for index, (op, a, b) in enumerate(rows):
        if op not in op_index:
            op_index[op] = len(ops)
            ops.append(op)
        if op == "scalar" and a < 0:
            a = scalar_count + (-1 - a)
        elif op not in LOADS:
            a = register[a]
            b = register[b] if _binary(op) else 0
        table[index] = (op_index[op], register[index], a, b)
    numbers = np.asarray(translator.number_values, np.dtype(dtype))
    names = ("_i0", "_i1")
    everything = tuple(range(len(results)))
    position = len(hoisted)  # the kernel's first arguments are the hoisted literals
    hoisted.append(HoistedLiteral(names[0], table, everything,
                                  "instruction table (interpret)"))
    hoisted.append(HoistedLiteral(names[1], numbers, everything,
                                  "numbers of the instruction table (interpret)"))
    output_registers = tuple(register[v] for v in computed)
    columns = ", ".join(ast.unparse(n) for n in translator.column_nodes)
    scalars = ", ".join(ast.unparse(n) for n in translator.scalar_nodes)
    packed = ", parameters=ps.buffer" if "parameter" in op_index else ""
    call = (f"_O = interp.run({names[0]}, {names[1]}, ({columns},), ({scalars}{',' if scalars else ''}), "
            f"ops={tuple(ops)!r}, outputs={output_registers!r}, registers={registers}, "
            f"dtype={np.dtype(dtype).name!r}{packed}, tile={int(tile)})")
    tail = ast.parse(call + f"\nreturn {returned_tuple(results, '_O')}").body
    function.args.args[position:position] = [ast.arg(n) for n in names]
    function.body = prologue + tail
    ast.fix_missing_locations(module)
    return InterpretedBody(len(rows), registers, len(translator.column_nodes), scalar_count,
                           len(translator.number_values))


class InterpreterNamespace:
    """What a kernel's code reads as `interp`: this module's `run`."""

    run = staticmethod(run)

    def __repr__(self) -> str:
        return "<the instruction-table interpreter of symkern.codegen.interpret>"


#: the one instance every kernel namespace holds as `interp` (no state)
NAMESPACE = InterpreterNamespace()


def listing(table: np.ndarray, ops: Sequence[str]) -> str:
    """The instruction table as text, one row a line: `r3 = mul r1 r2`, `r0 = data 4`."""
    lines = []
    for op_index, destination, a, b in np.asarray(table).tolist():
        op = ops[op_index]
        if op in LOADS:
            lines.append(f"r{destination} = {op} {a}")
        elif _binary(op):
            lines.append(f"r{destination} = {op} r{a} r{b}")
        else:
            lines.append(f"r{destination} = {op} r{a}")
    return "\n".join(lines)


__all__ = ["FUNCTIONS", "NAMESPACE", "TILE", "InterpretedBody", "interpret_body", "listing", "run"]
