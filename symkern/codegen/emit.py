"""codegen, stage 1: ask SymPy's own JAX code printer for the per-sample source.

Imports sympy, ast and symkern.symbolic / symkern.errors; nothing from kernels or batching.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import sympy as sp
from sympy.core.function import AppliedUndef
from sympy.matrices.expressions.matexpr import MatrixElement
from sympy.printing.numpy import JaxPrinter
from sympy.utilities.lambdify import _EvaluatorPrinter

from symkern.codegen.callee import SUPPORTED_SYMPY_FUNCTIONS
from symkern.codegen.linearize import linearize
from symkern.codegen.stopwatch import Stopwatch
from symkern.errors import BuildError, UnsupportedFunctionError
from symkern.symbolic.arguments import ArgumentSpec, EquationSet

#: the name SymPy's lambdify gives the functions it prints; kept so drift tests compare like
#: with like.
FUNCTION_NAME = "_lambdifygenerated"
#: generated positional names: `_a0`, `_a1`, ... (never a user's name)
ARGUMENT_PREFIX = "_a"
#: generated names of undefined functions: `_f0`, `_f1`, ...
FUNCTION_PREFIX = "_f"
#: common-subexpression names: `_c0`, `_c1`, ...
CSE_PREFIX = "_c"
#: CSE shares common sub-sums and sub-products (linearize's pair sharing) only in bodies of
#: more operations than this, the size above which kernels compile in pieces or vectorized
#: (batching.build.SPLIT_ABOVE_OPERATIONS): below it XLA fuses the expression as written
#: better (double pendulum 24 -> 38 M samples/s; 4-16-16-4 network Jacobian compiled whole,
#: docs/benchmarks.md)
SHARE_PAIRS_ABOVE_OPERATIONS = 5000


@dataclass(frozen=True)
class EmittedCode:
    """Stage 1's product: the source SymPy printed, parsed, and what its names stand for.

    `argument_names[k]` is the generated name of positional argument `k`;
    `user_functions` maps each generated callee name to the key of `functions` it calls.
    """

    source: str
    argument_names: tuple[str, ...]
    user_functions: Mapping[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.source

    @functools.cached_property
    def module(self) -> ast.Module:
        """The source parsed, on first use: the rules parse their own copy, and a cache load
        need not parse it at all (0.46 s of a 0.9 s cached 10^5-operation build)."""
        return ast.parse(self.source)


def walk(roots: Sequence[sp.Basic]) -> Iterator[sp.Basic]:
    """Every node under `roots`, each object once, without recursion.

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


def _printer(user_functions: Mapping[str, str]) -> JaxPrinter:
    # The settings sympy.lambdify passes for modules="jax"; printing function names bare
    # (not fully qualified) is what resolve_callees normalises. Undefined functions are
    # printed under generated names, so a user's function name never becomes code.
    # "order": "none" keeps the argument order linearize fixed (deterministic) and spares
    # the printer its recursive sort keys, which dominated printing time at scale.
    return JaxPrinter({
        "fully_qualified_modules": False,
        "inline": True,
        "allow_unknown_functions": True,
        "user_functions": dict(user_functions),
        "order": "none",
    })


def _generated_argument(spec: ArgumentSpec, position: int) -> tuple[sp.Basic, dict]:
    name = f"{ARGUMENT_PREFIX}{position}"
    if not spec.shape:
        symbol = sp.Symbol(name)
        return symbol, {spec.entries[0]: symbol}
    base = sp.IndexedBase(name, shape=spec.shape)
    indices = (
        [(i,) for i in range(spec.shape[0])]
        if len(spec.shape) == 1
        else [(i, j) for i in range(spec.shape[0]) for j in range(spec.shape[1])]
    )
    return base, {entry: base[index] for entry, index in zip(spec.entries, indices, strict=True)}


def _declared(arguments: Sequence[ArgumentSpec]) -> set[sp.Basic]:
    declared: set[sp.Basic] = set()
    for spec in arguments:
        declared.update(spec.matrix_symbols)
        for entry in spec.entries:
            declared.add(entry.parent if isinstance(entry, MatrixElement) else entry)
    return declared


def _check_functions(nodes: Sequence[sp.Basic], functions: Mapping[str, object]) -> list[str]:
    """Unsupported SymPy functions raise; undefined ones must be in `functions`."""
    undefined: dict[str, None] = {}
    for node in nodes:
        if node is sp.zoo:
            raise BuildError(
                "eqs: complex infinity (zoo, e.g. from 1/0) has no real value; "
                "remove the division by zero or use Piecewise"
            )
        if isinstance(node, AppliedUndef):
            name = type(node).__name__
            if name not in functions:
                raise UnsupportedFunctionError(
                    f"eqs: undefined function {name}() has no implementation; pass "
                    f'functions={{"{name}": a_jax_function}} to build_function'
                )
            undefined[name] = None
        elif isinstance(node, sp.Function) and type(node).__name__ not in SUPPORTED_SYMPY_FUNCTIONS:
            raise UnsupportedFunctionError(
                f"eqs: SymPy function {type(node).__name__} has no JAX implementation in symkern; "
                f"rewrite it (e.g. with .rewrite()) or pass it as an undefined Function with "
                f"functions={{...}}"
            )
    return list(undefined)


