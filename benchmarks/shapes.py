"""Random expression shapes sized by operation count, for scale benchmarks and smoke tests.

`generate(profile, target, seed)` builds equations of about `target` operations (counted as
`symkern.codegen.linearize.count_operations` counts a tree, like `sympy.count_ops`) from a
random grammar: sums, products, nests of calls (sin, cos, tanh, atan, exp, log, sqrt, Abs,
integer powers, reciprocals), numeric coefficients and shifts, sub-terms shared across terms
and outputs, and scalar parameters. The same (profile, target, seed) gives the same
expressions in every process: the generator draws from `random.Random` seeded by a string.

Values stay finite on inputs in [-1, 1] and parameters in [0.5, 1.5]: each node carries an
upper bound of its magnitude and a factor or power that would pass `MAGNITUDE_CAP` is taken
through tanh first, exp only sees an argument bounded by 3, log and sqrt see 1 + u**2.

>>> shape = generate(PROFILES["wide-sum"], 500, seed=0)
>>> abs(shape.operations - 500) < 60
True
>>> generate(PROFILES["wide-sum"], 500, seed=0).eqs == shape.eqs
True
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import sympy as sp

#: the largest magnitude a node may reach before it is squashed by tanh; with sums of a few
#: thousand terms an output stays below 1e7, far from float32's range
MAGNITUDE_CAP = 1e3
#: exp's argument is at most this in magnitude (e**3 ~ 20)
EXP_ARGUMENT_CAP = 3.0
#: parameters are drawn from this range (away from 0, so reciprocals of sums stay tame)
PARAMETER_RANGE = (0.5, 1.5)
#: the node kinds of the grammar
KINDS = ("add", "mul", "call", "power", "affine")


@dataclass(frozen=True)
class Profile:
    """The knobs of one family of shapes; `generate` draws a shape from it."""

    name: str
    description: str
    inputs: int
    #: scalar parameters per 1,000 operations (at least 4 in all)
    params_per_kop: float
    #: operations per output entry (the outputs are a column Matrix)
    ops_per_output: int
    #: operations of one term of an output's sum, drawn uniformly in [low, high]
    term_ops: tuple[int, int]
    #: relative weights of the node kinds in KINDS
    weights: Mapping[str, float]
    #: probability that a sub-term is one generated before (shared) rather than a new one
    share: float
    #: deepest nesting of a term
    max_depth: int = 10
    #: probability that a leaf is an input (else a parameter)
    input_leaf: float = 0.6


PROFILES: dict[str, Profile] = {p.name: p for p in [
    Profile("wide-sum", "wide sums of small unshared terms (products of calls of inputs)",
            inputs=8, params_per_kop=4, ops_per_output=2_500, term_ops=(3, 14),
            weights={"add": 0.5, "mul": 3, "call": 2, "power": 1, "affine": 1}, share=0.03),
    Profile("deep-nest", "long chains of calls inside calls, few terms per output",
            inputs=4, params_per_kop=2, ops_per_output=5_000, term_ops=(30, 200),
            weights={"add": 1, "mul": 1, "call": 4, "power": 0.5, "affine": 2}, share=0.05,
            max_depth=12),
    Profile("products", "products of sums and powers of sums, reciprocals",
            inputs=6, params_per_kop=8, ops_per_output=2_000, term_ops=(10, 60),
            weights={"add": 3, "mul": 3, "call": 1, "power": 2, "affine": 0.5}, share=0.05),
    Profile("shared-dag", "terms built from a pool of shared sub-terms, across outputs",
            inputs=8, params_per_kop=4, ops_per_output=2_000, term_ops=(8, 40),
            weights={"add": 2, "mul": 2, "call": 2, "power": 1, "affine": 1}, share=0.35),
    Profile("many-params", "a fresh scalar parameter in most leaves (about ops/5 parameters)",
            inputs=4, params_per_kop=200, ops_per_output=2_500, term_ops=(4, 20),
            weights={"add": 1, "mul": 3, "call": 1.5, "power": 0.5, "affine": 0.5}, share=0.02,
            input_leaf=0.3),
]}


@dataclass
class Shape:
    """Equations drawn from a profile, with their symbols and parameter values."""

    profile: str
    target: int
    seed: int
    eqs: sp.Matrix
    inputs: list[sp.Symbol]
    params: dict[str, sp.Symbol]
    param_values: dict[str, float]
    operations: int
    dag_operations: int
    construct_s: float
    calls: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.profile}-{self.target}-s{self.seed}"

    def summary(self) -> dict[str, Any]:
        """The shape's figures as plain data (no expressions)."""
        return {"shape": self.name, "profile": self.profile, "target": self.target,
                "seed": self.seed, "operations": self.operations,
                "dag_operations": self.dag_operations, "outputs": self.eqs.rows,
                "inputs": len(self.inputs), "params": len(self.params),
                "calls": dict(self.calls), "construct_s": round(self.construct_s, 3)}


