"""codegen, stage 2 rule: sums that weigh one set of per-sample values, as one matrix product.

Imports ast and numpy, and the codegen helpers; nothing from jax (the rewritten code calls
`jnp.tensordot`).

Why: a scalarized network is a set of sums `tanh(W[i,0]*h0 + W[i,1]*h1 + ... + b[i])`
over the same per-sample values `h0, h1, …`, with parameter-only weights. Written as
scalar code, XLA's CPU backend evaluates each sum in its own elementwise fusion, where a
matrix product (`(n_out, n_in) @ (n_in, batch)`) runs on the CPU's GEMM kernel: on the
8-32-32-8 network, hand-written `jnp` matrix products ran 1.4-1.6x faster than the scalar
body (docs/design/linear-forms.md). This rule finds such sums in the
rewritten body and evaluates each group of them with one `jnp.tensordot`:

- a *linear form* is a per-sample sum (through the single-use statements the emitter cut
  it into) whose terms are each a number times parameter-only factors times per-sample
  locals, plus parameter-only terms (a bias);
- forms over the same set of per-sample locals form a group. Their weights are a dense
  `(members, inputs)` matrix `_lw<g>`, built once per call (not per sample) by gathering
  the parameter entries (`ps['L1']['W'][i, j]`) and other parameter-only factors the
  weights are, through index tables passed as const args `_li0, …`; the biases are one
  vector `_lb<g>`;
- the group's inputs are one `(inputs, *batch)` array `_lv<g>` (batch last, so each
  row is contiguous), its values `_lz<g> = jnp.tensordot(_lw<g>, _lv<g>, axes=1) + _lb<g>`,
  and each form becomes the row `_lz<g>[m]`. When every member is a statement
  `h = jnp.tanh(<form>)`, the function is applied to the block (`_lh<g>`), and a next
  group whose inputs are exactly that block's rows reads the block itself.

A group is contracted only when its values stay arrays: each member is a returned value or
a local read only as an input of contracted groups (`_kept_as_blocks`), and each weight is
one parameter factor and each input one local. A network Jacobian's chain-rule sums
(`W2[k,j] * W1[j,c] * d_j`, rows read by `1 - h**2`) ran slower as products than as the
scalar body, which keeps them in registers, and stay scalar; above 5,000 operations, where
the scalar body would be vectorized or cut into pieces, `chain_rule=True` contracts them
too and `tile` runs the body a chunk of samples at a time. Groups smaller than
CONTRACT_MIN_INPUTS inputs, CONTRACT_MIN_MEMBERS members or CONTRACT_MIN_TERMS weights
stay scalar too (a 2-3-2 network runs fastest fully fused). `contract_linear_forms`
returns None, leaving the module untouched, when nothing groups.
"""

from __future__ import annotations

import ast
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from symkern.codegen.callee import BLOCKWISE_JNP
from symkern.codegen.rules import (
    DATA_NAME,
    HoistedLiteral,
    kernel_function,
    return_statement,
    returned_entries,
    single_assignments,
)

RULE = "contract_linear_forms"
#: a group needs at least this many distinct per-sample inputs, members and weights
CONTRACT_MIN_INPUTS = 4
CONTRACT_MIN_MEMBERS = 4
CONTRACT_MIN_TERMS = 64
#: locals of a group: stacked inputs, coefficient atoms, weights, products
VALUES, ATOMS, WEIGHTS, BIASES, PRODUCTS = "_lv", "_la", "_lw", "_lb", "_lz"
#: an elementwise function of every member's products, as one block
LIFTED = "_lh"
#: `jnp.<name>` functions of one argument applied to a whole block when every member is one
ELEMENTWISE = BLOCKWISE_JNP
#: const args holding the index tables and numeric coefficients
TABLE = "_li"
_PRODUCTS_NAME = re.compile(rf"{PRODUCTS}\d+$")


@dataclass
class ContractedBody:
    """What `contract_linear_forms` found: its groups and the sums they replace."""

    groups: int
    forms: int
    weights: int


def is_contracted(module: ast.Module) -> bool:
    """Whether `module` is a kernel this rule rewrote (it holds `_lz<g> = …`, or is tiled)."""
    function = module.body[0]
    return is_tiled(module) or isinstance(function, ast.FunctionDef) and any(
        isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name)
        and _PRODUCTS_NAME.match(statement.targets[0].id) for statement in function.body)


