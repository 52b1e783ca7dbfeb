"""Walking SymPy expression DAGs without recursion.

SymPy's own traversals (`preorder_traversal`, `has`, `atoms`) visit a shared
sub-expression once per path to it, so on a DAG such as a network's Jacobian they visit
exponentially many nodes; they also recurse on depth.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import sympy as sp


def walk(roots: Sequence[sp.Basic]) -> Iterator[sp.Basic]:
    """Every node under `roots`, each object once, without recursion, parents before
    children and roots in order.

    Objects are told apart by identity: SymPy's own `==` and `hash` recurse on depth.
    """
    seen: set[int] = set()
    stack = list(reversed(roots))
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(reversed(node.args))


def holds(roots: Sequence[sp.Basic], classes: type | tuple[type, ...]) -> bool:
    """Whether a node under `roots` is an instance of `classes`."""
    return any(isinstance(node, classes) for node in walk(roots))
