"""`rules.apply_rules` (the build's rewrite, one walk of the tree) against the rules run one
after the other, as `pipeline.rule_sequence` orders them: the same tree, the same const
args, the same rule reporting a drift; and each node is rewritten once.

The programs are drawn in the form SymPy's printer writes (generated argument names, CSE
assignments, `reduce`, `select`, array constructors and tables, user functions), with a
vector and a matrix data argument and a scalar and a matrix parameter.
"""

import ast
import copy
import functools

import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st

from symkern.codegen import rules
from symkern.codegen.emit import emit
from symkern.codegen.pipeline import apply_rules, print_source, rule_sequence
from symkern.errors import CodegenDriftError
from symkern.symbolic.arguments import data_argument, equation_set, parameter_arguments

ARGUMENTS = ["_a0", "_a1", "_a2", "_a3"]
DATA_COUNT = 2
DATA_RANKS = {"x1": 1, "x2": 2}
PARAMETER_PATHS = [("a",), ("L1", "W")]
USER_FUNCTIONS = {"_f0": "table"}
ORDER = ["substitute_arguments", "unfold_reductions", "resolve_callees", "use_integer_pow",
         "index_by_batch", "hoist_data_reads", "guard_piecewise_gradients", "stack_outputs",
         "broadcast_constant_outputs", "hoist_array_literals"]

LEAVES = ["_a0[0]", "_a0[1]", "_a0[2]", "_a1[0, 1]", "_a1[1, 1]", "_a2", "_a3[0, 1]",
          "_a3[1, 0]", "2", "1.5", "pi", "(-3)", "(_a2).maximum(_a0[1])"]
#: forms that drift, each noticed by one rule
DRIFTS = ["_a0", "_a1[0]", "_a0[0, 0, 0]", "_a0[_a2]", "os", "_a1.T", "bessely(0, _a2)",
          "arctan2(_a2)", "(_a2).transpose()", "_f1(_a2)", "reduce(maximum, _a2)",
          "select((greater(_a2, 0), True), (1, _a2), default=nan)"]


def expressions(names: list[str]) -> st.SearchStrategy[str]:
    leaves = st.sampled_from(LEAVES + names)

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        pair = st.tuples(inner, inner)
        return st.one_of(
            pair.map(lambda p: f"({p[0]} + {p[1]})"),
            pair.map(lambda p: f"({p[0]}*{p[1]})"),
            pair.map(lambda p: f"({p[0]}/{p[1]})"),
            st.tuples(inner, st.sampled_from(["2", "3", "(-1.0)", "(1/2)"])).map(
                lambda p: f"({p[0]})**{p[1]}"),
            inner.map(lambda e: f"(-{e})"),
            st.tuples(st.sampled_from(["sin", "cos", "exp", "tanh", "sqrt"]), inner).map(
                lambda p: f"{p[0]}({p[1]})"),
            pair.map(lambda p: f"arctan2({p[0]}, {p[1]})"),
            st.lists(inner, min_size=1, max_size=4).map(
                lambda items: f"reduce(maximum, [{', '.join(items)}])"),
            st.tuples(inner, inner, inner).map(
                lambda p: f"select([greater({p[0]}, 0), True], [{p[1]}, {p[2]}], default=nan)"),
            st.tuples(st.sampled_from(["[1.5, 2, 3, 4, 5, 6, 7, 8, 9]", "[1, 2]",
                                       "[[1/3, 2, 3, 4], [5, 6, -7, 8.5]]"]), inner).map(
                lambda p: f"_f0(array({p[0]}), {p[1]})"),
        )

    return st.recursive(leaves, extend, max_leaves=12)


@st.composite
def programs(draw: st.DrawFn) -> tuple[str, list[tuple[int, ...]]]:
    """A printed program and the printed shapes of its equations."""
    lines, names = [], []
    for k in range(draw(st.integers(0, 4))):
        lines.append(f"    _c{k} = {draw(expressions(names))}")
        names.append(f"_c{k}")
    shapes = draw(st.lists(st.sampled_from([(), (2, 1), (2, 2)]), min_size=1, max_size=3))
    outputs = []
    for shape in shapes:
        entry = expressions(names) if draw(st.booleans()) else st.sampled_from(["1", "2.5", "_a2"])
        if not shape:
            outputs.append(draw(entry))
        else:
            rows = [f"[{', '.join(draw(entry) for _ in range(shape[1]))}]" for _ in range(shape[0])]
            outputs.append(f"array([{', '.join(rows)}])")
    lines.append(f"    return ({', '.join(outputs)},)")
    drift = draw(st.none() | st.sampled_from(DRIFTS))
    if drift is not None:  # one drift, as a term of one statement
        where = draw(st.integers(0, len(lines) - 1))
        if where == len(lines) - 1:
            lines.insert(where, f"    _c{len(names)} = {drift}")
        else:
            lines[where] = lines[where].replace(" = ", f" = {drift} + ", 1)
    return f"def _lambdifygenerated({', '.join(ARGUMENTS)}):\n" + "\n".join(lines), shapes


