"""symbolic: a user's expression text to a SymPy expression, never evaluated as Python.

Imports ast, sympy and symkern.errors; nothing else of symkern.
"""

from __future__ import annotations

import ast
import keyword
import math
import operator
from collections.abc import Iterable, Mapping
from typing import Any

import sympy as sp

from symkern.errors import BuildError

#: the longest expression text accepted (a command line, not a file)
MAX_LENGTH = 10_000
#: the most decimal digits of a number, exact or not (`exp(10**6)`), written or computed:
#: float64 holds nothing above 1.8e308, SymPy computes powers, gamma and the like of exact
#: numbers exactly (2**(10**1000) would never finish), Python prints no integer above 4,300
#: digits, and SymPy evaluates a number wherever it must decide it (floor, Mod, sign) to
#: all its digits (floor(exp(10**6)) never finished, a 1,000-digit Mod took 2.6 s)
MAX_DIGITS = 308
#: the largest number a function outside ELEMENTARY_FUNCTIONS takes (gamma, factorial,
#: binomial, zeta, the orthogonal polynomials, ...): SymPy evaluates them exactly at
#: integers (gamma(10**9) would never finish; gamma(300) has 613 digits) or expands them
#: (chebyshevt(n, x) is a polynomial of degree n)
MAX_GROWING_ARGUMENT = 300
#: ... and the largest product of its numeric arguments: polygamma(n, m) at an integer m
#: sums 1/k**(n+1) exactly, polygamma(100, 300) took 0.24 s (43,593-bit numbers),
#: polygamma(300, 300) 2.0 s (129,934 bits)
MAX_GROWING_PRODUCT = 3_000
#: functions whose numeric values SymPy keeps symbolic or computes in bounded time; the
#: powers among them (Pow, root, exp2, exp of a log) are checked by their result's size
ELEMENTARY_FUNCTIONS = frozenset({
    "Abs", "And", "Equality", "GreaterThan", "Heaviside", "LessThan", "Max", "Min", "Mod",
    "Not", "Or", "Piecewise", "Pow", "Rational", "Sqrt", "StrictGreaterThan",
    "StrictLessThan", "Unequality", "Xor", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "acos",
    "acosh", "acot", "acoth", "acsc", "arg", "asec", "asin", "asinh", "atan", "atan2",
    "atanh", "cbrt", "ceiling", "conjugate", "cos", "cosh", "cosm1", "cot", "coth", "csc",
    "csch", "erf", "erf2", "erfc", "erfcinv", "erfi", "erfinv", "exp", "exp2", "expm1",
    "floor", "frac", "hypot", "im", "isinf", "isnan", "log", "log10", "log1p", "log2",
    "logaddexp", "logaddexp2", "maximum", "minimum", "re", "root", "sec", "sech", "sign",
    "sin", "sinc", "sinh", "sqrt", "tan", "tanh",
})
#: the deepest nesting (a chain of + - or of * / is one level) and the highest tower of
#: powers: SymPy's printers and Python's compiler recurse on the expression later
MAX_DEPTH = 100
MAX_POWER_HEIGHT = 16
LOG10_2 = math.log10(2)
#: names a text may use besides the declared symbols and the supported functions
EXTRA_NAMES = ("Piecewise", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not", "Rational",
               "pi", "E")

_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow, ast.Mod, ast.USub, ast.UAdd)
_COMPARISONS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_HINTS = {
    ast.Attribute: "attribute access",
    ast.Subscript: "subscripts",
    ast.Lambda: "lambdas",
    ast.BoolOp: "`and`/`or` (use And(...), Or(...))",
    ast.IfExp: "conditional expressions (use Piecewise)",
    ast.BitXor: "`^` (write powers as `**`)",
    ast.Eq: "`==` (use Eq(a, b))",
    ast.NotEq: "`!=` (use Ne(a, b))",
    ast.Not: "`not` (use Not(...))",
}


def resolve_sympy_functions(names: Iterable[str]) -> dict[str, Any]:
    """SymPy objects for `names`, from `sympy` or `sympy.codegen.cfunctions` (expm1, log1p, ...)."""
    from sympy.codegen import cfunctions

    resolved: dict[str, Any] = {}
    for name in names:
        obj = getattr(sp, name, None) or getattr(cfunctions, name, None)
        if obj is not None:
            resolved[name] = obj
    return resolved


def declared_symbol_name(name: str) -> str:
    """A name a symbol may be declared under: an identifier, no keyword, no leading underscore."""
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        raise BuildError(f"symbol name {name!r}: expected an identifier that does not start "
                         "with an underscore")
    return name