def _power(base: sp.Expr, exponent: Any) -> sp.Expr:
    """`base**exponent` without SymPy's evaluation: its assumption queries (is the base
    finite, real, zero?) walk the whole base, which made a 10^4-operation nest take minutes;
    the draws never hit a case evaluation would fold."""
    return sp.Pow(base, exponent, evaluate=False)


def _flat(kind: type, items: tuple[sp.Expr, ...]) -> list[sp.Expr]:
    """`items` with nested `kind` nodes spliced in and their numbers folded into one."""
    flat: list[sp.Expr] = []
    for item in items:
        flat.extend(item.args if isinstance(item, kind) else (item,))
    numbers = [item for item in flat if item.is_Number]
    if len(numbers) > 1:
        folded = kind(*numbers)
        flat = [folded] + [item for item in flat if not item.is_Number]
    return flat


def _product(*factors: sp.Expr) -> sp.Expr:
    """A product without SymPy's evaluation, for the same reason as `_power`, but flat, with
    one number and distinct factors like an evaluated one: SymPy's cse returns wrong values
    on unevaluated nodes that repeat an argument (`Add(a, b, Add(a, b), evaluate=False)`
    comes back as `a + b`), so a repeat is left to SymPy's evaluation."""
    flat = _flat(sp.Mul, factors)
    if len(set(flat)) < len(flat):
        return sp.Mul(*flat)
    return sp.Mul(*flat, evaluate=False) if len(flat) > 1 else flat[0]


def _sum(*terms: sp.Expr) -> sp.Expr:
    """A sum inside a term, built as `_product` builds a product; the outputs' sums of terms
    are evaluated (flattened and ordered as SymPy does)."""
    flat = _flat(sp.Add, terms)
    if len(set(flat)) < len(flat):
        return sp.Add(*flat)
    return sp.Add(*flat, evaluate=False) if len(flat) > 1 else flat[0]


@dataclass(frozen=True)
class _Node:
    expr: sp.Expr
    ops: int
    bound: float


class _Grammar:
    """One shape's random draw: nodes carry their expression, operations and magnitude bound."""

    def __init__(self, profile: Profile, rng: random.Random, inputs: list[sp.Symbol],
                 params: list[sp.Symbol]) -> None:
        self.profile, self.rng, self.inputs, self.params = profile, rng, inputs, params
        self.kinds = list(KINDS)
        self.kind_weights = [profile.weights.get(kind, 0.0) for kind in KINDS]
        self.pool: list[_Node] = []
        self.calls: dict[str, int] = {}

    def number(self) -> sp.Float:
        value = self.rng.uniform(0.1, 2.0) * self.rng.choice((-1, 1))
        return sp.Float(round(value, 3))

    def leaf(self) -> _Node:
        if self.rng.random() < self.profile.input_leaf:
            return _Node(self.rng.choice(self.inputs), 0, 1.0)
        return _Node(self.rng.choice(self.params), 0, PARAMETER_RANGE[1])

    def call(self, name: str, node: _Node) -> _Node:
        self.calls[name] = self.calls.get(name, 0) + 1
        u = node.expr
        if name in ("sin", "cos", "tanh"):
            return _Node(getattr(sp, name)(u, evaluate=False), node.ops + 1, 1.0)
        if name == "atan":
            return _Node(sp.atan(u, evaluate=False), node.ops + 1, 1.6)
        if name == "abs":
            return _Node(sp.Abs(u, evaluate=False), node.ops + 1, node.bound)
        if name == "exp":
            if node.bound > EXP_ARGUMENT_CAP:
                node = self.call("tanh", node)
            return _Node(sp.exp(node.expr, evaluate=False), node.ops + 1, 2.72 ** node.bound)
        # log(1 + u**2) and sqrt(1 + u**2): three operations, defined everywhere
        square = _sum(sp.S.One, _power(u, 2))
        if name == "log":
            return _Node(sp.log(square, evaluate=False), node.ops + 3, 1.0 + 2 * min(node.bound, 1e3) ** 0.5)
        return _Node(_power(square, sp.Rational(1, 2)), node.ops + 3, 1.0 + node.bound)

    def squash(self, node: _Node) -> _Node:
        return self.call("tanh", node) if node.bound > 1.0 else node

    def split(self, budget: int, parts: int) -> list[int]:
        cuts = sorted(self.rng.randint(0, budget) for _ in range(parts - 1))
        return [b - a for a, b in zip([0, *cuts], [*cuts, budget], strict=True)]

    def node(self, budget: int, depth: int = 0) -> _Node:
        if budget <= 0 or depth >= self.profile.max_depth:
            return self.leaf()
        if self.pool and self.rng.random() < self.profile.share:
            for _ in range(4):
                pooled = self.rng.choice(self.pool)
                if pooled.ops <= budget:
                    return pooled
        made = self.fresh(budget, depth)
        if made.ops >= 2 and self.profile.share > 0 and self.rng.random() < 0.2:
            if len(self.pool) < 256:
                self.pool.append(made)
            else:
                self.pool[self.rng.randrange(256)] = made
        return made

    def fresh(self, budget: int, depth: int) -> _Node:
        kind = self.rng.choices(self.kinds, self.kind_weights)[0]
        if kind == "add" and budget >= 1:
            parts = min(self.rng.randint(2, 4), budget + 1)
            children = [self.node(b, depth + 1) for b in self.split(budget - (parts - 1), parts)]
            return _Node(_sum(*(c.expr for c in children)), sum(c.ops for c in children) + parts - 1,
                         sum(c.bound for c in children))
        if kind == "mul" and budget >= 1:
            parts = min(self.rng.randint(2, 3), budget + 1)
            children = [self.node(b, depth + 1) for b in self.split(budget - (parts - 1), parts)]
            bound = 1.0
            for k, child in enumerate(children):
                if bound * child.bound > MAGNITUDE_CAP:
                    children[k] = child = self.squash(child)
                bound *= child.bound
            return _Node(_product(*(c.expr for c in children)), sum(c.ops for c in children) + parts - 1,
                         bound)
        if kind == "power" and budget >= 1:
            exponent = self.rng.choice((2, 2, 3, -1))
            if exponent == -1 and budget >= 3:
                # 1 / (1 + u**2): a reciprocal that stays below 1
                child = self.node(budget - 3, depth + 1)
                return _Node(_power(_sum(sp.S.One, _power(child.expr, 2)), -1), child.ops + 3, 1.0)
            exponent = abs(exponent)
            child = self.node(budget - 1, depth + 1)
            if child.bound**exponent > MAGNITUDE_CAP:
                child = self.squash(child)
            return _Node(_power(child.expr, exponent), child.ops + 1, child.bound**exponent)
        if kind == "affine" and budget >= 2:
            child = self.node(budget - 2, depth + 1)
            scale, shift = self.number(), self.number()
            return _Node(_sum(_product(scale, child.expr), shift), child.ops + 2,
                         abs(float(scale)) * child.bound + abs(float(shift)))
        name = self.rng.choice(("sin", "cos", "tanh", "atan", "exp", "log", "sqrt", "abs"))
        cost = 3 if name in ("log", "sqrt") else 1
        return self.call(name, self.node(max(budget - cost, 0), depth + 1))


