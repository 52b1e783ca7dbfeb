"""Split kernels: pieces with explicit live values give the unsplit kernel's results."""

import ast

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp

import symkern as sk
from symkern.codegen.operations import operation_count
from symkern.errors import CodegenDriftError
from symkern.kernels.split import LIVE_IN, SplitProgram, split_module

#: terms of the large test bodies: ~4 operations each, above the patched limits
TERMS = 150

HAND_WRITTEN = """
def kernel(x1, ps):
    _c0 = ps['a'] * x1[..., 0]
    _c1 = jnp.sin(_c0) + x1[..., 1]
    _c2 = _c1 * _c1
    _c3 = _c0 + 1
    return (_c2 + _c0, _c3, jnp.broadcast_to(2.0, x1.shape[:-1]))
"""


def _names(node, ctx):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def test_live_values_of_a_hand_written_module():
    split = split_module(ast.parse(HAND_WRITTEN), 2)
    assert split.arguments == ("x1", "ps")
    # the entries that are not plain locals became _r0.._r2, split like any statement
    assert split.results == ("_r0", "_c3", "_r2")
    assert [(p.live_in, p.live_out) for p in split.pieces] == [
        ((), ("_c0", "_c1")),
        (("_c0", "_c1"), ("_c2", "_c3")),
        # the last piece returns the entries, so it receives _c3 although it reads it not
        (("_c0", "_c2", "_c3"), ("_r0", "_c3", "_r2")),
    ]
    assert [p.statements for p in split.pieces] == [2, 2, 2]


@pytest.mark.parametrize("max_statements", [1, 2, 3, 100])
def test_every_read_is_an_argument_a_live_in_or_defined_before(max_statements):
    module = ast.parse(HAND_WRITTEN)
    split = split_module(module, max_statements)
    available = set(split.arguments) | {"jnp"}
    defined_before: set[str] = set()
    for piece in split.pieces:
        function = piece.module.body[0]
        assert [a.arg for a in function.args.args] == [*split.arguments, LIVE_IN]
        own = set()
        for statement in function.body[1 if piece.live_in else 0:-1]:
            assert _names(statement.value, ast.Load) <= available | set(piece.live_in) | own
            own |= _names(statement, ast.Store)
        assert set(piece.live_in) <= defined_before
        assert set(piece.live_out) <= own | (set(piece.live_in) if piece is split.pieces[-1]
                                             else set())
        defined_before |= own
    assert set(split.results) <= defined_before
    # the input module is left as it was
    assert ast.unparse(module) == ast.unparse(ast.parse(HAND_WRITTEN))


def test_operation_budget_cuts_within_the_statement_budget():
    split = split_module(ast.parse(HAND_WRITTEN), 100, max_operations=3)
    assert len(split.pieces) > 1
    assert all(p.operations <= 3 or p.statements == 1 for p in split.pieces)
    assert operation_count(ast.parse("a * jnp.sin(b) + -c")) == 4


def test_not_straight_line_code_is_drift():
    with pytest.raises(CodegenDriftError, match="return"):
        split_module(ast.parse("def kernel(x1):\n    _c0 = x1\n"), 1)
    with pytest.raises(CodegenDriftError, match="assigned once"):
        split_module(ast.parse("def kernel(x1):\n    _c0 = x1\n    _c0 = x1\n    return (_c0,)"),
                     1)
    with pytest.raises(ValueError, match="max_statements"):
        split_module(ast.parse(HAND_WRITTEN), 0)


x = sp.symbols("x0:3")
a, b = sp.symbols("a b")
W = sp.MatrixSymbol("W", 2, 2)


def _kernel():
    terms = [sp.sin(x[i % 3] * (i + 1)) * a * x[(i + 1) % 3] for i in range(24)]
    equations = {
        "sum": sp.Add(*terms),
        # (a parameter inside a Piecewise branch breaks jax.grad w.r.t. ps in the unsplit
        # kernel too: gate's JVP broadcasts the tangent to the batch shape)
        "vec": sp.Matrix([sp.Piecewise((sp.sqrt(x[0]), x[0] > 0), (x[1] * x[2], True)),
                          W[0, 1] * x[2] + sp.exp(b * x[1]) + sp.Rational(3, 7)]),
        "const": sp.Integer(1),
        "table": sp.Matrix([[0.5, 1.5, 2.5, 3.5, 4.5]]) * x[0],
    }
    return sk.build_function(equations, list(x), params={"a": a, "b": b, "W": W})


def _arguments(kernel, X, ps):
    const_values, data, leaves = kernel.prepare((X, ps))
    tree = jax.tree_util.tree_unflatten(kernel.signature.parameter_treedef, leaves)
    return (*const_values, *data, tree)


PS = {"a": 0.7, "b": -0.3, "W": np.array([[1.0, 2.0], [3.0, 4.0]])}


@pytest.fixture(scope="module")
def kernel():
    return _kernel()


