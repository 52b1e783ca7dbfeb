"""symbolic: a user's expression text to a SymPy expression, never evaluated as Python.

Imports ast, sympy and symkern.errors; nothing else of symkern.
"""

from __future__ import annotations

import ast
import keyword
from collections.abc import Iterable, Mapping
from typing import Any

import sympy as sp
from sympy.parsing.sympy_parser import auto_number, parse_expr

from symkern.errors import BuildError

#: the longest expression text accepted (a command line, not a file)
MAX_LENGTH = 10_000
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


def _has_name(node: ast.AST) -> bool:
    return any(isinstance(child, ast.Name) for child in ast.walk(node))


def _literal_exponent(node: ast.expr) -> float | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return abs(node.value)
    return None


def _validate(tree: ast.Expression, symbols: Mapping[str, Any], functions: Mapping[str, Any]) -> None:
    """Every node is one the grammar allows: checked before anything is evaluated."""
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and not _has_name(node):
            # SymPy computes numeric powers exactly: 9**9**9 would never finish
            exponent = _literal_exponent(node.right)
            if exponent is None or exponent > 1000:
                raise _reject(node, "a numeric power with an exponent that is not a number "
                              "of at most 1000")
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


def _check_tuples(node: ast.AST, allowed: bool = False) -> None:
    if isinstance(node, ast.Tuple) and not allowed:
        raise _reject(node, "a tuple outside a function's arguments")
    for child in ast.iter_child_nodes(node):
        _check_tuples(child, allowed=isinstance(node, ast.Call) and child in node.args)


def parse_expression(text: str, symbols: Mapping[str, sp.Symbol],
                     functions: Mapping[str, Any]) -> sp.Expr:
    """The SymPy expression `text` stands for, over the declared `symbols`.

    The text is parsed with `ast.parse` and checked node by node first: only numbers,
    arithmetic and comparison operators, the declared symbols and the given SymPy functions
    pass. Only then does SymPy's `parse_expr` (which calls `eval`) see it, with no builtins.

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
    _validate(tree, symbols, functions)
    # Numbers become SymPy numbers (auto_number), so 1/2 stays exact; nothing else is
    # transformed, and eval sees no builtins, only the checked names.
    global_dict: dict[str, Any] = {"__builtins__": {}, "Integer": sp.Integer, "Float": sp.Float,
                                   "Rational": sp.Rational}
    local_dict: dict[str, Any] = {**functions, **symbols}
    try:
        result = parse_expr(text.strip(), local_dict=local_dict, global_dict=global_dict,
                            transformations=(auto_number,))
    except (TypeError, ValueError, sp.SympifyError) as error:
        raise BuildError(f"EXPR: SymPy could not build {text.strip()!r}: {error}") from None
    if not isinstance(result, sp.Expr):
        raise BuildError(f"EXPR: expected a numeric expression, got {type(result).__name__} "
                         f"{result}; use Piecewise to turn a condition into a value")
    return result
