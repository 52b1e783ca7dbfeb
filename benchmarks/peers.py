"""numba, PyTensor and CasADi as tools of `compare.py`, each used the way its own
documentation shows; they need the `peers` extra (`pip install -e ".[peers]"`).

- ``numba``: the source `sympy.lambdify(args, entries, "numpy", cse=True)` generates, its
  body moved into a loop over the batch under ``numba.njit(parallel=True)`` with
  ``numba.prange`` (numba's documented pattern for an independent loop), float64.
- ``pytensor-c`` / ``pytensor-jax`` / ``pytensor-numba``: the SymPy tree translated node by
  node with the op mapping of SymPy's aesaracode printer (`PYTENSOR_OPS`; SymPy 1.14 has no
  PyTensor printer) into a graph over the batch's columns, ``pytensor.function(..., mode=)``
  with the C VM, JAX or numba backend, float64; ``-f32`` variants in float32.
- ``casadi`` / ``casadi-c``: the tree translated into CasADi ``SX`` (`CASADI_OPS`), one
  sample's ``Function`` mapped over the batch with ``Function.map`` over threads (parameters not widened) and
  called through its low-overhead ``buffer()``; interpreted, or the single-sample function
  generated as C, compiled with ``gcc -O3`` and loaded with ``casadi.external``. float64
  only (CasADi's ``SX`` is double).

Constant entries: lambdify and PyTensor hand an entry that reads no input back as a 0-d
value (unbroadcast); the numba loop and CasADi write it for every sample.
"""

from __future__ import annotations

import ast
import inspect
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import sympy as sp

#: how many threads the CasADi map and the numba loop use: the benchmark machine's cores
THREADS = os.cpu_count() or 1
#: numba's threading layer unless NUMBA_THREADING_LAYER names one: the OpenMP layer numba
#: picks by default cost 15-20 ms a call on the loaded 2-core machine (a one-sample call:
#: 16 ms against 30 us with workqueue; 100,000 nlink-2 samples: 35 ms against 13-18 ms)
THREADING_LAYER = "workqueue"


# ==== translating a SymPy tree =============================================================


def translate(entries: list[sp.Expr], leaves: dict[sp.Symbol, Any], ops: dict[type, Callable],
              number: Callable[[float], Any]) -> list[Any]:
    """Every entry as the target library's expression, bottom-up without recursion.

    `leaves` maps each free symbol to its target variable, `ops` a SymPy class (or a base
    class, looked up along the MRO) to a function of the translated arguments, `number` a
    SymPy number's float value to a target constant. A shared subexpression is translated
    once and reused, so the target graph is a DAG as SymPy's is.
    """
    done: dict[sp.Basic, Any] = {}
    for entry in entries:
        stack = [(entry, False)]
        while stack:
            node, expanded = stack.pop()
            if node in done:
                continue
            if node.is_Symbol:
                done[node] = leaves[node]
            elif node.is_Number or node in (sp.pi, sp.E):
                done[node] = number(float(node))
            elif not expanded:
                stack.append((node, True))
                stack.extend((arg, False) for arg in node.args if arg not in done)
            else:
                done[node] = _op(ops, node)(*[done[arg] for arg in node.args], node=node)
    return [done[entry] for entry in entries]


def _op(ops: dict[type, Callable], node: sp.Basic) -> Callable:
    for cls in type(node).__mro__:
        if cls in ops:
            return ops[cls]
    raise NotImplementedError(f"no translation for SymPy's {type(node).__name__}")


def _binary_chain(fn: Callable) -> Callable:
    """An n-ary SymPy node (Add, Mul, Max) as a left fold of a binary function."""

    def apply(*args: Any, node: sp.Basic) -> Any:
        result = args[0]
        for arg in args[1:]:
            result = fn(result, arg)
        return result

    return apply


def _unary(fn: Callable) -> Callable:
    return lambda arg, node: fn(arg)


def _pow(sqrt: Callable, pow_fn: Callable) -> Callable:
    """x**e with a numeric exponent kept a Python number, so each library picks its own
    integer-power and reciprocal code; x**(1/2) as sqrt, as SymPy's printers do."""

    def apply(base: Any, exponent: Any, node: sp.Pow) -> Any:
        e = node.exp
        if e == sp.S.Half:
            return sqrt(base)
        if e.is_Integer:
            return pow_fn(base, int(e))
        return pow_fn(base, float(e) if e.is_Number else exponent)

    return apply