def one_after_the_other(module: ast.Module, shapes, hoisted: list) -> ast.Module:
    steps = [
        ("substitute_arguments", lambda m: rules.substitute_arguments(
            m, ARGUMENTS, DATA_COUNT, PARAMETER_PATHS)),
        ("unfold_reductions", rules.unfold_reductions),
        ("resolve_callees", lambda m: rules.resolve_callees(m, USER_FUNCTIONS)),
        ("use_integer_pow", rules.use_integer_pow),
        ("index_by_batch", lambda m: rules.index_by_batch(m, DATA_RANKS)),
        ("hoist_data_reads", rules.hoist_data_reads),
        ("guard_piecewise_gradients", rules.guard_piecewise_gradients),
        ("stack_outputs", lambda m: rules.stack_outputs(m, shapes)),
        ("broadcast_constant_outputs", lambda m: rules.broadcast_constant_outputs(
            m, list(DATA_RANKS.values()))),
        ("hoist_array_literals", lambda m: rules.hoist_array_literals(
            m, 32, np.dtype("float32"), hoisted)),
    ]
    assert [name for name, _ in steps] == ORDER
    for _, step in steps:
        module = step(module)
    return module


def in_one_walk(module: ast.Module, shapes, hoisted: list) -> ast.Module:
    return rules.apply_rules(module, argument_names=ARGUMENTS, data_count=DATA_COUNT,
                             parameter_paths=PARAMETER_PATHS, user_functions=USER_FUNCTIONS,
                             data_ranks=DATA_RANKS, printed_shapes=shapes, embed_max_bytes=32,
                             dtype=np.dtype("float32"), hoisted=hoisted)


def outcome(rewrite, source: str, shapes) -> tuple:
    hoisted: list = []
    try:
        module = rewrite(ast.parse(source), shapes, hoisted)
    except CodegenDriftError as error:
        return ("drift", str(error).split(":")[0])
    literals = [(h.name, h.value.shape, h.value.tobytes(), h.used_by) for h in hoisted]
    return ast.dump(module), print_source(module), literals


@given(programs())
def test_one_walk_gives_what_the_rules_give_one_after_the_other(program):
    source, shapes = program
    assert outcome(in_one_walk, source, shapes) == outcome(one_after_the_other, source, shapes)


def test_the_drawn_programs_cover_every_rule():
    source = ("def _lambdifygenerated(_a0, _a1, _a2, _a3):\n"
              "    _c0 = reduce(maximum, [_a0[0], _a1[1, 1]*_a3[0, 1], _a2])\n"
              "    _c1 = select([greater(_c0, 0), True], [sqrt(_a0[1]), _c0**2], default=nan)\n"
              "    return (_f0(array([1.5, 2, 3, 4, 5, 6, 7, 8, 9]), _c1) + pi,"
              " array([[_c0, 2], [_a2, _a0[2]**(-1.0)]]))")
    shapes = [(), (2, 2)]
    hoisted: list = []
    text = print_source(in_one_walk(ast.parse(source), shapes, hoisted))
    for form in ("_d0 = x1[..., 0]", "jnp.maximum(jnp.maximum(", "ps['L1']['W'][0, 1]",
                 "_b0 = jnp.select(", "gate(_b0 == 0, _d1)", "lax.integer_pow(_d2, -1)",
                 "functions['table'](_k0,", "jnp.pi", "jnp.broadcast_to(2, x1.shape[:-1])"):
        assert form in text
    assert [h.name for h in hoisted] == ["_k0"]
    assert outcome(in_one_walk, source, shapes) == outcome(one_after_the_other, source, shapes)


def test_one_walk_rewrites_each_node_once(monkeypatch):
    source = ("def _lambdifygenerated(_a0, _a1, _a2, _a3):\n"
              "    _c0 = sin(_a0[0])*_a2 + _a3[1, 0]*_a1[0, 1]**2\n"
              "    return (_c0 + exp(_c0)*(_a0[1] - 1.5), array([[_c0, 1], [2, _a2]]))")
    module = ast.parse(source)
    before = {id(node) for node in ast.walk(module) if isinstance(node, ast.expr)}
    seen: list[int] = []
    expr = rules._OneWalk.expr

    def counted(self, node):
        seen.append(id(node))
        return expr(self, node)

    monkeypatch.setattr(rules._OneWalk, "expr", counted)
    in_one_walk(module, [(), (2, 2)], [])
    assert len(seen) == len(set(seen))  # no node twice
    assert set(seen) <= before  # only the nodes SymPy printed: none the rules made
    # all of them but the callees' names and the parts of the data reads, read whole
    callees = {id(node.func) for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)}
    assert len(seen) >= len(before) - len(callees) - 3 * 4


@functools.cache
def upstream(cse: bool):
    x, y, a = sp.symbols("x y a")
    M = sp.MatrixSymbol("M", 2, 2)
    equations = equation_set([
        sp.Matrix([sp.sin(x) * a + M[0, 1] + y**2, sp.Max(x, y, M[1, 1]) * sp.sin(x) * a]),
        sp.Piecewise((sp.sqrt(x), x > 0), (y, True)),
        x / x,
    ])
    parameters, _ = parameter_arguments({"a": a})
    arguments = [data_argument([x, y], 1), data_argument(M, 2)] + parameters
    return emit(equations, arguments, cse=cse), equations, arguments


@pytest.mark.parametrize("cse", [False, True])
def test_one_walk_applies_the_rules_of_rule_sequence_to_what_sympy_printed(cse):
    emitted, equations, arguments = upstream(cse)
    steps = rule_sequence(emitted, equations, arguments, 2)
    assert [name for name, _ in steps] == ORDER
    module = ast.parse(emitted.source)
    for _, step in steps:
        module = step(module)
    walked = apply_rules(ast.parse(emitted.source), emitted, equations, arguments, 2)
    assert print_source(walked) == print_source(module)
    assert ast.dump(walked) == ast.dump(copy.deepcopy(module))
