"""codegen, stage 1 helper: bounded-depth assignments (+ CSE) for huge SymPy expressions.
Nothing here recurses on expression depth; imports sympy only.
"""

# Why: SymPy's printer, ``ast.parse`` and ``compile`` all recurse on the nesting depth of
# one expression (sympy#24673: RecursionError near 10^5 operations), and a flat Add of N
# terms prints as ``a0 + a1 + ...``, which Python parses into an N-deep left-nested BinOp
# chain (``compile`` of that tree fails near N = 1000 at the default recursion limit).
# ``sympy.cse`` and ``preorder_traversal``/``postorder_traversal`` are recursive too
# (nested generators). ``linearize`` turns expressions into ``(replacements, reduced)``,
# the convention of ``sympy.cse(exprs, list=True)``, with every right-hand side of bounded
# depth, optionally sharing every repeated subexpression (hash-consing).
#
# Every walk below uses an explicit stack. SymPy itself is only called on single nodes
# (``.args``, hashing an atom) or on rebuilt nodes whose depth is already bounded, never
# on a whole deep input tree (``==``, ``hash``, ``xreplace``, assumptions all recurse).

from __future__ import annotations

from collections.abc import Iterator, Sequence

import sympy
from sympy.core.basic import _args_sortkey
from sympy.core.function import Function
from sympy.functions.elementary.miscellaneous import MinMaxBase
from sympy.matrices.expressions.matexpr import MatrixElement, MatrixSymbol
from sympy.tensor.indexed import Idx, Indexed, IndexedBase

__all__ = ["count_operations", "expression_depth", "linearize"]

# Node kinds of the hash-consed DAG.
_ATOM = 0  # never hoisted, never entered: Symbol, number, Indexed read, MatrixElement...
_NORMAL = 1  # Add/Mul/Pow/function application: args may be replaced by symbols
_OPAQUE = 2  # Piecewise, relational, boolean, anything unknown: kept whole, hoistable whole

# Bare index reads must stay inline: a later rule (index_by_batch) rewrites ``x[i]`` and
# rejects any other use of a data argument, so ``c0 = x[3]`` must never be emitted.
_ATOM_TYPES = (Indexed, IndexedBase, Idx, MatrixElement, MatrixSymbol)
# Node types whose arguments may be swapped for symbols without changing their meaning.
_NORMAL_TYPES = (sympy.Add, sympy.Mul, sympy.Pow, Function, MinMaxBase)


# Per-type facts, cached: what the kind of a node is when its type alone decides it, and
# whether the type carries state beyond its args (then the key must include it).
_TYPE_KIND: dict[type, int | None] = {}
_TYPE_EXTRA: dict[type, bool] = {}
_PLAIN_CONTENT = (sympy.Basic._hashable_content, sympy.Expr._hashable_content)


def _static_kind(cls: type) -> int | None:
    kind = _TYPE_KIND.get(cls, -1)
    if kind == -1:
        if cls.is_Atom or issubclass(cls, _ATOM_TYPES):
            kind = _ATOM
        elif issubclass(cls, (sympy.Add, sympy.Mul, sympy.Pow)):
            kind = _NORMAL  # their args are always Expr
        elif issubclass(cls, _NORMAL_TYPES) and not issubclass(cls, sympy.Piecewise):
            kind = None  # a function application: NORMAL only if every arg is an Expr
        else:
            kind = _OPAQUE
        _TYPE_KIND[cls] = kind
        _TYPE_EXTRA[cls] = cls._hashable_content not in _PLAIN_CONTENT
    return kind


def _kind(node: sympy.Basic) -> int:
    kind = _static_kind(type(node))
    if kind is None:
        args = node.args
        if not args:
            return _ATOM
        return _NORMAL if all(isinstance(a, sympy.Expr) for a in args) else _OPAQUE
    if kind != _ATOM and not node.args:
        return _ATOM
    return kind


def _weight(node: sympy.Basic, nargs: int) -> int:
    """Levels one node adds to the printed nesting depth.

    ``a + b + c`` parses as ``(a + b) + c``: an Add of k terms is k - 1 nested BinOps.
    A Mul of k factors may also print a unary minus or a division, hence k.
    """
    if isinstance(node, sympy.Add):
        return max(1, nargs - 1)
    if isinstance(node, sympy.Mul):
        return max(1, nargs)
    return 1


