"""codegen, stage 1: ask SymPy's own JAX code printer for the per-sample source.

Imports sympy, ast and symkern.symbolic / symkern.errors; nothing from kernels or batching.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy as sp
from sympy.core.function import AppliedUndef
from sympy.logic.boolalg import ITE, BooleanFunction
from sympy.matrices.expressions.matexpr import MatrixElement
from sympy.printing.numpy import JaxPrinter
from sympy.printing.precedence import PRECEDENCE, precedence
from sympy.utilities.lambdify import _EvaluatorPrinter

from symkern.codegen.callee import SUPPORTED_SYMPY_FUNCTIONS, unsupported_message
from symkern.codegen.linearize import linearize
from symkern.codegen.printer import StatementPrinter
from symkern.codegen.stopwatch import Stopwatch
from symkern.errors import BuildError, UnsupportedFunctionError
from symkern.symbolic.arguments import ArgumentSpec, EquationSet, is_bound_entry
from symkern.symbolic.nodes import walk
from symkern.symbolic.structured import NetworkFunction

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
#: docs/design/cse-pairs.md)
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


#: integers at least this large print as floats: JAX takes a Python int as a 32-bit integer
#: (64-bit under x64) and raises OverflowError beyond it, while the kernel computes in floats
LARGE_INTEGER = 2**31


class _KernelPrinter(JaxPrinter):
    """SymPy's JAX printer, with integers (and rationals) beyond 32 bits as float literals,
    and each argument entry printed as its generated name (`names`)."""

    def __init__(self, settings: dict, names: Mapping[sp.Basic, sp.Basic] | None = None) -> None:
        super().__init__(settings)
        self.names = names
        self.printed_names: dict[sp.Basic, str] = {}

    def print_node(self, expr: sp.Basic) -> str:
        """One node's text, as printed inside an expression (`printer.StatementPrinter`)."""
        return self._print(expr)

    def module_format(self, name: str) -> str:
        """`name` (a qualified function name) as this printer writes it."""
        return self._module_format(name)

    def module_name(self, name: str) -> str:
        """A function of the printer's module (jax.numpy) as this printer writes it."""
        return self._module_format(f"{self._module}.{name}")

    def _generated_name(self, expr: sp.Basic) -> str | None:
        # an argument entry prints as what it stands for (`_a0[1]`): the same text as the
        # expression with the entries substituted, without rebuilding it (substituting with
        # xreplace is a third of emitting a 10^5-operation body)
        printed = self.printed_names.get(expr)
        if printed is None:
            generated = None if self.names is None else self.names.get(expr)
            if generated is None:
                return None
            # the generated name prints as itself: a user's symbol may be spelled like a
            # generated one (`_a0`), and looking the name up again would print another
            # argument's entry, or recurse forever
            names, self.names = self.names, None
            try:
                printed = self.printed_names[expr] = self._print(generated)
            finally:
                self.names = names
        return printed

    def _print_Symbol(self, expr: sp.Symbol) -> str:
        return self._generated_name(expr) or super()._print_Symbol(expr)

    def _print_Dummy(self, expr: sp.Dummy) -> str:
        return self._generated_name(expr) or super()._print_Dummy(expr)

    def _print_MatrixElement(self, expr: MatrixElement) -> str:
        printed = self._generated_name(expr)
        if printed is not None:
            return printed
        if self.names is not None:
            raise BuildError("eqs: a matrix element is read whose matrix is not fully declared")
        return super()._print_MatrixElement(expr)

    def _print_Integer(self, expr: sp.Integer) -> str:
        if abs(expr.p) >= LARGE_INTEGER:
            return _float_literal(expr)
        return super()._print_Integer(expr)

    def _print_Rational(self, expr: sp.Rational) -> str:
        if max(abs(expr.p), expr.q) >= LARGE_INTEGER:
            return _float_literal(expr)
        return super()._print_Rational(expr)

    def _print_unknown_function(self, expr: sp.Function) -> str:
        # the NumPy printer refuses functions NumPy lacks; symkern's table has them
        return (f"{type(expr).__name__}("
                f"{', '.join(self._print(argument) for argument in expr.args)})")

    def _print_Mul(self, expr: sp.Mul) -> str:
        # SymPy's printer splits off a negative coefficient and multiplies its magnitude
        # back into the product, evaluated (`_keep_coeff(-c, f)` is `-c*f` when f is one
        # factor), which runs SymPy's assumptions on the factor: 1.4 of the 1.7 s of
        # printing a 1,000-operation nest of functions. The same product built as it
        # stands prints to the same text, after the sign. (Switching evaluation off
        # instead clears SymPy's cache at every switch.)
        c, factor = expr.as_coeff_Mul()
        if c < 0 and c != -1 and not (factor.is_Add or factor.is_Mul or factor.is_Number):
            return "-" + super()._print_Mul(sp.Mul(-c, factor, evaluate=False))
        return super()._print_Mul(expr)

    def parenthesize(self, item: sp.Basic, level: float, strict: bool = False) -> str:
        printed = _precedence(item)
        if printed < level or (not strict and printed <= level):
            return f"({self._print(item)})"
        return self._print(item)

    def _print_Add(self, expr: sp.Add, order: str | None = None) -> str:
        # SymPy's StrPrinter._print_Add, with `_precedence`
        terms = self._as_ordered_terms(expr, order=order)
        level = _precedence(expr)
        parts = []
        for term in terms:
            printed = self._print(term)
            if printed.startswith("-") and not term.is_Add:
                sign, printed = "-", printed[1:]
            else:
                sign = "+"
            if _precedence(term) < level or term.is_Add:
                parts.extend([sign, f"({printed})"])
            else:
                parts.extend([sign, printed])
        sign = parts.pop(0)
        return ("" if sign == "+" else sign) + " ".join(parts)

    _print_fresnels = _print_fresnelc = _print_unknown_function
    _print_lowergamma = _print_uppergamma = _print_binomial = _print_unknown_function

    def _print_Piecewise(self, expr: sp.Piecewise) -> str:
        # SymPy writes a comparison of a Piecewise (an elu layer of elu layers) as an ITE,
        # and the NumPy printer runs simplify_logic on such a condition: exponential in its
        # size (a 2-3-2 elu network took 33 s to print). Its negation normal form
        # (`ITE(a, b, c)` → `(a | c) & (~a | b)`, negations folded into the comparisons)
        # is the same condition, printed as it stands.
        if any(arg.cond.has(ITE) for arg in expr.args):
            expr = sp.Piecewise(*((arg.expr, arg.cond.to_nnf() if arg.cond.has(ITE) else arg.cond)
                                  for arg in expr.args), evaluate=False)
        return super()._print_Piecewise(expr)