@pytest.mark.parametrize("max_statements", [2, 10_000])
def test_results_equal_the_unsplit_kernel(kernel, max_statements):
    X = np.random.default_rng(0).standard_normal((17, 3))
    arguments = _arguments(kernel, X, PS)
    expected = kernel.program.function(*arguments)
    program = SplitProgram.from_module(kernel._generated.module, max_statements)
    assert len(program.split.pieces) > 1 or max_statements == 10_000
    got = program(*arguments)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(np.broadcast_to(g, (17,)), np.broadcast_to(e, (17,)),
                                   rtol=1e-12, atol=1e-12)


def test_parallel_compile_and_finish(kernel):
    X = np.random.default_rng(1).standard_normal((5, 3))
    arguments = _arguments(kernel, X, PS)
    batch = X.shape[:-1]

    def finish(entries, args):
        return tuple(jnp.broadcast_to(jnp.asarray(e, jnp.float64), batch) for e in entries)

    program = SplitProgram.from_module(kernel._generated.module, 4, workers=2, finish=finish)
    compiled = program.compile(*arguments)
    assert len(compiled) == len(program.split.pieces)
    assert set(program.timings) == {"trace_and_lower", "xla_compile"}
    got = program(*arguments)
    expected = jax.jit(kernel._compute)(*kernel.prepare((X, PS)))
    assert all(g.shape == batch for g in got)
    np.testing.assert_allclose(np.stack(got), np.stack(expected), rtol=1e-12, atol=1e-12)
    assert program.compile(*arguments) is compiled  # one compile per argument shapes


def test_under_jit_and_grad(kernel):
    X = np.random.default_rng(2).standard_normal((4, 3))
    program = SplitProgram.from_module(kernel._generated.module, 4)
    const_values, data, leaves = kernel.prepare((X, PS))
    treedef = kernel.signature.parameter_treedef

    def total(function, ps_leaves):
        ps = jax.tree_util.tree_unflatten(treedef, ps_leaves)
        return sum(jnp.sum(e) for e in function(*const_values, *data, ps))

    split_grad = jax.jit(jax.grad(lambda p: total(program, p)))(leaves)
    plain_grad = jax.grad(lambda p: total(kernel.program.function, p))(leaves)
    for s, p in zip(split_grad, plain_grad, strict=True):
        np.testing.assert_allclose(s, p, rtol=1e-10, atol=1e-12)


@pytest.fixture
def split_at_400(monkeypatch):
    """Pieces of 200 operations and merged pairs above 400, so that ~600-operation bodies
    (quick to compile) exercise them; the defaults are higher (passes.SPLIT_ABOVE_OPERATIONS,
    passes.PIECE_OPERATIONS, emit.SHARE_PAIRS_ABOVE_OPERATIONS)."""
    from symkern.batching import build
    from symkern.codegen import emit, passes

    monkeypatch.setattr(passes, "SPLIT_ABOVE_OPERATIONS", 400)
    monkeypatch.setattr(build, "PIECE_OPERATIONS", 200)
    monkeypatch.setattr(emit, "SHARE_PAIRS_ABOVE_OPERATIONS", 400)


def test_build_function_compiles_a_large_body_as_pieces(split_at_400):
    import numpy as np
    import sympy as sp

    import symkern as sk

    xs = sp.symbols("x0:4")
    a = sp.Symbol("a")
    expr = sp.Add(*[sp.sin(xs[i % 4] * (i + 1)) * a * xs[(i + 1) % 4] for i in range(TERMS)])
    kernel = sk.build_function(sp.Matrix([expr, xs[0] * a]), xs, params={"a": a},
                               dtype="float64", progress=False, vectorize=False)
    assert kernel._pieces is not None and len(kernel._pieces.split.pieces) > 1
    X = np.random.default_rng(0).uniform(-1, 1, size=(7, 4))
    reference = sp.lambdify([xs, a], [expr, xs[0] * a], "numpy")(X.T, 1.5)
    np.testing.assert_allclose(kernel(X, {"a": 1.5}), np.stack(reference, -1), rtol=1e-10)
    # traced calls see the whole body: grad through the kernel still works
    import jax

    grad = jax.grad(lambda p: kernel(X, p).sum())({"a": 1.5})
    np.testing.assert_allclose(grad["a"], np.sum(np.stack(reference, -1)) / 1.5, rtol=1e-10)


@pytest.mark.parametrize("limit", [0, 3, 4, 10])
def test_exceeds_operations_agrees_with_the_count(limit):
    from symkern.codegen.operations import exceeds_operations

    tree = ast.parse("a * jnp.sin(b) + -c")  # four operations
    assert exceeds_operations(tree, limit) == (operation_count(tree) > limit)