def _is_sum(node: ast.AST) -> bool:
    return isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))


@dataclass
class _Form:
    """One sum: where it is, its weighted inputs and its parameter-only terms."""

    node: ast.BinOp
    home: int                                   # statement index holding it (len = return)
    inputs: dict[tuple[str, ...], tuple[float, tuple]]  # names -> (number, atom keys)
    bias: list[tuple[ast.expr, bool]]
    reads: set[str]                             # param-only locals its atoms read


#: node types that hold no expression (operators, contexts): no child worth visiting
_NO_EXPRESSION = (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)


def _children(node: ast.AST) -> list[ast.AST]:
    """`ast.iter_child_nodes(node)` as a list, less operators and contexts."""
    found = []
    for field_name in node._fields:
        value = getattr(node, field_name, None)
        if isinstance(value, ast.AST):
            if not isinstance(value, _NO_EXPRESSION):
                found.append(value)
        elif isinstance(value, list):
            found.extend(item for item in value if isinstance(item, ast.AST))
    return found


class _Body:
    """The straight-line body: which locals are per-sample, how often each is read."""

    def __init__(self, statements: list[ast.Assign], result: ast.expr, data: set[str]) -> None:
        self.names = [s.targets[0].id for s in statements]  # type: ignore[attr-defined]
        self.index = {name: k for k, name in enumerate(self.names)}
        self.values = [s.value for s in statements]
        self.batched = set(data)
        # one walk of the body finds every node that reads a per-sample value, how often
        # each name is read, and the names read as operands of sums: asking each sum in turn
        # walked its operands again (4.5 M nodes for 4 * 10^4 parameters)
        self.reading: set[int] = set()
        self.uses: Counter = Counter()
        operands: list[str] = []
        for name, value in zip(self.names, self.values, strict=True):
            if self._walk(value, operands):
                self.batched.add(name)
        self._walk(result, operands)
        # a per-sample sum read once, as a term of another sum: the emitter's cut of a long sum
        chains = {name for name, value in zip(self.names, self.values, strict=True)
                  if name in self.batched and self.uses[name] == 1 and _is_sum(value)}
        self.absorbed = chains.intersection(operands)

    def _walk(self, root: ast.AST, operands: list[str]) -> bool:
        """Adds the nodes under `root` that read a per-sample local to `reading`, the names
        it reads to `uses`, and the names that are operands of its sums to `operands`;
        whether `root` reads a per-sample local."""
        reading, batched, uses = self.reading, self.batched, self.uses
        stack: list[tuple[ast.AST, list[ast.AST] | None]] = [(root, None)]
        while stack:
            node, children = stack.pop()
            if children is not None:
                if any(id(child) in reading for child in children):
                    reading.add(id(node))
            elif isinstance(node, ast.Name):
                if isinstance(node.ctx, ast.Load):
                    uses[node.id] += 1
                if node.id in batched:
                    reading.add(id(node))
            else:
                if _is_sum(node):
                    operands.extend(child.id for child in (node.left, node.right)  # type: ignore[attr-defined]
                                    if isinstance(child, ast.Name))
                children = _children(node)
                stack.append((node, children))
                stack.extend((child, None) for child in children)
        return id(root) in reading

    def reads_batched(self, node: ast.AST) -> bool:
        return id(node) in self.reading

    def terms(self, node: ast.expr, home: int) -> list[tuple[ast.expr, bool, int]]:
        """Operands of a `+`/`-` chain with their signs and homes, through absorbed locals."""
        out: list[tuple[ast.expr, bool, int]] = []
        stack = [(node, False, home)]
        while stack:
            current, negative, where = stack.pop()
            if isinstance(current, ast.Name) and current.id in self.absorbed:
                where = self.index[current.id]
                current = self.values[where]
            if _is_sum(current):
                stack.append((current.right, negative ^ isinstance(current.op, ast.Sub), where))
                stack.append((current.left, negative, where))
            elif isinstance(current, ast.UnaryOp) and isinstance(current.op, ast.USub):
                stack.append((current.operand, not negative, where))
            else:
                out.append((current, negative, where))
        return out