def pytensor_ops() -> dict[type, Callable]:
    """SymPy class -> PyTensor op: the scalar rows of SymPy's aesaracode printer's
    `mapping`, with `aesara.tensor` as `pytensor.tensor`."""
    import pytensor.tensor as pt

    unary = {sp.Abs: pt.abs, sp.sign: pt.sign, sp.ceiling: pt.ceil, sp.floor: pt.floor,
             sp.log: pt.log, sp.exp: pt.exp, sp.cos: pt.cos, sp.acos: pt.arccos, sp.sin: pt.sin,
             sp.asin: pt.arcsin, sp.tan: pt.tan, sp.atan: pt.arctan, sp.cosh: pt.cosh,
             sp.acosh: pt.arccosh, sp.sinh: pt.sinh, sp.asinh: pt.arcsinh, sp.tanh: pt.tanh,
             sp.atanh: pt.arctanh, sp.erf: pt.erf, sp.gamma: pt.gamma, sp.loggamma: pt.gammaln}
    return {sp.Add: lambda *args, node: pt.add(*args), sp.Mul: lambda *args, node: pt.mul(*args),
            sp.Pow: _pow(pt.sqrt, pt.pow), sp.atan2: lambda y, x, node: pt.arctan2(y, x),
            sp.Max: _binary_chain(pt.maximum), sp.Min: _binary_chain(pt.minimum),
            **{cls: _unary(fn) for cls, fn in unary.items()}}


#: the scalar rows of `pytensor_ops`, by the C math library's names, which CasADi's and
#: Python's `math` functions share
C_UNARY = {sp.Abs: "fabs", sp.ceiling: "ceil", sp.floor: "floor", sp.log: "log", sp.exp: "exp",
           sp.cos: "cos", sp.acos: "acos", sp.sin: "sin", sp.asin: "asin", sp.tan: "tan",
           sp.atan: "atan", sp.cosh: "cosh", sp.acosh: "acosh", sp.sinh: "sinh",
           sp.asinh: "asinh", sp.tanh: "tanh", sp.atanh: "atanh", sp.erf: "erf"}


def _c_library_ops(library: Any, sign: Callable, maximum: Callable,
                   minimum: Callable) -> dict[type, Callable]:
    """SymPy class -> function of a library with the C math library's names (`C_UNARY`),
    and the operators for sums, products and powers."""
    return {sp.Add: _binary_chain(lambda a, b: a + b), sp.Mul: _binary_chain(lambda a, b: a * b),
            sp.Pow: _pow(library.sqrt, lambda a, b: a ** b),
            sp.atan2: lambda y, x, node: library.atan2(y, x),
            sp.Max: _binary_chain(maximum), sp.Min: _binary_chain(minimum), sp.sign: _unary(sign),
            **{cls: _unary(getattr(library, name)) for cls, name in C_UNARY.items()}}


def casadi_ops() -> dict[type, Callable]:
    """SymPy class -> CasADi SX operation (the same rows as `pytensor_ops`)."""
    import casadi as ca

    return _c_library_ops(ca, ca.sign, ca.fmax, ca.fmin)


def math_ops() -> dict[type, Callable]:
    """SymPy class -> Python `math` function on floats (the same rows as `casadi_ops`): a
    derivative checked at one point in time linear in its DAG, where lambdify's namespace
    walk is exponential in the depth of a shared expression."""
    import math

    return _c_library_ops(math, lambda v: math.copysign(1.0, v) if v else 0.0, max, min)


# ==== the tools =============================================================================
# The interface of compare.py's adapters: build(), prepare(X), params(tree), call(data, ps),
# entries(out, n), single(x, ps), hlo(data, ps); `jax` (a JAX program: HLO and compile
# counts), `dtype`, `x64` (needs jax_enable_x64 in its process).


