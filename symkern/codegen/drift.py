"""codegen, drift guards: each upstream form a rule depends on, asked of the installed versions.

Imports sympy, astor, jax, numpy, symkern.codegen and symkern.symbolic; tests/drift and
`python -m symkern doctor` both run these checks, so the two cannot disagree.
"""

from __future__ import annotations

import ast
import inspect
import platform
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np
import sympy as sp

from symkern.codegen import rules
from symkern.codegen.callee import CALLEE_TABLE, COMPOSITE_SYMPY, callee_name
from symkern.codegen.emit import FUNCTION_NAME, emit
from symkern.codegen.pipeline import print_source
from symkern.symbolic.arguments import data_argument, equation_set, parameter_arguments

#: the distributions whose versions `doctor` reports
VERSIONED = ("sympy", "jax", "jaxlib", "astor", "numpy")


@dataclass(frozen=True)
class Observation:
    """What a probe saw: whether the assumption holds, the form expected, the form found."""

    ok: bool
    expected: str
    found: str


def observe(expected: str, found: str) -> Observation:
    """An observation that holds when the found form, described as text, is the expected one."""
    return Observation(expected == found, expected, found)


@dataclass(frozen=True)
class CheckResult:
    """One check run against the installed versions, for one `cse` setting (None: not used)."""

    check: str
    assumption: str
    cse: bool | None
    ok: bool
    expected: str
    found: str

    @property
    def label(self) -> str:
        return self.check if self.cse is None else f"{self.check} [cse={self.cse}]"

    def message(self) -> str:
        return (f"{self.label}: {self.assumption}\n  expected: {self.expected}\n"
                f"  found:    {self.found}")


@dataclass(frozen=True)
class DriftCheck:
    """A named upstream assumption and the probe that asks the installed libraries about it."""

    name: str
    assumption: str
    probe: Callable[[bool], Observation]
    depends_on_cse: bool = True

    def run(self, cse: bool | None = None) -> CheckResult:
        try:
            seen = self.probe(bool(cse))
        except Exception as error:  # noqa: BLE001 - an upstream failure is itself the finding
            seen = Observation(False, "the probe to run", f"{type(error).__name__}: {error}")
        return CheckResult(self.name, self.assumption, cse if self.depends_on_cse else None,
                           seen.ok, seen.expected, seen.found)


# ---- emitting small examples --------------------------------------------------------------

def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _emitted(eqs: Any, data: Sequence[Any], params: Any = None, *, cse: bool) -> ast.Module:
    """SymPy's source for `eqs` through symkern's stage 1, parsed: what the rules are fed."""
    arguments = [data_argument(arg, k + 1) for k, arg in enumerate(data)]
    parameters, _ = parameter_arguments(params)
    return ast.parse(emit(equation_set(eqs), arguments + parameters, cse=cse).source)


def _function(module: ast.Module) -> ast.FunctionDef:
    if len(module.body) != 1 or not isinstance(module.body[0], ast.FunctionDef):
        kinds = ", ".join(type(node).__name__ for node in module.body)
        raise ValueError(f"a module of {kinds or 'nothing'}, not one function definition")
    return module.body[0]


def _returned(module: ast.Module) -> list[ast.expr]:
    last = _function(module).body[-1]
    if not (isinstance(last, ast.Return) and isinstance(last.value, ast.Tuple)):
        raise ValueError(f"the function ends in `{_short(ast.unparse(last))}`, not a tuple return")
    return list(last.value.elts)


def _calls(module: ast.Module, name: str) -> list[ast.Call]:
    return [node for node in ast.walk(module)
            if isinstance(node, ast.Call) and callee_name(node.func).name == name]


def _nesting(node: ast.expr) -> str:
    """`[[a, b], [c, d]]` → "(2, 2)"; ragged or non-list entries are spelled out."""
    shape: list[int] = []
    level: list[ast.expr] = [node]
    while all(isinstance(item, ast.List) for item in level):
        lengths = {len(item.elts) for item in level}
        if len(lengths) != 1:
            return f"ragged {sorted(lengths)}"
        shape.append(lengths.pop())
        level = [element for item in level for element in item.elts]
        if not level:
            break
    if any(isinstance(item, ast.List) for item in level):
        return "ragged nesting"
    return str(tuple(shape))


def _list_form(node: ast.expr, what: str) -> str:
    if isinstance(node, ast.List):
        return f"[{len(node.elts)} {what}]"
    return f"<{type(node).__name__}: {_short(ast.unparse(node), 40)}>"


def _printed_callees(module: ast.Module) -> set[str]:
    """Every callee name printed, including the function `reduce` is handed (Min, Max)."""
    names: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Call):
            name = callee_name(node.func).name
            names.add(name)
            if name == "reduce" and node.args and isinstance(node.args[0], ast.Name):
                names.add(node.args[0].id)
    return names


# ---- the checks on emitted code -----------------------------------------------------------

_x, _y, _u, _v, _a = sp.symbols("x y u v a")
_M = sp.MatrixSymbol("M", 2, 2)


