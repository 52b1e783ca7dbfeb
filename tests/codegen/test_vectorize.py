"""Vectorized bodies (symkern.codegen.vectorize): same values, gradients and shapes as the
scalar body, against SymPy/mpmath at 30 digits and against `jax.jacfwd` of the scalar kernel.

Expressions are built to repeat templates (sums of products of a shared pool of
sin/cos/exp atoms), with ragged sums, parameter-only factors, constants and outputs that are
data or constants, so every branch of the rule runs: leaf and masked reductions, loops over
wide reductions (more than SCAN_ABOVE terms), merged output groups and chunked batches.
"""

from __future__ import annotations

import re

import jax

jax.config.update("jax_enable_x64", True)

import mpmath  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import sympy as sp  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import symkern as sk  # noqa: E402
from symkern.codegen import passes, vecops  # noqa: E402
from symkern.codegen.vectorize import SCAN_ABOVE  # noqa: E402
from symkern.errors import BuildError  # noqa: E402

X = sp.symbols("x0:4")
P = sp.symbols("p0:3")
FUNCTIONS = [sp.sin, sp.cos, sp.exp, sp.tanh, lambda e: sp.sqrt(e**2 + 1), lambda e: e**3]


def _reference(entries: list[sp.Expr], sample: np.ndarray, params: np.ndarray) -> np.ndarray:
    """Each entry at 30 digits with mpmath."""
    values = {**dict(zip(X, sample, strict=True)), **dict(zip(P, params, strict=True))}
    with mpmath.workdps(30):
        return np.array([float(sp.N(e.subs({s: sp.Float(repr(float(v)), 30)
                                           for s, v in values.items()}), 30)) for e in entries])


@st.composite
def repeated_models(draw):
    """A few outputs, each a sum of products of atoms `f(c * p_i * x_j + x_k)`."""
    atoms = [
        draw(st.sampled_from(FUNCTIONS))(
            sp.Rational(draw(st.integers(1, 3)), 2) * draw(st.sampled_from(P)) * draw(st.sampled_from(X))
            + draw(st.sampled_from(X)))
        for _ in range(draw(st.integers(2, 6)))
    ]
    outputs = []
    for _ in range(draw(st.integers(1, 4))):
        terms = []
        # some sums wider than SCAN_ABOVE (a loop), some ragged, some of one term
        for _ in range(draw(st.sampled_from([1, 3, SCAN_ABOVE + 3]))):
            factors = draw(st.lists(st.sampled_from(atoms), min_size=1, max_size=3))
            coefficient = draw(st.sampled_from([1, -1, sp.Rational(3, 4), P[2], P[0] * P[1]]))
            terms.append(coefficient * sp.Mul(*factors))
        outputs.append(sp.Add(*terms))
    return outputs