def _factors(node: ast.expr) -> tuple[list[ast.expr], bool]:
    """Operands of a `*` chain, and whether an odd number of them were negated."""
    out, negative, stack = [], False, [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.BinOp) and isinstance(current.op, ast.Mult):
            stack.extend((current.right, current.left))
        elif isinstance(current, ast.UnaryOp) and isinstance(current.op, ast.USub):
            negative = not negative
            stack.append(current.operand)
        else:
            out.append(current)
    return out, negative


def _number(node: ast.expr) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return float(node.value)
    return None


def _entry(node: ast.expr) -> tuple[str, tuple[int, ...]] | None:
    """`<base>[i, j]` with constant integer indices: (the base's dump, (i, j))."""
    if not isinstance(node, ast.Subscript):
        return None
    parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    if not parts or not all(isinstance(p, ast.Constant) and type(p.value) is int for p in parts):
        return None
    return ast.dump(node.value), tuple(p.value for p in parts)  # type: ignore[attr-defined]


class _Atoms:
    """Parameter-only factors of the coefficients: `("e", base, index)` for an entry of a
    parameter array, `("o", dump)` for any other, with the source each prints as."""

    def __init__(self) -> None:
        self.source: dict[str, str] = {}

    def key(self, node: ast.expr) -> tuple:
        entry = _entry(node)
        if entry is not None:
            base, index = entry
            if base not in self.source:
                self.source[base] = ast.unparse(node.value)  # type: ignore[attr-defined]
            return ("e", base, index)
        dumped = ast.dump(node)
        if dumped not in self.source:
            self.source[dumped] = ast.unparse(node)
        return ("o", dumped)


def _form(node: ast.BinOp, home: int, body: _Body, atoms: _Atoms) -> _Form | None:
    inputs: dict[tuple[str, ...], tuple[float, tuple]] = {}
    bias: list[tuple[ast.expr, bool]] = []
    reads: set[str] = set()
    for term, negative, _ in body.terms(node, home):
        if not body.reads_batched(term):
            bias.append((term, negative))
            continue
        factors, flipped = _factors(term)
        number, per_sample, coefficient = -1.0 if negative ^ flipped else 1.0, [], []
        for factor in factors:
            value = _number(factor)
            if value is not None:
                number *= value
            elif body.reads_batched(factor):
                if not isinstance(factor, ast.Name):
                    return None  # a computed per-sample factor: not a weighted input
                per_sample.append(factor.id)
            else:
                coefficient.append(atoms.key(factor))
                reads |= {n.id for n in ast.walk(factor) if isinstance(n, ast.Name)}
        key = tuple(sorted(per_sample))
        if key in inputs:
            return None  # one input weighted twice
        inputs[key] = (number, tuple(sorted(coefficient)))
    if len(inputs) < CONTRACT_MIN_INPUTS:
        return None
    return _Form(node, home, inputs, bias, reads)


def _forms(statements: list[ast.Assign], result: ast.expr, body: _Body,
           atoms: _Atoms) -> list[_Form]:
    """Every maximal per-sample sum of the body that is a linear form, in body order."""
    found: list[_Form] = []
    homes = [(k, s.value) for k, s in enumerate(statements) if body.names[k] not in body.absorbed]
    for home, value in [*homes, (len(statements), result)]:
        stack: list[tuple[ast.AST, int]] = [(value, home)]
        while stack:
            node, where = stack.pop()
            if _is_sum(node) and body.reads_batched(node):
                form = _form(node, where, body, atoms)  # type: ignore[arg-type]
                if form is not None:
                    found.append(form)
                    continue  # its terms are names and parameters: nothing nested to find
                terms = body.terms(node, where)  # type: ignore[arg-type]
                stack.extend((term, at) for term, _, at in reversed(terms))
            elif body.reads_batched(node) and not isinstance(node, ast.Name):
                # children in order: forms in body order; none under a parameter-only node
                stack.extend((child, where) for child in reversed(_children(node)))
    return found


def _signed_sum(terms: Sequence[tuple[ast.expr, bool]]) -> str:
    """`a + b - c` from terms and their signs; `0.0` for none."""
    text = ""
    for term, negative in terms:
        source = ast.unparse(term)
        text = (f"-({source})" if negative else source) if not text else \
            f"{text} {'-' if negative else '+'} ({source})"
    return text or "0.0"


class _Replace(ast.NodeTransformer):
    def __init__(self, replacements: dict[int, ast.expr]) -> None:
        self.replacements = replacements

    def visit(self, node: ast.AST) -> ast.AST:
        found = self.replacements.get(id(node))
        if found is not None:
            return found
        return super().visit(node)


