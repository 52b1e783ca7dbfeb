"""How outputs are assembled above PROBE_FROM samples: measured once per kernel, same values.

Which of one executable (entries stacked inside) or two (entries, then assembly) is faster
depends on the kernel (docs/benchmarks.md), so `Kernel._probe` times both on the first
batch of PROBE_FROM samples or more. These tests hold what must not depend on the timing:
the values, that the probe runs once, and that each choice computes the same thing.
"""

import threading

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import symkern as sk
from symkern.batching.kernel import PROBE_FROM

x0, x1, a = sp.symbols("x0 x1 a")
EQS = {"v": sp.Matrix([sp.sin(x0) * a + x1, sp.tanh(x0 * x1), x1**2]), "s": sp.cos(x0) * a}


def build():
    return sk.build_function(EQS, [x0, x1], params={"a": a}, dtype="float64")


def reference(X, value):
    return {"v": np.stack([np.sin(X[..., 0]) * value + X[..., 1], np.tanh(X[..., 0] * X[..., 1]),
                           X[..., 1] ** 2], axis=-1),
            "s": np.cos(X[..., 0]) * value}


def assert_reference(out, X, value):
    want = reference(X, value)
    for key in want:
        np.testing.assert_allclose(out[key], want[key], rtol=1e-13, atol=1e-13)


def test_small_batches_do_not_probe():
    kernel = build()
    X = np.random.default_rng(0).normal(size=(PROBE_FROM - 1, 2))
    assert_reference(kernel(X, {"a": 2.0}), X, 2.0)
    assert kernel.assembly is None and "assembly_probe" not in kernel.timings


def test_the_probe_runs_once_and_keeps_one_choice():
    kernel = build()
    rng = np.random.default_rng(1)
    for n in (PROBE_FROM, 300, 2000, PROBE_FROM):
        X = rng.normal(size=(n, 2))
        assert_reference(kernel(X, {"a": 0.5}), X, 0.5)
        assert kernel.assembly in ("fused", "separate")
    probed = kernel.timings["assembly_probe"]
    kernel(rng.normal(size=(700, 2)), {"a": 0.5})
    assert kernel.timings["assembly_probe"] == probed


def test_the_probe_records_what_it_measured_and_chooses_by_it():
    from symkern.batching.kernel import PROBE_ROUNDS

    kernel = build()
    assert kernel.probe is None
    X = np.random.default_rng(4).normal(size=(300, 2))
    kernel(X, {"a": 0.5})
    probe = kernel.probe
    assert probe["batch"] == 300 and probe["rounds"] >= PROBE_ROUNDS
    assert 0 < probe["fused_s"] < kernel.timings["assembly_probe"]
    assert 0 < probe["separate_s"] < kernel.timings["assembly_probe"]
    faster = "fused" if probe["fused_s"] <= probe["separate_s"] else "separate"
    assert kernel.assembly == faster


def test_the_probe_compiles_each_form_once_and_later_calls_none(compile_events):
    kernel = build()
    rng = np.random.default_rng(3)
    X = rng.normal(size=(PROBE_FROM, 2))
    assert_reference(kernel(X, {"a": 0.5}), X, 0.5)
    # one executable; the entries' and the assembly's (compiled together, before timing)
    assert sorted(compile_events) == ["jit(_assemble_entries)", "jit(_compute_arguments)",
                                      "jit(_evaluate_arguments)"]
    compile_events.clear()
    for value in (0.25, 3.0):
        X = rng.normal(size=(PROBE_FROM, 2))
        assert_reference(kernel(X, {"a": value}), X, value)
    assert compile_events == []