def _precedence(item: sp.Basic) -> int:
    """SymPy's `precedence`, asking a product whether a minus sign could be taken out of it
    only when its first factor is a negative number (else the answer is no): the question
    builds the product's negative, evaluated, a third of printing a 10^5-operation body."""
    if type(item) is sp.Mul:
        first = item.args[0]
        if not (first.is_Number and first.is_extended_negative):
            return PRECEDENCE["Mul"]
    return precedence(item)


def _float_literal(number: sp.Rational) -> str:
    """`number` as a float literal; beyond float range `1e999` (inf), as float() gives."""
    value = float(number)
    if math.isinf(value):
        return "1e999" if value > 0 else "(-1e999)"
    return repr(value) if value >= 0 else f"({value!r})"


def jax_printer(user_functions: Mapping[str, str],
                names: Mapping[sp.Basic, sp.Basic] | None = None) -> JaxPrinter:
    # The settings sympy.lambdify passes for modules="jax"; printing function names bare
    # (not fully qualified) is what resolve_callees normalises. Undefined functions are
    # printed under generated names, so a user's function name never becomes code.
    # "order": "none" keeps the argument order linearize fixed (deterministic) and spares
    # the printer its recursive sort keys, which dominated printing time at scale.
    return _KernelPrinter({
        "fully_qualified_modules": False,
        "inline": True,
        "allow_unknown_functions": True,
        "user_functions": dict(user_functions),
        "order": "none",
    }, names)


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