def contract_linear_forms(module: ast.Module, dtype: np.dtype, hoisted: list[HoistedLiteral],
                          chain_rule: bool = False) -> ContractedBody | None:
    """Rewrite `module` in place so that each group of linear forms over the same
    per-sample inputs is one `jnp.tensordot`; `hoisted` receives the index tables as const
    args (`_li0, …`, after the existing ones). Returns what it built, or None, leaving
    `module` and `hoisted` untouched, when the body is not a straight-line scalar body or no
    group is large enough."""
    function = kernel_function(module, RULE)
    body_found = single_assignments(function, RULE)
    if body_found is None:
        return None  # vectorized, a name assigned twice, or a form this rule does not know
    statements, returned = body_found
    data = {a.arg for a in function.args.args if DATA_NAME.match(a.arg)}
    if not data or is_contracted(module):
        return None
    body = _Body(statements, returned.value, data)
    uses = body.uses
    atoms = _Atoms()
    groups: dict[frozenset, list[_Form]] = defaultdict(list)
    forms = _forms(statements, returned.value, body, atoms)  # type: ignore[arg-type]
    for form in forms:
        groups[frozenset(form.inputs)].append(form)
    chosen = []
    for members in groups.values():
        inputs = list(members[0].inputs)
        if len(members) < CONTRACT_MIN_MEMBERS or len(members) * len(inputs) < CONTRACT_MIN_TERMS:
            continue
        if not chain_rule and (any(len(key) > 1 for key in inputs) or any(
                len(atoms) > 1 for form in members for _, atoms in form.inputs.values())):
            continue  # a Jacobian's chain-rule sums: slower as products (_kept_as_blocks)
        first = min(m.home for m in members)
        needed = {n for key in inputs for n in key} | set().union(*(m.reads for m in members))
        if any(body.index.get(n, -1) >= first for n in needed):
            continue  # an input or coefficient defined after the first member
        chosen.append((first, inputs, members))
    entries = returned_entries(returned.value)
    if not chain_rule:
        chosen = _kept_as_blocks(chosen, forms, statements, entries, body, uses)
    if not chosen:
        return None
    inserted: dict[int, list[ast.stmt]] = defaultdict(list)
    replacements: dict[int, ast.expr] = {}
    new_tables: list[tuple[str, np.ndarray]] = []
    rows: dict[str, tuple[str, int]] = {}  # local -> (block, row) for lifted members
    weights = 0
    for g, (first, inputs, members) in enumerate(sorted(chosen, key=lambda c: c[0])):
        matrix = _one_matrix(inputs, members)
        if matrix is not None:  # members in the order of the matrix rows
            members = sorted(members, key=lambda form: matrix[1][id(form)])
        block = _rows_of_one_block(inputs, rows)
        if block is not None:
            inputs = sorted(inputs, key=lambda key: rows[key[0]][1])
        elif matrix is not None:
            inputs = sorted(inputs, key=lambda key: matrix[2][key])
        lifted = _lifted(members, statements)
        code, tables = _group_code(g, inputs, members, atoms, dtype,
                                   len(hoisted) + len(new_tables), block, lifted, matrix)
        new_tables.extend(tables)
        inserted[first].extend(ast.parse(code).body)
        result_block = f"{LIFTED}{g}" if lifted is not None else f"{PRODUCTS}{g}"
        for m, form in enumerate(members):
            row = ast.parse(f"{result_block}[{m}]", mode="eval").body
            if lifted is not None:
                statement = statements[form.home]
                replacements[id(statement.value)] = row
                rows[body.names[form.home]] = (result_block, m)
            else:
                replacements[id(form.node)] = row
        weights += len(members) * len(inputs)
    replace = _Replace(replacements)
    rewritten: list[ast.stmt] = []
    for k, statement in enumerate(statements):
        rewritten.extend(inserted.get(k, ()))
        rewritten.append(replace.visit(statement))
    rewritten.extend(inserted.get(len(statements), ()))
    result = replace.visit(returned)
    # drop what no longer feeds the result (the cut sums the products replaced)
    live = {n.id for n in ast.walk(result) if isinstance(n, ast.Name)}
    kept: list[ast.stmt] = []
    for statement in reversed(rewritten):
        target = statement.targets[0].id  # type: ignore[attr-defined]
        if target in live:
            live |= {n.id for n in ast.walk(statement.value) if isinstance(n, ast.Name)}  # type: ignore[attr-defined]
            kept.append(statement)
    kept.reverse()
    function.body = [*kept, result]
    # const args come first, in the order of `hoisted`; the tables go after them
    position = next(k for k, a in enumerate(function.args.args) if DATA_NAME.match(a.arg))
    function.args.args[position:position] = [ast.arg(name) for name, _ in new_tables]
    everything = tuple(range(len(entries)))
    hoisted.extend(HoistedLiteral(name, value, everything) for name, value in new_tables)
    ast.fix_missing_locations(module)
    return ContractedBody(len(chosen), sum(len(c[2]) for c in chosen), weights)