class _Dag:
    """Hash-consed DAG of a list of expressions, built by one iterative post-order walk.

    Nodes are numbered in post-order (children before parents). Structural identity is
    decided on ``(type, child ids)`` keys, never with SymPy's ``==``/``hash`` on a whole
    subtree (both recurse on depth when objects are equal but not identical).
    """

    def __init__(self, exprs: Sequence[sympy.Basic]) -> None:
        self.nodes: list[sympy.Basic] = []
        self.children: list[tuple[int, ...]] = []
        self.kinds: list[int] = []
        self.depths: list[int] = []  # expression_depth of the whole subtree
        self.symbols: set[sympy.Basic] = set()  # free Symbol atoms, to avoid name clashes
        self.roots: list[int] = []
        self.pair_made: set[int] = set()  # nodes added by _share_pairs
        by_key: dict[tuple, int] = {}
        by_obj: dict[int, int] = {}  # id(object) -> node id; self.exprs keeps them alive
        self.exprs = [sympy.sympify(e) for e in exprs]
        nodes, children, kinds, depths = self.nodes, self.children, self.kinds, self.depths
        for expr in self.exprs:
            # Entries: (node, None) on the way down, (node, kind) once its args are queued.
            stack: list[tuple[sympy.Basic, int | None]] = [(expr, None)]
            while stack:
                node, kind = stack.pop()
                if id(node) in by_obj:
                    continue
                if kind is None:
                    kind = _kind(node)
                    if kind != _ATOM:
                        stack.append((node, kind))
                        stack.extend(
                            (a, None) for a in reversed(node.args) if id(a) not in by_obj
                        )
                        continue
                cls = type(node)
                if kind == _ATOM:
                    # Atoms are shallow, so hashing them is safe; the type is part of the
                    # key because Float(2.0) and Integer(2) hash alike.
                    key: tuple = (cls, node)
                    child_ids: tuple[int, ...] = ()
                    if isinstance(node, sympy.Symbol):
                        self.symbols.add(node)
                else:
                    child_ids = tuple([by_obj[id(a)] for a in node.args])
                    key = (cls, child_ids)
                    if _TYPE_EXTRA[cls]:
                        # A class carrying more than its args (rare): keep that too.
                        key = (cls, child_ids, node._hashable_content())
                nid = by_key.get(key)
                if nid is None:
                    nid = len(nodes)
                    by_key[key] = nid
                    nodes.append(node)
                    children.append(child_ids)
                    kinds.append(kind)
                    if child_ids:
                        deepest = max([depths[c] for c in child_ids])
                        depths.append(deepest + _weight(node, len(child_ids)))
                    else:
                        depths.append(0)
                by_obj[id(node)] = nid
            self.roots.append(by_obj[id(expr)])


def expression_depth(expr: sympy.Basic) -> int:
    """Printed nesting depth bound of ``expr``, computed without recursion.

    Atoms (symbols, numbers, ``Indexed``) count 0; an Add of k terms counts k - 1 (the
    BinOp chain Python builds), a Mul of k factors k, anything else 1 per level.

    >>> import sympy as sp
    >>> x, y, z = sp.symbols("x y z")
    >>> expression_depth(sp.sin(x + y + z))
    3
    """
    dag = _Dag([expr])
    return dag.depths[dag.roots[0]]


def count_operations(exprs: Sequence[sympy.Basic], *, dag: bool = False) -> int:
    """Number of arithmetic operations in ``exprs``, computed without recursion.

    An Add or Mul of k args counts k - 1, anything else that is not an atom counts 1
    (Piecewise, relationals and booleans are entered and counted like the rest).
    ``dag=False`` counts every occurrence like ``sympy.count_ops`` does on a tree (the
    count can be astronomically large for shared DAGs; Python ints do not overflow);
    ``dag=True`` counts each distinct subexpression once, i.e. the cost after perfect CSE.
    For ``(replacements, reduced)`` pass ``[rhs for _, rhs in replacements] + reduced``.

    >>> import sympy as sp
    >>> x, y = sp.symbols("x y")
    >>> count_operations([sp.sin(x) * y + sp.sin(x)])
    4
    >>> count_operations([sp.sin(x) * y + sp.sin(x)], dag=True)
    3
    """
    d = _Dag(list(exprs))
    own = _own_operations(d)
    if dag:
        return _dag_operations(d, own)
    tree = [0] * len(d.nodes)
    for nid, kids in enumerate(d.children):
        tree[nid] = own[nid] + sum(tree[c] for c in kids)
    return sum(tree[r] for r in d.roots)


def _own_operations(d: _Dag) -> list[int]:
    """Operations each node adds on its own: k - 1 for an Add/Mul of k args, else 1."""
    own = []
    for node, kids in zip(d.nodes, d.children, strict=True):
        if not kids:
            own.append(0)
        elif isinstance(node, (sympy.Add, sympy.Mul)):
            own.append(len(kids) - 1)
        else:
            own.append(1)
    return own


