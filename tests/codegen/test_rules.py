"""Each rewrite rule on hand-written trees: what it rewrites, and every rejection path."""

import ast

import pytest

from symkern.codegen import rules
from symkern.codegen.callee import callee_name
from symkern.errors import CodegenDriftError


def tree(source: str) -> ast.Module:
    return ast.parse(source)


def text(module: ast.Module) -> str:
    return ast.unparse(module)


# ---- substitute_arguments ------------------------------------------------------------------

def test_substitute_arguments_binds_by_position_not_by_name():
    module = tree("def _lambdifygenerated(_a0, _a1, _a2):\n    return (_a0[0]*_a2 + _a1[1, 0],)")
    out = rules.substitute_arguments(module, ["_a0", "_a1", "_a2"], 2, [("L1", "W")])
    assert text(out) == "def kernel(x1, x2, ps):\n    return (x1[0] * ps['L1']['W'] + x2[1, 0],)"


def test_substitute_arguments_names_are_irrelevant():
    module = tree("def f(ps, x1):\n    return (ps[0] + x1,)")
    out = rules.substitute_arguments(module, ["ps", "x1"], 1, [("a",)])
    assert text(out) == "def kernel(x1, ps):\n    return (x1[0] + ps['a'],)"


def test_substitute_arguments_rejects_other_argument_order():
    module = tree("def f(_a1, _a0):\n    return (_a0,)")
    with pytest.raises(CodegenDriftError, match="substitute_arguments: expected positional"):
        rules.substitute_arguments(module, ["_a0", "_a1"], 2, [])


def test_substitute_arguments_rejects_defaults_and_varargs():
    for source in ("def f(_a0, *rest):\n    return (_a0,)", "def f(_a0=1):\n    return (_a0,)"):
        with pytest.raises(CodegenDriftError, match="substitute_arguments"):
            rules.substitute_arguments(tree(source), ["_a0"], 1, [])


def test_substitute_arguments_rejects_a_module_without_one_function():
    with pytest.raises(CodegenDriftError, match="exactly one function"):
        rules.substitute_arguments(tree("x = 1"), [], 0, [])


def test_substitute_arguments_rejects_assignment_to_an_argument():
    module = tree("def f(_a0):\n    _a0 = 1\n    return (_a0,)")
    with pytest.raises(CodegenDriftError, match="only read"):
        rules.substitute_arguments(module, ["_a0"], 1, [])


# ---- unfold_reductions ---------------------------------------------------------------------

def test_unfold_reductions_turns_reduce_into_pairwise_calls():
    module = tree("def kernel(x1):\n    return (reduce(maximum, [x1[0], x1[1], x1[2]]),)")
    out = text(rules.unfold_reductions(module))
    assert "maximum(maximum(x1[0], x1[1]), x1[2])" in out


def test_unfold_reductions_rejects_a_reduce_without_a_list():
    module = tree("def kernel(x1):\n    return (reduce(maximum, x1),)")
    with pytest.raises(CodegenDriftError, match="unfold_reductions"):
        rules.unfold_reductions(module)


# ---- resolve_callees ---------------------------------------------------------------------

@pytest.mark.parametrize("callee", ["sin", "jax.numpy.sin", "numpy.sin", "jnp.sin", "math.sin"])
def test_resolve_callees_normalises_every_callee_form(callee):
    module = tree(f"def kernel(x1):\n    return ({callee}(x1[0]),)")
    assert text(rules.resolve_callees(module, {})) == "def kernel(x1):\n    return (jnp.sin(x1[0]),)"


def test_resolve_callees_maps_special_functions_to_jax_scipy():
    module = tree("def kernel(x1):\n    return (scipy.special.erf(x1[0]) + lgamma(x1[1]),)")
    assert "jsp.erf(x1[0]) + jsp.gammaln(x1[1])" in text(rules.resolve_callees(module, {}))


def test_resolve_callees_turns_a_method_into_a_call_with_its_receiver():
    module = tree("def kernel(x1):\n    return ((x1[0]).maximum(x1[1]),)")
    assert "jnp.maximum(x1[0], x1[1])" in text(rules.resolve_callees(module, {}))


def test_resolve_callees_resolves_printed_constants():
    module = tree("def kernel(x1):\n    return (pi*x1[0] + e + nan,)")
    assert "jnp.pi * x1[0] + jnp.e + jnp.nan" in text(rules.resolve_callees(module, {}))


def test_resolve_callees_sends_generated_function_names_to_the_users_functions():
    module = tree("def kernel(x1):\n    return (_f0(x1[0]),)")
    out = text(rules.resolve_callees(module, {"_f0": "table_lookup"}))
    assert "functions['table_lookup'](x1[0])" in out