def _kept_as_blocks(chosen: list, forms: Sequence[_Form], statements: Sequence[ast.Assign],
                    returned: Sequence[ast.expr], body: _Body, uses: Counter) -> list:
    """The groups whose results stay arrays: each member is a returned value, or a local
    (`h = form` or `h = jnp.tanh(form)`) read only as an input of linear forms or as a
    returned entry.

    A group whose rows scalar code reads (a network Jacobian's `1 - h**2`) is left scalar:
    its rows would be written to memory and read back per entry, where the scalar body
    keeps them in registers (the 4-16-16-4 Jacobian ran 4.7 M samples/s contracted, 11
    scalar; docs/design/linear-forms.md).
    """
    # reads as an input of a linear form, contracted or not: a small output layer's
    # scalar sums read each row of the block before it once
    reads: Counter = Counter(name for form in forms for key in form.inputs for name in key)
    reads.update(entry.id for entry in returned if isinstance(entry, ast.Name))  # an entry

    def stays_an_array(form: _Form) -> bool:
        if form.home == len(statements):
            return True  # in the returned entries
        value = statements[form.home].value
        whole = value is form.node or (isinstance(value, ast.Call)
                                       and _lifted([form], statements) is not None)
        name = body.names[form.home]
        return whole and uses[name] == reads[name]

    return [group for group in chosen if all(stays_an_array(form) for form in group[2])]


def _one_matrix(inputs: Sequence[tuple[str, ...]], members: Sequence[_Form]
                ) -> tuple[str, dict[int, int], dict[tuple[str, ...], int]] | None:
    """(base, member -> row, input -> column) when the weights are the entries
    `base[row, column]` of one parameter matrix, one row per member and one column per
    input: a dense layer, whose weights are then the matrix itself (`base[:M, :N]`)."""
    base, row, column = None, {}, {}
    for form in members:
        for key, (number, keys) in form.inputs.items():
            if number != 1.0 or len(keys) != 1 or keys[0][0] != "e" or len(keys[0][2]) != 2:
                return None
            _, found, (i, j) = keys[0]
            if base not in (None, found) or row.setdefault(id(form), i) != i \
                    or column.setdefault(key, j) != j:
                return None
            base = found
    if sorted(row.values()) != list(range(len(members))) \
            or sorted(column.values()) != list(range(len(inputs))):
        return None
    return base, row, column  # type: ignore[return-value]


def _bias_vector(members: Sequence[_Form], atoms: _Atoms) -> str | None:
    """`base[:M]` (or `base[:M, 0]`) when member m's bias is the entry `base[m]`."""
    entries = set()
    for m, form in enumerate(members):
        if len(form.bias) != 1 or form.bias[0][1]:
            return None
        entry = _entry(form.bias[0][0])
        if entry is None or entry[1] not in ((m,), (m, 0)):
            return None
        entries.add((entry[0], len(entry[1])))
    if len(entries) != 1:
        return None
    base, rank = entries.pop()
    source = ast.unparse(members[0].bias[0][0].value)  # type: ignore[attr-defined]
    return f"{source}[:{len(members)}]" if rank == 1 else f"{source}[:{len(members)}, 0]"


def _rows_of_one_block(inputs: Sequence[tuple[str, ...]],
                       rows: dict[str, tuple[str, int]]) -> str | None:
    """The block whose rows are exactly these inputs (a layer's activations), if any."""
    if not all(len(key) == 1 and key[0] in rows for key in inputs):
        return None
    blocks = {rows[key[0]][0] for key in inputs}
    if len(blocks) != 1 or sorted(rows[key[0]][1] for key in inputs) != list(range(len(inputs))):
        return None
    return blocks.pop()