#: what SymPy leaves unevaluated and a kernel cannot compute as it stands (their bound
#: variables would otherwise be reported as free symbols)
UNEVALUATED = (sp.Sum, sp.Product, sp.Integral, sp.Derivative)


#: the most terms an unevaluated Sum or Product (all of them, nested ones multiplied out)
#: is written out as; beyond, the expression would outgrow what a kernel compiles quickly
#: (docs/scaling.md: about 10^5 operations)
UNROLL_MAX_TERMS = 10_000


def static_bound(bound: sp.Basic, largest: bool) -> int | None:
    """The largest (or smallest) value a Sum's bound takes, known at build: an integer, or
    the integer in `Min(n, 100)` (`Max(m, 0)` for a lower bound) that bounds a parameter."""
    if isinstance(bound, sp.Integer):
        return int(bound)
    if isinstance(bound, sp.Min if largest else sp.Max):
        numbers = [int(arg) for arg in bound.args if isinstance(arg, sp.Integer)]
        if numbers:
            return min(numbers) if largest else max(numbers)
    return None


def _terms(function: sp.Basic, limits: Sequence[tuple], neutral: sp.Basic
           ) -> list[sp.Basic] | None:
    """The terms of a sum or product over `limits` (innermost first, as SymPy keeps them;
    inner bounds may read outer indices), or None when a bound has no value known at build
    (`static_bound`). Where a bound reads a parameter, each term is masked:
    `Piecewise((term, low <= k <= high), (neutral, True))`."""
    if not limits:
        return [function]
    (variable, low, high), inner = limits[-1], limits[:-1]
    first, last = static_bound(low, largest=False), static_bound(high, largest=True)
    if first is None or last is None:
        return None
    masked = not (isinstance(low, sp.Integer) and isinstance(high, sp.Integer))
    terms: list[sp.Basic] = []
    for k in range(first, last + 1):
        value = {variable: sp.Integer(k)}
        found = _terms(function.xreplace(value),
                       [(v, lo.xreplace(value), hi.xreplace(value)) for v, lo, hi in inner],
                       neutral)
        if found is None:
            return None
        if masked:
            inside = sp.And(low <= k, sp.Integer(k) <= high)
            found = [sp.Piecewise((term, inside), (neutral, True)) for term in found]
        terms.extend(found)
        if len(terms) > UNROLL_MAX_TERMS:
            return terms
    return terms


def unroll_sums(exprs: list[Any], nodes: Sequence[sp.Basic]) -> list[Any]:
    """Every unevaluated `Sum`/`Product` whose bounds are known at build, written out term
    by term (nested ones too, once the outer index is a number): integer bounds, or a bound
    reading a parameter with its largest value stated (`Min(n, 100)`, `static_bound`),
    whose terms past it are masked. The same list object when there are none; a
    BuildError beyond UNROLL_MAX_TERMS terms.

    >>> i, x = sp.symbols("i x")
    >>> unroll_sums([sp.Sum(x**i, (i, 1, 3))], [sp.Sum(x**i, (i, 1, 3))])
    [x**3 + x**2 + x]
    """
    if not any(isinstance(node, (sp.Sum, sp.Product)) for node in nodes):
        return exprs
    written = [0]

    def unroll(node: sp.Basic) -> sp.Basic:
        terms = _terms(node.function, node.limits,
                       sp.S.Zero if isinstance(node, sp.Sum) else sp.S.One)
        if terms is None:
            return node
        written[0] += len(terms)
        if written[0] > UNROLL_MAX_TERMS:
            raise UnsupportedFunctionError(
                f"eqs: {type(node).__name__} {node} has more than {UNROLL_MAX_TERMS} terms "
                "to write out; find its closed form (.doit()) or shorten its range")
        return (sp.Add if isinstance(node, sp.Sum) else sp.Mul)(*terms)

    changed = exprs
    for _ in range(64):  # each round writes out one level of nesting
        following = [expr.replace(lambda e: isinstance(e, (sp.Sum, sp.Product)), unroll)
                     for expr in changed]
        if all(a == b for a, b in zip(following, changed, strict=True)):
            break
        changed = following
    return changed