@given(repeated_models(), st.sampled_from([(), (5,), (2, 3)]), st.integers(0, 2**31 - 1))
def test_vectorized_kernels_match_sympy_at_30_digits(outputs, batch, seed):
    kernel = sk.build_function(sp.Matrix(outputs), list(X), params=list(P), dtype="float64",
                               vectorize=True)
    assert "vec.chunked" in kernel.source
    rng = np.random.default_rng(seed)
    data = rng.uniform(-1, 1, batch + (4,))
    params = rng.uniform(0.5, 1.5, 3)
    got = np.asarray(kernel(data, list(params)))
    assert got.shape == batch + (len(outputs),)
    flat = got.reshape(-1, len(outputs))
    for sample, values in zip(data.reshape(-1, 4), flat, strict=True):
        expected = _reference(outputs, sample, params)
        np.testing.assert_allclose(values, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("size", [1, 7, 8, 9, 23])
def test_chunked_batches_of_every_remainder_agree_with_the_scalar_body(monkeypatch, size):
    monkeypatch.setattr(vecops, "CHUNK", 4)
    eqs = sp.Matrix([sum(sp.sin(P[i % 3] * X[i % 4] + X[(i + 1) % 4]) * X[i % 3]
                         for i in range(12)), X[0], sp.Integer(2) * P[0]])
    scalar = sk.build_function(eqs, list(X), params=list(P), dtype="float64", vectorize=False)
    vector = sk.build_function(eqs, list(X), params=list(P), dtype="float64", vectorize=True)
    data = np.random.default_rng(size).uniform(-1, 1, (size, 4))
    params = [0.3, -1.2, 0.7]
    expected = scalar(data, params)
    got = vector(data, params)
    assert got.shape == expected.shape == (size, 3)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def _wide_model() -> sp.Matrix:
    return sp.Matrix([
        sum(P[(i + j) % 3] * sp.sin(P[j % 3] * X[(i + j) % 4] + X[j % 4]) * sp.cos(X[(i * j) % 4])
            for j in range(SCAN_ABOVE * 2 + i))
        for i in range(3)
    ])


def test_parameter_gradients_match_jacfwd_of_the_scalar_kernel():
    eqs = _wide_model()
    scalar = sk.build_function(eqs, list(X), params=list(P), dtype="float64", vectorize=False)
    vector = sk.build_function(eqs, list(X), params=list(P), dtype="float64", vectorize=True)
    data = np.random.default_rng(1).uniform(-1, 1, (6, 4))
    params = jax.numpy.array([0.4, 1.1, -0.8])

    def loss(kernel):
        return lambda q: jax.numpy.sum(kernel(data, list(q)) ** 2)

    np.testing.assert_allclose(jax.grad(loss(vector))(params), jax.jacfwd(loss(scalar))(params),
                               rtol=1e-10)
    jac_vector = jax.jacfwd(lambda d: vector(d, list(params)))(data[0])
    jac_scalar = jax.jacfwd(lambda d: scalar(d, list(params)))(data[0])
    np.testing.assert_allclose(jac_vector, jac_scalar, rtol=1e-10, atol=1e-12)


def test_repeated_terms_become_a_few_groups():
    kernel = sk.build_function(_wide_model(), list(X), params=list(P), vectorize=True)
    # 3 outputs of 16-18 terms: a few groups for the shared atoms, the outputs one group
    groups = re.findall(r"^ +(_g\d+) = (.*)$", kernel.source, re.MULTILINE)
    assert 2 <= len(groups) <= 6
    loops = [name for name, code in groups if "vec.scan_reduce" in code]
    assert loops == [groups[-1][0]]
    assert "vectorize" in kernel.timings


def test_auto_leaves_small_bodies_scalar_and_vectorizes_big_repeated_ones(monkeypatch):
    small = sk.build_function(_wide_model(), list(X), params=list(P))
    assert "vec." not in small.source and "vectorize" not in small.timings
    monkeypatch.setattr(passes, "VECTORIZE_ABOVE_OPERATIONS", 50)
    monkeypatch.setattr(passes, "VECTORIZE_MIN_SHRINK", 2.0)
    big = sk.build_function(_wide_model(), list(X), params=list(P))
    assert "vec.chunked" in big.source
    # one statement per template: nothing to share, the body stays scalar
    unique = sk.build_function(sp.sin(X[0]) * sp.exp(X[1] + P[0]) - sp.tanh(X[2] * X[3]),
                               list(X), params=list(P))
    assert "vec." not in unique.source


def test_forms_it_cannot_vectorize_fall_back_or_raise_when_asked():
    eqs = sp.Matrix([sp.Piecewise((X[0], X[1] > 0), (X[2], True)) * sp.sin(X[3] * P[0])])
    assert "vec." not in sk.build_function(eqs, list(X), params=list(P)).source
    with pytest.raises(BuildError, match="vectorize=True"):
        sk.build_function(eqs, list(X), params=list(P), vectorize=True)
    with pytest.raises(BuildError, match="vectorize: expected None, True or False"):
        sk.build_function(eqs, list(X), params=list(P), vectorize="yes")


def test_matrix_data_scalar_data_and_parameter_only_outputs():
    M = sp.MatrixSymbol("M", 2, 2)
    t, a = sp.symbols("t a")
    eqs = sp.Matrix([[sum(sp.sin(M[i % 2, j % 2] * t + a * i) for i in range(10) for j in range(2)),
                      a**2 + 1], [t, M[1, 0] * sp.exp(a * t)]])
    scalar = sk.build_function(eqs, M, t, params={"a": a}, dtype="float64", vectorize=False)
    vector = sk.build_function(eqs, M, t, params={"a": a}, dtype="float64", vectorize=True)
    rng = np.random.default_rng(3)
    m, tt = rng.uniform(-1, 1, (5, 2, 2)), rng.uniform(-1, 1, 5)
    expected = scalar(m, tt, {"a": 0.7})
    got = vector(m, tt, {"a": 0.7})
    assert got.shape == expected.shape == (5, 2, 2)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    single = vector(m[0], tt[0], {"a": 0.7})
    np.testing.assert_allclose(single, expected[0], rtol=1e-12)


def test_index_tables_are_arguments_and_parameters_never_recompile():
    kernel = sk.build_function(_wide_model(), list(X), params=list(P), vectorize=True)
    data = np.random.default_rng(0).uniform(-1, 1, (4, 4)).astype(np.float32)
    kernel(data, [0.1, 0.2, 0.3])
    kernel(data, [1.1, 1.2, 1.3])
    assert kernel.compilations == 1
    tables = [c for c in kernel.const_args if c.name.startswith("_v")]
    # index tables, and the numbers among the scalars in the kernel's dtype
    assert tables and all(np.asarray(c.value).dtype.kind in "ib"
                          or np.asarray(c.value).dtype == kernel.dtype for c in tables)
    # the tables are arguments of the lowered program, not constants inside it
    main = next(line for line in kernel.hlo(data, [0.1, 0.2, 0.3]).splitlines()
                if "func.func public @main" in line)
    assert main.count("%arg") >= len(tables) + 2


def _numbered_sum(terms: int) -> sp.Expr:
    """One template whose terms differ only in numbers: coefficients, multipliers inside a
    function, exponents."""
    return sp.Add(*[sp.Float(0.5 + i / 1024) * X[i % 2] ** (i % 3 + 1)
                    * sp.cos(i * X[(i + 1) % 2]) for i in range(1, terms + 1)])


def test_the_numbers_of_a_template_are_one_argument_whatever_their_count():
    data = np.random.default_rng(5).uniform(-1, 1, (5, 4))
    sizes = {}
    for terms in (60, 240):
        expr = _numbered_sum(terms)
        kernel = sk.build_function(expr, list(X), cse=False, dtype="float64", vectorize=True)
        assert kernel.form == "vectorized"
        numbers = [c for c in kernel.const_args if np.asarray(c.value).dtype == np.float64]
        # distinct scalars are stored once: the coefficients and the multipliers
        assert len(numbers) == 1 and np.asarray(numbers[0].value).size >= terms
        assert "numbers=" in kernel.source and "0.50" not in kernel.source
        want = sp.lambdify([X], expr, "numpy")(data.T)
        np.testing.assert_allclose(kernel(data), want, rtol=1e-10)
        sizes[terms] = len(kernel.hlo(data).splitlines())
    # the program does not grow with the numbers (it has them as one argument)
    assert sizes[240] <= 1.1 * sizes[60], sizes


def test_an_exported_vectorized_kernel_loads_and_agrees(monkeypatch):
    monkeypatch.setattr(vecops, "CHUNK", 8)
    kernel = sk.build_function(_wide_model(), list(X), params=list(P), vectorize=True)
    data = np.random.default_rng(2).uniform(-1, 1, (20, 4)).astype(np.float32)
    params = [0.1, 0.2, 0.3]
    loaded = sk.load(kernel.export(data, params), kernel.const_args)
    for batch in (data, data[:3]):
        np.testing.assert_allclose(loaded(batch, params), kernel(batch, params), rtol=1e-5)


def test_a_vectorized_kernel_assembles_in_one_executable_without_a_probe():
    kernel = sk.build_function(_wide_model(), list(X), params=list(P), vectorize=True)
    assert kernel.assembly == "fused"
    data = np.random.default_rng(4).uniform(-1, 1, (100, 4)).astype(np.float32)
    out = kernel(data, [0.1, 0.2, 0.3])
    assert out.shape == (100, 3) and "assembly_probe" not in kernel.timings
    assert kernel.compilations == 1


def test_a_body_above_the_threshold_is_vectorized_by_default_and_exact():
    # ~27,000 operations after CSE: 12 outputs of 400 terms p*sin(p*x + x)*cos(p*x)
    rng = np.random.default_rng(5)
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
    ps = sp.symbols("q0:8")
    outputs = [sp.Add(*[pick(ps) * sp.sin(pick(ps) * pick(X) + pick(X)) * sp.cos(pick(ps) * pick(X))
                        for _ in range(400)]) for _ in range(12)]
    kernel = sk.build_function(sp.Matrix(outputs), list(X), params=list(ps), dtype="float64")
    assert "vec.chunked" in kernel.source and kernel.timings["vectorize"] > 0
    data = rng.uniform(-1, 1, (2100, 4))  # three chunks, the last one partial
    values = rng.uniform(-1, 1, 8)
    reference = sp.lambdify([list(X), list(ps)], outputs, "numpy")
    expected = np.stack(reference(data.T, values), axis=-1)
    np.testing.assert_allclose(kernel(data, list(values)), expected, rtol=1e-11, atol=1e-11)


def test_a_vectorized_body_above_the_split_threshold_is_never_cut(monkeypatch):
    # n_link_pendulum_on_cart(14): a vectorized body of > 2,000 operations reached the
    # splitter, which only cuts straight-line bodies
    monkeypatch.setattr(passes, "SPLIT_ABOVE_OPERATIONS", 10)
    scalar = sk.build_function(_wide_model(), list(X), params=list(P), dtype="float64",
                               vectorize=False)
    vector = sk.build_function(_wide_model(), list(X), params=list(P), dtype="float64",
                               vectorize=True)
    assert scalar._pieces is not None and vector._pieces is None
    data = np.random.default_rng(6).uniform(-1, 1, (9, 4))
    np.testing.assert_allclose(vector(data, [0.2, 0.4, 0.6]), scalar(data, [0.2, 0.4, 0.6]),
                               rtol=1e-12)


def test_many_small_outputs_keep_the_scalar_body_by_default(monkeypatch):
    # one template, but every entry is its own output: the vectorized program would still
    # hold a slice and an assembly place per entry (n_link_pendulum_on_cart(14): 1,365)
    monkeypatch.setattr(passes, "VECTORIZE_ABOVE_OPERATIONS", 50)
    monkeypatch.setattr(passes, "VECTORIZE_MIN_SHRINK", 2.0)
    entries = sp.Matrix([sp.sin(P[i % 3] * X[i % 4]) * X[(i + 1) % 4] * (i + 1) for i in range(120)])
    assert "vec." not in sk.build_function(entries, list(X), params=list(P)).source
    forced = sk.build_function(entries, list(X), params=list(P), dtype="float64", vectorize=True)
    assert "vec.chunked" in forced.source
    data = np.random.default_rng(7).uniform(-1, 1, (3, 4))
    values = [0.5, -0.25, 2.0]
    want = np.array([[float(e.subs({**dict(zip(X, row, strict=True)), **dict(zip(P, values, strict=True))}))
                      for e in entries]
                     for row in data])
    np.testing.assert_allclose(forced(data, values), want, rtol=1e-12)


def test_a_deep_nest_is_declined_early_and_stays_exact(monkeypatch):
    import math

    monkeypatch.setattr(passes, "VECTORIZE_ABOVE_OPERATIONS", 50)
    x, a = sp.symbols("x a")
    e = x
    for i in range(400):
        e = sp.sin(a * e + x, evaluate=False) if i % 2 else sp.cos(e, evaluate=False)
    kernel = sk.build_function(e, x, params={"a": a}, dtype="float64")
    assert "vec." not in kernel.source and "vectorize" in kernel.timings
    value = 0.3
    for i in range(400):
        value = math.sin(0.7 * value + 0.3) if i % 2 else math.cos(value)
    assert float(kernel(np.array([0.3]), {"a": 0.7})[0]) == pytest.approx(value, rel=1e-12)