def _lifted(members: Sequence[_Form], statements: Sequence[ast.Assign]) -> str | None:
    """`jnp.tanh` (say) when every member is a whole statement `h = jnp.tanh(<form>)`."""
    found = set()
    for form in members:
        if form.home >= len(statements):
            return None
        value = statements[form.home].value
        if not (isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords
                and value.args[0] is form.node and isinstance(value.func, ast.Attribute)
                and isinstance(value.func.value, ast.Name) and value.func.value.id == "jnp"
                and value.func.attr in ELEMENTWISE):
            return None
        found.add(value.func.attr)
    return f"jnp.{found.pop()}" if len(found) == 1 else None


def _group_code(g: int, inputs: Sequence[tuple[str, ...]], members: Sequence[_Form],
                atoms: _Atoms, dtype: np.dtype, first_table: int, block: str | None,
                lifted: str | None, matrix: tuple | None,
                ) -> tuple[str, list[tuple[str, np.ndarray]]]:
    """The statements of group `g` and its const tables (name, value)."""
    tables: list[tuple[str, np.ndarray]] = []
    stacked = block or f"jnp.stack([{', '.join(' * '.join(key) for key in inputs)}])"
    code = f"{VALUES}{g} = {stacked}\n"
    in_order = matrix is not None and all(
        matrix[1][id(form)] == m for m, form in enumerate(members)) and all(
        matrix[2][key] == j for j, key in enumerate(inputs))
    if in_order:  # a dense layer: its weight matrix, no tables
        code += f"{WEIGHTS}{g} = {atoms.source[matrix[0]]}[:{len(members)}, :{len(inputs)}]\n"
    else:
        code += _gathered_weights(g, inputs, members, atoms, dtype, first_table, tables)
    products = f"jnp.tensordot({WEIGHTS}{g}, {VALUES}{g}, axes=1)"
    if any(form.bias for form in members):  # the biases join the products as one vector
        biases = _bias_vector(members, atoms) or "jnp.stack([{}])".format(
            ", ".join(_signed_sum(form.bias) for form in members))
        code += f"{BIASES}{g} = {biases}\n"
        products += (f" + jnp.reshape({BIASES}{g}, ({len(members)},) + (1,) * "
                     f"({VALUES}{g}.ndim - 1))")
    code += f"{PRODUCTS}{g} = {products}\n"
    if lifted is not None:
        code += f"{LIFTED}{g} = {lifted}({PRODUCTS}{g})\n"
    return code, tables


def _gathered_weights(g: int, inputs: Sequence[tuple[str, ...]], members: Sequence[_Form],
                      atoms: _Atoms, dtype: np.dtype, first_table: int,
                      tables: list[tuple[str, np.ndarray]]) -> str:
    """`_la<g>` (the parameter factors and numbers the weights use) and `_lw<g>` (the
    weights gathered from it), appending the index tables to `tables`."""

    def table(value: np.ndarray) -> str:
        name = f"{TABLE}{first_table + len(tables)}"
        tables.append((name, value))
        return name

    # the atoms the members' coefficients use and the numbers, in one vector `_la<g>`
    by_base: dict[str, list[tuple[int, ...]]] = defaultdict(list)
    others: list[str] = []
    seen: set[tuple] = set()
    for form in members:
        for _, keys in form.inputs.values():
            for key in keys:
                if key not in seen:
                    seen.add(key)
                    if key[0] == "e":
                        by_base[key[1]].append(key[2])
                    else:
                        others.append(key[1])
    position: dict[tuple, int] = {}
    pieces: list[str] = []
    for base, indices in by_base.items():
        name = table(np.array(indices, dtype=np.int32).T.copy())
        rank = len(indices[0])
        pieces.append(f"{atoms.source[base]}[{', '.join(f'{name}[{r}]' for r in range(rank))}]")
        position.update({("e", base, index): len(position) + k for k, index in enumerate(indices)})
    if others:
        pieces.append(f"jnp.stack([{', '.join(atoms.source[o] for o in others)}])")
        position.update({("o", o): len(position) + k for k, o in enumerate(others)})
    numbers = sorted({number for form in members for number, _ in form.inputs.values()} | {1.0})
    constants = table(np.asarray(numbers, dtype=dtype))
    pieces.append(constants)
    at_number = {v: len(position) + k for k, v in enumerate(numbers)}
    width = max(len(keys) for form in members for _, keys in form.inputs.values())
    scaled = any(number != 1.0 for form in members for number, _ in form.inputs.values())
    where = np.empty((width + scaled, len(members), len(inputs)), dtype=np.int32)
    for m, form in enumerate(members):
        for j, key in enumerate(inputs):
            number, keys = form.inputs[key]
            row = [position[k] for k in keys] + [at_number[1.0]] * (width - len(keys))
            where[:, m, j] = row + [at_number[number]] if scaled else row
    if where.shape[0] == 0:  # every weight is 1
        where = np.full((1, len(members), len(inputs)), at_number[1.0], dtype=np.int32)
    lookup = table(where)
    weights = " * ".join(f"{ATOMS}{g}[{lookup}[{r}]]" for r in range(where.shape[0]))
    return (f"{ATOMS}{g} = jnp.concatenate([{', '.join(pieces)}]).astype({constants}.dtype)\n"
            f"{WEIGHTS}{g} = {weights}\n")


