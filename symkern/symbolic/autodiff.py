"""symbolic: derivatives of SymPy expressions over their DAG, each distinct node visited once.

Imports sympy only; nothing of symkern. docs/design/derivatives.md says why and what it costs.

SymPy's `diff` walks the expression as a tree, so a sub-expression read by k parents is
differentiated k times, and a network's Jacobian does not finish in minutes. Here the rules
are SymPy's own (the product rule of `Mul._eval_derivative`, `Pow`'s, the chain rule through
each function's `fdiff`), applied once per distinct node in an iterative post-order:

* forward mode carries each node's tangents as a sparse dict `symbol -> expression`, holding
  only the symbols the node depends on (one sweep, cheaper when there are fewer symbols than
  outputs);
* reverse mode accumulates each node's adjoint from its parents, one sweep per output
  (cheaper for the gradient of one scalar w.r.t. many symbols).

A node no rule covers (an Integral, a Derivative, a Sum, a function that writes its own
derivative and whose argument is not known real) is differentiated by SymPy's `diff`, that
node only; a Piecewise differentiates branch by branch, as SymPy does, in forward mode.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable, Sequence

import sympy as sp
from sympy.core.basic import Basic, _args_sortkey, ordering_of_classes
from sympy.core.function import AppliedUndef, ArgumentIndexError
from sympy.functions.elementary.miscellaneous import MinMaxBase
from sympy.matrices.expressions.matexpr import MatrixElement

Tangents = dict[sp.Basic, sp.Expr]

#: functions that write their own `_eval_derivative` (through re/im when the argument may be
#: complex); for a real argument their derivative is taken on a real stand-in of it
_OWN_DERIVATIVE = (sp.Abs, sp.sign, sp.re, sp.im, sp.arg, sp.conjugate)

LEAF, ADD, MUL, POW, FUNCTION, STAND_IN, PIECEWISE, SYMPY = range(8)


def _rule(node: sp.Basic) -> int:
    """Which rule differentiates `node`."""
    if not node.args:
        return LEAF
    if isinstance(node, MatrixElement):
        return LEAF if all(index.is_Integer for index in node.args[1:]) else SYMPY
    if isinstance(node, sp.Add):
        return ADD
    if isinstance(node, sp.Mul):
        return MUL
    if isinstance(node, sp.Pow):
        return POW
    if isinstance(node, sp.Piecewise):
        return PIECEWISE
    if not all(isinstance(arg, sp.Expr) for arg in node.args):
        return SYMPY
    if isinstance(node, MinMaxBase) or (
            isinstance(node, sp.Function) and not _writes_own_derivative(type(node))):
        return FUNCTION
    if isinstance(node, _OWN_DERIVATIVE):
        return STAND_IN
    return SYMPY


@functools.cache
def _writes_own_derivative(cls: type) -> bool:
    """Whether a Function class replaces SymPy's chain rule through `fdiff` with a
    derivative of its own (SymPy's `_eval_derivative` hook, read statically: it is not
    public API). Cached per class: `getattr_static` walks the metaclass's MRO, 1 ms a call."""
    hook = "_eval_derivative"
    return inspect.getattr_static(cls, hook) is not inspect.getattr_static(sp.Function, hook)


def _fdiff(node: sp.Basic, index: int) -> sp.Expr:
    """∂node/∂(argument `index`, from 0), as `Function._eval_derivative` takes it."""
    try:
        return node.fdiff(index + 1)
    except ArgumentIndexError:
        return sp.Function.fdiff(node, index + 1)