def _function_shape(cse: bool) -> Observation:
    module = _emitted(sp.sin(_x) * _a + _M[0, 1] * sp.sin(_x) + _y, [[_x, _y], _M],
                      {"a": _a}, cse=cse)
    expected = (f"module of one `def {FUNCTION_NAME}(_a0, _a1, _a2)`, "
                "1 return statement, last: return of a 1-tuple")
    if len(module.body) != 1 or not isinstance(module.body[0], ast.FunctionDef):
        kinds = ", ".join(type(node).__name__ for node in module.body)
        return Observation(False, expected, f"module of {kinds}")
    function = module.body[0]
    returns = sum(isinstance(node, ast.Return) for node in ast.walk(function))
    last = function.body[-1]
    if isinstance(last, ast.Return) and isinstance(last.value, ast.Tuple):
        ending = f"return of a {len(last.value.elts)}-tuple"
    else:
        ending = f"`{_short(ast.unparse(last), 60)}`"
    found = (f"module of one `def {function.name}({ast.unparse(function.args)})`, "
             f"{returns} return statement{'s' if returns != 1 else ''}, last: {ending}")
    return observe(expected, found)


def _data_reads(cse: bool) -> Observation:
    column = sp.Matrix([_u, _v])
    eqs = sp.Matrix([sp.sin(_x) * _M[0, 1] + _y * _M[1, 0], _u * _M[1, 1] + _v * sp.sin(_x)])
    module = _emitted(eqs, [[_x, _y], _M, column], cse=cse)
    data = {"_a0": "_a0[i]", "_a1": "_a1[i, j]", "_a2": "_a2[i]"}
    forms: set[str] = set()
    subscripted: set[int] = set()
    for node in ast.walk(module):
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                and node.value.id in data):
            subscripted.add(id(node.value))
            index = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if all(isinstance(i, ast.Constant) and type(i.value) is int for i in index):
                forms.add(f"{node.value.id}[{', '.join('ij'[: len(index)])}]")
            else:
                forms.add(_short(ast.unparse(node), 40))
    # the def's own arguments are ast.arg nodes, so any Name left is a whole-array use
    forms.update(f"whole {node.id}" for node in ast.walk(module)
                 if isinstance(node, ast.Name) and node.id in data and id(node) not in subscripted)
    return observe(", ".join(sorted(data.values())), ", ".join(sorted(forms)))


def _array_constructor(cse: bool) -> Observation:
    eqs = [
        sp.Matrix([[_x, _y], [_x * _y, sp.sin(_x)]]),    # 2x2 Matrix: nesting (2, 2)
        sp.Matrix([_x + _y, _x * _y]),                  # column: nesting (2, 1)
        sp.Matrix([[_x, _y, _x - _y]]),                 # row: nesting (1, 3)
        sp.Array([[_x, _y], [_y, _x]]),                 # Array: its own shape
        sp.Array([_x, _y, _x * _y]),
        sp.Matrix([[1.5, 2.0], [3, 4]]),                # a numeric literal (hoist_array_literals)
    ]
    expected_shapes = [(2, 2), (2, 1), (1, 3), (2, 2), (3,), (2, 2)]
    expected = ", ".join(f"array({shape})" for shape in expected_shapes)
    found = []
    for value in _returned(_emitted(eqs, [[_x, _y]], cse=cse)):
        if isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords:
            argument = value.args[0]
            nesting = (_nesting(argument) if isinstance(argument, ast.List)
                       else _list_form(argument, "entries"))
            found.append(f"{callee_name(value.func).name}({nesting})")
        else:
            found.append(_short(ast.unparse(value), 60))
    return observe(expected, ", ".join(found))


def _is_number_literal(node: ast.expr) -> bool:
    # the literal grammar hoist_array_literals reads: 2, 0.5, -1.25, 1/3, -2/7
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _is_number_literal(node.operand)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _is_number_literal(node.left) and _is_number_literal(node.right)
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _array_literal(cse: bool) -> Observation:
    table = sp.Function("table")
    eqs = (table(sp.Array([sp.Rational(1, 3), 0.5, 2, -1.25, 7]), _x)
           + table(sp.Array([[1.5, 2], [3, sp.Rational(-2, 7)]]), _x))
    arguments = [data_argument([_x], 1)]
    module = ast.parse(emit(equation_set(eqs), arguments, cse=cse,
                            functions={"table": None}).source)
    found = []
    for call in _calls(module, "array"):
        argument = call.args[0] if len(call.args) == 1 and not call.keywords else None
        if isinstance(argument, ast.List):
            leaves = [argument]
            while leaves and all(isinstance(leaf, ast.List) for leaf in leaves):
                leaves = [element for leaf in leaves for element in leaf.elts]
            kind = "numbers" if all(map(_is_number_literal, leaves)) else "not only numbers"
            found.append(f"array({_nesting(argument)} {kind})")
        else:
            found.append(f"array({_short(', '.join(ast.unparse(a) for a in call.args), 60)})")
    return observe("array((2, 2) numbers), array((5,) numbers)", ", ".join(sorted(found)))


