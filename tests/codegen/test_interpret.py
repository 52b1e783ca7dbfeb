"""The interpreted form (symkern.codegen.interpret): an instruction table run by one loop.

Random expressions over every operation of the table are checked against SymPy/mpmath at
30 digits and against the compiled scalar kernel of the same equations (values and
gradients); the gate is tested on both sides of INTERPRET_ABOVE_OPERATIONS, the register
allocation by the table's own listing, and the program's size against the body's.
"""

from __future__ import annotations

import ast

import jax

jax.config.update("jax_enable_x64", True)

import mpmath  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import sympy as sp  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import symkern as sk  # noqa: E402
from symkern.codegen import interpret, passes  # noqa: E402
from symkern.errors import BuildError  # noqa: E402

X = sp.symbols("x0:3")
P = sp.symbols("p0:2")
UNARY = [sp.sin, sp.cos, sp.tanh, sp.atan, sp.exp, lambda e: sp.log(1 + e**2),
         lambda e: sp.sqrt(1 + e**2), sp.Abs, lambda e: e**3, lambda e: 1 / (2 + e**2)]


def _interpreted(eqs, inputs, params=None, **options):
    return sk.build_function(eqs, inputs, params=params, dtype="float64",
                             options=sk.BuildOptions(interpret=True, **options))