class _PartialFormulas:
    """Each function's partials written once on Dummy arguments, then read at a node by
    `xreplace`, the function itself mapped to the node.

    `node.fdiff` rebuilds the function of the node's own arguments (`tanh(u)` in
    `1 - tanh(u)**2`), and SymPy's `eval` of a large argument is the larger part of a
    network's Jacobian (tanh's looks for an imaginary coefficient in the whole sum). A
    formula that SymPy writes with a Derivative or a Subs (an undefined function's) is taken
    from the node itself, as are functions that evaluate to something else on Dummies or
    reorder them.
    """

    def __init__(self) -> None:
        self._formulas: dict[tuple, tuple | None] = {}

    def partial(self, node: sp.Basic, index: int) -> sp.Expr:
        entry = self._entry(node)
        if entry is None:
            return _fdiff(node, index)
        at, stand_ins, formulas = entry
        formula = formulas.get(index)
        if formula is None:
            formula = formulas[index] = _fdiff(at, index)
        if formula.has(sp.Derivative, sp.Subs):
            return _fdiff(node, index)
        mapping = {dummy: arg for dummy, arg in zip(stand_ins, node.args, strict=True)
                   if dummy is not arg}
        mapping[at] = node
        return formula.xreplace(mapping)

    def _entry(self, node: sp.Basic) -> tuple | None:
        if isinstance(node, AppliedUndef):
            return None
        key = (node.func, *(arg if arg.is_Number else None for arg in node.args))
        if key not in self._formulas:
            stand_ins = [arg if arg.is_Number else sp.Dummy() for arg in node.args]
            at = node.func(*stand_ins)
            # a function that reorders its arguments (Max, Min sort them by name, and Dummy
            # names sort as text) would read argument i's formula for another argument
            self._formulas[key] = (at, stand_ins, {}) if type(at) is type(node) \
                and at.args == tuple(stand_ins) else None
        return self._formulas[key]


def _stand_in_partials(node: sp.Basic, indices: list[int]) -> dict[int, sp.Expr] | None:
    """The partials of a function that writes its own derivative, taken on real Dummies that
    stand in for its arguments; None when an argument is not known real (SymPy's `diff`
    then answers, through re/im)."""
    if not all(node.args[i].is_extended_real for i in indices):
        return None
    stand_ins = {i: sp.Dummy(real=True) for i in indices}
    at = node.func(*[stand_ins.get(i, arg) for i, arg in enumerate(node.args)])
    back = {dummy: node.args[i] for i, dummy in stand_ins.items()}
    return {i: at.diff(dummy).xreplace(back) for i, dummy in stand_ins.items()}


def _post_order(roots: Iterable[sp.Basic], children) -> list[sp.Basic]:
    """Every node reachable from `roots` through `children(node)`, children first, once each."""
    order: list[sp.Basic] = []
    seen: set[sp.Basic] = set()
    for root in roots:
        if root in seen:
            continue
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if node in seen:
                continue
            seen.add(node)
            stack.append((node, True))
            stack.extend((child, False) for child in children(node) if child not in seen)
    return order


def _mergeable(factor: sp.Basic) -> bool:
    """A factor that SymPy's `Mul` keeps as it is beside any factor of another base: a
    symbol, a sum, a function other than exp, or a power of one of these."""
    base = factor.base if factor.is_Pow else factor
    return factor.is_commutative is True and (
        base.is_Symbol or base.is_Add
        or (isinstance(base, sp.Function) and not isinstance(base, sp.exp)))


def _coefficient_and_factors(expr: sp.Expr) -> tuple[sp.Rational, tuple] | None:
    if expr.is_Mul:
        coefficient, factors = (expr.args[0], expr.args[1:]) if expr.args[0].is_Rational \
            else (sp.S.One, expr.args)
    else:
        coefficient, factors = sp.S.One, (expr,)
    return (coefficient, factors) if all(_mergeable(f) for f in factors) else None


@functools.cache
def _class_key(cls: type) -> tuple[int, str]:
    """`Basic.compare`'s order of classes (`_cmp_name`): the index in SymPy's
    `ordering_of_classes`, classes it does not list after those, by name."""
    name = cls.__name__
    rank = ordering_of_classes.index(name) if name in ordering_of_classes \
        else len(ordering_of_classes) + 1
    return rank, name


class SortKeys:
    """A key per node whose tuple order is SymPy's `Basic.compare`, the order `Add` and
    `Mul` sort their arguments in: (class rank, class name, length of `_hashable_content`,
    then each element: a Basic's key, anything else as it is). Memoized per node, so a
    comparison reads a shared sub-expression's key instead of recursing into it again;
    `Basic.compare` walked the common part of two terms for every comparison (40 % of a
    network Jacobian's time). The key is flat at each level: Python compares two tuples by
    finding the first unequal pair and comparing it again, so each level of nesting under
    the first difference doubles the work.

    Raises TypeError for content it does not order: frozensets, which `Basic.compare`
    rebuilds as Basic, and a position where two nodes of one class hold a Basic and a
    plain value (as `Basic.compare` does too)."""

    def __init__(self) -> None:
        self._keys: dict[Basic, tuple] = {}

    def __call__(self, node: Basic) -> tuple:
        keys = self._keys
        key = keys.get(node)
        if key is not None:
            return key
        stack = [node]
        while stack:
            top = stack[-1]
            if top in keys:
                stack.pop()
                continue
            content = top._hashable_content()
            pending = [e for e in content if isinstance(e, Basic) and e not in keys]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            keys[top] = (*_class_key(type(top)), len(content),
                         *[keys[e] if isinstance(e, Basic) else _plain(e) for e in content])
        return keys[node]


