"""codegen, stage 2 rule: long sums of scalar parameters as sums over the packed buffer.

Imports ast, collections, symkern.codegen.operations and symkern.codegen.rules; nothing
from jax (the rewritten code calls `ps.sum_slices`, which symkern.batching.packing
implements).

Why: a kernel whose parameters are packed into one buffer (symkern.batching.packing) reads
each scalar leaf as a slice of it. A sum of 10^5 such leaves (`x * Add(*p)`) is then 10^5
slices and 10^5 additions, which JAX traces and XLA compiles one at a time: at 10^4
parameters that was 27 s of the first call. The emitter cuts such a sum into statements of
a few dozen terms (`_c0 = ps['p0'] + ps['p1005'] + ...`, then `_c80 = _c0 + _c1 + ...`);
this rule takes a chain of additions whose terms are scalar parameter reads, or locals read
once that are such sums themselves, and sums the leaves' entries of the buffer instead:
`ps.sum_slices((0, 100000))`, one reduction per run of consecutive entries. The other terms
of the chain stay as they are.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Sequence
from typing import Any

from symkern.codegen.operations import read_counts
from symkern.codegen.rules import KERNEL_NAME

#: a chain of additions is rewritten when it sums at least this many scalar parameter
#: entries (directly, or through the locals it absorbs). Two terms already trace and compile
#: as many operations as one run's slice and reduction; below eight the body is small
#: whatever it reads, and its source stays as SymPy printed it
PACKED_SUM_MIN_TERMS = 8
#: the packed buffer's method the rewritten code calls (symkern.batching.packing)
SUM_SLICES = "sum_slices"


def _terms(node: ast.expr) -> list[ast.expr]:
    """The terms of a chain of `+` (left- or right-nested), in order."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _terms(node.left) + _terms(node.right)
    return [node]


def parameter_path(node: ast.expr) -> tuple | None:
    """`ps['L1']['b']` → ('L1', 'b'); None for anything else."""
    keys: list[Any] = []
    while isinstance(node, ast.Subscript):
        if not isinstance(node.slice, ast.Constant):
            return None
        keys.append(node.slice.value)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "ps" and keys:
        return tuple(reversed(keys))
    return None


def _runs(offsets: Sequence[int]) -> list[tuple[int, int]]:
    """Entries (with repeats) as `[start, stop)` runs of consecutive entries, each entry
    covered as often as it occurs."""
    runs: list[tuple[int, int]] = []
    remaining = Counter(offsets)
    while remaining:
        layer = sorted(remaining)
        start = previous = layer[0]
        for offset in layer[1:]:
            if offset != previous + 1:
                runs.append((start, previous + 1))
                start = offset
            previous = offset
        runs.append((start, previous + 1))
        remaining = Counter({k: v - 1 for k, v in remaining.items() if v > 1})
    return runs


def _call(runs: Sequence[tuple[int, int]]) -> ast.expr:
    return ast.Call(ast.Attribute(ast.Name("ps", ast.Load()), SUM_SLICES, ast.Load()),
                    [ast.Tuple([ast.Constant(start), ast.Constant(stop)], ast.Load())
                     for start, stop in runs], [])


def sum_packed_parameters(module: ast.Module, scalar_offsets: dict[tuple, int]) -> int:
    """Rewrite, in place, each chain of additions of at least PACKED_SUM_MIN_TERMS scalar
    parameter entries as `ps.sum_slices(...)` plus its other terms; returns how many chains.

    `scalar_offsets` maps a scalar leaf's path to its entry in the packed buffer. A local
    whose value is a pure sum of parameter entries and that is read once, as a term of a
    rewritten chain, is absorbed into it (its statement removed).

    >>> import ast
    >>> src = "def kernel(x1, ps):\\n    _c0 = " + " + ".join(f"ps['p{k}']" for k in range(8)) \\
    ...     + "\\n    return (x1[..., 0] * _c0,)"
    >>> module = ast.parse(src)
    >>> sum_packed_parameters(module, {(f"p{k}",): k for k in range(8)})
    1
    >>> print(ast.unparse(module))
    def kernel(x1, ps):
        _c0 = ps.sum_slices((0, 8))
        return (x1[..., 0] * _c0,)
    """
    functions = [s for s in module.body if isinstance(s, ast.FunctionDef)]
    if len(functions) != 1 or functions[0].name != KERNEL_NAME:
        return 0
    function = functions[0]
    uses = read_counts(function)
    #: locals whose value is a sum of parameter entries only: their entries
    pure: dict[str, list[int]] = {}
    absorbed: set[str] = set()
    rewritten = 0

    def split(terms: Sequence[ast.expr]) -> tuple[list[int], list[str], list[ast.expr]]:
        """A chain's terms → (parameter entries, pure locals read once, the other terms)."""
        offsets: list[int] = []
        names: list[str] = []
        others: list[ast.expr] = []
        for term in terms:
            path = parameter_path(term)
            if path is not None and path in scalar_offsets:
                offsets.append(scalar_offsets[path])
            elif isinstance(term, ast.Name) and term.id in pure and uses.get(term.id, 0) == 1:
                offsets += pure[term.id]
                names.append(term.id)
            else:
                others.append(term)
        return offsets, names, others

    class Chains(ast.NodeTransformer):
        def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
            nonlocal rewritten
            if not isinstance(node.op, ast.Add):
                return self.generic_visit(node)
            offsets, names, others = split(_terms(node))
            if len(offsets) < PACKED_SUM_MIN_TERMS:
                return self._terms_visited(node)
            absorbed.update(names)
            rewritten += 1
            result: ast.expr = _call(_runs(offsets))
            for term in others:
                result = ast.BinOp(result, ast.Add(), self.visit(term))
            return result

        def _terms_visited(self, node: ast.expr) -> ast.expr:
            # a chain kept as it is, association and all; its terms may hold chains
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
                node.left = self._terms_visited(node.left)
                node.right = self._terms_visited(node.right)
                return node
            return self.visit(node)

    visitor = Chains()
    for statement in function.body:
        if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)):
            offsets, _, others = split(_terms(statement.value))
            if offsets and not others:
                pure[statement.targets[0].id] = offsets
        before = rewritten
        visitor.visit(statement)
        if rewritten != before:
            ast.fix_missing_locations(statement)  # its new nodes; the rest have theirs
    function.body = [statement for statement in function.body
                     if not (isinstance(statement, ast.Assign)
                             and isinstance(statement.targets[0], ast.Name)
                             and statement.targets[0].id in absorbed)]
    return rewritten