def _dag_operations(d: _Dag, own: list[int]) -> int:
    """Each distinct node reachable from a root, once (children have smaller ids)."""
    live = [False] * len(d.nodes)
    for r in d.roots:
        live[r] = True
    for nid in range(len(d.nodes) - 1, -1, -1):
        if live[nid]:
            for c in d.children[nid]:
                live[c] = True
    return sum(o for o, alive in zip(own, live, strict=True) if alive)


def _references(dag: _Dag, order: list[int]) -> list[int]:
    """How often each node is referenced through NORMAL parents (OPAQUE subtrees are never
    entered; 0 = not reached): a node referenced more than once is a common subexpression.
    ``order`` lists children before parents."""
    refs = [0] * len(dag.nodes)
    for r in dag.roots:
        refs[r] += 1
    for nid in reversed(order):  # parents before children
        if refs[nid] and dag.kinds[nid] == _NORMAL:
            for c in dag.children[nid]:
                refs[c] += 1
    return refs


# Pair counting is quadratic in the number of args of one node and repeats every round:
# bound the work (a wide sum of 10^6 three-factor terms is 3e6 pairs a round).
_MAX_PAIR_ARGS = 64
_MAX_PAIRS_PER_ROUND = 10_000_000
_MAX_PAIR_ROUNDS = 32


def _share_pairs(dag: _Dag, refs: list[int]) -> list[int]:
    """Greedy pair merging over commutative Add/Mul arg sets (in place on ``dag``).

    Each round counts, for every reached Add (resp. Mul), every pair of its args, then --
    most frequent first -- replaces a pair found in at least two nodes by a new (or the
    existing) two-arg node. Repeats until no pair is shared. Returns a new topological
    order (children before parents), since new nodes are appended at the end.
    """
    members: dict[int, dict[int, None]] = {}  # node -> its args, an ordered set
    where: dict[tuple[type, int], dict[int, None]] = {}  # (class, arg) -> nodes holding it
    pair_node: dict[tuple[type, int, int], int] = {}  # (class, a, b), a < b -> 2-arg node
    eligible = [
        nid
        for nid, node in enumerate(dag.nodes)
        if refs[nid]
        and dag.kinds[nid] == _NORMAL
        and type(node) in (sympy.Add, sympy.Mul)
        and node.is_commutative
        and 2 <= len(dag.children[nid]) <= _MAX_PAIR_ARGS
        and len(set(dag.children[nid])) == len(dag.children[nid])
    ]
    # Within the per-round budget, prefer small nodes (most sharing is among small terms).
    max_args = _MAX_PAIR_ARGS
    while max_args > 2 and sum(
        k * (k - 1) // 2 for k in (len(dag.children[i]) for i in eligible) if k <= max_args
    ) > _MAX_PAIRS_PER_ROUND:
        max_args //= 2
    for nid in eligible:
        node, kids = dag.nodes[nid], dag.children[nid]
        if len(kids) <= max_args:
            cls = type(node)
            members[nid] = dict.fromkeys(kids)
            for c in kids:
                where.setdefault((cls, c), {})[nid] = None
            if len(kids) == 2:
                pair_node.setdefault((cls, min(kids), max(kids)), nid)
    changed = False
    for _ in range(_MAX_PAIR_ROUNDS):
        counts: dict[tuple[type, int, int], int] = {}
        for nid, kids in members.items():
            cls = type(dag.nodes[nid])
            ks = sorted(kids)
            for i, a in enumerate(ks):
                for b in ks[i + 1 :]:
                    key = (cls, a, b)
                    counts[key] = counts.get(key, 0) + 1
        candidates = sorted(
            (k for k, v in counts.items() if v > 1),
            key=lambda k: (-counts[k], k[0].__name__, k[1], k[2]),
        )
        merged = False
        for cls, a, b in candidates:
            # Counts are from the start of the round: re-check who still holds both.
            existing = pair_node.get((cls, a, b))
            targets = [
                m for m in where.get((cls, a), {}) if b in members[m] and m != existing
            ]
            if len(targets) + (existing is not None) < 2:
                continue
            if existing is None:
                existing = len(dag.nodes)
                node = cls._from_args([dag.nodes[a], dag.nodes[b]], True)
                dag.nodes.append(node)
                dag.children.append((a, b))
                dag.kinds.append(_NORMAL)
                dag.depths.append(max(dag.depths[a], dag.depths[b]) + _weight(node, 2))
                dag.pair_made.add(existing)
                members[existing] = {a: None, b: None}
                where[(cls, a)][existing] = None
                where[(cls, b)][existing] = None
                pair_node[(cls, a, b)] = existing
            for m in targets:
                del members[m][a], members[m][b]
                members[m][existing] = None
                del where[(cls, a)][m], where[(cls, b)][m]
                where.setdefault((cls, existing), {})[m] = None
                dag.children[m] = tuple(members[m])
                if len(members[m]) == 2:  # now itself a pair other nodes may reuse
                    x, y = sorted(members[m])
                    pair_node.setdefault((cls, x, y), m)
            merged = changed = True
        if not merged:
            break
    return _topological(dag) if changed else list(range(len(dag.nodes)))


