"""codegen, stage 2 rule: compute each costly value that several outputs share once.

Imports ast and the codegen helpers; nothing from jax (the rewritten code calls `lax.cond`).

Why: XLA's CPU fusion copies an elementwise producer into every consumer fusion whose
inputs are no larger than its output, whatever the producer costs. A kernel returns its
entries as separate arrays (ANCHORS.md: stacking them inside one fusion is far worse), so a
`cos(q1)` read by 30 entries of a mass matrix is evaluated in each of their fusions:
the 3-link pendulum on a cart ran 36 sines and cosines per sample for its 6
(docs/design/shared-values.md). `lax.optimization_barrier` does not stop
it (XLA's CPU pipeline removes barriers before fusion); a conditional does: fusion never
crosses into or out of a branch. So the costly shared values are computed in
`lax.cond(p, f, f)` — both branches the same function, so the result does not depend on
`p` — and the entries read them from memory. `p` reads one element of the first data
argument, so XLA cannot fold the conditional away; under `jax.vmap` the conditional
becomes a select of two identical computations, which XLA merges again.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Sequence

from symkern.codegen.callee import COSTLY_TARGETS
from symkern.codegen.operations import count_and_reads
from symkern.codegen.rules import KERNEL_NAME, kernel_function, returned_entries, single_assignments
from symkern.errors import CodegenDriftError

#: calls that cost a polynomial evaluation or more per element: the callee table's costly
#: rows, and the calls the rules write themselves
COSTLY_CALLS = COSTLY_TARGETS | {"jnp.cbrt", "jnp.power", "jnp.float_power", "jnp.divide",
                                 "jnp.true_divide"}
#: prefix of the local functions that compute one level of shared values
STAGE_PREFIX = "_m"
#: the local holding the conditional's predicate
PREDICATE = "_mp"
RULE = "materialize_shared"


def _reads_any(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _constant(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    return isinstance(node, ast.Constant)


def is_costly(node: ast.AST, batched: set[str]) -> bool:
    """Whether an expression holds, on a value that reads one of the `batched` names, a
    call or operator that XLA should not repeat in every fusion: a costly `jnp` function,
    any `jsp` or user function, a division or `%` by a non-constant, `**`, or
    `lax.integer_pow` with a negative exponent (a reciprocal)."""
    for current in ast.walk(node):
        if isinstance(current, ast.BinOp):
            if (isinstance(current.op, (ast.Div, ast.Mod)) and not _constant(current.right)
                    or isinstance(current.op, ast.Pow)) and _reads_any(current, batched):
                return True
            continue
        if not isinstance(current, ast.Call):
            continue
        func = current.func
        if isinstance(func, ast.Subscript):  # functions['name'](...)
            costly = True
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            root, name = func.value.id, func.attr
            costly = root == "jsp" or f"{root}.{name}" in COSTLY_CALLS or (
                root == "lax" and name == "integer_pow" and len(current.args) == 2
                and isinstance(current.args[1], ast.UnaryOp)
                and isinstance(current.args[1].op, ast.USub))
        else:
            costly = False
        if costly and _reads_any(current, batched):
            return True
    return False


def materialize_shared(module: ast.Module, data_names: Sequence[str]) -> ast.Module | None:
    """`module` with every costly, data-dependent value that two or more returned entries
    read (directly or through other locals) computed once inside `lax.cond`; None when the
    body has no such value or is not a straight-line scalar body.

    Values that depend on each other go to successive levels, one conditional each.
    """
    function = kernel_function(module, RULE)
    if function.name != KERNEL_NAME:
        raise CodegenDriftError(f"{RULE}: expected the function {KERNEL_NAME}(...), "
                                f"found {function.name}")
    body = single_assignments(function, RULE)
    if body is None or not data_names:
        return None
    statements, ret = body
    names = [s.targets[0].id for s in statements]  # type: ignore[attr-defined]
    index = {name: k for k, name in enumerate(names)}
    reads = [count_and_reads(s.value)[1] for s in statements]
    data = set(data_names)
    batched = [False] * len(statements)
    for k, read in enumerate(reads):
        batched[k] = bool(read & data) or any(batched[index[r]] for r in read if r in index)
    # which entries each local reaches: a bit per entry, propagated backwards
    reach = [0] * len(statements)
    for e, entry in enumerate(returned_entries(ret.value)):
        for r in count_and_reads(entry)[1]:
            if r in index:
                reach[index[r]] |= 1 << e
    for k in range(len(statements) - 1, -1, -1):
        for r in reads[k]:
            if r in index:
                reach[index[r]] |= reach[k]
    batched_names = data | {names[k] for k in range(len(statements)) if batched[k]}
    shared = [batched[k] and reach[k] & (reach[k] - 1) != 0
              and is_costly(statements[k].value, batched_names) for k in range(len(statements))]
    if not any(shared):
        return None
    # level: 1 + the highest level of a shared value it reads, through any locals
    depth = [0] * len(statements)  # levels of shared values a local depends on, plus one
    level: dict[int, int] = {}
    for k, read in enumerate(reads):
        d = 0
        for r in read:
            j = index.get(r)
            if j is not None:
                d = max(d, level[j] + 1 if j in level else depth[j])
        depth[k] = d
        if shared[k]:
            level[k] = d
    prelude: list[ast.stmt] = [ast.parse(
        f"{PREDICATE} = jnp.isnan(jnp.sum(jnp.ravel({data_names[0]})[:1]))").body[0]]
    for lvl in range(max(level.values()) + 1):
        targets = [k for k in sorted(level) if level[k] == lvl]
        if not targets:
            continue
        needed, stack = set(targets), list(targets)
        while stack:  # the locals these values are computed from, stopping at earlier levels
            for r in reads[stack.pop()]:
                j = index.get(r)
                if j is not None and j not in needed and j not in level:
                    needed.add(j)
                    stack.append(j)
        stage = f"{STAGE_PREFIX}{lvl}"
        outputs = ", ".join(names[k] for k in targets)
        inner = [copy.deepcopy(statements[k]) for k in sorted(needed)]
        definition = ast.parse(f"def {stage}():\n    return ({outputs},)").body[0]
        definition.body[:0] = inner  # type: ignore[attr-defined]
        prelude.append(definition)
        prelude.append(ast.parse(f"({outputs},) = lax.cond({PREDICATE}, {stage}, {stage})").body[0])
    live = set().union(*(count_and_reads(e)[1] for e in returned_entries(ret.value)))
    rest: list[ast.stmt] = []
    for k in range(len(statements) - 1, -1, -1):  # what the entries still read, in order
        if names[k] in live and k not in level:
            live |= reads[k]
            rest.append(statements[k])
    rest.reverse()
    rewritten = copy.copy(function)
    rewritten.body = prelude + rest + [ret]
    module = copy.copy(module)
    module.body = [rewritten if s is function else s for s in module.body]
    return module
