"""codegen, stage 2 helper: the one table from printed callees to the kernel namespace.

Imports ast and symkern.errors only. Supporting a new function is one row here plus one
example expression in symkern/codegen/drift.py (CALLEE_EXAMPLES), which is its drift check.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from symkern.errors import CodegenDriftError


@dataclass(frozen=True)
class Callee:
    """Where a printed callee goes: `target` is a dotted path in the kernel namespace,
    `sympy` the SymPy functions that print as this callee (for messages and drift tests),
    `arity` the number of positional arguments accepted (None: any)."""

    target: str
    sympy: tuple[str, ...]
    arity: int | None = 1


def _row(target: str, *sympy: str, arity: int | None = 1) -> Callee:
    return Callee(target, sympy, arity)


#: printed callee name -> where it goes. The printed name is what SymPy's JAX printer
#: emits (NumPy spelling); the SymPy names are what a user writes.
CALLEE_TABLE: dict[str, Callee] = {
    "sin": _row("jnp.sin", "sin"),
    "cos": _row("jnp.cos", "cos"),
    "tan": _row("jnp.tan", "tan", "cot"),
    "arcsin": _row("jnp.arcsin", "asin", "acsc"),
    "arccos": _row("jnp.arccos", "acos", "asec"),
    "arctan": _row("jnp.arctan", "atan", "acot"),
    "arctan2": _row("jnp.arctan2", "atan2", arity=2),
    "sinh": _row("jnp.sinh", "sinh"),
    "cosh": _row("jnp.cosh", "cosh"),
    "tanh": _row("jnp.tanh", "tanh"),
    "arcsinh": _row("jnp.arcsinh", "asinh"),
    "arccosh": _row("jnp.arccosh", "acosh"),
    "arctanh": _row("jnp.arctanh", "atanh"),
    "exp": _row("jnp.exp", "exp", "coth", "sech", "csch"),
    "expm1": _row("jnp.expm1", "expm1"),
    "exp2": _row("jnp.exp2", "exp2"),
    "log": _row("jnp.log", "log", "acoth"),
    "log1p": _row("jnp.log1p", "log1p"),
    "log2": _row("jnp.log2", "log2"),
    "log10": _row("jnp.log10", "log10"),
    "sqrt": _row("jnp.sqrt", "sqrt", "Sqrt"),
    "hypot": _row("jnp.hypot", "hypot", arity=2),
    "abs": _row("jnp.abs", "Abs"),
    "sign": _row("jnp.sign", "sign"),
    "floor": _row("jnp.floor", "floor"),
    "ceil": _row("jnp.ceil", "ceiling"),
    "mod": _row("jnp.mod", "Mod", "frac", arity=2),
    "real": _row("jnp.real", "re"),
    "imag": _row("jnp.imag", "im"),
    "conjugate": _row("jnp.conjugate", "conjugate"),
    "angle": _row("jnp.angle", "arg"),
    "sinc": _row("jnp.sinc", "sinc"),
    "minimum": _row("jnp.minimum", "Min", arity=2),
    "maximum": _row("jnp.maximum", "Max", arity=2),
    "erf": _row("jsp.erf", "erf", "erf2"),
    "erfc": _row("jsp.erfc", "erfc"),
    "erfinv": _row("jsp.erfinv", "erfinv"),
    "gamma": _row("jsp.gamma", "gamma", "beta"),
    "lgamma": _row("jsp.gammaln", "loggamma"),
    "polygamma": _row("jsp.polygamma", "polygamma", "digamma", arity=2),
    "select": _row("jnp.select", "Piecewise", "Heaviside", arity=2),
    "greater": _row("jnp.greater", "StrictGreaterThan", arity=2),
    "greater_equal": _row("jnp.greater_equal", "GreaterThan", arity=2),
    "less": _row("jnp.less", "StrictLessThan", arity=2),
    "less_equal": _row("jnp.less_equal", "LessThan", arity=2),
    "equal": _row("jnp.equal", "Equality", arity=2),
    "not_equal": _row("jnp.not_equal", "Unequality", arity=2),
    "all": _row("jnp.all", "And", "Xor", arity=1),
    "any": _row("jnp.any", "Or", "Xor", arity=1),
    "asarray": _row("jnp.asarray", "And", "Or"),
    "array": _row("jnp.array", "Matrix", "Array"),
}

#: SymPy functions that print only through other rows (no callee of their own).
COMPOSITE_SYMPY = ("cbrt", "root", "Not", "Pow", "sec", "csc")

#: printed constant names -> where they go.
CONSTANT_TABLE: dict[str, str] = {"pi": "jnp.pi", "e": "jnp.e", "nan": "jnp.nan", "inf": "jnp.inf"}

#: dotted prefixes that name a module (a function reached through one is not a method call).
MODULE_PREFIXES = (
    "jax.numpy", "jax.scipy.special", "jax.lax", "jnp", "jsp", "lax", "numpy", "np", "math",
    "scipy.special", "cmath",
)

#: every SymPy function class name a kernel can evaluate.
SUPPORTED_SYMPY_FUNCTIONS = frozenset(
    name for callee in CALLEE_TABLE.values() for name in callee.sympy
) | frozenset(COMPOSITE_SYMPY)


def dotted_name(node: ast.expr) -> str | None:
    """`jax.numpy.sin` → "jax.numpy.sin"; anything but names and attributes → None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


@dataclass(frozen=True)
class CalleeName:
    """A callee normalised: its bare name, and the receiver if it was a method call."""

    name: str
    receiver: ast.expr | None = None


def callee_name(func: ast.expr) -> CalleeName:
    """Normalise every callee form to its bare name.

    `sin`, `jax.numpy.sin`, `numpy.sin`, `jnp.sin` and `math.sin` all give "sin";
    a method such as `(W).dot(x)` gives "dot" with `W` as receiver; a user's function,
    once resolved to `functions["f"]`, gives `functions['f']`.

    >>> callee_name(ast.parse("jax.numpy.sin", mode="eval").body).name
    'sin'
    >>> ast.unparse(callee_name(ast.parse("(W).dot", mode="eval").body).receiver)
    'W'
    """
    if isinstance(func, ast.Name):
        return CalleeName(func.id)
    if isinstance(func, ast.Attribute):
        owner = dotted_name(func.value)
        if owner is not None and owner in MODULE_PREFIXES:
            return CalleeName(func.attr)
        return CalleeName(func.attr, func.value)
    if (isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name)
            and func.value.id == "functions" and isinstance(func.slice, ast.Constant)):
        # a user's function after resolve_callees: named so that it matches no table row
        return CalleeName(f"functions[{func.slice.value!r}]")
    raise CodegenDriftError(
        f"callee_name: expected a name, a module attribute or a method as callee, "
        f"found {ast.unparse(func)!r}"
    )


def target_node(target: str) -> ast.expr:
    """The expression node for a dotted namespace path such as `jnp.sin`."""
    head, *rest = target.split(".")
    node: ast.expr = ast.Name(head, ast.Load())
    for attr in rest:
        node = ast.Attribute(node, attr, ast.Load())
    return node