def _cse_form(cse: bool) -> Observation:
    shared = sp.sin(_x) * _y
    module = _emitted(shared + shared**2 + sp.cos(shared), [[_x, _y]], cse=cse)
    before = _function(module).body[:-1]
    forms = []
    for statement in before:
        if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
                and re.fullmatch(r"_c\d+", statement.targets[0].id)):
            forms.append("_cN = ...")
        else:
            forms.append(_short(ast.unparse(statement), 60))
    if cse:
        expected = "assignments `_cN = ...` (at least one), then the return"
        ok = bool(forms) and set(forms) == {"_cN = ..."}
        found = (f"{len(forms)} statement(s) before the return: "
                 f"{', '.join(sorted(set(forms))) or 'none'}")
        return Observation(ok, expected, found)
    found = ", ".join(forms) if forms else "nothing before the return"
    return observe("nothing before the return", found)


def _piecewise_form(cse: bool) -> Observation:
    module = _emitted(sp.Piecewise((_x, _x > 0), (sp.sqrt(_y), True)), [[_x, _y]], cse=cse)
    calls = _calls(module, "select")
    if len(calls) != 1:
        return observe("one select(...) call", f"{len(calls)} select call(s) in "
                       f"{_short(ast.unparse(module))}")
    call = calls[0]
    arguments = [_list_form(call.args[0], "conditions") if call.args else "<none>",
                 _list_form(call.args[1], "choices") if len(call.args) > 1 else "<none>"]
    arguments += [_short(ast.unparse(extra), 40) for extra in call.args[2:]]
    arguments += [f"{k.arg}={_short(ast.unparse(k.value), 20)}" for k in call.keywords]
    return observe("select([2 conditions], [2 choices], default=nan)",
                   f"select({', '.join(arguments)})")


def _constant_output(cse: bool) -> Observation:
    returned = _returned(_emitted([_x / _x, _x], [[_x]], cse=cse))
    return observe("(1, _a0[0])", ast.unparse(ast.Tuple(returned, ast.Load())))


def _reduce_form(cse: bool) -> Observation:
    module = _emitted([sp.Max(_x, _y, _u), sp.Min(_x, _y, _u)], [[_x, _y, _u]], cse=cse)
    found = []
    for call in _calls(module, "reduce"):
        function = ast.unparse(call.args[0]) if call.args else "<none>"
        rest = [_list_form(a, "arguments") for a in call.args[1:]]
        rest += [f"{k.arg}=..." for k in call.keywords]
        found.append(f"reduce({', '.join([function, *rest])})")
    return observe("reduce(maximum, [3 arguments]), reduce(minimum, [3 arguments])",
                   ", ".join(found) or f"no reduce in {_short(ast.unparse(module))}")


# ---- callee forms, one check per row of CALLEE_TABLE ---------------------------------------