def without_ite(leaves: list[Any], nodes: Sequence[sp.Basic] | None = None) -> list[Any]:
    """Every `ITE(a, b, c)` in negation normal form (`(~a | b) & (a | c)`), which prints as
    elementwise logic: SymPy's printer writes an ITE as a Piecewise of conditions, a select
    with a NaN default. `nodes`: their walk, when already made. The same list object when
    they hold none."""
    if not any(isinstance(node, ITE) for node in (walk(leaves) if nodes is None else nodes)):
        return leaves

    def rewrite(expr: sp.Basic) -> sp.Basic:
        return expr.replace(lambda e: isinstance(e, ITE), lambda e: e.to_nnf())

    return [leaf.applyfunc(rewrite) if isinstance(leaf, (sp.MatrixBase, sp.NDimArray))
            else rewrite(leaf) for leaf in leaves]


def without_dirac_delta(exprs: list[Any], nodes: Sequence[sp.Basic] | None = None) -> list[Any]:
    """`exprs` with every `DiracDelta` as 0: its value wherever it has one, and what JAX's
    derivatives give (the second derivative of a relu or Heaviside network). `nodes`: their
    walk, when already made. The same list object when they hold none."""
    deltas = {node: sp.S.Zero for node in (walk(exprs) if nodes is None else nodes)
              if isinstance(node, sp.DiracDelta)}
    return [expr.xreplace(deltas) for expr in exprs] if deltas else exprs


def check_functions(nodes: Sequence[sp.Basic], functions: Mapping[str, object],
                    complex_values: bool = False) -> list[str]:
    """Unsupported SymPy functions raise; undefined ones must be in `functions`; the
    imaginary unit needs a complex kernel (`complex_values`)."""
    undefined: dict[str, None] = {}
    for node in nodes:
        if node is sp.zoo:
            raise BuildError(
                "eqs: complex infinity (zoo, e.g. from 1/0) has no real value; "
                "remove the division by zero or use Piecewise"
            )
        if node is sp.I and not complex_values:
            raise BuildError(
                "eqs: the imaginary unit I has no value in a real kernel (dtype float32 or "
                "float64), which computes in real numbers; leave dtype out or pass "
                "dtype='complex128' for a complex kernel, or rewrite the expression in real "
                "form first (e.g. a root from sp.solve written with I: solve over real "
                "symbols, or take sp.re(...) and simplify)"
            )
        if isinstance(node, NetworkFunction):
            raise BuildError(
                f"eqs: holds {type(node).__name__}, a network compiled as an array program (a "
                "layer above 64 weights, or structured=True); build it with "
                "build_nn_function(eqs, snn), or scalarize it: SymbolicNetwork(net, structured=False)"
            )
        if isinstance(node, (sp.Derivative, sp.Subs)) and node.atoms(AppliedUndef):
            name = type(next(iter(node.atoms(AppliedUndef)))).__name__
            raise UnsupportedFunctionError(
                f"eqs: {node} is a derivative of the undefined function {name}(), which .doit() "
                f"cannot evaluate; define the derivative as a function of its own (e.g. "
                f'd{name} = sp.Function("d{name}"), with functions={{"d{name}": ...}}, such as '
                f'jax.grad of functions["{name}"]) and substitute it for the derivative '
                f"(expr.subs(...))"
            )
        if isinstance(node, (sp.Sum, sp.Product)):
            raise UnsupportedFunctionError(
                f"eqs: unevaluated {type(node).__name__} {node} has a bound with no largest "
                "value known at build; a bound given as an integer parameter n needs one: "
                "write it as Min(n, 100) (a lower bound m as Max(m, 0)), and the terms up to "
                "100 are written out, those past n masked; or find its closed form (.doit())"
            )
        if isinstance(node, UNEVALUATED):
            raise UnsupportedFunctionError(
                f"eqs: unevaluated {type(node).__name__} has no JAX implementation in symkern; "
                "evaluate it first (.doit()) or write it out"
            )
        if isinstance(node, AppliedUndef):
            name = type(node).__name__
            if name not in functions:
                raise UnsupportedFunctionError(
                    f"eqs: undefined function {name}() has no implementation; pass "
                    f'functions={{"{name}": a_jax_function}} to build_function'
                )
            undefined[name] = None
        elif isinstance(node, sp.Function) and type(node).__name__ in functions:
            raise BuildError(
                f'functions["{type(node).__name__}"]: {type(node).__name__} in eqs is SymPy\'s own '
                "function, which functions= does not replace; functions= implements undefined "
                f'functions (sp.Function("name")): write the equations with one of those'
            )
        elif (isinstance(node, (sp.Function, BooleanFunction)) and not isinstance(node, ITE)
              and type(node).__name__ not in SUPPORTED_SYMPY_FUNCTIONS):
            # an ITE is a Piecewise's condition of a Piecewise, which the printer writes in
            # negation normal form (JaxPrinter._print_Piecewise above)
            raise UnsupportedFunctionError(unsupported_message(type(node).__name__))
        elif isinstance(node, sp.Function):
            refused = refused_form(node)
            if refused is not None:
                raise UnsupportedFunctionError(f"eqs: {node}: {refused}")
    return list(undefined)