def _plain(value: object) -> object:
    if isinstance(value, frozenset):
        raise TypeError("SortKeys: frozenset content, which Basic.compare rebuilds as Basic")
    return value


def product(a: sp.Expr, b: sp.Expr, keys: SortKeys | None = None) -> sp.Expr:
    """`a * b`, the same expression as SymPy's `Mul(a, b)`, by merging the two sorted factor
    lists where no two factors share a base (SymPy's `Mul.flatten` re-sorts and re-gathers
    every factor, the larger part of a network's Jacobian); `Mul(a, b)` otherwise. `keys`:
    the sort keys to compare factors by (a fresh `SortKeys` when None)."""
    if a is sp.S.One:
        return b
    if b is sp.S.One:
        return a
    left, right = _coefficient_and_factors(a), _coefficient_and_factors(b)
    if left is None or right is None:
        return a * b
    (ca, fa), (cb, fb) = left, right
    bases = {f.base if f.is_Pow else f for f in fa}
    if any((f.base if f.is_Pow else f) in bases for f in fb):
        return a * b
    coefficient = ca * cb
    if coefficient is sp.S.Zero or (coefficient is not sp.S.One and len(fa) + len(fb) == 1):
        return a * b
    keys = SortKeys() if keys is None else keys
    try:
        ka, kb = [keys(f) for f in fa], [keys(f) for f in fb]
    except (TypeError, RecursionError):  # content SortKeys does not order: Mul sorts it
        return a * b
    merged, i, j = [], 0, 0
    while i < len(fa) and j < len(fb):
        if ka[i] <= kb[j]:
            merged.append(fa[i])
            i += 1
        else:
            merged.append(fb[j])
            j += 1
    merged.extend(fa[i:])
    merged.extend(fb[j:])
    if coefficient is not sp.S.One:
        merged.insert(0, coefficient)
    return _assembled(sp.Mul, merged)


@functools.cache
def _postprocessed(cls: type) -> bool:
    """Whether SymPy runs constructor postprocessors for a node with an argument of `cls`
    (registered in `Basic._constructor_postprocessor_mapping` along its MRO)."""
    return any(c in Basic._constructor_postprocessor_mapping for c in cls.__mro__)


def _assembled(kind: type, args: list[sp.Expr]) -> sp.Expr:
    """`kind(*args, evaluate=False)` for commutative `args` already in canonical order:
    the node is made from its arguments directly (`_from_args`), without the constructor's
    cache lookup, re-sympification and commutativity fold (a third of a network
    Jacobian's time); through the constructor where an argument's class registers a
    postprocessor."""
    if any(_postprocessed(type(arg)) for arg in args):
        return kind(*args, evaluate=False)
    return kind._from_args(args, is_commutative=True)


def total(terms: list[sp.Expr], keys: SortKeys | None = None) -> sp.Expr:
    """`Add(*terms)`, the same expression, by one sort of the terms where no two share their
    non-numeric part and none is a number or a sum (SymPy's `Add.flatten` also splits and
    re-joins every term's coefficient); `Add(*terms)` otherwise. `keys`: the sort keys (a
    fresh `SortKeys` when None)."""
    if len(terms) == 1:
        return terms[0]
    parts = set()
    for term in terms:
        split = _coefficient_and_factors(term)
        if split is None or term.is_Add:
            return sp.Add(*terms)
        parts.add(split[1])
    if len(parts) < len(terms):
        return sp.Add(*terms)
    try:
        ordered = sorted(terms, key=SortKeys() if keys is None else keys)
    except (TypeError, RecursionError):  # content SortKeys does not order, or too deep
        ordered = sorted(terms, key=_args_sortkey)
    return _assembled(sp.Add, ordered)


def _nonzero(tangents: Tangents) -> Tangents:
    return {s: d for s, d in tangents.items() if d is not sp.S.Zero}