#: the local function a tiled body runs per chunk, its input rows and its output rows
TILE, TILE_ROWS, TILE_OUT = "_lt", "_ltr", "_lto"
#: samples per chunk of a tiled body: the 8-32-32-8 network Jacobian ran 1.05 M samples/s
#: at 1,024, 1.6 at 4,096, 1.4 at 16,384 and 0.97 unchunked (hand-written jax 1.08)
TILE_CHUNK = 4096


def is_tiled(module: ast.Module) -> bool:
    """Whether `module` is a kernel `tile` rewrote (it holds the local function `_lt`)."""
    function = module.body[0]
    return isinstance(function, ast.FunctionDef) and any(
        isinstance(statement, ast.FunctionDef) and statement.name == TILE
        for statement in function.body)


def tile(module: ast.Module) -> bool:
    """Rewrite a contracted `module` in place to run TILE_CHUNK samples at a time.

    The body's data reads (`_d0 = x1[..., 0]`, …) become rows of one `(reads, *batch)`
    array, the rest of the body a local function of a chunk of it, and `vec.chunked`
    maps that function over the chunks (`lax.map`), so a group's `(members, chunk)` blocks
    stay in cache. Returns False, leaving `module` alone, when the body reads a data
    argument anywhere but in its leading reads.
    """
    function = kernel_function(module, RULE)
    returned = return_statement(function, RULE)
    data = {a.arg for a in function.args.args if DATA_NAME.match(a.arg)}
    statements = function.body[:-1]
    reads = 0
    while reads < len(statements) and any(
            isinstance(n, ast.Name) and n.id in data for n in ast.walk(statements[reads])):
        reads += 1
    rest = statements[reads:]
    if not reads or any(isinstance(n, ast.Name) and n.id in data
                        for statement in [*rest, returned] for n in ast.walk(statement)):
        return False
    names = [s.targets[0].id for s in statements[:reads]]  # type: ignore[attr-defined]
    entries = returned_entries(returned.value)
    count = len(entries)
    header = [f"{name} = {TILE_ROWS}[{k}]" for k, name in enumerate(names)]
    outputs = ", ".join(f"jnp.broadcast_to({ast.unparse(e)}, {TILE_ROWS}.shape[1:])"
                        for e in entries)
    local = ast.parse(f"def {TILE}({TILE_ROWS}):\n"
                      + "".join(f"    {line}\n" for line in header)
                      + f"    return jnp.stack([{outputs}])\n").body[0]
    local.body[reads:reads] = rest  # type: ignore[attr-defined]
    stacked = ast.parse(f"{TILE_ROWS} = jnp.stack(jnp.broadcast_arrays({', '.join(names)}))\n"
                        f"{TILE_OUT} = vec.chunked({TILE}, {TILE_ROWS}, {TILE_CHUNK})\n"
                        f"return {', '.join(f'{TILE_OUT}[{k}]' for k in range(count))}"
                        + ("," if count == 1 and isinstance(returned.value, ast.Tuple) else "")
                        ).body
    function.body = [*statements[:reads], local, *stacked]
    ast.fix_missing_locations(module)
    return True