def _topological(dag: _Dag) -> list[int]:
    """Iterative post-order over node ids from the roots: children before parents."""
    seen = [False] * len(dag.nodes)
    order: list[int] = []
    for root in dag.roots:
        stack = [(root, False)]
        while stack:
            nid, done = stack.pop()
            if done:
                order.append(nid)
                continue
            if seen[nid]:
                continue
            seen[nid] = True
            stack.append((nid, True))
            stack.extend((c, False) for c in reversed(dag.children[nid]) if not seen[c])
    return order


def _splice_single_use(dag: _Dag, order: list[int], refs: list[int]) -> None:
    """A pair node made by ``_share_pairs`` that ended up used once, inside a node of its
    own class (``(a*b)*c``), is spliced back into it (``a*b*c``): no assignment for it."""
    for nid in order:
        if type(dag.nodes[nid]) not in (sympy.Add, sympy.Mul) or dag.kinds[nid] != _NORMAL:
            continue
        cls = type(dag.nodes[nid])
        kids = dag.children[nid]
        if not any(c in dag.pair_made and refs[c] == 1 and type(dag.nodes[c]) is cls
                   for c in kids):
            continue
        new: list[int] = []
        for c in kids:
            if c in dag.pair_made and refs[c] == 1 and type(dag.nodes[c]) is cls:
                new.extend(dag.children[c])  # already spliced: c comes before nid
                refs[c] = 0
            else:
                new.append(c)
        dag.children[nid] = tuple(new)


def _rebuild(node: sympy.Basic, args: list[sympy.Basic]) -> sympy.Basic:
    """``node`` with new args, unevaluated so that the structure (and its depth) is exactly
    the one accounted for: an evaluated ``Mul(-1, a + b)`` would distribute, an ``Add``
    of two partial-sum Adds would flatten back into one wide Add."""
    if all(new is old for new, old in zip(args, node.args, strict=True)):
        return node
    if isinstance(node, (sympy.Add, sympy.Mul)):
        return _assoc(node.func, args, node.is_commutative)
    return node.func(*args, evaluate=False)


def _assoc(
    cls: type, args: list[sympy.Basic], commutative: bool | None, canonical: bool = True
) -> sympy.Basic:
    """An unevaluated Add/Mul, faster than ``evaluate=False`` (no sympify).

    With ``canonical``, a commutative node's args are put in SymPy's canonical order, so
    that a rebuilt node compares equal to the evaluated one where evaluation would only
    have sorted. ``Basic.compare`` is slow (a third of the run time on a wide sum), so
    partial sums -- our own nodes -- and nodes with many args are left in ``.args`` order.
    """
    if commutative and canonical and len(args) <= 8:
        args = sorted(args, key=_args_sortkey)
    return cls._from_args(args, commutative)


