"""Smoke run of the peer tools of `benchmarks/compare.py --peers` (numba, PyTensor, CasADi;
the `peers` extra): each builds on a tiny workload and computes the float64 reference's
entries, in its own dtype; a peer that is not installed is skipped.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

#: tolerance on the max relative error against lambdify's float64 entries, per dtype
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


@pytest.fixture(scope="module")
def tiny() -> tuple:
    """The 2-link pendulum on a fixed pivot (20 entries, 8 of them constant), 64 samples, and
    lambdify's float64 entries."""
    import compare
    import workloads

    wl = workloads.build("nlink-fixed-2")
    X = wl.sample(64, seed=0)
    reference = compare.LambdifyNumpyTool(wl)
    reference.build()
    ref = reference.entries(reference.call(reference.prepare(X), reference.params(wl.param_values)), 64)
    return wl, X, ref


@pytest.mark.parametrize("tool", ["numba", "pytensor-c", "pytensor-jax-f32", "casadi", "casadi-c"])
def test_peer_computes_the_reference_entries(tool: str, tiny: tuple) -> None:
    import compare

    for module in compare.OPTIONAL[tool]:
        pytest.importorskip(module)
    wl, X, ref = tiny
    adapter = compare.ADAPTERS[tool](wl)
    adapter.build()
    ps = adapter.params(wl.param_values)
    got = adapter.entries(adapter.call(adapter.prepare(X), ps), X.shape[0])
    assert got.shape == ref.shape
    assert compare._rel_error(got, ref) < TOLERANCE[adapter.dtype], tool
    one = adapter.entries(adapter.single(X[0].copy(), ps), 1)
    assert np.allclose(one[0], ref[0], rtol=TOLERANCE[adapter.dtype] * 10, atol=1e-6), tool


def test_symkern_c_loop_tool_computes_the_reference_entries(tiny: tuple) -> None:
    """`symkern-c`: the kernel with BuildOptions(cpu_loop="c") (needs a C++ compiler)."""
    import compare

    from symkern.kernels.c_loop import compiler

    if compiler() is None:
        pytest.skip("cpu_loop='c' needs a C++ compiler")
    wl, X, ref = tiny
    adapter = compare.ADAPTERS["symkern-c"](wl)
    adapter.build()
    assert adapter.kernel.options.cpu_loop == "c" and "for (int64_t i" in adapter.kernel.source
    got = adapter.entries(adapter.call(adapter.prepare(X), adapter.params(wl.param_values)),
                          X.shape[0])
    assert compare._rel_error(got, ref) < TOLERANCE["float32"]


def test_batch_loop_source_moves_lambdify_body_into_a_prange_loop() -> None:
    import peers

    source = "def _lambdifygenerated(a, b, k):\n    x0 = sin(a)\n    return [x0*k, b + x0, 1]\n"
    loop = peers.batch_loop_source(source, n_inputs=2)
    namespace = {"sin": np.sin, "prange": range, "empty": np.empty}
    exec(loop, namespace)  # noqa: S102 - the generated loop, run without numba
    X = np.array([[0.5, 2.0], [1.0, -1.0]])
    out = namespace["batched"](X, np.array([3.0]))
    assert np.allclose(out, [[3 * np.sin(0.5), 2 + np.sin(0.5), 1], [3 * np.sin(1.0), -1 + np.sin(1.0), 1]])


def test_translation_names_what_it_cannot_translate() -> None:
    import peers
    import sympy as sp

    x = sp.Symbol("x")
    with pytest.raises(NotImplementedError, match="besselj"):
        peers.translate([sp.besselj(0, x) + 1], {x: 1.0}, {sp.Add: lambda *a, node: sum(a)}, float)


def test_nonconstant_workload_leaves_out_exactly_the_numeric_entries() -> None:
    import workloads

    full = workloads.build("nlink-2")
    varying = workloads.build("nlink-2-nonconstant")
    numeric = [e for e in full.eqs[0] if e.is_Number]
    assert len(numeric) == 27 and len(varying.flat_entries()) == len(full.flat_entries()) - 27
    assert [e for e in full.flat_entries() if not e.is_Number] == varying.flat_entries()


def test_same_dtype_ratios_compare_within_one_dtype() -> None:
    import compare

    tools = {"symkern": ("float32", 10.0), "symkern-f64": ("float64", 4.0), "numba": ("float64", 8.0),
             "pytensor-c-f32": ("float32", 5.0), "casadi": ("float64", 2.0), "broken": ("float64", None)}
    report = {"workloads": {"w": {"tools": {
        name: {"status": "ok", "dtype": dtype, "throughput": rate} if rate else {"status": "error"}
        for name, (dtype, rate) in tools.items()}}}}
    ratios = compare.same_dtype_ratios(report)["w"]
    assert ratios["float32"]["best_peer"] == "pytensor-c-f32" and ratios["float32"]["ratio"] == 2.0
    assert ratios["float64"]["best_peer"] == "numba" and ratios["float64"]["ratio"] == 0.5


def test_math_ops_evaluate_a_shared_expression_as_sympy_does() -> None:
    import peers
    import sympy as sp

    x, y = sp.symbols("x y")
    shared = sp.tanh(x * y + 1)
    exprs = [shared**2 - sp.sqrt(1 + x**2) * shared, sp.atan2(y, x) + sp.Max(x, y) * sp.exp(-y),
             sp.Abs(x - y) / 3 + sp.sign(y) * sp.cos(shared)]
    point = {x: 0.3, y: -1.7}
    got = peers.translate(exprs, point, peers.math_ops(), float)
    assert np.allclose(got, [float(e.subs(point)) for e in exprs], rtol=1e-14)


@pytest.mark.parametrize("tool", ["symkern", "casadi"])
@pytest.mark.parametrize("derivative", ["input-jacobian", "parameter-gradient"])
def test_derivatives_benchmark_checks_each_tool(tool: str, derivative: str) -> None:
    import derivatives

    if tool == "casadi":
        pytest.importorskip("casadi")
    result = derivatives.measure(tool, (2, 3, 2), derivative)
    assert result["derive_s"] > 0 and result["max_error"] < 1e-12
