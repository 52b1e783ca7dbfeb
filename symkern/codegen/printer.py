"""codegen, stage 1 helper: print the linearized statements without SymPy's printer walking them.

Imports sympy and symkern.codegen.callee; the printer it falls back to is passed in (emit's).

The text is the one SymPy's JAX printer writes (docs/design/build-cost.md, "The printer"):
sums, products, powers, the functions of the callee table written `name(args)` and the
atoms are printed here, one dispatch by node type; any other node (Piecewise, a relational,
an unusual function, ...) is handed whole to the given printer. The right-hand sides are at
most `linearize`'s max_depth deep outside the subtrees handed on, so the recursion is bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy as sp
from mpmath.libmp import fninf as _NEGATIVE_INFINITY
from sympy.core.function import AppliedUndef, Function, UndefinedFunction
from sympy.matrices.expressions.matexpr import MatrixElement
from sympy.printing.codeprinter import CodePrinter
from sympy.printing.precedence import PRECEDENCE, PRECEDENCE_FUNCTIONS, PRECEDENCE_VALUES, precedence
from sympy.printing.pycode import _print_known_func

from symkern.codegen.callee import CALLEE_TABLE
from symkern.symbolic.nodes import holds

_ADD = PRECEDENCE["Add"]
_MUL = PRECEDENCE["Mul"]
_POW = PRECEDENCE["Pow"]
_ATOM = PRECEDENCE["Atom"]
#: the weight SymPy gives a unary minus before a lone factor (between Mul and Pow)
_UNARY_MINUS = 0.5 * (PRECEDENCE["Pow"] + PRECEDENCE["Mul"])


def float_is_negative(number: sp.Float) -> bool:
    """`number < 0` (and `number.is_extended_negative`) read off its mpmath value: SymPy
    deduces the assumptions again for each Float object, a third of printing a body of
    distinct coefficients. -inf is negative; nan and -0.0 are not."""
    value, _ = number._hashable_content()  # (mpmath value, precision)
    sign, mantissa, _, _ = value
    return sign == 1 and (mantissa != 0 or value == _NEGATIVE_INFINITY)


class _DelegateWholeFunction(Exception):
    """A statement holds what only SymPy's own function printer writes alike (a node its
    printer reports as not supported, a `Subs` in a returned value): print it all there."""


class _DelegateStatement(Exception):
    """The statement reads `re(...)`, which SymPy's `doprint` rebuilds before printing."""


def _precedence_rule(cls: type) -> int | Callable[[sp.Basic], int]:
    """What SymPy's `precedence` reads for instances of `cls`: a number, or a function."""
    if hasattr(cls, "precedence"):
        return precedence
    for base in cls.__mro__:
        name = base.__name__
        if name in PRECEDENCE_FUNCTIONS:
            return PRECEDENCE_FUNCTIONS[name]
        if name in PRECEDENCE_VALUES:
            return PRECEDENCE_VALUES[name]
    return PRECEDENCE["Atom"]


def _print_method(printer: CodePrinter, cls: type) -> Callable | None:
    """The method SymPy's `Printer._print` dispatches instances of `cls` to, or None when
    the class prints itself (the printer's `printmethod`) or falls to `emptyPrinter`."""
    if printer.printmethod and hasattr(cls, printer.printmethod):
        return None
    classes = cls.__mro__
    if AppliedUndef in classes:
        classes = classes[classes.index(AppliedUndef):]
    if UndefinedFunction in classes:
        classes = classes[classes.index(UndefinedFunction):]
    if Function in classes:
        i = classes.index(Function)
        classes = tuple(c for c in classes[:i]
                        if c.__name__ == classes[0].__name__ or c.__name__.endswith("Base")
                        ) + classes[i:]
    for base in classes:
        method = getattr(printer, "_print_" + base.__name__, None)
        if method is not None:
            return method
    return None