#: SymPy name -> an example expression of it in `x`, `y`. Every SymPy name of every row of
#: CALLEE_TABLE (and COMPOSITE_SYMPY) needs one: adding a function adds its drift check.
CALLEE_EXAMPLES: dict[str, Callable[[sp.Symbol, sp.Symbol], sp.Basic]] = {
    "sin": lambda x, y: sp.sin(x),
    "cos": lambda x, y: sp.cos(x),
    "tan": lambda x, y: sp.tan(x),
    "cot": lambda x, y: sp.cot(x),
    "asin": lambda x, y: sp.asin(x),
    "acsc": lambda x, y: sp.acsc(x),
    "acos": lambda x, y: sp.acos(x),
    "asec": lambda x, y: sp.asec(x),
    "atan": lambda x, y: sp.atan(x),
    "acot": lambda x, y: sp.acot(x),
    "atan2": lambda x, y: sp.atan2(x, y),
    "sinh": lambda x, y: sp.sinh(x),
    "cosh": lambda x, y: sp.cosh(x),
    "tanh": lambda x, y: sp.tanh(x),
    "asinh": lambda x, y: sp.asinh(x),
    "acosh": lambda x, y: sp.acosh(x),
    "atanh": lambda x, y: sp.atanh(x),
    "exp": lambda x, y: sp.exp(x),
    "coth": lambda x, y: sp.coth(x),
    "sech": lambda x, y: sp.sech(x),
    "csch": lambda x, y: sp.csch(x),
    "expm1": lambda x, y: _cfunction("expm1")(x),
    "exp2": lambda x, y: _cfunction("exp2")(x),
    "log": lambda x, y: sp.log(x),
    "acoth": lambda x, y: sp.acoth(x),
    "log1p": lambda x, y: _cfunction("log1p")(x),
    "log2": lambda x, y: _cfunction("log2")(x),
    "log10": lambda x, y: _cfunction("log10")(x),
    "sqrt": lambda x, y: sp.sqrt(x),
    "Sqrt": lambda x, y: _cfunction("Sqrt")(x),
    "hypot": lambda x, y: _cfunction("hypot")(x, y),
    "Abs": lambda x, y: sp.Abs(x),
    "sign": lambda x, y: sp.sign(x),
    "floor": lambda x, y: sp.floor(x),
    "ceiling": lambda x, y: sp.ceiling(x),
    "Mod": lambda x, y: sp.Mod(x, y),
    "frac": lambda x, y: sp.frac(x),
    "re": lambda x, y: sp.re(x),
    "im": lambda x, y: sp.im(x),
    "conjugate": lambda x, y: sp.conjugate(x),
    "arg": lambda x, y: sp.arg(x),
    "sinc": lambda x, y: sp.sinc(x),
    "Min": lambda x, y: sp.Min(x, y),
    "Max": lambda x, y: sp.Max(x, y),
    "erf": lambda x, y: sp.erf(x),
    "erf2": lambda x, y: sp.erf2(x, y),
    "erfc": lambda x, y: sp.erfc(x),
    "erfinv": lambda x, y: sp.erfinv(x),
    "gamma": lambda x, y: sp.gamma(x),
    "beta": lambda x, y: sp.beta(x, y),
    "loggamma": lambda x, y: sp.loggamma(x),
    "polygamma": lambda x, y: sp.polygamma(1, x),
    "digamma": lambda x, y: sp.digamma(x),
    "Piecewise": lambda x, y: sp.Piecewise((x, y > 0), (y, True)),
    "Heaviside": lambda x, y: sp.Heaviside(x),
    # relations and logic print only inside a Piecewise condition
    "StrictGreaterThan": lambda x, y: sp.Piecewise((x, x > y), (y, True)),
    "GreaterThan": lambda x, y: sp.Piecewise((x, x >= y), (y, True)),
    "StrictLessThan": lambda x, y: sp.Piecewise((x, x < y), (y, True)),
    "LessThan": lambda x, y: sp.Piecewise((x, x <= y), (y, True)),
    "Equality": lambda x, y: sp.Piecewise((x, sp.Eq(x, y)), (y, True)),
    "Unequality": lambda x, y: sp.Piecewise((x, sp.Ne(x, y)), (y, True)),
    "And": lambda x, y: sp.Piecewise((x, sp.And(x > 0, y > 0)), (y, True)),
    "Or": lambda x, y: sp.Piecewise((x, sp.Or(x > 0, y > 0)), (y, True)),
    "Xor": lambda x, y: sp.Piecewise((x, sp.Xor(x > 0, y > 0)), (y, True)),
    "Not": lambda x, y: sp.Piecewise((x, sp.Not(_cfunction("isnan")(x))), (y, True)),
    "isinf": lambda x, y: sp.Piecewise((x, _cfunction("isinf")(x)), (y, True)),
    "isnan": lambda x, y: sp.Piecewise((x, _cfunction("isnan")(x)), (y, True)),
    "logaddexp": lambda x, y: _numpy_node("logaddexp")(x, y),
    "logaddexp2": lambda x, y: _numpy_node("logaddexp2")(x, y),
    "maximum": lambda x, y: _numpy_node("maximum")(x, y),
    "minimum": lambda x, y: _numpy_node("minimum")(x, y),
    "cosm1": lambda x, y: _scipy_node("cosm1")(x),
    "powm1": lambda x, y: _scipy_node("powm1")(x, y),
    "factorial": lambda x, y: sp.factorial(x),
    "factorial2": lambda x, y: sp.factorial2(x),
    "RisingFactorial": lambda x, y: sp.RisingFactorial(x, y),
    "FallingFactorial": lambda x, y: sp.FallingFactorial(x, y),
    "binomial": lambda x, y: sp.binomial(x, y),
    "uppergamma": lambda x, y: sp.uppergamma(x, y),
    "lowergamma": lambda x, y: sp.lowergamma(x, y),
    "betainc": lambda x, y: sp.betainc(x, y, 0, sp.Rational(1, 2)),
    "betainc_regularized": lambda x, y: sp.betainc_regularized(x, y, 0, sp.Rational(1, 2)),
    "Ei": lambda x, y: sp.Ei(x),
    "expint": lambda x, y: sp.expint(y, x),
    "E1": lambda x, y: sp.E1(x),
    "Si": lambda x, y: sp.Si(x),
    "Ci": lambda x, y: sp.Ci(x),
    "Shi": lambda x, y: sp.Shi(x),
    "Chi": lambda x, y: sp.Chi(x),
    "li": lambda x, y: sp.li(x),
    "Li": lambda x, y: sp.Li(x),
    "fresnels": lambda x, y: sp.fresnels(x),
    "fresnelc": lambda x, y: sp.fresnelc(x),
    "erfi": lambda x, y: sp.erfi(x),
    "erfcinv": lambda x, y: sp.erfcinv(x),
    "zeta": lambda x, y: sp.zeta(x) + sp.zeta(x, y),
    "harmonic": lambda x, y: sp.harmonic(x) + sp.harmonic(x, y),
    "bernoulli": lambda x, y: sp.bernoulli(x),
    "LambertW": lambda x, y: sp.LambertW(x) + sp.LambertW(x, -1),
    "elliptic_k": lambda x, y: sp.elliptic_k(x),
    "elliptic_e": lambda x, y: sp.elliptic_e(x),
    "besselj": lambda x, y: sp.besselj(y, x),
    "besseli": lambda x, y: sp.besseli(y, x),
    "besselk": lambda x, y: sp.besselk(y, x),
    "legendre": lambda x, y: sp.legendre(y, x),
    "assoc_legendre": lambda x, y: sp.assoc_legendre(y, 2, x),
    "chebyshevt": lambda x, y: sp.chebyshevt(y, x),
    "chebyshevu": lambda x, y: sp.chebyshevu(y, x),
    "hermite": lambda x, y: sp.hermite(y, x),
    "laguerre": lambda x, y: sp.laguerre(y, x),
    "assoc_laguerre": lambda x, y: sp.assoc_laguerre(y, sp.Rational(1, 2), x),
    "gegenbauer": lambda x, y: sp.gegenbauer(y, sp.Rational(3, 2), x),
    "jacobi": lambda x, y: sp.jacobi(y, sp.Rational(1, 2), sp.Rational(3, 2), x),
    "Matrix": lambda x, y: sp.Matrix([[x, y], [y, x]]),
    "Array": lambda x, y: sp.Array([x, y]),
    "cbrt": lambda x, y: sp.cbrt(x),
    "root": lambda x, y: sp.root(x, 5),
    "Pow": lambda x, y: x**y,
    "sec": lambda x, y: sp.sec(x),
    "csc": lambda x, y: sp.csc(x),
}


