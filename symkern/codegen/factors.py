"""codegen, stage 3 helper: a product's factors that do not read the data multiplied first.

Imports ast and symkern.codegen.operations. SymPy's printer orders a product's factors by
their printed names, and the kernel's names put a parameter read (`ps['l1']`) after the
per-sample values (`_c1`, `_d2`), so `2 * _c1 * _c9 * _d2 * ps['l1']` multiplies the whole
batch four times, where `2 * ps['l1'] * _c1 * _c9 * _d2` multiplies two numbers once and the
batch three times (the double pendulum's body: 8 batch-wide multiplications more, 0.93x its
throughput). The `scalar_factors_first` pass (symkern.codegen.passes) moves, in every chain of `*`, the
factors that read no per-sample value to the front, keeping the order within each group
(a leading minus sign goes to the first of them).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from symkern.codegen.operations import reads_values_of


def _chain(node: ast.expr) -> list[ast.expr]:
    """The factors of a left-nested chain of `*` (one factor for anything else)."""
    factors = []
    while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        factors.append(node.right)
        node = node.left
    factors.append(node)
    return factors[::-1]


class _Reorder(ast.NodeTransformer):
    def __init__(self, per_sample: set[str]) -> None:
        self.per_sample = per_sample
        self.changed = 0

    def reads_data(self, node: ast.AST) -> bool:
        return reads_values_of(node, self.per_sample)

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        if not isinstance(node.op, ast.Mult):
            self.generic_visit(node)
            return node
        factors = [self.visit(f) for f in _chain(node)]
        reads = [self.reads_data(f) for f in factors]
        first = factors[0]
        if (isinstance(first, ast.UnaryOp) and isinstance(first.op, ast.USub) and reads[0]
                and not all(reads)):
            # `-_c13 * _c2 * ps['l1']`: the sign goes to the first scalar (-ps['l1'])
            scalar = reads.index(False)
            factors = [first.operand, *factors[1:]]
            factors[scalar] = ast.UnaryOp(ast.USub(), factors[scalar])
        ordered = ([f for f, r in zip(factors, reads, strict=True) if not r]
                   + [f for f, r in zip(factors, reads, strict=True) if r])
        if [id(f) for f in ordered] != [id(f) for f in factors]:
            self.changed += 1
        result = ordered[0]
        for factor in ordered[1:]:
            result = ast.BinOp(result, ast.Mult(), factor)
        return result


def scalar_factors_first(module: ast.Module, data_names: Sequence[str]) -> int:
    """Reorder every `*` chain of the kernel function in place (see the module docstring);
    how many chains changed. A local is per-sample when its value reads a data argument or
    another per-sample local."""
    function = next(node for node in module.body if isinstance(node, ast.FunctionDef))
    reorder = _Reorder(set(data_names))
    for statement in function.body:
        for node in ast.walk(statement):  # nested functions (materialize's levels) too
            if isinstance(node, ast.Assign):
                targets = [t for t in node.targets if isinstance(t, (ast.Name, ast.Tuple))]
                names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
                if reorder.reads_data(node.value):
                    reorder.per_sample.update(names)
    # a name assigned from per-sample values anywhere (a level's outputs unpacked) reads data
    function.body = [reorder.visit(statement) for statement in function.body]
    ast.fix_missing_locations(module)
    return reorder.changed