class Differentiator:
    """Derivatives w.r.t. fixed `symbols` (Symbols or MatrixElements with integer indices),
    memoized per node across every expression asked of one instance."""

    def __init__(self, symbols: Sequence[sp.Basic]) -> None:
        self.symbols = list(dict.fromkeys(symbols))
        self._symbol_set = set(self.symbols)
        self._rules: dict[sp.Basic, int] = {}
        self._formulas = _PartialFormulas()
        self._keys = SortKeys()
        #: forward mode: each visited node's nonzero tangents
        self._tangents: dict[sp.Basic, Tangents] = {}
        #: reverse mode: whether a node depends on a symbol, and its partials w.r.t. its
        #: live children, or its whole tangents where reverse mode reads them as they are
        self._depends: dict[sp.Basic, bool] = {}
        self._partials: dict[sp.Basic, list[tuple[sp.Basic, sp.Expr]] | Tangents] = {}

    def _rule_of(self, node: sp.Basic) -> int:
        rule = self._rules.get(node)
        if rule is None:
            rule = self._rules[node] = _rule(node)
        return rule

    def _children(self, node: sp.Basic) -> tuple[sp.Basic, ...]:
        rule = self._rule_of(node)
        if rule in (LEAF, SYMPY):
            return ()
        if rule == PIECEWISE:
            return tuple(pair.expr for pair in node.args)
        return node.args

    def _by_sympy(self, node: sp.Basic) -> Tangents:
        return _nonzero({s: node.diff(s) for s in self.symbols})

    def _leaf(self, node: sp.Basic) -> Tangents:
        return {node: sp.S.One} if node in self._symbol_set else {}

    def _local_partials(self, node: sp.Basic,
                        live: list[int]) -> list[tuple[sp.Basic, sp.Expr]] | None:
        """(argument, ∂node/∂argument) for the `live` argument indices of an ADD, MUL, POW,
        FUNCTION or STAND_IN node; None where SymPy's `diff` must take the node whole."""
        rule = self._rule_of(node)
        args = node.args
        if rule == ADD:
            return [(args[i], sp.S.One) for i in live]
        if rule == MUL:
            return [(args[i], sp.Mul(*args[:i], *args[i + 1:])) for i in live]
        if rule == POW:
            base, exp = args
            partials = []
            if 0 in live:
                partials.append((base, node * exp / base if 1 in live
                                 else exp * base ** (exp - 1)))
            if 1 in live:
                partials.append((exp, node * sp.log(base)))
            return partials
        if rule == FUNCTION:
            return [(args[i], self._formulas.partial(node, i)) for i in live]
        stand_ins = _stand_in_partials(node, live)
        return None if stand_ins is None else [(args[i], stand_ins[i]) for i in live]

    # ---- forward mode ---------------------------------------------------------------------
    def tangents(self, exprs: Sequence[sp.Basic]) -> list[Tangents]:
        """For each expression, its nonzero derivatives `{symbol: d expr / d symbol}`."""
        pending = [e for e in exprs if e not in self._tangents]
        for node in _post_order(pending, self._pending_children):
            self._tangents[node] = self._tangent(node)
        return [self._tangents[e] for e in exprs]

    def _pending_children(self, node: sp.Basic) -> tuple[sp.Basic, ...]:
        return tuple(c for c in self._children(node) if c not in self._tangents)

    def _tangent(self, node: sp.Basic) -> Tangents:
        rule = self._rule_of(node)
        if rule == LEAF:
            return self._leaf(node)
        if rule == SYMPY:
            return self._by_sympy(node)
        if rule == PIECEWISE:
            branches = [self._tangents[pair.expr] for pair in node.args]
            used = dict.fromkeys(s for branch in branches for s in branch)
            return _nonzero({s: sp.Piecewise(*[(branch.get(s, sp.S.Zero), pair.cond)
                                               for branch, pair in zip(branches, node.args, strict=True)])
                             for s in used})
        live = [i for i, arg in enumerate(node.args) if self._tangents[arg]]
        if not live:
            return {}
        partials = self._local_partials(node, live)
        if partials is None:
            return self._by_sympy(node)
        terms: dict[sp.Basic, list[sp.Expr]] = {}
        for child, partial in partials:
            for s, d in self._tangents[child].items():
                terms.setdefault(s, []).append(product(partial, d, self._keys))
        return _nonzero({s: total(ts, self._keys) for s, ts in terms.items()})

    # ---- reverse mode ---------------------------------------------------------------------
    def gradient(self, expr: sp.Basic) -> Tangents:
        """`{symbol: d expr / d symbol}`, nonzero entries, by one reverse sweep."""
        for node in _post_order([expr], self._undecided_children):
            self._decide(node)
        order = _post_order([expr], self._live_children)
        adjoints: dict[sp.Basic, list[sp.Expr]] = {expr: [sp.S.One]}
        result: dict[sp.Basic, list[sp.Expr]] = {}
        for node in reversed(order):
            terms = adjoints.pop(node, None)
            if not terms:
                continue
            adjoint = total(terms, self._keys)
            local = self._partials[node]
            if isinstance(local, dict):
                for s, d in local.items():
                    result.setdefault(s, []).append(product(adjoint, d, self._keys))
                continue
            for child, partial in local:
                adjoints.setdefault(child, []).append(product(adjoint, partial, self._keys))
        return _nonzero({s: total(result[s], self._keys) for s in self.symbols if s in result})

    def _undecided_children(self, node: sp.Basic) -> tuple[sp.Basic, ...]:
        rule = self._rule_of(node)
        if rule in (LEAF, SYMPY, PIECEWISE):
            return ()
        return tuple(c for c in node.args if c not in self._depends)

    def _decide(self, node: sp.Basic) -> None:
        """Whether `node` depends on a symbol, and what reverse mode reads of it."""
        rule = self._rule_of(node)
        local: list[tuple[sp.Basic, sp.Expr]] | Tangents | None
        if rule == LEAF:
            local = self._leaf(node)
        elif rule == SYMPY:
            local = self._by_sympy(node)
        elif rule == PIECEWISE:
            local = self.tangents([node])[0]
        else:
            live = [i for i, arg in enumerate(node.args) if self._depends[arg]]
            local = self._local_partials(node, live) if live else []
            if local is None:
                local = self._by_sympy(node)
        self._depends[node] = bool(local)
        self._partials[node] = local

    def _live_children(self, node: sp.Basic) -> tuple[sp.Basic, ...]:
        local = self._partials[node]
        return () if isinstance(local, dict) else tuple(child for child, _ in local)


