"""Fuzz campaign: random kernels — expressions, shapes, dtypes, parameter trees, hostile names.

Each example draws data arguments (a Symbol, a list of symbols, a Matrix of symbols or a
MatrixSymbol), a parameter tree (nested dicts / lists / tuples with Symbol and Matrix
leaves), an equation structure (an Expr, a Matrix, a dict / list / tuple of them), a batch
shape ((), (1,), (2, 3)), a dtype and `cse`; every symbol name and dict key comes from a
pool of hostile names (`x1`, `ps`, `jnp`, `lambda`, `__import__('os')...`, generated-name
look-alikes, unicode, spaces and quotes) or random text. The kernel's results are compared
with SymPy's float64 evaluation of the same equations — `lambdify` over copies in which
every user symbol is replaced by a `Dummy`, so no user name reaches the reference either.

    python tools/fuzz.py --examples 2000 [--seed 0]

tests/reliability/test_fuzz.py runs the bounded profile of the same property.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
import sympy as sp  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import symkern as sk  # noqa: E402

#: a file that hostile names try to create; it must never exist
PWNED = os.path.join(tempfile.gettempdir(), "symkern-fuzz-pwned")

HOSTILE_NAMES = (
    "x", "x0", "x1", "x2", "ps", "jnp", "lax", "jsp", "np", "jax", "lambda", "def", "return",
    "None", "True", "__builtins__", "__import__", "__import__('os')",
    f"__import__('os').system('touch {PWNED}')", "exec('1')", "_a0", "_a1", "_c0", "_c1",
    "_k0", "_w0", "_b0", "_f0", "gate", "functions", "kernel", "_lambdifygenerated", "select",
    "array", "sin", "nan", "inf", "pi", "E", "I", "S", "α", "λ_1", "x₁", "名前", "a b",
    "it's", '"q"', "back\\slash", "new\nline", "x1[0]", 'ps["a"]', "[0]", "{}", "#", "a;b", "1x",
    "Dummy", "...",
)

BATCH_SHAPES = ((), (1,), (2, 3))
DTYPES = ("float32", "float64")
THRESHOLDS = (sp.Rational(-1, 2), sp.Integer(0), sp.Rational(1, 2), sp.Integer(1))

names = st.one_of(st.sampled_from(HOSTILE_NAMES), st.sampled_from(HOSTILE_NAMES),
                  st.text(min_size=1, max_size=6))


@dataclass
class Case:
    """One drawn kernel: what to build, what to call it with, and what to compare."""

    eqs: Any
    data_args: list
    params: Any
    cse: bool
    dtype: str
    batch: tuple[int, ...]
    seed: int

    def describe(self) -> str:
        return (f"Case(eqs={self.eqs!r}, data_args={self.data_args!r}, params={self.params!r}, "
                f"cse={self.cse}, dtype={self.dtype!r}, batch={self.batch}, seed={self.seed})")


def _data_argument(draw, fresh) -> Any:
    kind = draw(st.sampled_from(["symbol", "list", "matrix", "matrix_symbol"]))
    if kind == "symbol":
        return sp.Symbol(fresh())
    if kind == "list":
        return [sp.Symbol(fresh()) for _ in range(draw(st.integers(1, 3)))]
    rows, cols = draw(st.sampled_from([(2, 1), (1, 2), (2, 2)]))
    if kind == "matrix":
        return sp.Matrix(rows, cols, [sp.Symbol(fresh()) for _ in range(rows * cols)])
    return sp.MatrixSymbol(fresh(), rows, cols)


def _parameter_tree(draw, fresh, depth: int = 0) -> Any:
    kind = draw(st.sampled_from(["symbol", "symbol", "matrix"] if depth >= 2
                                else ["symbol", "matrix", "dict", "dict", "list", "tuple"]))
    if kind == "symbol":
        return sp.Symbol(fresh())
    if kind == "matrix":
        rows, cols = draw(st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]))
        return sp.Matrix(rows, cols, [sp.Symbol(fresh()) for _ in range(rows * cols)])
    count = draw(st.integers(1, 3))
    if kind == "dict":
        keys = draw(st.lists(names, min_size=count, max_size=count, unique=True))
        return {key: _parameter_tree(draw, fresh, depth + 1) for key in keys}
    children = [_parameter_tree(draw, fresh, depth + 1) for _ in range(count)]
    return children if kind == "list" else tuple(children)


def _scalars(tree: Any) -> list[sp.Basic]:
    """Every scalar entry a data argument or parameter tree declares."""
    if isinstance(tree, sp.MatrixSymbol):
        return [tree[i, j] for i in range(tree.shape[0]) for j in range(tree.shape[1])]
    if isinstance(tree, sp.MatrixBase):
        return list(tree)
    if isinstance(tree, sp.Symbol):
        return [tree]
    if isinstance(tree, dict):
        return [s for value in tree.values() for s in _scalars(value)]
    if isinstance(tree, (list, tuple)):
        return [s for value in tree for s in _scalars(value)]
    return []


UNARY = (
    lambda e: -e, sp.sin, sp.cos, sp.tanh, sp.atan, sp.Abs,
    lambda e: sp.exp(sp.sin(e)), lambda e: sp.sqrt(e**2 + 1), lambda e: sp.log(e**2 + 1),
    lambda e: e**2, lambda e: e**3, lambda e: 1 / (e**2 + 1),
)
BINARY = (
    lambda p, q: p + q, lambda p, q: p - q, lambda p, q: p * q, lambda p, q: p / (q**2 + 1),
    sp.Max, sp.Min, lambda p, q: sp.atan2(p, q**2 + 1),
)
RELATIONS = (sp.Lt, sp.Le, sp.Gt, sp.Ge, sp.Eq, sp.Ne)


def _expression(draw, leaves: list[sp.Basic], depth: int) -> sp.Expr:
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        if draw(st.integers(0, 4)) == 0:
            return draw(st.sampled_from([sp.Integer(2), sp.Rational(1, 3), sp.pi, sp.Float(0.25)]))
        return draw(st.sampled_from(leaves))
    kind = draw(st.sampled_from(["unary", "binary", "binary", "piecewise"]))
    if kind == "unary":
        return draw(st.sampled_from(UNARY))(_expression(draw, leaves, depth - 1))
    if kind == "binary":
        return draw(st.sampled_from(BINARY))(_expression(draw, leaves, depth - 1),
                                             _expression(draw, leaves, depth - 1))
    condition = draw(st.sampled_from(RELATIONS))(draw(st.sampled_from(leaves)),
                                                 draw(st.sampled_from(THRESHOLDS)))
    return sp.Piecewise((_expression(draw, leaves, depth - 1), condition),
                        (_expression(draw, leaves, depth - 1), True))


def _equations(draw, leaves: list[sp.Basic]) -> Any:
    def expr():
        return _expression(draw, leaves, 3)

    kind = draw(st.sampled_from(["expr", "column", "matrix", "dict", "list", "tuple"]))
    if kind == "expr":
        return expr()
    if kind == "column":
        return sp.Matrix([expr() for _ in range(draw(st.integers(1, 3)))])
    if kind == "matrix":
        return sp.Matrix(2, 2, [expr() for _ in range(4)])
    count = draw(st.integers(1, 3))
    items = [expr() if draw(st.booleans()) else sp.Matrix([expr(), expr()]) for _ in range(count)]
    if kind == "dict":
        keys = draw(st.lists(names, min_size=count, max_size=count, unique=True))
        return dict(zip(keys, items, strict=True))
    return items if kind == "list" else tuple(items)


@st.composite
def cases(draw) -> Case:
    pool = draw(st.lists(names, min_size=30, max_size=30, unique=True))
    pool_iter = iter(pool)

    def fresh() -> str:
        return next(pool_iter)

    data_args = [_data_argument(draw, fresh) for _ in range(draw(st.integers(1, 2)))]
    params = _parameter_tree(draw, fresh) if draw(st.booleans()) else None
    leaves = [s for arg in data_args for s in _scalars(arg)] + _scalars(params)
    return Case(
        eqs=_equations(draw, leaves),
        data_args=data_args,
        params=params,
        cse=draw(st.booleans()),
        dtype=draw(st.sampled_from(DTYPES)),
        batch=draw(st.sampled_from(BATCH_SHAPES)),
        seed=draw(st.integers(0, 2**16)),
    )


# ---- running one case ------------------------------------------------------------------

def _per_sample_shape(obj: Any, *, data: bool) -> tuple[int, ...]:
    if isinstance(obj, sp.Symbol):
        return ()
    if isinstance(obj, (list, tuple)):
        return (len(obj),)
    rows, cols = (int(d) for d in obj.shape)
    if data and isinstance(obj, sp.MatrixSymbol):
        return (rows, cols)  # its declared shape, as DESIGN.md writes it
    if cols == 1:
        return (rows,)
    if rows == 1 and data:
        return (cols,)
    return (rows, cols)


def _is_leaf(obj: Any) -> bool:
    return isinstance(obj, (sp.Basic, sp.MatrixBase))


def _flat_entries(eqs: Any) -> list[tuple[Any, sp.Basic]]:
    """(path in the result tree, entry index or (), SymPy entry) for every scalar entry."""
    flat, _ = jax.tree_util.tree_flatten_with_path(eqs, is_leaf=_is_leaf)
    out = []
    for path, leaf in flat:
        if isinstance(leaf, sp.MatrixBase):
            rows, cols = leaf.shape
            for i in range(rows):
                for j in range(cols):
                    index = (i,) if cols == 1 else (i, j)
                    out.append((path, index, leaf[i, j]))
        else:
            out.append((path, (), sp.sympify(leaf)))
    return out


#: SymPy functions its automatic evaluation introduces that symkern cannot build yet
#: (`Abs(exp(sin(x)))` evaluates to `exp(sin(re(x))*cosh(im(x)))` for a symbol without
#: assumptions). Cases holding them are rejected until the bug is fixed — see
#: tests/reliability/test_fuzz_regressions.py::test_im_introduced_by_sympy_evaluation_builds.
#: Empty this tuple with the fix.
KNOWN_OPEN_BUGS: tuple[str, ...] = ()


def _has_known_open_bug(eqs: Any) -> bool:
    for _, _, entry in _flat_entries(eqs):
        if any(type(node).__name__ in KNOWN_OPEN_BUGS for node in sp.preorder_traversal(entry)):
            return True
    return False


def run_case(case: Case) -> None:
    """Build, call and compare one case; raise AssertionError with the case on a mismatch."""
    from hypothesis import assume

    assume(not _has_known_open_bug(case.eqs))
    rng = np.random.default_rng(case.seed)
    dtype = np.dtype(case.dtype)
    values: dict[sp.Basic, np.ndarray] = {}
    data = []
    for arg in case.data_args:
        shape = _per_sample_shape(arg, data=True)
        array = rng.uniform(-2, 2, size=case.batch + shape).astype(dtype)
        # some samples exactly on Piecewise thresholds
        array.reshape(-1)[:: 3] = rng.choice([float(t) for t in THRESHOLDS],
                                             size=array.reshape(-1)[::3].shape)
        data.append(array)
        flat = array.reshape(case.batch + (-1,))
        for k, entry in enumerate(_scalars(arg)):
            values[entry] = flat[..., k].astype(np.float64)

    def parameter_value(leaf: Any) -> Any:
        array = np.asarray(rng.uniform(-2, 2, size=_per_sample_shape(leaf, data=False)), dtype)
        flat = array.reshape(-1)
        for k, entry in enumerate(_scalars(leaf)):
            values[entry] = np.broadcast_to(flat[k].astype(np.float64), case.batch)
        return array

    ps = (jax.tree_util.tree_map(parameter_value, case.params, is_leaf=_is_leaf)
          if case.params is not None else None)
    args = [*data] + ([ps] if case.params is not None else [])

    kernel = sk.build_function(case.eqs, *case.data_args, params=case.params, cse=case.cse,
                               dtype=case.dtype)
    printed = {n.id for n in ast.walk(ast.parse(kernel.upstream_source)) if isinstance(n, ast.Name)}
    strange = {n for n in printed if not re.fullmatch(r"_[acwf]\d+|[a-z0-9_]+", n)}
    assert not strange, f"user names reached the printed code: {strange}\n{case.describe()}"
    result = kernel(*args)

    symbols = list(values)
    dummies = [sp.Dummy() for _ in symbols]
    substitution = dict(zip(symbols, dummies, strict=True))
    entries = _flat_entries(case.eqs)
    reference_function = sp.lambdify(dummies, [e.xreplace(substitution) for _, _, e in entries],
                                      modules="numpy")
    with np.errstate(all="ignore"):
        references = reference_function(*(values[s] for s in symbols))
    result_by_path = dict(jax.tree_util.tree_flatten_with_path(result)[0])
    rtol, atol = (1e-9, 1e-9) if dtype == np.float64 else (2e-4, 2e-4)
    for (path, index, expr), reference in zip(entries, references, strict=True):
        got = np.asarray(result_by_path[path])
        assert got.dtype == dtype, f"dtype {got.dtype} at {path}\n{case.describe()}"
        got = got[(Ellipsis, *index)] if index else got
        assert got.shape == case.batch, (f"shape {got.shape} != batch {case.batch} at "
                                         f"{jax.tree_util.keystr(path)}{list(index)}\n"
                                         f"{case.describe()}")
        want = np.broadcast_to(np.asarray(reference, np.float64), case.batch)
        scale = 1 + np.max(np.abs(want), initial=0.0)
        np.testing.assert_allclose(
            got.astype(np.float64), want, rtol=rtol, atol=atol * scale,
            err_msg=(f"entry {jax.tree_util.keystr(path)}{list(index)} = {expr}\n"
                     f"{case.describe()}\nsource:\n{kernel.source}"))
    assert not os.path.exists(PWNED), "a hostile name was executed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=None)
    arguments = parser.parse_args()
    from hypothesis import HealthCheck, given, seed, settings

    start = time.perf_counter()
    count = 0

    @settings(max_examples=arguments.examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), print_blob=True)
    @given(cases())
    def campaign(case: Case) -> None:
        nonlocal count
        run_case(case)
        count += 1
        if count % 50 == 0:
            print(f"fuzz: {count} examples passed ({time.perf_counter() - start:.0f} s)",
                  file=sys.stderr, flush=True)

    if arguments.seed is not None:
        campaign = seed(arguments.seed)(campaign)
    campaign()
    print(f"fuzz: {arguments.examples} examples passed in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
