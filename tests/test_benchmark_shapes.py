"""The random shapes of `benchmarks/shapes.py`: the same seed gives the same expressions, the
operation count lands near its target, and symkern builds each profile's shape and agrees
with `sympy.lambdify` on NumPy in float64."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import sympy as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import shapes  # noqa: E402

import symkern as sk  # noqa: E402

#: small enough that the five builds take a few seconds
TARGET = 200


@pytest.mark.parametrize("profile", sorted(shapes.PROFILES))
def test_shape_is_deterministic_for_a_seed(profile: str) -> None:
    first, again = shapes.generate(profile, TARGET, seed=3), shapes.generate(profile, TARGET, seed=3)
    assert sp.srepr(first.eqs) == sp.srepr(again.eqs)
    assert first.param_values == again.param_values
    assert sp.srepr(shapes.generate(profile, TARGET, seed=4).eqs) != sp.srepr(first.eqs)


@pytest.mark.parametrize("target", [200, 2_000])
def test_operation_count_is_near_the_target(target: int) -> None:
    for profile in shapes.PROFILES:
        shape = shapes.generate(profile, target, seed=0)
        assert 0.85 * target <= shape.operations <= 1.25 * target, shape.summary()
        assert 0 < shape.dag_operations <= shape.operations
        assert shape.eqs.rows == max(1, round(target / shapes.PROFILES[profile].ops_per_output))


def test_profiles_differ_in_what_they_stress() -> None:
    by_name = {name: shapes.generate(name, 2_000, seed=0) for name in shapes.PROFILES}
    shared = by_name["shared-dag"]
    assert shared.dag_operations < 0.8 * shared.operations
    assert len(by_name["many-params"].params) >= 300
    assert len(set().union(*(s.calls for s in by_name.values()))) == 8


@pytest.mark.parametrize("profile", sorted(shapes.PROFILES))
def test_symkern_agrees_with_lambdify_numpy(profile: str) -> None:
    shape = shapes.generate(profile, TARGET, seed=1)
    kernel = sk.build_function(shape.eqs, shape.inputs, params=shape.params, dtype=np.float64)
    X = np.random.default_rng(0).uniform(-1, 1, (8, len(shape.inputs)))
    got = np.asarray(kernel(X, shape.param_values))
    reference = sp.lambdify((shape.inputs, list(shape.params.values())), list(shape.eqs), "numpy")
    values = list(shape.param_values.values())
    want = np.stack([np.asarray(reference(x, values), float).ravel() for x in X])
    assert np.all(np.isfinite(want))
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


def test_issue_cases_have_their_size() -> None:
    from symkern.codegen.linearize import count_operations

    expr, data = shapes.cosine_sum(200)
    assert len(data) == 2 and len(expr.atoms(sp.cos)) == 200
    assert 4 * 200 <= count_operations([expr]) <= 6 * 200
    expr, x, params = shapes.parameter_sum(50)
    assert len(params) == 50 and expr.free_symbols == {x, *params.values()}


@pytest.mark.parametrize("profile", sorted(shapes.PROFILES))
def test_sympy_cse_keeps_the_value_of_a_shape(profile: str) -> None:
    """The nodes are built unevaluated; one that repeats an argument made SymPy's cse
    (and so lambdify's cse=True, a benchmark's anchor) return another value."""
    shape = shapes.generate(profile, 1_000, seed=0)
    args = (shape.inputs, list(shape.params.values()))
    x, values = np.random.default_rng(0).uniform(-1, 1, len(shape.inputs)), list(shape.param_values.values())
    plain = np.ravel(sp.lambdify(args, list(shape.eqs), "numpy", cse=False)(x, values))
    shared = np.ravel(sp.lambdify(args, list(shape.eqs), "numpy", cse=True)(x, values))
    np.testing.assert_allclose(shared, plain, rtol=1e-9, atol=1e-9 * np.abs(plain).max())


@pytest.mark.slow  # two lambdify builds of 10^4 operations
def test_the_peers_workload_of_a_shape_keeps_its_value_under_sympy_cse() -> None:
    """At 10^4 operations the generator's unevaluated wide-sum shape still makes lambdify's
    cse=True compute another function (log(1 + 2*x2) for log(1 + x2**2)); the peers' workload
    (`workloads.random_shape`) evaluates it, and there cse=True agrees with cse=False."""
    import workloads

    wl = workloads.build("shape-wide-sum-1e4")
    args = (wl.inputs, wl.flat_param_symbols())
    X = wl.sample(16, seed=2).T
    values = wl.flat_param_values()
    plain = np.asarray(sp.lambdify(args, wl.flat_entries(), "numpy", cse=False)(X, values))
    shared = np.asarray(sp.lambdify(args, wl.flat_entries(), "numpy", cse=True)(X, values))
    assert np.isfinite(plain).all()
    np.testing.assert_allclose(shared, plain, rtol=1e-9, atol=1e-9 * np.abs(plain).max())