class NumbaTool:
    """lambdify's NumPy source, its body inside `for i in numba.prange(n)`."""

    jax, dtype, x64 = False, "float64", False

    def __init__(self, wl: Any) -> None:
        self.wl = wl

    def build(self) -> None:
        import numba

        if "NUMBA_THREADING_LAYER" not in os.environ:
            numba.config.THREADING_LAYER = THREADING_LAYER
        symbols = list(self.wl.inputs) + self.wl.flat_param_symbols()
        scalar = sp.lambdify(symbols, self.wl.flat_entries(), modules="numpy", cse=True)
        source = batch_loop_source(inspect.getsource(scalar), len(self.wl.inputs))
        namespace = dict(scalar.__globals__, prange=numba.prange, empty=np.empty)
        exec(compile(source, "<numba batch loop>", "exec"), namespace)  # noqa: S102 - generated here
        self.fn = numba.njit(parallel=True, cache=False)(namespace["batched"])

    def prepare(self, X: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(X, np.float64)

    def params(self, tree: Any) -> np.ndarray:
        return np.asarray(_leaves_flat(tree), np.float64)

    def call(self, data: np.ndarray, ps: np.ndarray) -> np.ndarray:
        return self.fn(data, ps)

    def entries(self, out: np.ndarray, n: int) -> np.ndarray:
        return np.asarray(out, np.float64)

    def single(self, x: np.ndarray, ps: np.ndarray) -> np.ndarray:
        return self.fn(x[None, :], ps)

    def extra(self) -> dict:
        import numba

        return {"threading_layer": numba.threading_layer(), "threads": numba.get_num_threads()}

    def hlo(self, data: Any, ps: Any) -> None:
        return None


def _leaves_flat(tree: Any) -> np.ndarray:
    from workloads import _tree_leaves

    leaves = _tree_leaves(tree)
    if not leaves:
        return np.zeros(0)
    return np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in leaves])


def batch_loop_source(scalar_source: str, n_inputs: int) -> str:
    """`def f(a, b, p): ...; return [e0, e1]` (lambdify's source) as
    `def batched(X, P): out = empty((n, 2)); for i in prange(n): a = X[i, 0]; ...;
    out[i, 0] = e0; ...; return out` (the first `n_inputs` arguments read X, the rest P)."""
    function = ast.parse(scalar_source).body[0]
    assert isinstance(function, ast.FunctionDef), scalar_source[:200]
    *body, returned = function.body
    assert isinstance(returned, ast.Return) and isinstance(returned.value, (ast.List, ast.Tuple))
    names = [arg.arg for arg in function.args.args]
    loads = [f"{name} = X[i, {k}]" if k < n_inputs else f"{name} = P[{k - n_inputs}]"
             for k, name in enumerate(names)]
    stores = [f"out[i, {k}] = {ast.unparse(value)}" for k, value in enumerate(returned.value.elts)]
    lines = ["def batched(X, P):", "    n = X.shape[0]",
             f"    out = empty((n, {len(stores)}))", "    for i in prange(n):"]
    lines += ["        " + line for line in loads + [ast.unparse(s) for s in body] + stores]
    lines.append("    return out")
    return "\n".join(lines)