def refused_form(node: sp.Function) -> str | None:
    """Why a supported function is refused in this form (its arguments), or None."""
    name, arguments = type(node).__name__, node.args
    if name == "bernoulli" and len(arguments) == 2:
        return ("Bernoulli polynomials have no JAX implementation in symkern; with an "
                "integer n, sp.bernoulli(n, x) is a polynomial SymPy writes out")
    if name == "elliptic_e" and len(arguments) == 2:
        return ("the incomplete elliptic integral E(phi, m) has no JAX implementation in "
                "symkern (the complete elliptic_e(m) has); pass a functions= implementation")
    if name == "LambertW" and len(arguments) == 2 and arguments[1] not in (0, -1):
        return ("LambertW is real on branches 0 and -1 only, and its branch must be a "
                "number; write LambertW(x) or LambertW(x, -1)")
    return None


def symbol_name(symbol: sp.Basic) -> str:
    """A symbol's name as messages print it: quoted when it is not a plain identifier, so
    "a, b" and a name with spaces, commas or line breaks cannot be misread."""
    name = str(symbol)
    return name if name.isidentifier() else repr(name)


#: what a SymPy function replaced through functions= is called until it is printed under
#: its generated name: no name a user can give an undefined function of their own
OVERRIDE_SUFFIX = " (functions=)"


def override_functions(leaves: list[Any], functions: Mapping[str, object],
                       nodes: Sequence[sp.Basic] | None = None
                       ) -> tuple[list[Any], dict[str, str]]:
    """SymPy's own functions named in `functions` (`functions={"sin": my_sin}`, lambdify's
    `modules=[{"sin": my_sin}, "jax"]`) become undefined functions that call the given
    implementation. Returns the equations and {undefined function name: key of functions}.
    Functions of conditions (Piecewise) stay as they are. `nodes`: their walk, when made."""
    if not functions:
        return leaves, {}

    def replaceable(node: sp.Basic) -> bool:
        return (isinstance(node, sp.Function) and not isinstance(node, AppliedUndef)
                and type(node).__name__ in functions
                and all(isinstance(a, sp.Expr) for a in node.args))

    overridden = {f"{type(node).__name__}{OVERRIDE_SUFFIX}": type(node).__name__
                  for node in (walk(leaves) if nodes is None else nodes) if replaceable(node)}
    if not overridden:
        return leaves, {}

    def replace(expr: sp.Basic) -> sp.Basic:
        # bottom-up: an argument may itself be replaced
        return expr.replace(replaceable, lambda e: sp.Function(
            type(e).__name__ + OVERRIDE_SUFFIX)(*e.args))

    return [leaf.applyfunc(replace) if isinstance(leaf, (sp.MatrixBase, sp.NDimArray))
            else replace(leaf) for leaf in leaves], overridden