def _reject(node: ast.AST, what: str) -> BuildError:
    return BuildError(f"EXPR: not allowed: {what} (column {getattr(node, 'col_offset', 0) + 1}); "
                      "an expression may use numbers, + - * / ** %, < <= > >=, the declared "
                      "symbols and SymPy functions")


def _rational_digits(number: sp.Rational) -> int:
    """Decimal digits of the larger of a rational's numerator and denominator (about)."""
    return int(max(abs(number.p).bit_length(), number.q.bit_length()) * LOG10_2) + 1


def _bases_digits(base: sp.Basic) -> float:
    """log10 of the largest exact number in `base` (its exponents too: sqrt(2) is 2**(1/2)),
    what one unit of an exact exponent multiplies the size of a power by."""
    numbers = [base] if isinstance(base, sp.Rational) else base.atoms(sp.Rational)
    return max((math.log10(max(abs(n.p), n.q)) for n in numbers if n not in (0, 1, -1)),
               default=0.0)


def _magnitude(number: sp.Basic) -> float:
    try:
        return abs(float(number))
    except (OverflowError, TypeError, ValueError):
        return math.inf


def _check_power(base: sp.Basic, exponent: sp.Basic, node: ast.AST) -> None:
    """SymPy computes a power of exact numbers exactly (`(2*x0)**n` as `2**n*x0**n`):
    refuse one whose result would have more than MAX_DIGITS digits, before it is computed."""
    if not isinstance(exponent, sp.Basic) or not exponent.is_number:
        return
    digits = _magnitude(exponent) * _bases_digits(base)
    if digits > MAX_DIGITS:
        raise _reject(node, f"a power with an exact result of more than {MAX_DIGITS} digits")


def _check_call(name: str, arguments: list[Any], node: ast.AST) -> None:
    """Refuse numeric arguments that would make SymPy compute a huge exact number."""
    if name not in ELEMENTARY_FUNCTIONS:
        numeric = [_magnitude(argument) for argument in arguments
                   if isinstance(argument, sp.Basic) and argument.is_number]
        if any(size > MAX_GROWING_ARGUMENT for size in numeric):
            raise _reject(node, f"{name} of a number above {MAX_GROWING_ARGUMENT} (SymPy "
                          "would compute it exactly)")
        if math.prod(max(size, 1.0) for size in numeric) > MAX_GROWING_PRODUCT:
            raise _reject(node, f"{name} of numbers whose product is above "
                          f"{MAX_GROWING_PRODUCT:,} (SymPy would compute it exactly)")
    elif name == "Pow" and len(arguments) == 2:
        _check_power(*arguments, node)
    elif name == "root" and len(arguments) >= 2 and isinstance(arguments[1], sp.Basic) \
            and arguments[1].is_number and arguments[1] != 0:
        _check_power(arguments[0], 1 / arguments[1], node)
    elif name == "exp2" and len(arguments) == 1:
        _check_power(sp.Integer(2), arguments[0], node)
    elif name == "exp" and len(arguments) == 1 and isinstance(arguments[0], sp.Basic) \
            and arguments[0].has(sp.log):
        # exp(n*log(m)) is m**n: n at most the largest number in the argument
        coefficient = max((_magnitude(r) for r in arguments[0].atoms(sp.Rational)), default=0)
        logged = sp.Tuple(*[term.args[0] for term in arguments[0].atoms(sp.log)])
        _check_power(logged, sp.Float(min(coefficient, 1e300)), node)


def _check_size(value: Any, node: ast.AST) -> Any:
    """`value`, unless an exact number in it has more than MAX_DIGITS digits, or it is a
    number (no symbols: `exp(10**6)`, `10**99*pi`) whose magnitude has more: SymPy would
    evaluate it to all its digits wherever it must decide it (floor, Mod, sign, Max)."""
    if not isinstance(value, sp.Basic):
        return value
    numbers = (value,) if isinstance(value, sp.Rational) else value.atoms(sp.Rational)
    if any(_rational_digits(number) > MAX_DIGITS for number in numbers):
        raise _reject(node, f"an exact number of more than {MAX_DIGITS} digits")
    if isinstance(value, sp.Expr) and value.is_number and value.is_finite is not False \
            and not isinstance(value, (sp.Rational, sp.Float)) and value is not sp.nan:
        try:
            number = complex(value.evalf(15))
        except OverflowError:
            number = complex(math.inf)
        except Exception:  # noqa: BLE001 - whatever SymPy raises evaluating it
            raise _reject(node, "a number SymPy cannot evaluate") from None
        if abs(number) >= 10.0**MAX_DIGITS:
            raise _reject(node, f"a number of more than {MAX_DIGITS} digits")
        # a kernel computes in real numbers, and SymPy's Max and Min of a complex number
        # never returned (Max(-x0, atan2(acos(2), 1)))
        if abs(number.imag) > 1e-12 * abs(number):
            raise _reject(node, f"the complex number {str(value)[:60]} (kernels compute in "
                          "real numbers)")
    return value


