"""How outputs are assembled: decided at build time, the same at every batch size.

One executable (entries stacked inside) or two (entries, then assembly): the build decides
from the body (symkern.codegen.passes.decide_assembly), `BuildOptions(assembly=...)` says
so, and `kernel.tune(X, ps)` measures both and keeps the faster. Nothing depends on timing
unless tune is called, and a sample's value never depends on the batch size.
"""

import threading

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import symkern as sk
from symkern.batching.kernel import TUNE_ROUNDS

x0, x1, a = sp.symbols("x0 x1 a")
EQS = {"v": sp.Matrix([sp.sin(x0) * a + x1, sp.tanh(x0 * x1), x1**2]), "s": sp.cos(x0) * a}


def build(**options):
    return sk.build_function(EQS, [x0, x1], params={"a": a}, dtype="float64",
                             options=sk.BuildOptions(**options) if options else None)


def reference(X, value):
    return {"v": np.stack([np.sin(X[..., 0]) * value + X[..., 1], np.tanh(X[..., 0] * X[..., 1]),
                           X[..., 1] ** 2], axis=-1),
            "s": np.cos(X[..., 0]) * value}


def assert_reference(out, X, value):
    want = reference(X, value)
    for key in want:
        np.testing.assert_allclose(out[key], want[key], rtol=1e-13, atol=1e-13)


def test_the_assembly_is_decided_at_build_time_and_never_measured_by_a_call():
    kernel = build()
    assert kernel.assembly == "fused" and kernel.tuned is None
    rng = np.random.default_rng(1)
    for n in (1, 63, 64, 65, 300, 2000):
        X = rng.normal(size=(n, 2))
        assert_reference(kernel(X, {"a": 0.5}), X, 0.5)
    assert kernel.assembly == "fused" and kernel.tuned is None
    assert "tune" not in kernel.timings


@pytest.mark.parametrize("choice", ["fused", "separate"])
def test_an_assembly_given_in_the_options_holds_at_every_batch(choice):
    kernel = build(assembly=choice)
    assert kernel.assembly == choice and kernel.options.assembly == choice
    for n in (1, 64, 5000):
        X = np.random.default_rng(n).normal(size=(n, 2))
        assert_reference(kernel(X, {"a": 0.25}), X, 0.25)
    assert kernel.assembly == choice


def test_a_sample_gets_the_same_bits_in_every_batch_size():
    kernel = sk.build_function(EQS, [x0, x1], params={"a": a})
    X = np.random.default_rng(7).normal(size=(4097, 2)).astype(np.float32)
    first = None
    for n in (1, 8, 63, 64, 65, 1023, 1024, 1025, 4095, 4096, 4097):
        out = kernel(X[:n], {"a": np.float32(0.5)})
        head = {key: np.asarray(value)[:1] for key, value in out.items()}
        if first is None:
            first = head
        for key in head:
            np.testing.assert_array_equal(head[key], first[key])


def test_tune_records_what_it_measured_and_chooses_by_it():
    kernel = build()
    X = np.random.default_rng(4).normal(size=(300, 2))
    report = kernel.tune(X, {"a": 0.5})
    assert report == kernel.tuned
    assert report["batch"] == 300 and report["rounds"] >= TUNE_ROUNDS
    assert 0 < report["fused_s"] < kernel.timings["tune"]
    assert 0 < report["separate_s"] < kernel.timings["tune"]
    faster = "fused" if report["fused_s"] <= report["separate_s"] else "separate"
    assert kernel.assembly == faster == report["assembly"]
    for n in (64, 300, 2000):  # every batch takes the tuned form, with the same values
        X = np.random.default_rng(n).normal(size=(n, 2))
        assert_reference(kernel(X, {"a": 0.5}), X, 0.5)


@pytest.mark.parametrize("start", ["fused", "separate"])
def test_tune_moves_shapes_that_ran_in_the_other_form(start, monkeypatch):
    kernel = build(assembly=start)
    X = np.random.default_rng(3).normal(size=(200, 2))
    assert_reference(kernel(X, {"a": 1.0}), X, 1.0)
    other = "separate" if start == "fused" else "fused"
    import symkern.batching.kernel as kernel_module

    # the other form always measures faster, so that the choice changes
    monkeypatch.setattr(kernel_module.time, "perf_counter", _clock_favouring(kernel, other))
    assert kernel.tune(X, {"a": 1.0})["assembly"] == other
    monkeypatch.undo()
    assert kernel.assembly == other and kernel.runs_fused == (other == "fused")
    assert_reference(kernel(X, {"a": 2.0}), X, 2.0)
    assert (tuple(X.shape) in kernel._direct_shapes) == (other == "fused")
    assert (tuple(X.shape) in kernel._separate_shapes) == (other == "separate")


def _clock_favouring(kernel, form):
    """A perf_counter under which `form`'s runs in `tune` take no time and the other's 1 s."""
    import time

    state = {"now": time.perf_counter(), "calls": 0}

    def clock():
        state["calls"] += 1
        state["now"] += 0.001
        return state["now"]

    original = kernel._execute_fused if form == "separate" else kernel._execute_separate

    def slow(*args, **kwargs):
        state["now"] += 1.0
        return original(*args, **kwargs)

    if form == "separate":
        kernel._execute_fused = slow
    else:
        kernel._execute_separate = slow
    return clock


def test_tune_compiles_each_form_once_and_later_calls_none(compile_events):
    kernel = build()
    rng = np.random.default_rng(3)
    X = rng.normal(size=(64, 2))
    kernel.tune(X, {"a": 0.5})
    # one executable; the entries' and the assembly's (compiled together, before timing)
    assert sorted(compile_events) == ["jit(_assemble_entries)", "jit(_compute_arguments)",
                                      "jit(_evaluate_arguments)"]
    compile_events.clear()
    for value in (0.25, 3.0):
        X = rng.normal(size=(64, 2))
        assert_reference(kernel(X, {"a": value}), X, value)
    assert compile_events == []


def test_threads_racing_the_first_large_call_agree():
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


def test_a_kernel_with_nothing_to_assemble_is_not_tuned():
    kernel = sk.build_function(sp.sin(x0) * a, [x0, x1], params={"a": a}, dtype="float64")
    report = kernel.tune(np.zeros((100, 2)), {"a": 1.0})
    assert report["rounds"] == 0 and kernel.tuned is None and kernel.runs_fused


# one kernel per choice, shared by the examples
KERNELS = {choice: build(assembly=choice) for choice in ("fused", "separate")}


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 3000), choice=st.sampled_from(["fused", "separate"]),
       value=st.floats(-3, 3))
def test_either_choice_computes_the_same_values(n, choice, value):
    kernel = KERNELS[choice]
    X = np.random.default_rng(n).normal(size=(n, 2))
    assert_reference(kernel(X, {"a": value}), X, value)


@pytest.mark.parametrize("choice", ["fused", "separate"])
def test_the_flat_form_follows_the_choice(choice):
    kernel = build(assembly=choice)
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
        got = kernel.program.assemble(entries, transpose_up_to)
        for key, value in want.items():
            assert np.shape(got[key]) == np.shape(value)
            np.testing.assert_array_equal(got[key], value)
    got = kernel.assemble(entries)  # the assembly executable's choice
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value)


WIDE_KERNEL = sk.build_function(WIDE, list(_SYMBOLS) + [x0], dtype="float64")