def test_threads_racing_the_first_large_call_probe_once():
    kernel = build()
    X = np.random.default_rng(2).normal(size=(256, 2))
    results, barrier = [None] * 4, threading.Barrier(4)

    def task(k):
        barrier.wait()
        results[k] = kernel(X, {"a": float(k)})

    threads = [threading.Thread(target=task, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for k, out in enumerate(results):
        assert_reference(out, X, float(k))
    assert kernel.assembly in ("fused", "separate")


# one kernel per choice, set as if measured, shared by the examples
KERNELS = {choice: build() for choice in ("fused", "separate")}
for _choice, _kernel in KERNELS.items():
    _kernel.assembly = _choice


@settings(max_examples=10, deadline=None)
@given(n=st.integers(PROBE_FROM, 3000), choice=st.sampled_from(["fused", "separate"]),
       value=st.floats(-3, 3))
def test_either_choice_computes_the_same_values(n, choice, value):
    kernel = KERNELS[choice]
    X = np.random.default_rng(n).normal(size=(n, 2))
    assert_reference(kernel(X, {"a": value}), X, value)


@pytest.mark.parametrize("choice", ["fused", "separate"])
def test_the_flat_form_follows_the_choice(choice):
    kernel = build()
    kernel.assembly = choice
    X = np.random.default_rng(3).normal(size=(500, 2))
    flat = kernel.flat()
    assert_reference(flat(X, kernel.flatten({"a": 1.25})), X, 1.25)


# leaves on both sides of TRANSPOSED_ASSEMBLY_UP_TO entries (a scalar, 2, 4, 9 and 16)
_SYMBOLS = sp.symbols("y0:31")
WIDE = {"s": _SYMBOLS[0], "v": sp.Matrix(_SYMBOLS[1:3]), "m": sp.Matrix(2, 2, _SYMBOLS[3:7]),
        "n": sp.Matrix(3, 3, _SYMBOLS[7:16]), "w": sp.Matrix(4, 4, [*_SYMBOLS[16:31], x0])}


@settings(max_examples=15, deadline=None)
@given(batch=st.lists(st.integers(1, 7), min_size=0, max_size=3), seed=st.integers(0, 2**16))
def test_both_stackings_of_the_assembly_agree_with_numpy(batch, seed):
    from symkern.batching.kernel import TRANSPOSED_ASSEMBLY_UP_TO

    kernel = WIDE_KERNEL
    entries = tuple(np.random.default_rng(seed).normal(size=(32,) + tuple(batch)))
    assert [np.prod(shape, dtype=int) for shape in kernel.equations.shapes] == [4, 9, 1, 2, 16]
    leaves, start = [], 0
    for shape in kernel.equations.shapes:  # the tree's leaf order: m, n, s, v, w
        count = int(np.prod(shape, dtype=int))
        chunk = entries[start:start + count]
        leaves.append(np.stack(chunk, axis=-1).reshape(tuple(batch) + tuple(shape))
                      if shape else chunk[0])
        start += count
    want = dict(zip("mnsvw", leaves, strict=True))
    for transpose_up_to in (0, TRANSPOSED_ASSEMBLY_UP_TO, 99):
        got = kernel._assemble(entries, transpose_up_to)
        for key, value in want.items():
            assert np.shape(got[key]) == np.shape(value)
            np.testing.assert_array_equal(got[key], value)
    got = kernel._assemble_jitted(entries)  # the assembly executable's choice
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value)


WIDE_KERNEL = sk.build_function(WIDE, list(_SYMBOLS) + [x0], dtype="float64")


def test_a_batch_sixteen_times_larger_is_measured_again():
    from symkern.batching.kernel import REPROBE_FACTOR

    kernel = build()
    rng = np.random.default_rng(5)
    X = rng.normal(size=(100, 2))
    assert_reference(kernel(X, {"a": 1.0}), X, 1.0)
    first = kernel.timings["assembly_probe"]
    for n in (200, REPROBE_FACTOR * 100 - 1):  # below the factor: the choice holds
        X = rng.normal(size=(n, 2))
        assert_reference(kernel(X, {"a": 1.0}), X, 1.0)
    assert kernel.timings["assembly_probe"] == first and kernel._probed_size == 100
    X = rng.normal(size=(REPROBE_FACTOR * 100, 2))
    assert_reference(kernel(X, {"a": 1.0}), X, 1.0)
    assert kernel._probed_size == REPROBE_FACTOR * 100
    assert kernel.timings["assembly_probe"] > first and kernel.assembly in ("fused", "separate")
    again = kernel.timings["assembly_probe"]
    assert_reference(kernel(X, {"a": -2.0}), X, -2.0)  # the same shape: no probe, no compile
    assert kernel.timings["assembly_probe"] == again


def test_an_assembly_set_by_hand_is_never_measured():
    kernel = build()
    kernel.assembly = "separate"
    for n in (100, 5000):
        X = np.random.default_rng(n).normal(size=(n, 2))
        assert_reference(kernel(X, {"a": 0.25}), X, 0.25)
    assert kernel.assembly == "separate" and "assembly_probe" not in kernel.timings


def test_no_second_measurement_above_reprobe_up_to(monkeypatch):
    import symkern.batching.kernel as kernel_module

    monkeypatch.setattr(kernel_module, "REPROBE_UP_TO", 1000)  # so that the test stays small
    kernel = build()
    rng = np.random.default_rng(6)
    X = rng.normal(size=(PROBE_FROM, 2))
    kernel(X, {"a": 1.0})
    probed = kernel.timings["assembly_probe"]
    X = rng.normal(size=(kernel_module.REPROBE_FACTOR * PROBE_FROM * 2, 2))  # 2,048 > 1,000
    assert_reference(kernel(X, {"a": 1.0}), X, 1.0)
    assert kernel.timings["assembly_probe"] == probed and kernel._probed_size == PROBE_FROM