class StatementPrinter:
    """Prints expressions as `delegate.doprint` does, without SymPy's dispatch and
    precedence lookups on the nodes of large bodies.

    `delegate` is the JAX printer whose text this reproduces (emit's `jax_printer`, whose
    `print_node`, `module_format` and `module_name` it calls): it prints the atoms once
    each and every node type not printed here.
    """

    def __init__(self, delegate: CodePrinter) -> None:
        self.delegate = delegate
        self._handlers: dict[type, Callable[[sp.Basic], str]] = {
            sp.Add: self._add, sp.Mul: self._mul, sp.Pow: self._pow}
        self._precedences: dict[type, int | Callable[[sp.Basic], int]] = {}
        self._atoms: dict[type, dict] = {}
        self._sqrt = delegate.module_name("sqrt")
        self._one = delegate.print_node(sp.S.One)
        self._negative_exponents: dict[sp.Basic, str] = {}
        #: per number but Floats: (`number < 0`, its precedence, is_extended_negative)
        self._numbers: dict = {}
        #: the types whose handler may print a whole right-hand side: all but the Float
        #: (which prints all its digits there) and the nodes handed on, which doprint prints
        self._top_level: set[type] = {sp.Add, sp.Mul, sp.Pow}

    # -- the whole function ---------------------------------------------------------------

    def function(self, name: str, arguments: Sequence[sp.Basic],
                 assignments: Sequence[tuple[sp.Basic, sp.Basic]],
                 returned: Sequence[sp.Basic]) -> str | None:
        """The source `_EvaluatorPrinter(delegate).doprint(name, arguments, returned,
        cses=assignments)` writes, for arguments that are plain identifiers (emit's `_a0`, ...),
        or None where only that function writes it alike."""
        try:
            return self._function(name, arguments, assignments, returned)
        except _DelegateWholeFunction:
            return None

    def _function(self, name, arguments, assignments, returned) -> str:
        if any(holds([value], sp.Subs) for value in returned):
            raise _DelegateWholeFunction("a returned value holds Subs")
        lines = [f"def {name}({', '.join(str(argument) for argument in arguments)}):"]
        for symbol, value in assignments:
            lines.append(f"    {self.expression(symbol)} = {self.expression(value)}")
        printed = "(" + ", ".join(self.expression(value) for value in returned) + ",)" \
            if returned else "()"
        if "\n" in printed:
            printed = f"({printed})"
        lines.append(f"    return {printed}")
        return "\n".join(lines) + "\n"

    def expression(self, expr: sp.Basic) -> str:
        """`delegate.doprint(expr)`."""
        delegate = self.delegate
        if type(expr) not in self._top_level:
            self._handler(type(expr))
            if type(expr) not in self._top_level:
                return self._doprint(expr)
        delegate._not_supported = set()
        delegate._number_symbols = set()
        delegate._print_level = 1  # what delegate.doprint's own call makes it: children at 2
        try:
            printed = self._text(expr)
        except _DelegateStatement:
            return self._doprint(expr)
        finally:
            delegate._print_level = 0
        if delegate._not_supported or delegate._number_symbols:
            raise _DelegateWholeFunction("the printer reported a node it does not support")
        return "\n".join(printed.splitlines())

    def _doprint(self, expr: sp.Basic) -> str:
        printed = self.delegate.doprint(expr)
        if printed.startswith("#"):
            raise _DelegateWholeFunction("the printer reported a node it does not support")
        return printed

    # -- nodes ----------------------------------------------------------------------------

    def _text(self, node: sp.Basic) -> str:
        handler = self._handlers.get(type(node))
        if handler is None:
            handler = self._handler(type(node))
        return handler(node)

    def _handler(self, cls: type) -> Callable[[sp.Basic], str]:
        handler = self._handlers.get(cls)
        if handler is None:
            handler = self._handlers[cls] = self._handler_for(cls)
        return handler

    def _handler_for(self, cls: type) -> Callable[[sp.Basic], str]:
        if issubclass(cls, sp.re):
            return _delegate_statement
        if issubclass(cls, sp.Float):
            return self._float
        if issubclass(cls, sp.Atom) or cls is MatrixElement:
            self._top_level.add(cls)
            return self._atom
        method = _print_method(self.delegate, cls)
        known = self.delegate.known_functions.get(cls.__name__)
        if (issubclass(cls, Function) and getattr(method, "__func__", None) is _print_known_func
                and isinstance(known, str)):
            name = self.delegate.module_format(known)
            if name in CALLEE_TABLE:
                self._top_level.add(cls)
                return lambda node: f"{name}({', '.join(map(self._text, node.args))})"
        return self._delegated

    def _number(self, number: sp.Number) -> tuple:
        if number.is_Float:
            negative = float_is_negative(number)
            return negative, _ADD if negative else _ATOM, negative
        facts = self._numbers.get(number)
        if facts is None:
            facts = self._numbers[number] = (bool(number < 0), precedence(number),
                                             bool(number.is_extended_negative))
        return facts

    def _precedence(self, node: sp.Basic) -> int:
        if node.is_Number:
            return self._number(node)[1]
        if type(node) is sp.Mul:
            return self._mul_precedence(node)
        rule = self._precedences.get(type(node))
        if rule is None:
            rule = self._precedences[type(node)] = _precedence_rule(type(node))
        return rule if type(rule) is int else rule(node)

    def _parenthesize(self, node: sp.Basic, level: float) -> str:
        printed = self._text(node)
        return f"({printed})" if self._precedence(node) <= level else printed

    def _atom(self, node: sp.Basic) -> str:
        # an atom prints alike wherever it stands (only a Float's digits depend on the
        # nesting, and every atom here is nested): once per distinct atom
        seen = self._atoms.get(type(node))
        if seen is None:
            seen = self._atoms[type(node)] = {}
        printed = seen.get(node)
        if printed is None:
            printed = seen[node] = self._delegated(node)
        return printed

    def _mul_precedence(self, expr: sp.Mul) -> int:
        # SymPy's precedence_Mul: Add when a minus sign can be taken out, i.e. the first
        # factor is a negative number and the product is not its own negative, which it is
        # only when the factor after that number is zoo (Mul.__neg__ leaves that one alone,
        # and it leaves a Float's sign to as_coeff_mul, which takes it out)
        args = expr.args
        first = args[0]
        if (first.is_Number and self._number(first)[2]
                and (len(args) < 2 or args[1] is not sp.S.ComplexInfinity or not first.is_Rational)):
            return _ADD
        return _MUL

    def _float(self, node: sp.Float) -> str:
        # equal Floats of other precisions print other digits: keyed by both
        seen = self._atoms.get(sp.Float)
        if seen is None:
            seen = self._atoms[sp.Float] = {}
        key = (type(node), node._hashable_content())  # its value and precision
        printed = seen.get(key)
        if printed is None:
            printed = seen[key] = self._delegated(node)
        return printed

    def _delegated(self, node: sp.Basic) -> str:
        if holds([node], sp.re):
            raise _DelegateStatement
        return self.delegate.print_node(node)

    def _add(self, expr: sp.Add) -> str:
        # emit._KernelPrinter._print_Add, terms in .args order ("order": "none")
        parts = []
        for term in expr.args:
            printed = self._text(term)
            if printed.startswith("-") and not term.is_Add:
                sign, printed = "-", printed[1:]
            else:
                sign = "+"
            if self._precedence(term) < _ADD or term.is_Add:
                parts.extend([sign, f"({printed})"])
            else:
                parts.extend([sign, printed])
        sign = parts.pop(0)
        return ("" if sign == "+" else sign) + " ".join(parts)

    def _mul(self, expr: sp.Mul) -> str:
        # emit._KernelPrinter._print_Mul and CodePrinter._print_Mul: the factors the latter
        # prints after taking out a negative coefficient, without building that product
        args = expr.args
        if not expr.is_commutative or len(args) < 2 or any(arg.is_Mul for arg in args):
            return self._delegated(expr)
        c = args[0] if args[0].is_Number else sp.S.One
        rest = args[1:] if c is args[0] else args
        if not (c.is_Number and self._number(c)[0]):
            sign, factors, level = "", args, self._precedence(expr)
        elif rest[0].is_Number:
            return self._delegated(expr)
        elif c is sp.S.NegativeOne:
            sign, factors, level = "-", rest, self._precedence(expr)
        elif len(rest) == 1 and not rest[0].is_Add:
            # _KernelPrinter: "-" before the product of -c and the factor, a product of
            # precedence Mul with a positive coefficient
            return "-" + self._product("", (-c, rest[0]), _MUL)
        else:
            sign, factors, level = "-", (-c, *rest), self._precedence(expr)
        return self._product(sign, factors, level)

    def _product(self, sign: str, factors: Sequence[sp.Basic], level: int) -> str:
        numerator: list[str] = []
        denominator: list[str] = []
        bases: list[sp.Basic | None] = []  # the denominator's entries that are bare bases
        parenthesized: list[sp.Basic] = []
        for item in factors:
            exponent = item.exp if item.is_Pow else None
            if (exponent is not None and item.is_commutative and exponent.is_Rational
                    and exponent.p < 0):
                if not (exponent.p == -1 and exponent.q == 1):
                    # Pow(base, -exponent, evaluate=False): precedence Pow, above `level`
                    denominator.append(self._power(item.base, -exponent, True))
                    bases.append(None)
                else:
                    base = item.base
                    if len(base.args) != 1 and isinstance(base, sp.Mul):
                        parenthesized.append(base)
                    denominator.append(self._parenthesize(base, level))
                    bases.append(base)
            else:
                numerator.append(item)
        if not numerator:
            numerator = [sp.S.One]
        if len(numerator) == 1 and sign == "-":
            top = [self._parenthesize(numerator[0], _UNARY_MINUS)]
        else:
            top = [self._parenthesize(item, level) for item in numerator]
        for base in parenthesized:
            k = bases.index(base)
            denominator[k] = f"({denominator[k]})"
        if not denominator:
            return sign + "*".join(top)
        if len(denominator) == 1:
            return sign + "*".join(top) + "/" + denominator[0]
        return sign + "*".join(top) + f"/({'*'.join(denominator)})"

    def _pow(self, expr: sp.Pow) -> str:
        # NumPyPrinter._print_Pow: a negative integer exponent printed as a float
        exponent = expr.exp
        if exponent.is_integer and exponent.is_negative:
            printed = self._negative_exponents.get(exponent)
            if printed is None:
                printed = self._negative_exponents[exponent] = self._parenthesize(
                    exponent.evalf(), _POW)
            return f"{self._parenthesize(expr.base, _POW)}**{printed}"
        return self._power(expr.base, exponent, expr.is_commutative)

    def _power(self, base: sp.Basic, exponent: sp.Basic, commutative: bool) -> str:
        # AbstractPythonCodePrinter._hprint_Pow with jax.numpy's sqrt
        if exponent.is_Rational and exponent.p == 1 and exponent.q == 2:  # == S.Half
            return f"{self._sqrt}({self._text(base)})"
        if commutative:
            if -exponent is sp.S.Half:
                return f"{self._one}/{self._sqrt}({self._text(base)})"
            if exponent is sp.S.NegativeOne:
                return f"{self._one}/{self._parenthesize(base, _POW)}"
        return f"{self._parenthesize(base, _POW)}**{self._parenthesize(exponent, _POW)}"


def _delegate_statement(node: sp.Basic) -> str:
    raise _DelegateStatement