def jacobian_rows(exprs: Sequence[sp.Basic], symbols: Sequence[sp.Basic]) -> list[list[sp.Expr]]:
    """`[[d e / d s for s in symbols] for e in exprs]`: forward mode when there are no more
    symbols than expressions, else one reverse sweep per expression.

    >>> x, y = sp.symbols("x y")
    >>> jacobian_rows([x * y, sp.sin(x)], [x, y])
    [[y, x], [cos(x), 0]]
    """
    exprs = [sp.sympify(e) for e in exprs]
    differentiator = Differentiator(symbols)
    if len(differentiator.symbols) <= len(exprs):
        rows = differentiator.tangents(exprs)
    else:
        rows = [differentiator.gradient(e) for e in exprs]
    return [[row.get(s, sp.S.Zero) for s in symbols] for row in rows]


def gradient_entries(expr: sp.Basic, symbols: Sequence[sp.Basic]) -> list[sp.Expr]:
    """`[d expr / d s for s in symbols]` by one reverse sweep.

    >>> x, y = sp.symbols("x y")
    >>> gradient_entries(x**2 * y, [x, y])
    [2*x*y, x**2]
    """
    row = Differentiator(symbols).gradient(sp.sympify(expr))
    return [row.get(s, sp.S.Zero) for s in symbols]


def hessian_rows(expr: sp.Basic, symbols: Sequence[sp.Basic]) -> list[list[sp.Expr]]:
    """The Hessian as SymPy's `hessian` lays it out: row i differentiates the i-th gradient
    entry, the lower triangle mirrors the upper.

    >>> x, y = sp.symbols("x y")
    >>> hessian_rows(x**2 * y, [x, y])
    [[2*y, 2*x], [2*x, 0]]
    """
    differentiator = Differentiator(symbols)
    row = differentiator.gradient(sp.sympify(expr))
    first = [row.get(s, sp.S.Zero) for s in symbols]
    second = differentiator.tangents(first)
    n = len(symbols)
    upper = [[second[i].get(symbols[j], sp.S.Zero) for j in range(n)] for i in range(n)]
    return [[upper[min(i, j)][max(i, j)] for j in range(n)] for i in range(n)]