def test_resolve_callees_rejects_an_unknown_callee():
    module = tree("def kernel(x1):\n    return (bessely(0, x1[0]),)")
    with pytest.raises(CodegenDriftError, match="resolve_callees: .*'bessely'"):
        rules.resolve_callees(module, {})


def test_resolve_callees_rejects_a_callee_with_the_wrong_arity():
    module = tree("def kernel(x1):\n    return (arctan2(x1[0]),)")
    with pytest.raises(CodegenDriftError, match="atan2"):
        rules.resolve_callees(module, {})


def test_resolve_callees_rejects_an_unknown_name():
    module = tree("def kernel(x1):\n    return (os,)")
    with pytest.raises(CodegenDriftError, match="'os'"):
        rules.resolve_callees(module, {})


def test_callee_name_rejects_a_computed_callee():
    with pytest.raises(CodegenDriftError, match="callee_name"):
        callee_name(ast.parse("(lambda v: v)", mode="eval").body)


# ---- use_integer_pow ---------------------------------------------------------------------

def test_use_integer_pow_rewrites_integer_and_integral_float_exponents():
    module = tree("def kernel(x1):\n    return (x1[0]**2 + x1[1]**(-1.0) + x1[2]**(1/2),)")
    out = text(rules.use_integer_pow(module))
    assert "lax.integer_pow(x1[0], 2) + lax.integer_pow(x1[1], -1) + x1[2] ** (1 / 2)" in out


def test_use_integer_pow_makes_an_integer_literal_base_a_float():
    # Pow(2, -1, evaluate=False) prints 2**(-1.0): integer_pow of the int 2 would refuse -1
    module = tree("def kernel(x1):\n    return (2**(-1.0) + (-3)**3 + x1[0]**2,)")
    out = text(rules.use_integer_pow(module))
    assert "lax.integer_pow(2.0, -1) + lax.integer_pow(-3.0, 3) + lax.integer_pow(x1[0], 2)" in out


# ---- index_by_batch -----------------------------------------------------------------------

@pytest.mark.parametrize("read", ["x1[1]", "x1[1, 0]"])
def test_index_by_batch_puts_the_batch_dimension_first(read):
    module = tree(f"def kernel(x1):\n    return ({read},)")
    assert "x1[..., 1]" in text(rules.index_by_batch(module, {"x1": 1}))


def test_index_by_batch_indexes_matrix_data_by_two_indices():
    module = tree("def kernel(x1, x2):\n    return (x2[1, 0] * x1,)")
    out = text(rules.index_by_batch(module, {"x1": 0, "x2": 2}))
    assert "x2[..., 1, 0] * x1" in out


@pytest.mark.parametrize("use", ["x1", "x1[0:2]", "x1[k]", "x1[1, 1]", "x1.sum()"])
def test_index_by_batch_rejects_whole_array_use(use):
    module = tree(f"def kernel(x1, k):\n    return ({use},)")
    with pytest.raises(CodegenDriftError, match="index_by_batch"):
        rules.index_by_batch(module, {"x1": 1})


def test_index_by_batch_rejects_indexing_a_scalar_argument():
    module = tree("def kernel(x1):\n    return (x1[0],)")
    with pytest.raises(CodegenDriftError, match="index_by_batch"):
        rules.index_by_batch(module, {"x1": 0})


# ---- guard_piecewise_gradients -------------------------------------------------------------

def test_guard_piecewise_gradients_gates_every_input_of_each_branch():
    module = tree(
        "def kernel(x1, ps):\n"
        "    return (jnp.select([x1[..., 0] > 0, True], [jnp.sqrt(x1[..., 0]), ps['a']],"
        " default=jnp.nan),)"
    )
    out = text(rules.guard_piecewise_gradients(module))
    assert "_b0 = jnp.select([x1[..., 0] > 0, True], [0, 1], default=-1)" in out
    assert "jnp.sqrt(gate(_b0 == 0, x1[..., 0]))" in out
    assert "gate(_b0 == 1, ps['a'])" in out


def test_guard_piecewise_gradients_leaves_constant_choices_alone():
    module = tree("def kernel(x1):\n    return (select([x1[..., 0] < 0, True], [0, 1]),)")
    assert "_b0" not in text(rules.guard_piecewise_gradients(module))


def test_guard_piecewise_gradients_rejects_a_select_of_another_form():
    module = tree("def kernel(x1):\n    return (select(conditions, [x1[..., 0]]),)")
    with pytest.raises(CodegenDriftError, match="guard_piecewise_gradients"):
        rules.guard_piecewise_gradients(module)


# ---- stack_outputs ------------------------------------------------------------------------