def _cfunction(name: str) -> Callable[..., sp.Basic]:
    from sympy.codegen import cfunctions

    return getattr(cfunctions, name)


def _numpy_node(name: str) -> Callable[..., sp.Basic]:
    from sympy.codegen import numpy_nodes

    return getattr(numpy_nodes, name)


def _scipy_node(name: str) -> Callable[..., sp.Basic]:
    from sympy.codegen import scipy_nodes

    return getattr(scipy_nodes, name)


def _callee_probe(key: str) -> Callable[[bool], Observation]:
    row = CALLEE_TABLE[key]

    def probe(cse: bool) -> Observation:
        expected = f"{key}(...) printed for each of {', '.join(row.sympy)}; every callee in the table"
        found, ok = [], True
        for name in row.sympy:
            example = CALLEE_EXAMPLES.get(name)
            if example is None:
                found.append(f"{name}: no example in drift.CALLEE_EXAMPLES")
                ok = False
                continue
            callees = _printed_callees(_emitted(example(_x, _y), [[_x, _y]], cse=cse))
            unknown = callees - set(CALLEE_TABLE) - {"reduce"}
            ok = ok and key in callees and not unknown
            found.append(f"{name}: {', '.join(sorted(callees)) or 'no call'}"
                         + (f" (not in the table: {', '.join(sorted(unknown))})" if unknown else ""))
        return Observation(ok, expected, "; ".join(found))

    return probe


def _composite_forms(cse: bool) -> Observation:
    found, ok = [], True
    for name in COMPOSITE_SYMPY:
        example = CALLEE_EXAMPLES.get(name)
        if example is None:
            found.append(f"{name}: no example in drift.CALLEE_EXAMPLES")
            ok = False
            continue
        callees = _printed_callees(_emitted(example(_x, _y), [[_x, _y]], cse=cse))
        unknown = callees - set(CALLEE_TABLE) - {"reduce"}
        ok = ok and not unknown
        found.append(f"{name}: {', '.join(sorted(callees)) or 'operators only'}"
                     + (f" (not in the table: {', '.join(sorted(unknown))})" if unknown else ""))
    return Observation(ok, f"{', '.join(COMPOSITE_SYMPY)} printed through table rows only",
                       "; ".join(found))


# ---- the upstream APIs themselves ---------------------------------------------------------

