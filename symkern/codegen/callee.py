"""codegen, stage 2 helper: the one table from printed callees to the kernel namespace.

Imports ast and symkern.errors only. Supporting a new function is one row here plus one
example expression in symkern/codegen/drift.py (CALLEE_EXAMPLES), which is its drift check.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass

from symkern.errors import CodegenDriftError


@dataclass(frozen=True)
class Callee:
    """Where a printed callee goes: `target` is a dotted path in the kernel namespace,
    `sympy` the SymPy functions that print as this callee (for messages and drift tests),
    `arity` the number of positional arguments accepted (None: any). What the passes need
    to know of it (the sets they read derive from these fields):

    - `elementwise`: each output element reads only the same element of every argument
      (False for the array constructors and reductions, which would mix samples);
    - `costly`: a polynomial evaluation or more per element, so that XLA should not repeat
      it in every fusion that reads it (materialize);
    - `vectorizable`: a template of the vectorize pass may hold it (the ones its
      vectorized bodies were measured and tested with);
    - `blockwise`: a one-argument function the contract pass applies to a whole block of
      members at once."""

    target: str
    sympy: tuple[str, ...]
    arity: int | None = 1
    elementwise: bool = True
    costly: bool = True
    vectorizable: bool = False
    blockwise: bool = False


def _row(target: str, *sympy: str, arity: int | None = 1, elementwise: bool = True,
         costly: bool = True, vectorizable: bool = False, blockwise: bool = False) -> Callee:
    return Callee(target, sympy, arity, elementwise, costly, vectorizable, blockwise)


#: printed callee name -> where it goes. The printed name is what SymPy's JAX printer
#: emits (NumPy spelling); the SymPy names are what a user writes.
CALLEE_TABLE: dict[str, Callee] = {
    "sin": _row("jnp.sin", "sin", vectorizable=True, blockwise=True),
    "cos": _row("jnp.cos", "cos", vectorizable=True, blockwise=True),
    "tan": _row("jnp.tan", "tan", "cot", vectorizable=True, blockwise=True),
    "arcsin": _row("jnp.arcsin", "asin", "acsc", vectorizable=True),
    "arccos": _row("jnp.arccos", "acos", "asec", vectorizable=True),
    "arctan": _row("jnp.arctan", "atan", "acot", vectorizable=True, blockwise=True),
    "arctan2": _row("jnp.arctan2", "atan2", arity=2, vectorizable=True),
    "sinh": _row("jnp.sinh", "sinh", vectorizable=True, blockwise=True),
    "cosh": _row("jnp.cosh", "cosh", vectorizable=True, blockwise=True),
    "tanh": _row("jnp.tanh", "tanh", vectorizable=True, blockwise=True),
    "arcsinh": _row("jnp.arcsinh", "asinh", vectorizable=True, blockwise=True),
    "arccosh": _row("jnp.arccosh", "acosh", vectorizable=True),
    "arctanh": _row("jnp.arctanh", "atanh", vectorizable=True),
    "exp": _row("jnp.exp", "exp", "coth", "sech", "csch", vectorizable=True, blockwise=True),
    "expm1": _row("jnp.expm1", "expm1", vectorizable=True, blockwise=True),
    "exp2": _row("jnp.exp2", "exp2", vectorizable=True),
    "log": _row("jnp.log", "log", "acoth", vectorizable=True, blockwise=True),
    "log1p": _row("jnp.log1p", "log1p", vectorizable=True, blockwise=True),
    "log2": _row("jnp.log2", "log2", vectorizable=True),
    "log10": _row("jnp.log10", "log10", vectorizable=True),
    "sqrt": _row("jnp.sqrt", "sqrt", "Sqrt", vectorizable=True, blockwise=True),
    "hypot": _row("jnp.hypot", "hypot", arity=2, vectorizable=True),
    "abs": _row("jnp.abs", "Abs", costly=False, vectorizable=True, blockwise=True),
    "sign": _row("jnp.sign", "sign", costly=False, vectorizable=True),
    "floor": _row("jnp.floor", "floor", costly=False, vectorizable=True),
    "ceil": _row("jnp.ceil", "ceiling", costly=False, vectorizable=True),
    "mod": _row("jnp.mod", "Mod", "frac", arity=2),
    "real": _row("jnp.real", "re", costly=False),
    "imag": _row("jnp.imag", "im", costly=False),
    "conjugate": _row("jnp.conjugate", "conjugate", costly=False),
    "angle": _row("jnp.angle", "arg"),
    "sinc": _row("jnp.sinc", "sinc"),
    "minimum": _row("jnp.minimum", "Min", arity=2, costly=False, vectorizable=True),
    "maximum": _row("jnp.maximum", "Max", arity=2, costly=False, vectorizable=True),
    "erf": _row("jsp.erf", "erf", "erf2", vectorizable=True),
    "erfc": _row("jsp.erfc", "erfc", vectorizable=True),
    "erfinv": _row("jsp.erfinv", "erfinv"),
    "gamma": _row("jsp.gamma", "gamma", "beta"),
    "lgamma": _row("jsp.gammaln", "loggamma", vectorizable=True),
    "polygamma": _row("special.polygamma", "polygamma", "digamma", arity=2),
    "select": _row("jnp.select", "Piecewise", "Heaviside", arity=2, elementwise=False, costly=False),
    "greater": _row("jnp.greater", "StrictGreaterThan", arity=2, costly=False),
    "greater_equal": _row("jnp.greater_equal", "GreaterThan", arity=2, costly=False),
    "less": _row("jnp.less", "StrictLessThan", arity=2, costly=False),
    "less_equal": _row("jnp.less_equal", "LessThan", arity=2, costly=False),
    "equal": _row("jnp.equal", "Equality", arity=2, costly=False),
    "not_equal": _row("jnp.not_equal", "Unequality", arity=2, costly=False),
    "all": _row("jnp.all", "And", "Xor", arity=1, elementwise=False, costly=False),
    "any": _row("jnp.any", "Or", "Xor", arity=1, elementwise=False, costly=False),
    "asarray": _row("jnp.asarray", "And", "Or", elementwise=False, costly=False),
    "array": _row("jnp.array", "Matrix", "Array", elementwise=False, costly=False),
    "logical_not": _row("jnp.logical_not", "Not", costly=False),
    "isinf": _row("jnp.isinf", "isinf", costly=False),
    "isnan": _row("jnp.isnan", "isnan", costly=False),
    "logaddexp": _row("jnp.logaddexp", "logaddexp", arity=2),
    "logaddexp2": _row("jnp.logaddexp2", "logaddexp2", arity=2),
    # the special functions symkern writes in JAX (symkern.codegen.special)
    "factorial": _row("special.factorial", "factorial"),
    "binomial": _row("special.binomial", "binomial", arity=2),
    "uppergamma": _row("special.uppergamma", "uppergamma", arity=2),
    "lowergamma": _row("special.lowergamma", "lowergamma", arity=2),
    "betainc": _row("special.betainc", "betainc", arity=4),
    "betainc_regularized": _row("special.betainc_regularized", "betainc_regularized", arity=4),
    "Ei": _row("jsp.expi", "Ei"),
    "expint": _row("special.expint", "expint", "E1", arity=2),
    "Si": _row("special.Si", "Si"),
    "Ci": _row("special.Ci", "Ci"),
    "Shi": _row("special.Shi", "Shi"),
    "Chi": _row("special.Chi", "Chi"),
    "li": _row("special.li", "li"),
    "Li": _row("special.Li", "Li"),
    "fresnels": _row("special.fresnels", "fresnels"),
    "fresnelc": _row("special.fresnelc", "fresnelc"),
    "erfi": _row("special.erfi", "erfi"),
    "erfcinv": _row("special.erfcinv", "erfcinv"),
    "cosm1": _row("special.cosm1", "cosm1"),
    "powm1": _row("special.powm1", "powm1", arity=2),
    "zeta": _row("special.zeta", "zeta", arity=None),
    "harmonic": _row("special.harmonic", "harmonic", arity=None),
    "bernoulli": _row("special.bernoulli", "bernoulli", arity=None),
    "LambertW": _row("special.LambertW", "LambertW", arity=None),
    "elliptic_k": _row("special.elliptic_k", "elliptic_k"),
    "elliptic_e": _row("special.elliptic_e", "elliptic_e", arity=None),
    "besselj": _row("special.besselj", "besselj", arity=2),
    "besseli": _row("special.besseli", "besseli", arity=2),
    "besselk": _row("special.besselk", "besselk", arity=2),
    "legendre": _row("special.legendre", "legendre", arity=2),
    "assoc_legendre": _row("special.assoc_legendre", "assoc_legendre", arity=3),
    "chebyshevt": _row("special.chebyshevt", "chebyshevt", arity=2),
    "chebyshevu": _row("special.chebyshevu", "chebyshevu", arity=2),
    "hermite": _row("special.hermite", "hermite", arity=2),
    "laguerre": _row("special.laguerre", "laguerre", arity=2),
    "assoc_laguerre": _row("special.assoc_laguerre", "assoc_laguerre", arity=3),
    "gegenbauer": _row("special.gegenbauer", "gegenbauer", arity=3),
    "jacobi": _row("special.jacobi", "jacobi", arity=4),
}

#: kernel-namespace targets of the rows with each property (what the passes read)
ELEMENTWISE_TARGETS = frozenset(row.target for row in CALLEE_TABLE.values() if row.elementwise)
COSTLY_TARGETS = frozenset(row.target for row in CALLEE_TABLE.values() if row.costly)
VECTORIZABLE_TARGETS = frozenset(row.target for row in CALLEE_TABLE.values()
                                 if row.vectorizable)
BLOCKWISE_JNP = frozenset(row.target.split(".", 1)[1] for row in CALLEE_TABLE.values()
                          if row.blockwise and row.target.startswith("jnp."))

#: SymPy functions that print only through other rows (no callee of their own).
COMPOSITE_SYMPY = ("cbrt", "root", "Pow", "sec", "csc", "RisingFactorial", "FallingFactorial",
                   "factorial2", "maximum", "minimum")

#: SymPy functions symkern refuses, each with the reason and the route a user can take:
#: `symkern.errors.UnsupportedFunctionError` carries both, and docs/coverage.md lists them.
REFUSED_SYMPY: dict[str, str] = {
    "bessely": "JAX has no Bessel function of the second kind; write Y_n through its "
               "integral representation in a functions= implementation",
    "airyai": "JAX has no Airy function; for x > 0, rewrite it through besselk "
              "(expr.rewrite(sp.besselk) where SymPy can) or pass a functions= implementation",
    "airybi": "JAX has no Airy function; pass a functions= implementation",
    "airyaiprime": "JAX has no Airy function; pass a functions= implementation",
    "airybiprime": "JAX has no Airy function; pass a functions= implementation",
    "elliptic_f": "the incomplete elliptic integral has no JAX implementation in symkern; "
                  "pass a functions= implementation (Carlson's R_F)",
    "elliptic_pi": "the elliptic integral of the third kind has no JAX implementation in "
                   "symkern; pass a functions= implementation",
    "hankel1": "a Hankel function is complex-valued; write it as besselj + I*bessely",
    "hankel2": "a Hankel function is complex-valued; write it as besselj - I*bessely",
    "polylog": "the polylogarithm has no JAX implementation in symkern; try "
               "expr.rewrite(sp.lerchphi) or .doit(), or pass a functions= implementation",
    "lerchphi": "the Lerch transcendent has no JAX implementation in symkern; pass a "
                "functions= implementation",
    "hyper": "a generalized hypergeometric function has no JAX implementation in symkern; "
             "try sp.hyperexpand(expr), or pass a functions= implementation",
    "meijerg": "a Meijer G-function has no JAX implementation in symkern; try "
               "sp.hyperexpand(expr), or pass a functions= implementation",
    "Ynm": "a spherical harmonic is complex-valued; use Ynm(...).expand(func=True) and its "
           "real part (sp.re), or assoc_legendre with cos/sin",
    "Znm": "write the real spherical harmonic with assoc_legendre and cos/sin",
    "KroneckerDelta": "write KroneckerDelta(i, j) as Piecewise((1, Eq(i, j)), (0, True))",
    "subfactorial": "write subfactorial(n) as its sum, or uppergamma(n + 1, -1)/E",
    "erf2inv": "write erf2inv(x, y) as erfinv(y + erf(x))",
    "mathieus": "Mathieu functions have no JAX implementation; pass a functions= "
                "implementation",
    "mathieuc": "Mathieu functions have no JAX implementation; pass a functions= "
                "implementation",
}

#: printed constant names -> where they go.
CONSTANT_TABLE: dict[str, str] = {"pi": "jnp.pi", "e": "jnp.e", "nan": "jnp.nan", "inf": "jnp.inf",
                                  "euler_gamma": "special.EULER_GAMMA"}

#: dotted prefixes that name a module (a function reached through one is not a method call).
MODULE_PREFIXES = (
    "jax.numpy", "jax.scipy.special", "jax.lax", "jnp", "jsp", "lax", "numpy", "np", "math",
    "scipy.special", "cmath",
)

#: every SymPy function class name a kernel can evaluate.
SUPPORTED_SYMPY_FUNCTIONS = frozenset(
    name for callee in CALLEE_TABLE.values() for name in callee.sympy
) | frozenset(COMPOSITE_SYMPY)


def unsupported_message(name: str, supported: frozenset[str] = SUPPORTED_SYMPY_FUNCTIONS) -> str:
    """Why SymPy function `name` is refused, and the nearest supported route.

    >>> unsupported_message("airyai").split(";")[0]
    'eqs: SymPy function airyai has no JAX implementation in symkern (JAX has no Airy function'
    """
    reason = REFUSED_SYMPY.get(name)
    if reason is not None:
        return f"eqs: SymPy function {name} has no JAX implementation in symkern ({reason})"
    close = difflib.get_close_matches(name, sorted(supported), n=3, cutoff=0.6)
    nearest = f"; the nearest supported: {', '.join(close)}" if close else ""
    return (f"eqs: SymPy function {name} has no JAX implementation in symkern; rewrite it "
            f"(e.g. with .rewrite() or .doit()) or pass it as an undefined Function with "
            f"functions={{...}}{nearest} (docs/coverage.md lists what is supported)")


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