@st.composite
def expressions(draw, depth: int = 3):
    """An expression of the data and parameters through the table's operations."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from([*X, *P, sp.Rational(3, 4), sp.Integer(-2), sp.Float(0.3)]))
    kind = draw(st.sampled_from(["unary", "add", "mul", "sub", "div", "pow", "atan2"]))
    a = draw(expressions(depth - 1))
    if kind == "unary":
        return draw(st.sampled_from(UNARY))(a)
    b = draw(expressions(depth - 1))
    if kind == "add":
        return a + b
    if kind == "mul":
        return a * b
    if kind == "sub":
        return a - b
    if kind == "div":
        return a / (3 + sp.tanh(b))
    if kind == "pow":
        return (1 + a**2) ** sp.Rational(draw(st.integers(-3, 3)), 2)
    return sp.atan2(a, 1 + b**2)


def _mpmath(expr, sample, params):
    values = {**dict(zip(X, sample, strict=True)), **dict(zip(P, params, strict=True))}
    with mpmath.workdps(30):
        return float(sp.N(expr.subs({s: sp.Float(repr(float(v)), 30) for s, v in values.items()}), 30))


@settings(max_examples=25, deadline=None)
@given(st.lists(expressions(), min_size=1, max_size=3), st.sampled_from([(), (3,), (2, 2)]),
       st.integers(0, 2**31 - 1))
def test_interpreted_kernels_match_sympy_at_30_digits(outputs, batch, seed):
    outputs = [e + X[0] for e in outputs]  # every output reads the data
    kernel = _interpreted(sp.Matrix(outputs), list(X), list(P))
    assert kernel.form == "interpreted" and "interp.run(" in kernel.source
    rng = np.random.default_rng(seed)
    data = rng.uniform(-1, 1, batch + (3,))
    params = rng.uniform(0.5, 1.5, 2)
    got = np.asarray(kernel(data, list(params))).reshape(-1, len(outputs))
    for sample, values in zip(data.reshape(-1, 3), got, strict=True):
        want = [_mpmath(e, sample, params) for e in outputs]
        np.testing.assert_allclose(values, want, rtol=1e-10, atol=1e-12)


@settings(max_examples=6, deadline=None)
@given(st.lists(expressions(), min_size=1, max_size=2), st.integers(0, 2**31 - 1))
def test_values_and_gradients_equal_the_compiled_kernel(outputs, seed):
    outputs = [e * X[1] + X[2] for e in outputs]
    eqs = sp.Matrix(outputs)
    interpreted = _interpreted(eqs, list(X), list(P))
    compiled = sk.build_function(eqs, list(X), params=list(P), dtype="float64",
                                 options=sk.BuildOptions(interpret=False))
    assert compiled.form == "scalar"
    rng = np.random.default_rng(seed)
    data, params = rng.uniform(-1, 1, (7, 3)), list(rng.uniform(0.5, 1.5, 2))
    np.testing.assert_allclose(interpreted(data, params), compiled(data, params), rtol=1e-12,
                               atol=1e-13)
    for argnums in (0, 1):
        got = jax.grad(lambda d, p: interpreted(d, p).sum(), argnums)(data, params)
        want = jax.grad(lambda d, p: compiled(d, p).sum(), argnums)(data, params)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def _sum_of_terms(terms: int) -> sp.Expr:
    return sp.Add(*[sp.Float(0.5 + i / 512) * sp.cos(i * X[i % 3] + P[i % 2]) * X[(i + 1) % 3]
                    for i in range(terms)])


def test_the_gate_on_both_sides_of_the_threshold(monkeypatch):
    expr = _sum_of_terms(40)  # ~300 operations
    monkeypatch.setattr(passes, "INTERPRET_ABOVE_OPERATIONS", 200)
    above = sk.build_function(expr, list(X), params=list(P), dtype="float64", cse=False)
    monkeypatch.setattr(passes, "INTERPRET_ABOVE_OPERATIONS", 2000)
    below = sk.build_function(expr, list(X), params=list(P), dtype="float64", cse=False)
    assert above.form == "interpreted" and below.form == "scalar"
    assert "interpret=None" in repr(above)
    data = np.random.default_rng(1).uniform(-1, 1, (9, 3))
    np.testing.assert_allclose(above(data, [0.7, 1.1]), below(data, [0.7, 1.1]), rtol=1e-12)


def test_the_program_does_not_grow_with_the_body():
    data = np.random.default_rng(2).uniform(-1, 1, (5, 3))
    lines = {}
    for terms in (30, 300):
        kernel = _interpreted(_sum_of_terms(terms), list(X), list(P), cse=False)
        table = next(c for c in kernel.const_args if c.name == "_i0")
        assert table.value.shape[0] > 4 * terms  # one row an operation
        lines[terms] = len(kernel.hlo(data, [0.7, 1.1]).splitlines())
    assert lines[300] <= 1.1 * lines[30], lines


def test_numbers_and_parameters_are_tables_not_code():
    kernel = _interpreted(_sum_of_terms(50), list(X), list(P), cse=False)
    assert "0.50" not in kernel.source  # the coefficients are in _i1
    numbers = next(c for c in kernel.const_args if c.name == "_i1")
    assert np.asarray(numbers.value).size >= 50
    assert "instruction table" in next(c for c in kernel.const_args if c.name == "_i0").origin


def test_packed_parameters_are_read_from_the_buffer():
    ps = sp.symbols("q0:6")
    expr = sp.Add(*[sp.sin(q * X[k % 3]) for k, q in enumerate(ps)])
    kernel = _interpreted(expr, list(X), {str(q): q for q in ps})
    assert kernel.packs_parameters and "parameters=ps.buffer" in kernel.source
    values = {str(q): 0.1 * (k + 1) for k, q in enumerate(ps)}
    data = np.random.default_rng(3).uniform(-1, 1, (4, 3))
    want = sum(np.sin(0.1 * (k + 1) * data[:, k % 3]) for k in range(6))
    np.testing.assert_allclose(kernel(data, values), want, rtol=1e-12)


def test_the_listing_reuses_registers():
    kernel = _interpreted(_sum_of_terms(100), list(X), list(P), cse=False)
    table = np.asarray(next(c for c in kernel.const_args if c.name == "_i0").value)
    ops = kernel.source.split("ops=")[1].split("), ")[0] + ")"
    listing = interpret.listing(table, ast.literal_eval(ops))
    assert listing.count("\n") + 1 == table.shape[0]
    assert listing.splitlines()[0].startswith("r") and " = " in listing
    registers = int(kernel.source.split("registers=")[1].split(",")[0])
    assert registers < 20 < table.shape[0]  # a wide sum keeps a few values live


def test_a_sample_gets_the_same_bits_in_every_batch_and_tile():
    kernel = _interpreted(_sum_of_terms(30), list(X), list(P), cse=False, tile_chunk=64)
    data = np.random.default_rng(4).uniform(-1, 1, (300, 3))
    whole = np.asarray(kernel(data, [0.7, 1.1]))
    for n in (1, 63, 64, 65, 129, 300):
        np.testing.assert_array_equal(np.asarray(kernel(data[:n], [0.7, 1.1])), whole[:n])
    assert "tile=64" in kernel.source


#: every function of the table, each on its own entry (arguments inside its domain)
EVERY_FUNCTION = [sp.sin(X[0]), sp.cos(X[1]), sp.tan(X[0]), sp.asin(X[0] / 2), sp.acos(X[1] / 2),
                  sp.atan(X[0]), sp.atan2(X[0], X[1]), sp.sinh(X[1]), sp.cosh(X[0]),
                  sp.tanh(X[0]), sp.asinh(X[1]), sp.acosh(2 + X[0]), sp.atanh(X[1] / 2),
                  sp.exp(X[0]), sp.exp(X[1]) - 1, sp.Pow(2, X[0]), sp.log(2 + X[1]),
                  sp.log(1 + X[1] ** 2), sp.log(2 + X[0], 2), sp.log(2 + X[0], 10),
                  sp.sqrt(2 + X[1]), sp.sqrt(X[0] ** 2 + X[1] ** 2), sp.Abs(X[0]),
                  sp.sign(X[1]), sp.floor(3 * X[0]), sp.ceiling(3 * X[1]), sp.Min(X[0], X[1]),
                  sp.Max(X[0], X[2]), sp.erf(X[0]), sp.erfc(X[1]), sp.loggamma(2 + X[0]),
                  (2 + X[0]) ** X[1], X[0] * X[1] + X[1] * X[2], X[0] / (3 + X[2])]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_every_function_gets_the_same_bits_in_every_batch(dtype):
    """A batch smaller than a tile runs in registers of a multiple of REGISTER_QUANTUM
    samples; in shorter ones XLA computes atan with other bits (below 50 samples), which the
    sizes under the quantum here would show without it."""
    kernel = sk.build_function(sp.Matrix(EVERY_FUNCTION), list(X), dtype=dtype,
                               options=sk.BuildOptions(interpret=True, tile_chunk=1024))
    assert kernel.form == "interpreted"
    data = np.random.default_rng(5).uniform(-0.9, 0.9, (3000, 3)).astype(dtype)
    whole = np.asarray(kernel(data))
    for n in (1, 3, 49, 65, 1025):  # both sides of the quantum and of a tile
        for start in (0, 7):
            part = np.asarray(kernel(data[start:start + n]))
            np.testing.assert_array_equal(part, whole[start:start + n], err_msg=f"{n} at {start}")


def test_a_tile_shorter_than_the_register_quantum_is_the_register():
    kernel = _interpreted(sp.Matrix([sp.atan(X[0]) * X[1] + X[2]]), list(X), tile_chunk=16)
    data = np.random.default_rng(6).uniform(-1, 1, (100, 3))
    whole = np.asarray(kernel(data))
    for n in (1, 15, 16, 17, 40):
        np.testing.assert_array_equal(np.asarray(kernel(data[:n])), whole[:n])


def test_forms_outside_the_table_fall_back_or_raise_when_asked(monkeypatch):
    expr = sp.Piecewise((X[0], X[1] > 0), (X[2], True)) + sp.sin(X[0])
    with pytest.raises(BuildError, match="interpret=True.*does not run"):
        _interpreted(expr, list(X))
    monkeypatch.setattr(passes, "INTERPRET_ABOVE_OPERATIONS", 1)
    kernel = sk.build_function(expr, list(X), dtype="float64")
    assert kernel.form == "scalar"
    with pytest.raises(BuildError, match="interpret: expected None, True or False"):
        sk.BuildOptions(interpret="yes")


def test_outputs_of_parameters_alone_and_constants_stay_outside_the_table():
    eqs = sp.Matrix([sp.sin(X[0]) * P[0], P[0] * P[1], sp.Integer(2)])
    kernel = _interpreted(eqs, list(X), list(P))
    data = np.random.default_rng(5).uniform(-1, 1, (6, 3))
    got = np.asarray(kernel(data, [0.5, 4.0]))
    np.testing.assert_allclose(got[:, 0], np.sin(data[:, 0]) * 0.5, rtol=1e-12)
    np.testing.assert_array_equal(got[:, 1:], np.broadcast_to([2.0, 2.0], (6, 2)))


def test_run_refuses_unknown_operations():
    with pytest.raises(ValueError, match="not an operation"):
        interpret.run(np.zeros((1, 4), np.int32), np.zeros(0), (np.zeros(3),), (),
                      ops=("jnp.save",), outputs=(0,), registers=1, dtype="float64")


@pytest.mark.parametrize("count", [2, 6])  # parameters passed one by one, and packed
def test_parameters_mapped_per_sample_under_vmap(count):
    qs = sp.symbols(f"q0:{count}")
    expr = sum(sp.sin(q * X[0]) * X[1] for q in qs)
    interpreted = _interpreted(expr, list(X), list(qs))
    compiled = sk.build_function(expr, list(X), params=list(qs), dtype="float64",
                                 options=sk.BuildOptions(interpret=False))
    assert interpreted.packs_parameters == (count >= 4)
    data = np.random.default_rng(6).uniform(-1, 1, (7, 3))
    ensemble = [np.linspace(0.1, 0.9, 7) * (k + 1) for k in range(count)]

    def mapped(kernel):
        return jax.vmap(lambda d, *p: kernel(d, list(p)))(data, *ensemble)

    np.testing.assert_allclose(mapped(interpreted), mapped(compiled), rtol=1e-12)