def _check_free_symbols(nodes: Sequence[sp.Basic], arguments: Sequence[ArgumentSpec]) -> None:
    free = {node for node in nodes if isinstance(node, (sp.Symbol, sp.MatrixSymbol))}
    undeclared = free - _declared(arguments)
    if undeclared:
        names = ", ".join(sorted(str(symbol) for symbol in undeclared))
        raise BuildError(
            f"eqs: free symbols {names} are neither data arguments nor parameters; "
            "add them to a data argument or to params"
        )


def _entries(leaf: sp.Basic) -> list[sp.Basic]:
    if isinstance(leaf, sp.NDimArray):
        return list(sp.flatten(leaf.tolist()))
    if isinstance(leaf, sp.MatrixBase):
        return list(leaf)
    return [leaf]


def _rebuild(leaf: sp.Basic, entries: Sequence[sp.Basic]) -> sp.Basic:
    if isinstance(leaf, sp.NDimArray):
        return sp.ImmutableDenseNDimArray(list(entries), leaf.shape)
    if isinstance(leaf, sp.MatrixBase):
        return sp.ImmutableMatrix(leaf.rows, leaf.cols, list(entries))
    return entries[0]


def emit(
    equations: EquationSet,
    arguments: Sequence[ArgumentSpec],
    *,
    cse: bool = True,
    functions: Mapping[str, object] | None = None,
    stopwatch: Stopwatch | None = None,
    share_pairs: bool = True,
) -> EmittedCode:
    """Print the per-sample function for `equations`, one positional argument per spec.

    User symbols are replaced by generated names before printing, so nothing a user
    named ever becomes code. `share_pairs=False` keeps CSE from merging common sub-sums
    and sub-products at any size (a body compiled as one executable, `split=False`).

    >>> from symkern.symbolic.arguments import data_argument, equation_set
    >>> x, y = sp.symbols("x y")
    >>> print(emit(equation_set(sp.sin(x) * y), [data_argument([x, y], 1)], cse=False))
    def _lambdifygenerated(_a0):
        return (sin(_a0[0])*_a0[1],)
    <BLANKLINE>
    """
    functions = functions or {}
    stopwatch = stopwatch or Stopwatch(progress=False)
    leaves = list(equations.leaves)
    nodes = list(walk(leaves))
    _check_free_symbols(nodes, arguments)
    undefined = _check_functions(nodes, functions)

    substitutions: dict[sp.Basic, sp.Basic] = {}
    printed_arguments = []
    for position, spec in enumerate(arguments):
        generated, mapping = _generated_argument(spec, position)
        printed_arguments.append(generated)
        substitutions.update(mapping)
    user_functions = {f"{FUNCTION_PREFIX}{k}": name for k, name in enumerate(undefined)}

    # Bounded-depth statements (and CSE) first, on the user's trees, without recursion;
    # every right-hand side is then shallow enough for xreplace, the printer and `ast`.
    # Piecewise is never entered, so no branch shares a value computed outside its gate.
    flat = [entry for leaf in leaves for entry in _entries(leaf)]
    with stopwatch.stage("cse"):
        assignments, reduced = linearize(flat, cse=cse, symbols=sp.numbered_symbols(CSE_PREFIX),
                                         opt=share_pairs,
                                         share_above=SHARE_PAIRS_ABOVE_OPERATIONS)
    with stopwatch.stage("emit"):
        return _print(equations, leaves, assignments, reduced, substitutions, printed_arguments,
                      user_functions)


def _print(equations, leaves, assignments, reduced, substitutions, printed_arguments,
           user_functions) -> EmittedCode:
    """Substitute the generated argument names, then print with SymPy's JAX printer."""
    assignments = [(name, value.xreplace(substitutions)) for name, value in assignments]
    reduced = [entry.xreplace(substitutions) for entry in reduced]
    leaves, start = [], 0
    for leaf in equations.leaves:
        count = len(_entries(leaf))
        leaves.append(_rebuild(leaf, reduced[start:start + count]))
        start += count
    if any(isinstance(n, MatrixElement) for n in walk(leaves + [v for _, v in assignments])):
        raise BuildError("eqs: a matrix element is read whose matrix is not fully declared")
    try:
        source = _EvaluatorPrinter(
            _printer({name: generated for generated, name in user_functions.items()}), False
        ).doprint(FUNCTION_NAME, printed_arguments, tuple(leaves), cses=assignments)
    except sp.printing.codeprinter.PrintMethodNotImplementedError as error:
        raise UnsupportedFunctionError(f"eqs: {error}".split("\n")[0]) from error
    names = tuple(str(argument) for argument in printed_arguments)
    return EmittedCode(source, names, user_functions)