def linearize(
    exprs: Sequence[sympy.Basic],
    *,
    cse: bool,
    max_depth: int = 50,
    symbols: Iterator[sympy.Symbol],
    opt: bool = True,
    share_above: int = 0,
) -> tuple[list[tuple[sympy.Symbol, sympy.Basic]], list[sympy.Basic]]:
    """Break ``exprs`` into assignments whose right-hand sides are at most ``max_depth`` deep.

    Returns ``(replacements, reduced)`` like ``sympy.cse(exprs, list=True)``: replacements
    in dependency order (each right-hand side uses only earlier symbols), then the reduced
    expressions. Substituting the replacements back (last to first) gives ``exprs``.

    - Every right-hand side and reduced expression has ``expression_depth <= max_depth``,
      except a Piecewise/relational/boolean subtree deeper than that on its own: those
      are never entered, only hoisted whole.
    - An Add/Mul with more than ``max_depth // 2`` args is split into partial sums or
      products of that many args, each assigned to a symbol.
    - ``cse=True`` also assigns every non-atomic subexpression that occurs more than once
      (structurally, in the DAG of all ``exprs``) to one symbol. Symbols, numbers,
      ``Indexed`` reads and ``MatrixElement`` are atoms and never assigned on their own.
    - ``cse=True, opt=True`` (the default) also shares common sub-sums and sub-products:
      ``a*b*c`` and ``a*b*d`` become ``t = a*b; t*c; t*d`` (greedy pair merging, the
      counterpart of ``sympy.cse``'s ``opt_cse`` pre-pass; 24-40% fewer operations on
      the n-link pendulum mass matrix and its Jacobian). Add/Mul with more than 64
      args are not searched for sub-sums. With ``share_above`` > 0 only expressions of
      more than that many operations after CSE are searched: fewer operations is what
      a large body's compile needs, but on a small one XLA fuses the expression as
      written better than with the shared pairs (a double pendulum ran 1.6x faster
      without them, docs/design/cse-pairs.md).
    - Deterministic: names and order depend only on the expressions' structure and
      ``.args`` order, not on hash order.
    - Symbols drawn from ``symbols`` that occur in ``exprs`` are skipped.

    >>> import sympy as sp
    >>> x, y = sp.symbols("x y")
    >>> repl, red = linearize([sp.sin(x + y) ** 2 + sp.sin(x + y)], cse=True,
    ...                       symbols=sp.numbered_symbols("c"))
    >>> repl
    [(c0, sin(x + y))]
    >>> red
    [c0**2 + c0]
    """
    if max_depth < 4:
        raise ValueError(f"max_depth: expected an int >= 4, got {max_depth!r}")
    width = max(2, max_depth // 2)  # args per partial sum/product
    dag = _Dag(list(exprs))
    n = len(dag.nodes)
    replacements: list[tuple[sympy.Symbol, sympy.Basic]] = []

    def fresh() -> sympy.Symbol:
        for s in symbols:
            if s not in dag.symbols:
                return s
        raise ValueError("symbols: the iterator ran out of fresh symbols")

    def hoist(form: sympy.Basic) -> sympy.Symbol:
        sym = fresh()
        replacements.append((sym, form))
        return sym

    def bounded(items: list[list], weight: int) -> list[sympy.Basic]:
        """Hoist the deepest items until ``weight + max depth <= max_depth``.

        ``items`` are ``[form, depth, is_same_assoc_op]``; an unevaluated Add directly
        inside an Add prints without parentheses and lengthens the parent's BinOp chain,
        so such items are always hoisted.
        """
        order = sorted(range(len(items)), key=lambda i: (-items[i][1], i))
        for i in order:
            form, depth, same_op = items[i]
            if same_op or (depth and weight + depth > max_depth):
                items[i][0] = hoist(form)
                items[i][1] = 0
        return [it[0] for it in items]

    order = list(range(n))  # children before parents
    refs = _references(dag, order)
    if cse and opt and (share_above <= 0
                        or _dag_operations(dag, _own_operations(dag)) > share_above):
        order = _share_pairs(dag, refs)
        refs = _references(dag, order)
        _splice_single_use(dag, order, refs)
    n = len(dag.nodes)

    forms: list[sympy.Basic | None] = [None] * n
    depths = [0] * n
    for nid in order:
        if not refs[nid]:
            continue
        node, kind = dag.nodes[nid], dag.kinds[nid]
        if kind == _ATOM:
            forms[nid] = node
            continue
        if kind == _OPAQUE:
            form, depth = node, dag.depths[nid]
        else:
            is_add = isinstance(node, sympy.Add)
            assoc = sympy.Add if is_add else sympy.Mul if isinstance(node, sympy.Mul) else None
            items = [
                [forms[c], depths[c], assoc is not None and isinstance(forms[c], assoc)]
                for c in dag.children[nid]
            ]
            if assoc is not None:
                # Wide Add/Mul: a tree of partial sums/products, each one assigned.
                while len(items) > width:
                    merged = []
                    for start in range(0, len(items), width):
                        chunk = items[start : start + width]
                        if len(chunk) == 1:
                            merged.append(chunk[0])
                            continue
                        args = bounded(chunk, _weight(node, len(chunk)))
                        partial = _assoc(assoc, args, node.is_commutative, canonical=False)
                        merged.append([hoist(partial), 0, False])
                    items = merged
            weight = _weight(node, len(items))
            args = bounded(items, weight)
            if assoc is not None and len(args) != len(node.args):
                form = _assoc(assoc, args, node.is_commutative)
            else:
                form = _rebuild(node, args)
            depth = weight + max(it[1] for it in items)
        if cse and refs[nid] > 1:
            form, depth = hoist(form), 0
        forms[nid] = form
        depths[nid] = depth

    reduced = [forms[r] for r in dag.roots]
    return replacements, reduced