def _evaluator_printer(_: bool) -> Observation:
    from sympy.utilities.lambdify import _EvaluatorPrinter

    doprint = inspect.signature(_EvaluatorPrinter.doprint).parameters
    init = inspect.signature(_EvaluatorPrinter.__init__).parameters
    positional = [p for p in doprint if doprint[p].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    found = (f"__init__({', '.join(list(init)[1:3])}), "
             f"doprint({', '.join(positional[1:])}{', cses=' if 'cses' in doprint else ''})")
    return observe("__init__(printer, dummify), doprint(funcname, args, expr, cses=)", found)


def _jax_printer_settings(_: bool) -> Observation:
    from sympy.printing.numpy import JaxPrinter

    wanted = ("allow_unknown_functions", "fully_qualified_modules", "inline", "user_functions")
    present = [key for key in wanted if key in JaxPrinter._default_settings]
    return observe(", ".join(wanted), ", ".join(present) or "none of them")


def _closed_over(table: Any) -> Callable[[Any], Any]:
    def function(x: Any) -> Any:
        return x @ table

    return function


def _staging_constants(_: bool) -> Observation:
    import jax
    import jax.numpy as jnp

    table = np.arange(16.0, dtype=np.float32).reshape(4, 4)
    found = []
    for kind, captured in (("numpy", table), ("jax", jnp.asarray(table))):
        closed = jax.make_jaxpr(_closed_over(captured))(np.ones(4, np.float32))
        consts = [tuple(np.shape(c)) for c in getattr(closed, "consts", [])]
        constvars = [tuple(v.aval.shape) for v in closed.jaxpr.constvars]
        found.append(f"{kind}: {type(closed).__name__}, consts {consts}, constvars {constvars}")
    expected = "; ".join(f"{kind}: ClosedJaxpr, consts [(4, 4)], constvars [(4, 4)]"
                         for kind in ("numpy", "jax"))
    return observe(expected, "; ".join(found))


def _lowering_text(_: bool) -> Observation:
    import jax

    table = np.arange(16.0, dtype=np.float32).reshape(4, 4)
    text = jax.jit(_closed_over(table)).lower(np.ones(4, np.float32)).as_text(dialect="stablehlo")
    main = re.search(r"func\.func public @main\(%arg\d+: tensor<4xf32>", text)
    constant = re.search(r"stablehlo\.constant dense<.*> : tensor<4x4xf32>", text)
    signature = next((line.strip() for line in text.splitlines() if "@main" in line), "no @main")
    found = ["argument %argN of public @main" if main else _short(signature, 80),
             "captured table as stablehlo.constant" if constant
             else "no stablehlo.constant of tensor<4x4xf32>"]
    return observe("argument %argN of public @main; captured table as stablehlo.constant",
                   "; ".join(found))


def _shared_in_conditional(_: bool) -> Observation:
    import jax
    import jax.numpy as jnp
    from jax import lax

    def consumers(s: Any, c: Any) -> tuple:
        return tuple(s * k + c for k in range(1, 5))

    def plain(x: Any) -> tuple:
        return consumers(jnp.sin(x), jnp.cos(x))

    def conditional(x: Any) -> tuple:
        def stage() -> tuple:
            return jnp.sin(x), jnp.cos(x)
        return consumers(*lax.cond(jnp.isnan(jnp.sum(jnp.ravel(x)[:1])), stage, stage))

    x = np.linspace(0.0, 1.0, 4096, dtype=np.float32)
    found = []
    for name, function in (("plain", plain), ("lax.cond", conditional)):
        text = jax.jit(function).lower(x).compile().as_text()
        count = len(re.findall(r"\bsine[(]", text))
        found.append(f"{name}: {count} sine")
    return observe("plain: 4 sine; lax.cond: 2 sine", "; ".join(found))


def _dense_layer_sums(_: bool) -> Observation:
    from symkern.codegen.contract import contract_linear_forms
    from symkern.codegen.pipeline import generate

    x = list(sp.symbols("x0:8"))
    weights = [sp.Matrix(8, 8, lambda i, j, k=k: sp.Symbol(f"w{k}_{i}_{j}")) for k in (1, 2)]
    bias = sp.Matrix(8, 1, lambda i, _: sp.Symbol(f"b{i}"))
    hidden = [sp.tanh(sp.Add(*[weights[0][i, j] * x[j] for j in range(8)], bias[i]))
              for i in range(8)]
    out = [sp.tanh(sp.Add(*[weights[1][i, j] * hidden[j] for j in range(8)])) for i in range(8)]
    arguments = [data_argument(x, 1)]
    parameters, _ = parameter_arguments({"W1": weights[0], "W2": weights[1], "b": bias})
    module = generate(equation_set(sp.Matrix(out)), arguments + parameters, 1).module
    found = contract_linear_forms(module, np.dtype("float32"), [])
    if found is None:
        return observe("2 groups of 16 sums", "no group of sums over shared inputs")
    text = ast.unparse(module)
    read = sorted(set(re.findall(r"ps\['W\d'\]\[:8, :8\]", text)))
    lifted = "tanh on the first block" if "_lh0 = jnp.tanh(_lz0)" in text else "no block tanh"
    return observe("2 groups of 16 sums; weights ps['W1'][:8, :8], ps['W2'][:8, :8]; "
                   "tanh on the first block",
                   f"{found.groups} groups of {found.forms} sums; weights "
                   f"{', '.join(read) or 'not one matrix'}; {lifted}")


def _matrix_expression_forms(_: bool) -> Observation:
    from sympy.codegen.matrix_nodes import MatrixSolve
    from sympy.matrices.expressions.applyfunc import ElementwiseApplyFunction

    W, A = sp.MatrixSymbol("W", 3, 3), sp.MatrixSymbol("A", 3, 3)
    x, a = sp.MatrixSymbol("x", 3, 1), sp.Symbol("a")
    product = a * W * x
    numeric = sp.Matrix([[1, 2], [3, 4]]) * sp.MatrixSymbol("y", 2, 1)
    applied = W.applyfunc(sp.sin)
    solve = MatrixSolve(A, x)
    found = [
        f"a*W*x: {type(product).__name__}{tuple(str(arg) for arg in product.args)}",
        f"W.inv(): {type(W.inv()).__name__}, W**-1: {type(W**-1).__name__}",
        f"Matrix*y: {type(numeric).__name__} of "
        f"{', '.join(type(arg).__name__ for arg in numeric.args)}",
        f"applyfunc: {type(applied).__name__} of a {type(applied.function).__name__} in "
        f"{len(getattr(applied.function, 'variables', ()))} variable",
        f"MatrixSolve(A, x).args: {tuple(str(arg) for arg in solve.args)}, shape {solve.shape}",
        f"d(x.T*W*x)/dx: {type((x.T * W * x).diff(x)).__name__}",
    ]
    return observe("a*W*x: MatMul('a', 'W', 'x'); W.inv(): Inverse, W**-1: Inverse; "
                   "Matrix*y: MatMul of ImmutableDenseMatrix, MatrixSymbol; applyfunc: "
                   f"{ElementwiseApplyFunction.__name__} of a Lambda in 1 variable; "
                   "MatrixSolve(A, x).args: ('A', 'x'), shape (3, 1); d(x.T*W*x)/dx: MatAdd",
                   "; ".join(found))


def _array_expression_axes(_: bool) -> Observation:
    from sympy.tensor.array.expressions import (
        ArrayContraction,
        ArrayDiagonal,
        ArrayTensorProduct,
        PermuteDims,
    )

    W, v = sp.MatrixSymbol("W", 2, 3), sp.MatrixSymbol("v", 4, 1)
    U = sp.MatrixSymbol("U", 3, 3)
    permuted = PermuteDims(ArrayTensorProduct(W, v), [2, 0, 1, 3])
    diagonal = ArrayDiagonal(ArrayTensorProduct(W, U), (1, 2))
    contracted = ArrayContraction(ArrayTensorProduct(W, U), (1, 2))
    return observe(
        "PermuteDims [2, 0, 1, 3] of (2, 3, 4, 1): (4, 2, 3, 1), array_form [2, 0, 1, 3]; "
        "ArrayDiagonal (1, 2) of (2, 3, 3, 3): (2, 3, 3), groups ((1, 2),); "
        "ArrayContraction (1, 2): (2, 3), groups ((1, 2),), of ArrayTensorProduct",
        f"PermuteDims [2, 0, 1, 3] of (2, 3, 4, 1): {permuted.shape}, array_form "
        f"{permuted.permutation.array_form}; ArrayDiagonal (1, 2) of (2, 3, 3, 3): "
        f"{diagonal.shape}, groups {diagonal.diagonal_indices}; ArrayContraction (1, 2): "
        f"{contracted.shape}, groups {contracted.contraction_indices}, of "
        f"{type(contracted.expr).__name__}")


def _astor_round_trip(_: bool) -> Observation:
    # trees built by the rules themselves, so the check covers what they really produce
    trees = [
        rules.substitute_arguments(ast.parse("def f(_a0, _a1):\n    return (_a0[0] * _a1,)"),
                                   ["_a0", "_a1"], 1, [("L1", "W")]),
        rules.index_by_batch(ast.parse("def kernel(x1, x2):\n    return (x1[0] + x2[1, 0],)"),
                             {"x1": 1, "x2": 2}),
        rules.use_integer_pow(ast.parse("def kernel(x1):\n    return (x1**2 * x1**(-1.0),)")),
        rules.broadcast_constant_outputs(ast.parse("def kernel(x1):\n    return (1,)"), [1]),
        rules.guard_piecewise_gradients(ast.parse(
            "def kernel(x1):\n    return (jnp.select([x1 > 0, True], [jnp.sqrt(x1), 0],"
            " default=jnp.nan),)")),
        rules.hoist_array_literals(ast.parse(
            "def kernel(x1):\n    return (functions['f'](jnp.array([0.5, 1/3, -2, 4, 5]), x1),)"),
            8, np.dtype("float64"), []),
    ]
    expected, found = [], []
    for tree in trees:
        reference = ast.unparse(tree)
        printed = print_source(tree)
        expected.append(_short(reference.split("\n", 1)[1], 70))
        same = ast.dump(ast.parse(printed)) == ast.dump(ast.parse(reference))
        found.append(_short(reference.split("\n", 1)[1], 70) if same
                     else f"astor printed {_short(printed, 70)!r}")
    return observe("; ".join(expected), "; ".join(found))


#: what BuildOptions(cpu_loop="c") calls of jax.ffi (symkern.kernels.c_loop), and the names
#: its printed loop uses from the FFI headers (symkern.codegen.c_loop)
FFI_PARAMETERS = {"register_ffi_target": ("name", "fn", "platform"),
                  "ffi_call": ("target_name", "result_shape_dtypes", "vmap_method")}
FFI_HEADER_NAMES = ("XLA_FFI_DEFINE_HANDLER_SYMBOL", "ResultBuffer", "typed_data", "dimensions",
                    "size_bytes", "Attr", "Bind", "Success")


def _ffi_interface(_: bool) -> Observation:
    import inspect
    from pathlib import Path

    import jax

    found = []
    for function, parameters in FFI_PARAMETERS.items():
        taken = set(inspect.signature(getattr(jax.ffi, function)).parameters)
        missing = [p for p in parameters if p not in taken]
        found.append(f"{function}({', '.join(p for p in parameters if p in taken)})"
                     + (f" without {', '.join(missing)}" if missing else ""))
    api = Path(jax.ffi.include_dir()) / "xla" / "ffi" / "api"
    text = "".join((api / name).read_text() for name in ("ffi.h", "api.h")
                   if (api / name).is_file())
    found.append("headers: " + ", ".join(n if n in text else f"no {n}" for n in FFI_HEADER_NAMES))
    expected = [f"{f}({', '.join(p)})" for f, p in FFI_PARAMETERS.items()]
    expected.append("headers: " + ", ".join(FFI_HEADER_NAMES))
    return observe("; ".join(expected), "; ".join(found))


# ---- the list -------------------------------------------------------------------------------

CHECKS: list[DriftCheck] = [
    DriftCheck("function_shape", "SymPy prints one function `_lambdifygenerated` with the "
               "positional arguments in the order given and a single return of a tuple",
               _function_shape),
    DriftCheck("data_reads", "data arguments are read one entry at a time, `_a0[i]` (1-d) and "
               "`_a1[i, j]` (2-d), the subscripts index_by_batch matches", _data_reads),
    DriftCheck("array_constructor", "array outputs print as `array(nested lists)`, nested (m, n) "
               "for a Matrix, (m, 1) for a column, the shape for an Array (stack_outputs)",
               _array_constructor),
    DriftCheck("array_literal", "a numeric table handed to a function prints as `array([...])` "
               "of number literals (2, 0.5, -1.25, 1/3): what hoist_array_literals hoists",
               _array_literal),
    DriftCheck("cse_form", "with cse, common subexpressions are assignments `_cN = ...` before "
               "the return; without, there are none", _cse_form),
    DriftCheck("piecewise_form", "Piecewise prints as `select([conditions], [choices], "
               "default=nan)` (guard_piecewise_gradients)", _piecewise_form),
    DriftCheck("constant_output", "a constant output is printed unbroadcast, `return (1,)` for "
               "x/x (why broadcast_constant_outputs exists)", _constant_output),
    DriftCheck("reduce_form", "Max and Min print as `reduce(maximum, [...])` (unfold_reductions)",
               _reduce_form),
    *(DriftCheck(f"callee:{key}", f"SymPy {', '.join(row.sympy)} print(s) the callee `{key}` "
                 f"(CALLEE_TABLE -> {row.target})", _callee_probe(key))
      for key, row in CALLEE_TABLE.items()),
    DriftCheck("callee:composites", "functions without a row of their own print through "
               "table rows only", _composite_forms),
    DriftCheck("evaluator_printer_api", "sympy.utilities.lambdify._EvaluatorPrinter(printer, "
               "dummify).doprint(name, args, expr, cses=...) exists (emit)", _evaluator_printer,
               depends_on_cse=False),
    DriftCheck("jax_printer_settings", "JaxPrinter accepts the settings emit passes",
               _jax_printer_settings, depends_on_cse=False),
    DriftCheck("jax_staging_constants", "jax.make_jaxpr returns a ClosedJaxpr whose .consts and "
               ".jaxpr.constvars hold closed-over arrays", _staging_constants,
               depends_on_cse=False),
    DriftCheck("jax_lowering_text", "jax.jit(f).lower(...).as_text() shows an argument as %arg "
               "of `func.func public @main` and a closed-over array as stablehlo.constant",
               _lowering_text, depends_on_cse=False),
    DriftCheck("xla_shared_in_conditional", "XLA's CPU fusion repeats an elementwise sine in "
               "every consumer fusion, and once per branch inside lax.cond with identical "
               "branches (codegen.materialize)", _shared_in_conditional, depends_on_cse=False),
    DriftCheck("dense_layer_sums", "a scalarized tanh layer prints as sums of `W[i, j] * h` "
               "over the same locals, which codegen.contract turns into one tensordot per "
               "layer reading the weight matrix", _dense_layer_sums, depends_on_cse=False),
    DriftCheck("matrix_expression_forms", "SymPy's matrix expressions keep the structure "
               "codegen.arrays prints: MatMul's scalar factors first, an inverse as Inverse, a "
               "numeric Matrix as a MatMul argument, applyfunc as a one-variable Lambda, "
               "MatrixSolve(matrix, vector), a quadratic form's derivative as a MatAdd",
               _matrix_expression_forms, depends_on_cse=False),
    DriftCheck("array_expression_axes", "SymPy's array expressions order axes as codegen.arrays' "
               "einsum does: PermuteDims takes axis p[k] to k, ArrayDiagonal appends each "
               "diagonal after the other axes, ArrayContraction drops its groups",
               _array_expression_axes, depends_on_cse=False),
    DriftCheck("jax_ffi", "jax.ffi registers and calls a handler as symkern.kernels.c_loop "
               "does, and jaxlib's FFI headers define what the printed C loop uses "
               "(BuildOptions(cpu_loop='c'))", _ffi_interface, depends_on_cse=False),
    DriftCheck("astor_round_trip", "astor.to_source(module, pretty_source=''.join) prints the "
               "trees the rules build, and they parse back to the same tree", _astor_round_trip,
               depends_on_cse=False),
]


def cases(checks: Sequence[DriftCheck] | None = None) -> list[tuple[DriftCheck, bool | None]]:
    """Every (check, cse) pair to run: cse in (False, True) where the check depends on it."""
    return [(check, cse) for check in (CHECKS if checks is None else checks)
            for cse in ((False, True) if check.depends_on_cse else (None,))]


def run_checks(checks: Sequence[DriftCheck] | None = None) -> list[CheckResult]:
    """Run every check against the installed SymPy, astor and JAX."""
    return [check.run(cse) for check, cse in cases(checks)]


def versions() -> dict[str, str]:
    """The installed versions the checks ran against."""
    found = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found
