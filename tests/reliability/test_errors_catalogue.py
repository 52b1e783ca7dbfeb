"""docs/errors.md is complete and true: each entry is triggered here and its message checked,
and every exception class a `raise` in symkern/ uses is documented there."""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp

import symkern as sk
from symkern.codegen import rules
from symkern.kernels import memory

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "errors.md"
x0, x1, a, b = sp.symbols("x0 x1 a b")


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def anchors() -> set[str]:
    return set(re.findall(r'<a id="([^"]+)"></a>', doc_text()))


# ---- the doc covers every raise site -----------------------------------------------------

def _returned_exception(function: ast.FunctionDef) -> str | None:
    """`def _drift(...) -> CodegenDriftError:` — a helper that builds the exception raised."""
    returns = function.returns
    if isinstance(returns, ast.Name):
        return returns.id
    if isinstance(returns, ast.Constant) and isinstance(returns.value, str):
        return returns.value
    return None


def raised_classes() -> dict[str, list[str]]:
    """Exception class name → `file:line` of every `raise` (and `warnings.warn`) under symkern/."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "symkern").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        helpers = {node.name: _returned_exception(node) for node in ast.walk(tree)
                   if isinstance(node, ast.FunctionDef)}
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Raise) and node.exc is not None:
                target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(target, ast.Attribute):
                    name = target.attr
                elif isinstance(target, ast.Name):
                    name = helpers.get(target.id) or target.id
                    if isinstance(node.exc, ast.Name) and target.id[:1].islower() \
                            and target.id not in helpers:
                        continue  # `raise error`: re-raising a caught exception
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "warn" and len(node.args) >= 2):
                category = node.args[1]
                name = category.id if isinstance(category, ast.Name) else None
            if name is not None:
                found.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def documented_classes() -> set[str]:
    return set(re.findall(r"^## .*?`?(\w+)`?", doc_text(), flags=re.M)) | set(
        re.findall(r"`(\w+)`", doc_text().split("\n## ")[0]))


def _caught(path) -> set[str]:
    """Names of the exception classes an `except` clause of the file catches."""
    caught = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            types = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            caught.update(t.id for t in types if isinstance(t, ast.Name))
    return caught


def test_every_raised_exception_class_is_documented():
    raised = raised_classes()
    assert {"BuildError", "ArgumentError", "CodegenDriftError"} <= set(raised)
    headings = "\n".join(line for line in doc_text().splitlines() if line.startswith("## "))
    # a private class caught in the module that raises it never reaches a user
    private = {name for name, sites in raised.items() if name.startswith("_") and all(
        name in _caught(ROOT / site.split(":")[0]) for site in sites)}
    missing = {name: sites for name, sites in raised.items()
               if name not in private and not re.search(rf"\b{re.escape(name)}\b", headings)}
    assert not missing, f"raised but not documented in docs/errors.md: {missing}"


def test_every_public_exception_has_an_entry_with_an_anchor():
    for name in ("SymkernError", "BuildError", "UnsupportedFunctionError", "ArgumentError",
                 "DtypeMismatchError", "ConstArgsError", "CodegenDriftError",
                 "CapturedConstantsWarning"):
        assert name.lower() in anchors(), name
        assert f"## {name}" in doc_text(), name
        assert hasattr(sk, name)


def test_the_index_table_links_resolve():
    for target in re.findall(r"\]\(#([^)]+)\)", doc_text()):
        assert target in anchors(), target


# ---- one test per entry: trigger it, check the message -----------------------------------

def _check(anchor: str, error_type, pattern: str, call) -> None:
    assert anchor in anchors(), f"docs/errors.md has no entry #{anchor}"
    with pytest.raises(error_type, match=pattern) as caught:
        call()
    assert isinstance(caught.value, sk.SymkernError)


def test_symkernerror_is_the_base_of_every_error():
    assert "symkernerror" in anchors()
    for cls in (sk.BuildError, sk.UnsupportedFunctionError, sk.ArgumentError,
                sk.DtypeMismatchError, sk.ConstArgsError, sk.CodegenDriftError):
        assert issubclass(cls, sk.SymkernError)


def test_builderror_free_symbols():
    _check("builderror-free-symbols", sk.BuildError,
           "eqs: free symbols b, c are neither data arguments nor parameters",
           lambda: sk.build_function(x0 * b + sp.Symbol("c"), [x0], params={"a": a}))


def test_builderror_declared_twice():
    _check("builderror-declared-twice", sk.BuildError,
           r'symbol x0 is declared twice: as x1\[0\] and as ps\["a"\]',
           lambda: sk.build_function(x0, [x0], params={"a": x0}))


@pytest.mark.parametrize(("argument", "pattern"), [
    (3, "x1: expected a Symbol, a MatrixSymbol, a Matrix of symbols or a list/tuple of symbols, "
        "got int 3"),
    ([x0, x0 + 1], r"x1\[1\]: expected a SymPy Symbol, got Add"),
    ([], "x1: expected at least one symbol, got an empty list"),
])
def test_builderror_argument(argument, pattern):
    _check("builderror-argument", sk.BuildError, pattern, lambda: sk.build_function(x0, argument))


def test_builderror_parameter():
    _check("builderror-parameter", sk.BuildError,
           r'ps\["L1"\]\["b"\]: expected a Symbol, a MatrixSymbol or a Matrix of symbols, got int 3',
           lambda: sk.build_function(x0, [x0], params={"L1": {"b": 3}}))


@pytest.mark.parametrize(("eqs", "pattern"), [
    ([], "eqs: expected at least one equation"),
    (sp.Matrix(0, 0, []), r"eqs: expected a non-empty Matrix, got shape \(0, 0\)"),
    ("x0", "eqs: expected a SymPy expression, Matrix or Array, got str"),
    (sp.Interval(0, 1), r"eqs: expected a SymPy expression, a condition \(x > 0, Eq, And, "
                        r"...\), a Matrix or an Array, got Interval"),
])
def test_builderror_equations(eqs, pattern):
    _check("builderror-equations", sk.BuildError, pattern, lambda: sk.build_function(eqs, [x0]))


@pytest.mark.parametrize(("options", "pattern"), [
    ({"dtype": "int32"}, "dtype: expected float32, float64, complex64 or complex128, got int32"),
    ({"cse": 1}, "cse: expected True or False, got 1"),
    ({"embed_max_bytes": -1}, "embed_max_bytes: expected a non-negative int, got -1"),
    ({"functions": {"g": 3}}, r"functions\['g'\]: expected a name mapped to a callable, got int"),
])
def test_builderror_options(options, pattern):
    _check("builderror-options", sk.BuildError, pattern,
           lambda: sk.build_function(x0, [x0], **options))


@pytest.fixture
def without_x64():
    jax.config.update("jax_enable_x64", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", True)


def test_builderror_float64(without_x64):
    _check("builderror-float64", sk.BuildError,
           re.escape("dtype: float64 needs jax.config.update('jax_enable_x64', True) before building"),
           lambda: sk.build_function(x0, [x0], dtype="float64"))


def test_builderror_user_function():
    g = sp.Function("g")
    _check("builderror-user-function", sk.BuildError,
           re.escape('functions["g"]: expected one scalar per sample, got [(2,)] for arguments '
                     "of shapes [()]"),
           lambda: sk.build_function(g(x0), x0, functions={"g": lambda v: jnp.stack([v, v])}))


def test_builderror_warn_bytes(monkeypatch):
    monkeypatch.setenv("SYMKERN_CAPTURED_CONSTANTS_WARN_BYTES", "lots")
    first = sp.Function("first")
    _check("builderror-warn-bytes", sk.BuildError,
           "SYMKERN_CAPTURED_CONSTANTS_WARN_BYTES: expected an integer number of bytes or -1, "
           "got 'lots'",
           lambda: sk.build_function(first(sp.Array([0.5] * 16), x0), x0,
                                     functions={"first": lambda t, v: t[0] * v}))


def test_builderror_vector_width(monkeypatch):
    monkeypatch.setenv("SYMKERN_CPU_VECTOR_WIDTH", "wide")
    _check("builderror-vector-width", sk.BuildError,
           "SYMKERN_CPU_VECTOR_WIDTH: expected 128, 256, 512, or 0 for XLA's default, got 'wide'",
           lambda: sk.build_function(x0 + 1, x0))


def test_builderror_cpu_threads():
    _check("builderror-cpu-threads", sk.BuildError,
           r"set_cpu_threads: n: expected an int from 1 to \d+ \(the cores this process may run "
           r"on\), got 0", lambda: sk.set_cpu_threads(0))
    jax.devices("cpu")
    _check("builderror-cpu-threads", sk.BuildError,
           "set_cpu_threads: JAX's backend has already started, and its CPU thread pool was "
           "sized then", lambda: sk.set_cpu_threads(1))


def test_builderror_cpu_memory():
    _check("builderror-cpu-memory", sk.BuildError,
           "reuse_cpu_memory: up_to_bytes: expected an int from 131072 to 2147483647, got 0",
           lambda: sk.reuse_cpu_memory(0))
    if memory.glibc() is not None:
        jax.devices("cpu")
        _check("builderror-cpu-memory", sk.BuildError,
               "reuse_cpu_memory: JAX's backend has already started, and XLA's threads have "
               "their heaps", lambda: sk.reuse_cpu_memory())


def test_builderror_build_options():
    _check("builderror-build-options", sk.BuildError,
           "options: expected a symkern.BuildOptions, got dict",
           lambda: sk.build_function(x0 + 1, x0, options={"trig": "library"}))
    _check("builderror-build-options", sk.BuildError,
           re.escape("assembly: expected one of ('fused', 'separate') or None, got 'stacked'"),
           lambda: sk.BuildOptions(assembly="stacked"))


def test_builderror_constant_outputs():
    W, xm = sp.MatrixSymbol("W", 2, 2), sp.MatrixSymbol("xm", 2, 1)
    _check("builderror-constant-outputs", sk.BuildError,
           "constant_outputs: 'unbatched' applies to scalar bodies; a kernel of matrix "
           "expressions returns every output shaped like the batch",
           lambda: sk.build_function(W * xm, xm, params={"W": W},
                                     options=sk.BuildOptions(constant_outputs="unbatched")))


def test_builderror_vectorized_trig(monkeypatch):
    monkeypatch.setenv("SYMKERN_VECTORIZED_TRIG", "fast")
    _check("builderror-vectorized-trig", sk.BuildError,
           re.escape("SYMKERN_VECTORIZED_TRIG: expected 1 (polynomial sin and cos where they "
                     "apply) or 0 (jnp.sin and jnp.cos everywhere), got 'fast'"),
           lambda: sk.build_function(x0 + 1, x0))


def test_builderror_matrix_element():
    M = sp.MatrixSymbol("M", 2, 2)
    _check("builderror-matrix-element", sk.BuildError, "eqs: free symbols M are neither|"
           "eqs: a matrix element is read whose matrix is not fully declared",
           lambda: sk.build_function(M[0, 0] * x0, [x0]))


def test_builderror_parse():
    parse = pytest.importorskip("symkern.symbolic.parse")
    assert "builderror-parse" in anchors()
    x = sp.Symbol("x")
    with pytest.raises(sk.BuildError, match="EXPR: not allowed: attribute access"):
        parse.parse_expression("x.__class__", {"x": x}, {})
    with pytest.raises(sk.BuildError, match="EXPR: expected a non-empty expression"):
        parse.parse_expression("  ", {"x": x}, {})


def test_builderror_networks():
    symbolic = pytest.importorskip("symkern.symbolic")
    assert "builderror-networks" in anchors()
    with pytest.raises(sk.BuildError, match="expected a positive int"):
        symbolic.Dense(0, 3, "tanh")


def test_unsupportedfunctionerror_sympy():
    _check("unsupportedfunctionerror-sympy", sk.UnsupportedFunctionError,
           r"eqs: SymPy function bessely has no JAX implementation in symkern \(",
           lambda: sk.build_function(sp.bessely(0, x0), x0))


def test_unsupportedfunctionerror_form():
    _check("unsupportedfunctionerror-form", sk.UnsupportedFunctionError,
           r"eqs: bernoulli\(b, x0\): Bernoulli polynomials have no JAX implementation",
           lambda: sk.build_function(sp.bernoulli(b, x0), x0, params={"b": b}))


@pytest.mark.parametrize("eqs", [sp.Sum(b * x0, (b, 0, x0)), sp.Product(b + x0, (b, 1, x0))])
def test_unsupportedfunctionerror_sum_bounds(eqs):
    name = type(eqs).__name__
    _check("unsupportedfunctionerror-sum-bounds", sk.UnsupportedFunctionError,
           rf"eqs: unevaluated {name} .* has a bound with no largest value known at build; .*"
           r"write it as Min\(n, 100\) .*closed form \(\.doit\(\)\)",
           lambda: sk.build_function(eqs, x0))


@pytest.mark.parametrize("eqs", [sp.Integral(sp.exp(-b**2), (b, 0, x0)),
                                 sp.Derivative(sp.sin(x0 * b), b)])
def test_unsupportedfunctionerror_unevaluated(eqs):
    name = type(eqs).__name__
    _check("unsupportedfunctionerror-unevaluated", sk.UnsupportedFunctionError,
           rf"eqs: unevaluated {name} has no JAX implementation in symkern; evaluate it first "
           r"\(\.doit\(\)\)", lambda: sk.build_function(eqs, x0))


@pytest.mark.parametrize("eqs", [sp.Derivative(sp.Function("g")(x0), x0),
                                 sp.diff(sp.Function("g")(x0**2), x0)])
def test_unsupportedfunctionerror_derivative_of_undefined(eqs):
    """What `.doit()` cannot evaluate is not told to call `.doit()`."""
    _check("unsupportedfunctionerror-derivative-of-undefined", sk.UnsupportedFunctionError,
           r"is a derivative of the undefined function g\(\), which \.doit\(\) cannot evaluate; "
           r"define the derivative as a function of its own",
           lambda: sk.build_function(eqs, x0, functions={"g": jnp.sin}))


def test_derivative_of_undefined_fix_works():
    """The fix the entry gives: the derivative as a function of its own."""
    g, dg = sp.Function("g"), sp.Function("dg")
    expr = sp.diff(g(x0), x0).subs(sp.Derivative(g(x0), x0), dg(x0)) * x0
    k = sk.build_function(expr, x0, functions={"g": jnp.sin, "dg": jax.grad(jnp.sin)})
    X = np.linspace(-1.0, 1.0, 5)
    np.testing.assert_allclose(k(X), np.cos(X) * X, rtol=1e-6)


@pytest.mark.parametrize(("implementation", "raised"), [
    (lambda u: jnp.sin(u), "TypeError"),                   # called with 2 arguments
    (lambda u, v: np.asarray(u) + v, "TracerArrayConversionError"),
])
def test_builderror_user_function_raised(implementation, raised):
    g = sp.Function("g")
    _check("builderror-user-function-raised", sk.BuildError,
           rf'functions\["g"\]: raised {raised} when traced with 2 argument\(s\) '
           r"\(float(32|64)\[\], float(32|64)\[\]\), as the equations call it",
           lambda: sk.build_function(g(x0, b), [x0, b], functions={"g": implementation}))


def test_builderror_sympy_function_in_functions():
    _check("builderror-sympy-function-in-functions", sk.BuildError,
           r'functions\["Piecewise"\]: Piecewise in eqs is SymPy\'s own function, which '
           "functions= does not replace",
           lambda: sk.build_function(sp.Piecewise((x0, x0 > 0), (0, True)), x0,
                                     functions={"Piecewise": jnp.cos}))


@pytest.mark.parametrize(("name", "shown"), [("a b", "'a b'"), ("a, b", "'a, b'"), ("", "''"),
                                             ("\n", r"'\\n'"), ("c", "c")])
def test_builderror_free_symbols_quotes_odd_names(name, shown):
    _check("builderror-free-symbols", sk.BuildError,
           f"eqs: free symbols {shown} are neither data arguments nor parameters",
           lambda: sk.build_function(x0 + sp.Symbol(name), x0))


@pytest.mark.parametrize(("eqs", "pattern"), [
    (x0 + 1 / sp.Integer(0), r"eqs: complex infinity \(zoo, e\.g\. from 1/0\) has no real value"),
    (sp.I * x0, r"eqs: the imaginary unit I has no value in a real kernel \(dtype float32 or "
                r"float64\), which computes in real numbers; leave dtype out or pass "
                r"dtype='complex128' for a complex kernel"),
    (sp.solve(b**3 - 3 * b + x0, b)[0], "eqs: the imaginary unit I"),  # a real root, by Cardano
])
def test_builderror_complex(eqs, pattern):
    _check("builderror-complex", sk.BuildError, pattern,
           lambda: sk.build_function(eqs, x0, dtype="float64"))


@pytest.mark.parametrize("key", [a, np.int64(0), sp.Integer(1), (a, "W")])
def test_builderror_parameter_key(key):
    _check("builderror-parameter-key", sk.BuildError,
           rf"params: key {re.escape(repr(key if not isinstance(key, tuple) else key[0]))} of ps.* "
           r"expected str, int, float, bool or None keys",
           lambda: sk.build_function(a * x0, x0, params={key: a}))


def test_builderror_matrix_symbol_shape():
    n = sp.Symbol("n", integer=True)
    _check("builderror-matrix-symbol-shape", sk.BuildError,
           r"x1: expected a MatrixSymbol of integer shape, got A of shape \(n, 2\)",
           lambda: sk.build_function(x0, sp.MatrixSymbol("A", n, 2)))


def test_unsupportedfunctionerror_undefined():
    _check("unsupportedfunctionerror-undefined", sk.UnsupportedFunctionError,
           re.escape('eqs: undefined function g() has no implementation; pass '
                     'functions={"g": a_jax_function}'),
           lambda: sk.build_function(sp.Function("g")(x0), x0))


@pytest.fixture(scope="module")
def kernel():
    W = sp.Matrix(3, 2, sp.symbols("w0:6"))
    return sk.build_function(W * sp.Matrix([x0, x1]), [x0, x1], params={"L1": {"W": W}},
                             dtype="float64")


PS = {"L1": {"W": np.zeros((3, 2))}}


def test_argumenterror_count(kernel):
    _check("argumenterror-count", sk.ArgumentError,
           re.escape("kernel: expected 2 argument(s) (x1, ps), got 1"), lambda: kernel(np.zeros(2)))
    bound = kernel.bind(PS)
    _check("argumenterror-count", sk.ArgumentError,
           re.escape("bound kernel: expected 1 data argument(s), got 2"),
           lambda: bound(np.zeros(2), np.zeros(2)))


def test_argumenterror_shape(kernel):
    _check("argumenterror-shape", sk.ArgumentError,
           re.escape("x1: expected shape (..., 2), got (4, 3)"), lambda: kernel(np.zeros((4, 3)), PS))
    _check("argumenterror-shape", sk.ArgumentError,
           re.escape('ps["L1"]["W"]: expected shape (3, 2), got (2, 3)'),
           lambda: kernel(np.zeros(2), {"L1": {"W": np.zeros((2, 3))}}))
    loaded = sk.load(kernel.export(np.zeros((4, 2)), PS), kernel.const_args)
    _check("argumenterror-shape", sk.ArgumentError,
           re.escape("x1: this kernel was exported for shape (b, 2), got (4, 3)"),
           lambda: loaded(np.zeros((4, 3)), PS))


def test_argumenterror_batch():
    k = sk.build_function(x0 * x1, [x0], [x1], dtype="float64")
    _check("argumenterror-batch", sk.ArgumentError,
           re.escape("x2: batch shape (3,) does not broadcast with x1's (2,); the data "
                     "arguments' batch shapes must broadcast together (NumPy's rules)"),
           lambda: k(np.zeros((2, 1)), np.zeros((3, 1))))


def test_argumenterror_tree(kernel):
    _check("argumenterror-tree", sk.ArgumentError, "ps: expected a tree of the structure",
           lambda: kernel(np.zeros(2), {"L2": {"W": np.zeros((3, 2))}}))


@pytest.mark.parametrize("bad", [np.array([1 + 2j, 0]), np.array(["a", "b"])])
def test_argumenterror_dtype(kernel, bad):
    _check("argumenterror-dtype", sk.ArgumentError, "x1: expected real numbers, got dtype",
           lambda: kernel(bad, PS))


def test_argumenterror_export():
    _check("argumenterror-export", sk.ArgumentError,
           re.escape("blob: expected bytes from kernel.export(...)"), lambda: sk.load(b"nope"))


def test_argumenterror_stream_shard():
    assert "argumenterror-stream-shard" in anchors()
    k = sk.build_function(x0 * a, [x0], params={"a": a}, dtype="float64")
    if not hasattr(k, "stream"):
        pytest.skip("kernel.stream not there yet")
    with pytest.raises(sk.ArgumentError, match="chunk: expected a positive number of rows"):
        list_or_result = k.stream(np.zeros((4, 1)), {"a": 1.0}, chunk=0)
        list(list_or_result) if hasattr(list_or_result, "__iter__") else None


def test_dtypemismatcherror_x64(kernel):
    kernel(np.zeros(2), PS)
    jax.config.update("jax_enable_x64", False)
    try:
        _check("dtypemismatcherror-x64", sk.DtypeMismatchError,
               re.escape("dtype: this kernel computes in float64, which needs "
                         "jax.config.update('jax_enable_x64', True)"),
               lambda: kernel(np.zeros(2), PS))
    finally:
        jax.config.update("jax_enable_x64", True)


def test_dtypemismatcherror_export(kernel):
    blob = kernel.export(np.zeros((4, 2)), PS)
    jax.config.update("jax_enable_x64", False)
    try:
        _check("dtypemismatcherror-export", sk.DtypeMismatchError,
               "this kernel was lowered with jax_enable_x64=True and is executed with "
               "jax_enable_x64=False", lambda: sk.load(blob, kernel.const_args))
    finally:
        jax.config.update("jax_enable_x64", True)


@pytest.fixture(scope="module")
def table_kernel():
    lookup = sp.Function("lookup")
    table = np.linspace(0.0, 1.0, 1000)
    return sk.build_function(lookup(x0) + x1, [x0, x1], dtype="float64",
                             functions={"lookup": lambda v: jnp.interp(v, table, table)})


def test_constargserror_count(table_kernel):
    blob = table_kernel.export(np.zeros((3, 2)))
    _check("constargserror-count", sk.ConstArgsError,
           re.escape("const_args: this kernel was exported without its 1 const arg(s) "
                     "[_k0: float64[1000]"), lambda: sk.load(blob))


def test_constargserror_spec(table_kernel):
    blob = table_kernel.export(np.zeros((3, 2)))
    _check("constargserror-spec", sk.ConstArgsError,
           re.escape("const_args: _k0 expected float64[1000], got float32[1000]"),
           lambda: sk.load(blob, [np.zeros(1000, np.float32)]))


def test_codegendrifterror():
    module = ast.parse("def _lambdifygenerated(_a0):\n    return _a0\n")
    _check("codegendrifterror", sk.CodegenDriftError,
           "stack_outputs: expected a tuple of 2 outputs, found _a0",
           lambda: rules.stack_outputs(module, [(), ()]))


def test_capturedconstantswarning(monkeypatch):
    assert "capturedconstantswarning" in anchors()
    monkeypatch.setenv("SYMKERN_CAPTURED_CONSTANTS_WARN_BYTES", "100")
    first = sp.Function("first")
    with pytest.warns(sk.CapturedConstantsWarning,
                      match=r"this kernel holds 128 bytes of constants as const args") as record:
        sk.build_function(first(sp.Array([0.5 + k for k in range(16)]), x0), x0, dtype="float64",
                          functions={"first": lambda t, v: t[0] * v})
    assert len(record) == 1
    assert "_k0: float64[16], 128 bytes, array literal (hoist_array_literals)" in str(record[0].message)
    monkeypatch.setenv("SYMKERN_CAPTURED_CONSTANTS_WARN_BYTES", "-1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sk.build_function(first(sp.Array([0.5 + k for k in range(16)]), x0), x0, dtype="float64",
                          functions={"first": lambda t, v: t[0] * v})


@pytest.mark.parametrize("option, pattern", [
    ({"split": "no"}, "split: expected True or False, got 'no'"),
    ({"vectorize": False}, "vectorize: a network with a layer above 64 weights compiles as an "
                           "array program"),
])
def test_builderror_split(option, pattern):
    from symkern.symbolic import Chain, Dense, SymbolicNetwork

    if "split" in option:
        call = lambda: sk.build_function(x0 * a, [x0], params={"a": a}, **option)  # noqa: E731
    else:
        snn = SymbolicNetwork(Chain(Dense(2, 40, "tanh"), Dense(40, 1)))
        call = lambda: sk.build_nn_function(snn.output, snn, **option)  # noqa: E731
    _check("builderror-split", sk.BuildError, pattern, call)


# ---- loading damaged artifacts, refused cache directories ---------------------------------

def test_argumenterror_saved(tmp_path):
    path = tmp_path / "kernel.npz"
    sk.build_function(x0 * a, [x0], params={"a": a}).save(path)
    path.write_bytes(path.read_bytes()[:-40])
    _check("argumenterror-saved", sk.ArgumentError,
           r"path: '.*kernel.npz' is not a kernel saved by kernel.save\(path\): it is damaged",
           lambda: sk.load(path))
    _check("argumenterror-saved", sk.ArgumentError,
           r"path: '.*missing.npz' cannot be read \(No such file or directory\)",
           lambda: sk.load(tmp_path / "missing.npz"))


def test_argumenterror_export_damaged():
    blob = sk.build_function(x0 * a, [x0], params={"a": a}).export(np.zeros((3, 1)), {"a": 1.0})
    _check("argumenterror-export", sk.ArgumentError,
           re.escape("its digest does not match its content (the blob is damaged or altered)"),
           lambda: sk.load(blob[:-1] + bytes([blob[-1] ^ 1])))


def test_constargserror_saved(tmp_path, table_kernel):
    path = table_kernel.save(tmp_path / "kernel.npz")
    _check("constargserror-saved", sk.ConstArgsError,
           "a kernel saved with kernel.save holds its const args; pass only the path",
           lambda: sk.load(path, table_kernel.const_args))


def _cache_warning(call) -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    (warning,) = [w for w in caught if issubclass(w.category, sk.CacheWarning)]
    return str(warning.message)


def test_cachewarning_directory(tmp_path):
    assert "cachewarning-directory" in anchors()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    message = _cache_warning(lambda: sk.enable_cache(shared))
    assert message.startswith("enable_cache: the cache directory is refused: ")
    assert "is writable by its group or by others (mode 777)" in message


def test_cachewarning_entry(tmp_path):
    assert "cachewarning-entry" in anchors()
    assert sk.enable_cache(tmp_path / "cache") is not None
    try:
        sk.build_function(sp.cos(x0) * a, [x0], params={"a": a})
        (meta,) = (tmp_path / "cache").glob("codegen/*/*/meta.json")
        meta.write_text("{}")
        message = _cache_warning(lambda: sk.build_function(sp.cos(x0) * a, [x0],
                                                           params={"a": a}))
    finally:
        sk.disable_cache()
    assert message.startswith("codegen cache: the entry in ") and "is not used" in message
    assert message.endswith("the kernel is generated again and the entry rewritten")