def implemented_functions(leaves: Sequence[sp.Basic]) -> dict[str, Any]:
    """The implementations that `sympy.utilities.lambdify.implemented_function` attached to
    undefined functions in the equations (`_imp_`), by name, for functions=."""
    found: dict[str, Any] = {}
    for node in walk(list(leaves)):
        implementation = getattr(type(node), "_imp_", None)
        if isinstance(node, AppliedUndef) and callable(implementation):
            found[type(node).__name__] = implementation
    return found


def bind_entries(leaves: list[Any], arguments: Sequence[ArgumentSpec],
                 nodes: Sequence[sp.Basic] | None = None
                 ) -> tuple[list[Any], Sequence[ArgumentSpec]]:
    """Entries such as `q(t)` and `q(t).diff(t)` (sympy.physics.mechanics' dynamicsymbols)
    and IndexedBase entries `x[0]` become placeholder symbols, in the equations and in
    their specs, so that they are bound by position like symbols. The same objects when
    there are none.

    A derivative of a declared function that is not itself declared is refused: SymPy
    would differentiate the placeholder to zero. `nodes`: the equations' walk, when made.
    """
    placeholders = {entry: sp.Dummy(f"arg{k}")
                    for k, entry in enumerate(e for spec in arguments for e in spec.entries
                                              if is_bound_entry(e))}
    if not placeholders:
        return leaves, arguments
    functions = {entry for entry in placeholders if isinstance(entry, AppliedUndef)}
    for node in (walk(leaves) if nodes is None else nodes):
        if (isinstance(node, (sp.Derivative, sp.Subs)) and node not in placeholders
                and node.atoms(AppliedUndef) & functions):
            found = next(iter(node.atoms(AppliedUndef) & functions))
            raise BuildError(
                f"eqs: {node} differentiates {found}, an argument, but is not an argument "
                f"itself; declare it beside {found} (e.g. [{found}, {found}.diff()] as a data "
                "argument), or substitute a symbol for it"
            )
    bound = [leaf.xreplace(placeholders) for leaf in leaves]
    specs = [dataclasses.replace(spec, entries=tuple(placeholders.get(e, e) for e in spec.entries))
             for spec in arguments]
    return bound, specs