def _shape_limits(tree: ast.Expression) -> None:
    """Nesting depth (a chain of `+ -` or `* /` counts once) and power height, iteratively."""
    stack: list[tuple[ast.AST, int, int]] = [(tree.body, 1, 0)]
    while stack:
        node, depth, height = stack.pop()
        if depth > MAX_DEPTH:
            raise _reject(node, f"nesting deeper than {MAX_DEPTH} levels")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            height += 1
            if height > MAX_POWER_HEIGHT:
                raise _reject(node, f"powers nested more than {MAX_POWER_HEIGHT} high")
        chain = _chain_kind(node)
        for child in ast.iter_child_nodes(node):
            same = chain is not None and _chain_kind(child) == chain and child is node.left
            stack.append((child, depth if same else depth + 1, height))


def _chain_kind(node: ast.AST) -> str | None:
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, (ast.Add, ast.Sub)):
            return "sum"
        if isinstance(node.op, (ast.Mult, ast.Div)):
            return "product"
    return None


def _validate(tree: ast.Expression, symbols: Mapping[str, Any], functions: Mapping[str, Any]) -> None:
    """Every node is one the grammar allows: checked before anything is evaluated."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expression, ast.Load, ast.BinOp, ast.UnaryOp) + _OPERATORS
                      + _COMPARISONS):
            continue
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1:
                raise _reject(node, "chained comparisons (use And(a < b, b < c))")
            continue
        if isinstance(node, ast.Constant):
            if type(node.value) not in (int, float, bool):
                raise _reject(node, f"the constant {node.value!r}")
            if type(node.value) is int and node.value.bit_length() * LOG10_2 > MAX_DIGITS:
                raise _reject(node, f"an integer of more than {MAX_DIGITS} digits")
            continue
        if isinstance(node, ast.Name):
            if node.id not in symbols and node.id not in functions:
                known = ", ".join(sorted(symbols)) or "none"
                raise BuildError(f"EXPR: unknown name {node.id!r}; the declared symbols are "
                                 f"{known}, and SymPy functions such as sin, exp, Piecewise")
            continue
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id not in functions:
                raise BuildError(f"EXPR: unknown function {node.func.id!r}; SymPy functions "
                                 "such as sin, exp, Max, Piecewise may be called")
            if not isinstance(node.func, ast.Name):
                raise _reject(node, f"calling {ast.unparse(node.func)!r}")
            if node.keywords:
                raise _reject(node, "keyword arguments")
            continue
        if isinstance(node, ast.Tuple):
            # Piecewise((value, condition), ...) needs pairs; where tuples may stand is
            # checked below, what they hold is checked here like everything else
            continue
        raise _reject(node, _HINTS.get(type(node), type(node).__name__))
    _check_tuples(tree.body)
    _shape_limits(tree)


def _check_tuples(root: ast.AST) -> None:
    stack: list[tuple[ast.AST, bool]] = [(root, False)]
    while stack:
        node, allowed = stack.pop()
        if isinstance(node, ast.Tuple) and not allowed:
            raise _reject(node, "a tuple outside a function's arguments")
        stack.extend((child, isinstance(node, ast.Call) and child in node.args)
                     for child in ast.iter_child_nodes(node))


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.Mod: sp.Mod}
_COMPARE = {ast.Lt: sp.Lt, ast.LtE: sp.Le, ast.Gt: sp.Gt, ast.GtE: sp.Ge}


def _operands(node: ast.BinOp) -> tuple[list[ast.expr], list[ast.operator]]:
    """A left-leaning chain `a + b - c + ...` (or of `* /`) as its operands and operators."""
    kind, operands, operators = _chain_kind(node), [], []
    while _chain_kind(node) == kind:
        operands.append(node.right)
        operators.append(node.op)
        node = node.left
    operands.append(node)
    return operands[::-1], operators[::-1]


def _combine(node: ast.AST, values: list[Any], operators: list[ast.operator]) -> Any:
    if isinstance(operators[0], (ast.Add, ast.Sub)):
        terms = [values[0]] + [-v if isinstance(op, ast.Sub) else v
                               for v, op in zip(values[1:], operators, strict=True)]
        return sp.Add(*terms)
    factors = [values[0]] + [sp.Integer(1) / v if isinstance(op, ast.Div) else v
                             for v, op in zip(values[1:], operators, strict=True)]
    return sp.Mul(*factors)


def _evaluate(tree: ast.Expression, symbols: Mapping[str, Any],
              functions: Mapping[str, Any]) -> Any:
    """The SymPy object a checked tree stands for, built node by node without recursion
    and without `eval`: each power and call is checked for a huge exact result first."""
    values: dict[int, Any] = {}
    stack: list[tuple[ast.AST, bool]] = [(tree.body, False)]
    while stack:
        node, ready = stack.pop()
        if isinstance(node, ast.BinOp) and _chain_kind(node):
            children, operators = _operands(node)
        elif isinstance(node, ast.Call):
            children, operators = list(node.args), []
        else:
            children, operators = list(ast.iter_child_nodes(node)), []
            children = [c for c in children if isinstance(c, ast.expr)]
        if not ready:
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(children))
            continue
        arguments = [values.pop(id(child)) for child in children]
        if isinstance(node, ast.Constant):
            value: Any = (sp.true if node.value else sp.false) if type(node.value) is bool \
                else sp.Integer(node.value) if type(node.value) is int else sp.Float(node.value)
        elif isinstance(node, ast.Name):
            value = symbols[node.id] if node.id in symbols else functions[node.id]
            if not isinstance(value, sp.Basic):
                raise _reject(node, f"the function {node.id} used as a value (call it: "
                              f"{node.id}(...))")
        elif isinstance(node, ast.BinOp) and _chain_kind(node):
            value = _combine(node, arguments, operators)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            _check_power(*arguments, node)
            value = sp.Pow(*arguments)
        elif isinstance(node, ast.BinOp):
            value = _BINARY[type(node.op)](*arguments)
        elif isinstance(node, ast.UnaryOp):
            value = -arguments[0] if isinstance(node.op, ast.USub) else arguments[0]
        elif isinstance(node, ast.Compare):
            value = _COMPARE[type(node.ops[0])](*arguments)
        elif isinstance(node, ast.Tuple):
            value = tuple(arguments)
        else:  # a call, whose function _validate checked to be a name of `functions`
            _check_call(node.func.id, arguments, node)
            value = functions[node.func.id](*arguments)
        values[id(node)] = _check_size(value, node)
    return values[id(tree.body)]


def parse_expression(text: str, symbols: Mapping[str, sp.Symbol],
                     functions: Mapping[str, Any]) -> sp.Expr:
    """The SymPy expression `text` stands for, over the declared `symbols`.

    The text is parsed with `ast.parse` and checked node by node first: only numbers,
    arithmetic and comparison operators, the declared symbols and the given SymPy functions
    pass, nested at most MAX_DEPTH deep with powers at most MAX_POWER_HEIGHT high. Then
    the expression is built from the tree node by node, without `eval`; an exact number of
    more than MAX_DIGITS digits, written or about to be computed, is refused.

    >>> x = sp.Symbol("x")
    >>> parse_expression("sin(x)**2 + 1/2", {"x": x}, resolve_sympy_functions(["sin"]))
    sin(x)**2 + 1/2
    >>> parse_expression("x.__class__", {"x": x}, {})
    Traceback (most recent call last):
    ...
    symkern.errors.BuildError: EXPR: not allowed: attribute access (column 1); ...
    """
    if not isinstance(text, str) or not text.strip():
        raise BuildError("EXPR: expected a non-empty expression such as 'sin(x0) * a'")
    if len(text) > MAX_LENGTH:
        raise BuildError(f"EXPR: expected at most {MAX_LENGTH} characters, got {len(text)}")
    clashes = sorted(set(symbols) & (set(functions) | set(EXTRA_NAMES)))
    if clashes:
        raise BuildError(f"symbols {', '.join(clashes)}: these names are SymPy functions; "
                         "declare the symbols under other names")
    for name in symbols:
        declared_symbol_name(name)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as error:
        raise BuildError(f"EXPR: not an expression ({error.msg}, column {error.offset})") from None
    except (RecursionError, MemoryError, ValueError):
        raise BuildError(f"EXPR: nested too deeply to parse (more than {MAX_DEPTH} levels "
                         "are refused)") from None
    _validate(tree, symbols, functions)
    try:
        result = _evaluate(tree, symbols, functions)
    except BuildError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever SymPy raises for these arguments
        raise BuildError(f"EXPR: SymPy could not build {text.strip()[:200]!r}: "
                         f"{type(error).__name__}: {str(error)[:200]}") from None
    try:
        str(result)  # SymPy evaluates some numbers only to print them
    except Exception as error:  # noqa: BLE001 - whatever SymPy raises for these numbers
        raise BuildError(f"EXPR: SymPy cannot print {text.strip()[:200]!r}: "
                         f"{type(error).__name__}") from None
    if not isinstance(result, sp.Expr):
        raise BuildError(f"EXPR: expected a numeric expression, got {type(result).__name__} "
                         f"{str(result)[:200]}; use Piecewise to turn a condition into a value")
    return result