class PytensorTool:
    """The SymPy tree as a PyTensor graph over the batch's columns, one function call."""

    jax, dtype, x64 = False, "float64", False
    mode = "CVM"

    def __init__(self, wl: Any) -> None:
        self.wl = wl

    def build(self) -> None:
        import pytensor
        import pytensor.tensor as pt

        X = pt.matrix("X", dtype=self.dtype)  # (inputs, batch): each input a contiguous row
        P = pt.vector("P", dtype=self.dtype)
        leaves = {s: X[k] for k, s in enumerate(self.wl.inputs)}
        leaves.update({s: P[k] for k, s in enumerate(self.wl.flat_param_symbols())})
        outputs = translate(self.wl.flat_entries(), leaves, pytensor_ops(),
                            lambda v: pt.constant(np.asarray(v, self.dtype)))
        self.fn = pytensor.function([X, P], outputs, mode=self.mode)

    def prepare(self, X: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(X.T, self.dtype)

    def params(self, tree: Any) -> np.ndarray:
        return np.asarray(_leaves_flat(tree), self.dtype)

    def call(self, data: np.ndarray, ps: np.ndarray) -> list:
        return self.fn(data, ps)

    def entries(self, out: list, n: int) -> np.ndarray:
        return np.stack([np.broadcast_to(np.asarray(e, np.float64), (n,)) for e in out], axis=1)

    def single(self, x: np.ndarray, ps: np.ndarray) -> list:
        return self.fn(np.asarray(x, self.dtype)[:, None], ps)

    def hlo(self, data: Any, ps: Any) -> None:
        return None


class PytensorTool32(PytensorTool):
    dtype = "float32"


class PytensorJaxTool(PytensorTool):
    mode, x64 = "JAX", True


class PytensorJaxTool32(PytensorJaxTool):
    dtype, x64 = "float32", False


class PytensorNumbaTool(PytensorTool):
    mode = "NUMBA"


class PytensorNumbaTool32(PytensorNumbaTool):
    dtype = "float32"


class CasadiTool:
    """One sample's CasADi Function, mapped over the batch and called through buffer()."""

    jax, dtype, x64 = False, "float64", False
    generate_c = False

    def __init__(self, wl: Any) -> None:
        self.wl = wl
        self.calls: dict[int, tuple[Any, Any, np.ndarray]] = {}

    def build(self) -> None:
        import casadi as ca

        x = ca.SX.sym("x", len(self.wl.inputs))
        p = ca.SX.sym("p", len(self.wl.flat_param_symbols()))
        leaves = {s: x[k] for k, s in enumerate(self.wl.inputs)}
        leaves.update({s: p[k] for k, s in enumerate(self.wl.flat_param_symbols())})
        outputs = translate(self.wl.flat_entries(), leaves, casadi_ops(), lambda v: ca.SX(v))
        f = ca.Function("f", [x, p], [ca.vertcat(*outputs)])
        if self.generate_c:
            f = compile_c(f)
        self.f = f
        self.m = len(outputs)

    def _buffered(self, n: int) -> tuple[Any, Any, np.ndarray]:
        if n not in self.calls:
            self.calls = {n: self._buffer(n), **self.calls}
        return self.calls[n]

    def _buffer(self, n: int) -> tuple[Any, Any, np.ndarray]:
        # map(n, "thread", THREADS) as CasADi's documentation writes it, but with the
        # parameters (input 1) shared by every evaluation instead of widened to n columns:
        # THREADS serial chunks, run on threads
        if n % THREADS == 0 and n > THREADS:
            chunk = self.f.map("chunk", "serial", n // THREADS, [1], [])
            mapped = chunk.map("batch", "thread", THREADS, [1], [])
        else:
            mapped = self.f.map("batch", "serial", n, [1], [])
        buffer, evaluate = mapped.buffer()
        out = np.empty((n, self.m))  # CasADi is column-major: (m, n) there is (n, m) here
        buffer.set_res(0, memoryview(out))
        return buffer, evaluate, out

    def prepare(self, X: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(X, np.float64)  # (n, inputs) here is (inputs, n) in CasADi

    def params(self, tree: Any) -> np.ndarray:
        return np.ascontiguousarray(_leaves_flat(tree), np.float64)

    def call(self, data: np.ndarray, ps: np.ndarray) -> np.ndarray:
        buffer, evaluate, out = self._buffered(data.shape[0])
        buffer.set_arg(0, memoryview(data))
        buffer.set_arg(1, memoryview(ps))
        evaluate()
        return out

    def entries(self, out: np.ndarray, n: int) -> np.ndarray:
        return np.array(out, np.float64)

    def single(self, x: np.ndarray, ps: np.ndarray) -> np.ndarray:
        return self.call(np.ascontiguousarray(x[None, :]), ps)

    def hlo(self, data: Any, ps: Any) -> None:
        return None


class CasadiCTool(CasadiTool):
    generate_c = True


def compile_c(f: Any) -> Any:
    """`f.generate()` as C, compiled with gcc -O3 into a shared library, loaded back with
    `casadi.external` (CasADi's documented code-generation route)."""
    import casadi as ca

    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler (gcc or cc) on PATH for CasADi's generated code")
    directory = tempfile.mkdtemp(prefix="symkern-casadi-")
    source = os.path.join(directory, "f.c")
    library = os.path.join(directory, "f.so")
    generator = ca.CodeGenerator("f.c")
    generator.add(f)
    generator.generate(directory + os.sep)
    subprocess.run([compiler, "-O3", "-fPIC", "-shared", source, "-o", library, "-lm"], check=True,
                   capture_output=True)
    return ca.external("f", library)


PEER_ADAPTERS: dict[str, type] = {
    "numba": NumbaTool,
    "pytensor-c": PytensorTool, "pytensor-c-f32": PytensorTool32,
    "pytensor-jax": PytensorJaxTool, "pytensor-jax-f32": PytensorJaxTool32,
    "pytensor-numba": PytensorNumbaTool, "pytensor-numba-f32": PytensorNumbaTool32,
    "casadi": CasadiTool, "casadi-c": CasadiCTool,
}
#: the Python modules each peer needs
PEER_MODULES = {name: ("pytensor", "numba") if name.startswith("pytensor-numba") else (name.split("-")[0],)
                for name in PEER_ADAPTERS}