def _check_free_symbols(nodes: Sequence[sp.Basic], arguments: Sequence[ArgumentSpec]) -> None:
    free = {node for node in nodes if isinstance(node, (sp.Symbol, sp.MatrixSymbol))}
    undeclared = free - _declared(arguments)
    if undeclared:
        names = ", ".join(sorted(symbol_name(symbol) for symbol in undeclared))
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
    complex_values: bool = False,
) -> EmittedCode:
    """Print the per-sample function for `equations`, one positional argument per spec.

    User symbols are replaced by generated names before printing, so nothing a user
    named ever becomes code. `share_pairs=False` keeps CSE from merging common sub-sums
    and sub-products at any size (a body compiled as one executable, `split=False`).
    `complex_values`: a complex kernel's, where the imaginary unit has a value.

    >>> from symkern.symbolic.arguments import data_argument, equation_set
    >>> x, y = sp.symbols("x y")
    >>> print(emit(equation_set(sp.sin(x) * y), [data_argument([x, y], 1)], cse=False))
    def _lambdifygenerated(_a0):
        return (_a0[1]*sin(_a0[0]),)
    <BLANKLINE>
    """
    functions = functions or {}
    stopwatch = stopwatch or Stopwatch(progress=False)
    # one walk of the equations, made again only after a step that changed them
    leaves = list(equations.leaves)
    nodes = list(walk(leaves))
    for step in (without_ite, unroll_sums):
        written = step(leaves, nodes)
        if written is not leaves:
            leaves, nodes = written, list(walk(written))
    written, arguments = bind_entries(leaves, arguments, nodes)
    if written is not leaves:
        leaves, nodes = written, list(walk(written))
    written, overridden = override_functions(leaves, functions, nodes)
    if written is not leaves:
        leaves, nodes = written, list(walk(written))
    written = without_dirac_delta(leaves, nodes)
    if written is not leaves:
        leaves, nodes = written, list(walk(written))
    undefined = check_functions(
        nodes, {**functions, **{name: functions[key] for name, key in overridden.items()}},
        complex_values)
    _check_free_symbols(nodes, arguments)

    substitutions: dict[sp.Basic, sp.Basic] = {}
    printed_arguments = []
    for position, spec in enumerate(arguments):
        generated, mapping = _generated_argument(spec, position)
        printed_arguments.append(generated)
        substitutions.update(mapping)
    printed_functions = {name: f"{FUNCTION_PREFIX}{k}" for k, name in enumerate(undefined)}
    user_functions = {generated: overridden.get(name, name)
                      for name, generated in printed_functions.items()}

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
                      user_functions, printed_functions)


def _print(equations, leaves, assignments, reduced, substitutions, printed_arguments,
           user_functions, printed_functions) -> EmittedCode:
    """Print the per-sample function, each argument entry as its generated name: the
    statements through `printer.StatementPrinter`, which writes SymPy's JAX printer's text
    (docs/design/build-cost.md, "The printer"), or all of it through that printer
    (`_print_with_sympy`) where only it writes the text alike.

    The expressions are printed as they stand: substituting the generated names would
    rebuild each one (without evaluating it, or SymPy's assumptions system runs: each rebuilt
    `tanh`, `Mod` or `Pow` asks whether its argument is real, finite, negative, …), for the
    same text.
    """
    leaves = _returned(equations, reduced)
    try:
        source = StatementPrinter(jax_printer(printed_functions, substitutions)).function(
            FUNCTION_NAME, printed_arguments, assignments, leaves)
    except sp.printing.codeprinter.PrintMethodNotImplementedError as error:
        raise UnsupportedFunctionError(f"eqs: {error}".split("\n")[0]) from error
    if source is None:
        return _print_with_sympy(equations, assignments, reduced, substitutions,
                                 printed_arguments, user_functions, printed_functions)
    names = tuple(str(argument) for argument in printed_arguments)
    return EmittedCode(source, names, user_functions)


def _returned(equations: EquationSet, reduced: Sequence[sp.Basic]) -> list[sp.Basic]:
    """The returned values: the equations' leaves rebuilt from their reduced entries."""
    leaves, start = [], 0
    for leaf in equations.leaves:
        count = len(_entries(leaf))
        leaves.append(_rebuild(leaf, reduced[start:start + count]))
        start += count
    return leaves


def _print_with_sympy(equations, assignments, reduced, substitutions, printed_arguments,
                      user_functions, printed_functions) -> EmittedCode:
    """`_print` through SymPy's own function printer (lambdify's `_EvaluatorPrinter`)."""
    leaves = _returned(equations, reduced)
    try:
        source = _EvaluatorPrinter(
            jax_printer(printed_functions, substitutions), False
        ).doprint(FUNCTION_NAME, printed_arguments, tuple(leaves), cses=assignments)
    except sp.printing.codeprinter.PrintMethodNotImplementedError as error:
        raise UnsupportedFunctionError(f"eqs: {error}".split("\n")[0]) from error
    names = tuple(str(argument) for argument in printed_arguments)
    return EmittedCode(source, names, user_functions)
