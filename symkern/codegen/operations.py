"""codegen helper: how many operations a piece of generated code holds.

Imports ast only. The measure of a body's size that decides splitting
(symkern.kernels.split) and vectorizing (symkern.codegen.vectorize): XLA's CPU compile
time grows with it.
"""

from __future__ import annotations

import ast
from collections.abc import Container

#: AST nodes counted as one operation by `operation_count`
_OPERATIONS = (ast.BinOp, ast.UnaryOp, ast.Call, ast.Compare, ast.BoolOp)


def operation_count(node: ast.AST) -> int:
    """Operations in one statement: each operator, call and comparison counts one."""
    return count_and_reads(node)[0]


def exceeds_operations(node: ast.AST, limit: int) -> bool:
    """Whether `node` holds more than `limit` operations; stops counting once it does
    (deciding to split a 10^5-op body took a whole walk before split_module's own)."""
    count = 0
    for current in ast.walk(node):
        if isinstance(current, _OPERATIONS):
            count += 1
            if count > limit:
                return True
    return False


def count_and_reads(node: ast.AST) -> tuple[int, set[str]]:
    """`operation_count(node)` and the names it loads, in one walk (a 10^5-op body has
    600k nodes: each separate walk cost ~0.5 s)."""
    count, reads, stack = 0, set(), [node]
    operations, name, load = _OPERATIONS, ast.Name, ast.Load
    while stack:
        current = stack.pop()
        if isinstance(current, operations):
            count += 1
        elif isinstance(current, name):
            if isinstance(current.ctx, load):
                reads.add(current.id)
            continue
        for field_name in current._fields:
            value = getattr(current, field_name, None)
            if isinstance(value, ast.AST):
                stack.append(value)
            elif isinstance(value, list):
                stack.extend(item for item in value if isinstance(item, ast.AST))
    return count, reads



def read_counts(node: ast.AST) -> dict[str, int]:
    """How often each name is loaded under `node`, in one walk (as `count_and_reads`)."""
    counts: dict[str, int] = {}
    stack, name, load = [node], ast.Name, ast.Load
    while stack:
        current = stack.pop()
        if isinstance(current, name):
            if isinstance(current.ctx, load):
                counts[current.id] = counts.get(current.id, 0) + 1
            continue
        for field_name in current._fields:
            value = getattr(current, field_name, None)
            if isinstance(value, ast.AST):
                stack.append(value)
            elif isinstance(value, list):
                stack.extend(item for item in value if isinstance(item, ast.AST))
    return counts


def reads_values_of(node: ast.AST, names: Container[str]) -> bool:
    """Whether `node` reads the value of one of `names` (reading its `.shape`, as the
    broadcast of a constant output does, is not reading its values)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Attribute) and current.attr == "shape":
            continue
        if isinstance(current, ast.Name) and current.id in names:
            return True
        stack.extend(ast.iter_child_nodes(current))
    return False