def generate(profile: Profile | str, target: int, seed: int = 0) -> Shape:
    """A shape of about `target` operations drawn from `profile`, the same for the same seed."""
    from symkern.codegen.linearize import count_operations

    if isinstance(profile, str):
        profile = PROFILES[profile]
    start = time.perf_counter()
    rng = random.Random(f"{profile.name}:{target}:{seed}")
    inputs = list(sp.symbols(f"x0:{profile.inputs}", real=True))
    n_params = max(4, round(profile.params_per_kop * target / 1000))
    params = list(sp.symbols(f"p0:{n_params}", real=True))
    grammar = _Grammar(profile, rng, inputs, params)
    n_out = max(1, round(target / profile.ops_per_output))
    outputs: list[list[sp.Expr]] = [[] for _ in range(n_out)]
    operations = 0
    # SymPy merges like terms and numeric factors as the sums are built, so the count the
    # grammar keeps runs ahead of the true one: top up from the true count, at most 4 times
    for _ in range(4):
        missing = target - operations
        if missing <= 0.02 * target:
            break
        for k in range(n_out):
            goal, ops = (missing * (k + 1)) // n_out - (missing * k) // n_out, 0
            while ops < goal:
                term = grammar.fresh(min(rng.randint(*profile.term_ops), max(goal - ops - 2, 1)), 0)
                outputs[k].append(_product(grammar.number(), term.expr))
                ops += term.ops + 2
        eqs = sp.Matrix([sp.Add(*terms) for terms in outputs])
        operations = int(count_operations(list(eqs)))
    values = {p.name: round(rng.uniform(*PARAMETER_RANGE), 6) for p in params}
    construct = time.perf_counter() - start
    return Shape(profile.name, target, seed, eqs, inputs, {p.name: p for p in params}, values,
                 operations, int(count_operations(list(eqs), dag=True)),
                 construct, grammar.calls)


def cosine_sum(n_terms: int = 20_000, seed: int = 0) -> tuple[sp.Expr, list[sp.Symbol]]:
    """`sum_i c_i * v_(i mod 2)**(i mod 3 + 1) * cos(i * v_((i+1) mod 2))`: one structure whose
    terms differ only in numbers (about 5 operations a term, every cosine distinct)."""
    rng = random.Random(f"cosine-sum:{n_terms}:{seed}")
    v = list(sp.symbols("v0:2"))
    terms = [sp.Float(round(rng.uniform(-1, 1), 4)) * v[i % 2] ** (i % 3 + 1) * sp.cos(i * v[(i + 1) % 2])
             for i in range(1, n_terms + 1)]
    return sp.Add(*terms), v


def parameter_sum(n_params: int) -> tuple[sp.Expr, sp.Symbol, dict[str, sp.Symbol]]:
    """`x * Add(*p)` with `n_params` scalar parameters `p0 ... p(n-1)`."""
    x = sp.Symbol("x")
    params = sp.symbols(f"p0:{n_params}")
    return x * sp.Add(*params), x, {p.name: p for p in params}