def test_split_false_compiles_a_large_body_as_one_executable_without_merged_pairs(
        tmp_path, split_at_400):
    import jax
    import numpy as np
    import sympy as sp

    import symkern as sk
    from symkern.errors import BuildError

    xs = sp.symbols("x0:4")
    a = sp.Symbol("a")
    expr = sp.Add(*[sp.sin(xs[i % 4] * (i + 1)) * a * xs[(i + 1) % 4] for i in range(TERMS)])
    eqs = sp.Matrix([expr, xs[0] * a])
    sk.enable_cache(tmp_path)  # split is part of the generated code's cache key
    try:
        kernels = {split: sk.build_function(eqs, xs, params={"a": a}, dtype="float64",
                                            progress=False, vectorize=False, split=split)
                   for split in (True, False)}
        again = sk.build_function(eqs, xs, params={"a": a}, dtype="float64", progress=False,
                                  vectorize=False, split=False)
    finally:
        sk.disable_cache()
    assert "cache_load" not in kernels[False].timings and "cache_load" in again.timings
    assert kernels[True]._pieces is not None and kernels[False]._pieces is None
    # the pieces' body shares the products a*x_k that ~38 terms each hold; one executable
    # keeps the terms as written (XLA fuses them better, docs/benchmarks.md)
    ops = {split: operation_count(k._generated.module) for split, k in kernels.items()}
    assert ops[False] > ops[True] + 25, ops
    X = np.random.default_rng(0).uniform(-1, 1, size=(7, 4))
    reference = np.stack(sp.lambdify([xs, a], [expr, xs[0] * a], "numpy")(X.T, 1.5), -1)
    for kernel in (*kernels.values(), again):
        np.testing.assert_allclose(kernel(X, {"a": 1.5}), reference, rtol=1e-10)
    grad = jax.grad(lambda p: kernels[False](X, p).sum())({"a": 1.5})
    np.testing.assert_allclose(grad["a"], np.sum(reference) / 1.5, rtol=1e-10)
    with pytest.raises(BuildError, match="split: expected True or False, got 'no'"):
        sk.build_function(eqs, xs, params={"a": a}, split="no")


def test_scalar_body_options_on_a_structured_network_are_refused():
    import symkern as sk
    from symkern.errors import BuildError
    from symkern.symbolic import Chain, Dense, SymbolicNetwork

    snn = SymbolicNetwork(Chain(Dense(2, 40, "tanh"), Dense(40, 1)))  # 80 weights: structured
    assert getattr(snn, "structured", False)
    assert sk.build_nn_function(snn.output, snn, vectorize=None, split=True) is not None
    for option, value in (("vectorize", True), ("vectorize", False), ("split", False)):
        with pytest.raises(BuildError, match=f"{option}: a network with a layer above 64"):
            sk.build_nn_function(snn.output, snn, **{option: value})


def test_a_body_between_the_separate_and_split_limits_compiles_whole_and_assembles_separately(
        monkeypatch):
    import jax
    import numpy as np
    import sympy as sp

    import symkern as sk
    from symkern.codegen import emit, passes

    # separately assembled above 500 operations, pieces above 2,000 (defaults:
    # passes.SEPARATE_ABOVE_OPERATIONS, passes.SPLIT_ABOVE_OPERATIONS)
    monkeypatch.setattr(passes, "SEPARATE_ABOVE_OPERATIONS", 500)
    monkeypatch.setattr(passes, "SPLIT_ABOVE_OPERATIONS", 2000)
    xs = sp.symbols("x0:4")
    a = sp.Symbol("a")
    expr = sp.Add(*[sp.sin(xs[i % 4] * (i + 1)) * a * xs[(i + 1) % 4] for i in range(TERMS)])
    eqs = sp.Matrix([expr, xs[0] * a, expr * xs[1]])
    kernel = sk.build_function(eqs, xs, params={"a": a}, dtype="float64", progress=False,
                               vectorize=False)
    ops = operation_count(kernel._generated.module)
    assert passes.SEPARATE_ABOVE_OPERATIONS < ops <= passes.SPLIT_ABOVE_OPERATIONS
    assert ops <= emit.SHARE_PAIRS_ABOVE_OPERATIONS
    # compiled whole: its entries, then the assembly executable, at every batch size
    assert kernel._pieces is None and kernel.assembly == "separate" and not kernel.runs_fused
    rng = np.random.default_rng(0)
    f = sp.lambdify([xs, a], [expr, xs[0] * a, expr * xs[1]], "numpy")
    for batch in ((), (3,), (200,)):
        X = rng.uniform(-1, 1, size=batch + (4,))
        reference = np.stack([np.broadcast_to(r, batch) for r in f(np.moveaxis(X, -1, 0), 1.5)],
                             -1)
        np.testing.assert_allclose(kernel(X, {"a": 1.5}), reference, rtol=1e-10)
    assert "assembly_probe" not in kernel.timings
    assert not kernel._direct_shapes and {(3, 4), (200, 4)} <= kernel._separate_shapes
    grad = jax.grad(lambda p: kernel(X, p)[..., 1].sum())({"a": 1.5})
    np.testing.assert_allclose(grad["a"], X[..., 0].sum(), rtol=1e-10)
