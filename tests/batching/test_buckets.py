"""Batch-size buckets: a sweep of batch sizes compiles a bounded number of times."""

import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st

import symkern as sk
from symkern.batching.buckets import EXACT_SHAPES, bucket_size

x0, x1, a = sp.symbols("x0 x1 a")


@given(st.integers(1, 10**7))
def test_bucket_is_at_least_the_size_and_wastes_under_an_eighth(n):
    size = bucket_size(n)
    assert n <= size < n * 1.125 + 1


def test_buckets_per_octave_are_bounded():
    # eight buckets inside the octave, and its top for sizes just under 2048
    assert sorted({bucket_size(n) for n in range(1024, 2048)}) == [1024 + 128 * k for k in range(9)]


@pytest.mark.parametrize("assembly, executables", [("fused", 1), ("separate", 2)])
def test_a_sweep_of_batch_sizes_compiles_once_per_bucket(compile_events, assembly, executables):
    kernel = sk.build_function(sp.Matrix([sp.sin(x0) * a, x1 * x0]), [x0, x1], params={"a": a},
                               dtype="float64")
    kernel.assembly = assembly  # as if measured (Kernel._probe): the counts are exact then
    rng = np.random.default_rng(0)
    kernel(rng.normal(size=(1000, 2)), {"a": 2.0})
    for n in range(1001, 1101):
        X = rng.normal(size=(n, 2))
        out = kernel(X, {"a": 2.0})
        assert out.shape == (n, 2)
        out = np.asarray(out)
        np.testing.assert_allclose(out[:, 0], np.sin(X[:, 0]) * 2.0, rtol=1e-13)
        np.testing.assert_allclose(out[:, 1], X[:, 0] * X[:, 1], rtol=1e-13)
    # 1000..1003 exactly, then 1004..1100 fall into buckets 1024 and 1152
    assert kernel.compilations == EXACT_SHAPES + 2
    kernel_events = [name for name in compile_events if name in (
        "jit(_evaluate_arguments)", "jit(_compute)", "jit(_compute_arguments)",
        "jit(_assemble_entries)")]
    # per exact size and bucket: one executable fused, two (entries, assembly) separate
    assert len(kernel_events) == (EXACT_SHAPES + 2) * executables


def test_multi_dimensional_batches_are_padded_and_reshaped():
    kernel = sk.build_function(x0 * a, [x0], params={"a": a}, dtype="float64")
    for n in range(5, 5 + EXACT_SHAPES):
        kernel(np.ones((n, 1)), {"a": 1.0})
    values = np.arange(3 * 7, dtype=float).reshape(3, 7, 1)
    out = kernel(values, {"a": 3.0})
    assert out.shape == (3, 7)
    np.testing.assert_array_equal(out, values[..., 0] * 3.0)
    assert kernel.compilations == EXACT_SHAPES + 1


def test_a_batch_shape_already_compiled_runs_exactly():
    kernel = sk.build_function(x0 * a, [x0], params={"a": a}, dtype="float64")
    for _ in range(3):
        kernel(np.ones((40, 1)), {"a": 1.0})
        kernel(np.ones((1, 1)), {"a": 1.0})
    assert kernel.compilations == 2