def test_stack_outputs_flattens_array_constructors_row_major():
    module = tree("def kernel(x1):\n    return (array([[x1, 1], [2, 3]]), x1, jnp.array([[4], [5]]))")
    out = text(rules.stack_outputs(module, [(2, 2), (), (2, 1)]))
    assert out.endswith("return (x1, 1, 2, 3, x1, 4, 5)")


def test_stack_outputs_rejects_a_renamed_constructor():
    module = tree("def kernel(x1):\n    return (matrix([[x1], [x1]]),)")
    with pytest.raises(CodegenDriftError, match="stack_outputs: expected array"):
        rules.stack_outputs(module, [(2, 1)])


def test_stack_outputs_rejects_a_different_nesting():
    module = tree("def kernel(x1):\n    return (array([x1, x1]),)")
    with pytest.raises(CodegenDriftError, match="stack_outputs: expected a nested list"):
        rules.stack_outputs(module, [(2, 1)])


def test_stack_outputs_rejects_a_return_that_is_not_a_tuple_of_the_outputs():
    module = tree("def kernel(x1):\n    return x1")
    with pytest.raises(CodegenDriftError, match="stack_outputs: expected a tuple of 1"):
        rules.stack_outputs(module, [()])


# ---- broadcast_constant_outputs --------------------------------------------------------------

def test_broadcast_constant_outputs_broadcasts_outputs_that_read_no_data():
    module = tree(
        "def kernel(x1, ps):\n    _c0 = x1[..., 0] * 2\n    _c1 = ps['a'] + 1\n"
        "    return (1, _c0, _c1, ps['a'] * x1[..., 1])"
    )
    out = text(rules.broadcast_constant_outputs(module, [1]))
    assert ("return (jnp.broadcast_to(1, x1.shape[:-1]), _c0, "
            "jnp.broadcast_to(_c1, x1.shape[:-1]), ps['a'] * x1[..., 1])") in out


def test_broadcast_constant_outputs_reads_the_batch_shape_of_matrix_and_scalar_data():
    module = tree("def kernel(x1):\n    return (1,)")
    assert "x1.shape[:-2]" in text(rules.broadcast_constant_outputs(module, [2]))
    module = tree("def kernel(x1):\n    return (1,)")
    assert "jnp.broadcast_to(1, x1.shape)" in text(rules.broadcast_constant_outputs(module, [0]))


def test_broadcast_constant_outputs_rejects_an_unflattened_return():
    module = tree("def kernel(x1):\n    return 1")
    with pytest.raises(CodegenDriftError, match="broadcast_constant_outputs"):
        rules.broadcast_constant_outputs(module, [1])


# ---- hoist_array_literals --------------------------------------------------------------------

def test_hoist_array_literals_moves_large_literals_into_leading_parameters():
    import numpy as np

    module = tree(
        "def kernel(x1):\n    _c0 = f(jnp.array([1.0, 2.0, 3.0, 4.0, 5.0]), x1[..., 0])\n"
        "    return (_c0, g(array([1.0, 2.0, 3.0, 4.0, 5.0]), x1[..., 1]), h(array([1.0, 2.0])))"
    )
    hoisted = []
    out = text(rules.hoist_array_literals(module, 32, np.dtype("float64"), hoisted))
    assert out.startswith("def kernel(_k0, x1):")
    assert "f(_k0, x1[..., 0])" in out and "g(_k0, x1[..., 1])" in out
    assert "h(array([1.0, 2.0]))" in out
    assert [h.name for h in hoisted] == ["_k0"] and hoisted[0].used_by == (0, 1)
    np.testing.assert_array_equal(hoisted[0].value, [1, 2, 3, 4, 5])


def test_hoist_array_literals_keeps_arrays_with_non_numeric_entries():
    import numpy as np

    module = tree("def kernel(x1):\n    return (f(array([x1[..., 0], 2.0, 3.0, 4.0, 5.0])),)")
    hoisted = []
    out = text(rules.hoist_array_literals(module, 0, np.dtype("float64"), hoisted))
    assert hoisted == [] and out.startswith("def kernel(x1):")


# ---- hoist_data_reads -------------------------------------------------------------------------

def test_hoist_data_reads_reads_each_entry_once_in_index_order():
    module = tree("def kernel(x1, x2):\n    return (x1[..., 1] * x2[..., 0, 1] + x1[..., 1], x1[..., 0])")
    out = text(rules.hoist_data_reads(module))
    assert out == ("def kernel(x1, x2):\n    _d0 = x1[..., 0]\n    _d1 = x1[..., 1]\n"
                   "    _d2 = x2[..., 0, 1]\n    return (_d1 * _d2 + _d1, _d0)")
