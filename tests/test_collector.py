"""The collector pause (symkern.collector) around builds and derivatives: off inside, back as
it was after the outermost pause, also when the work raises or another thread still builds."""

import gc
import threading

import pytest
import sympy as sp

import symkern as sk
from symkern.codegen import pipeline
from symkern.collector import collection_paused


def test_collection_is_paused_inside_and_enabled_after_the_outermost():
    assert gc.isenabled()
    with collection_paused():
        assert not gc.isenabled()
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled():
    gc.disable()
    try:
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_collection_is_enabled_after_an_error_inside():
    try:
        with collection_paused():
            raise ValueError("inside")
    except ValueError:
        pass
    assert gc.isenabled()


def test_concurrent_pauses_enable_the_collector_when_the_last_ends():
    inside, release = threading.Event(), threading.Event()

    def other_build() -> None:
        with collection_paused():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other_build)
    thread.start()
    inside.wait(10)
    with collection_paused():
        pass
    assert not gc.isenabled()  # the other build still runs
    release.set()
    thread.join(10)
    assert gc.isenabled()


def test_a_build_runs_with_the_collector_paused_and_leaves_it_enabled(monkeypatch):
    seen = []
    emit = pipeline.emit

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return emit(*args, **kwargs)

    monkeypatch.setattr(pipeline, "emit", watched)
    x, y = sp.symbols("x y")
    sk.build_function(sp.sin(x) * y, [x, y])
    assert seen == [False] and gc.isenabled()


def test_builds_and_derivatives_restore_the_collector_when_they_raise():
    x = sp.Symbol("x")
    with pytest.raises(sk.BuildError):
        sk.build_function(x, [x], dtype="float17")
    assert gc.isenabled()
    with pytest.raises(sk.BuildError):
        sk.symbolic.jacobian(sp.zeros(2, 2), [x])
    assert gc.isenabled()


def test_a_derivative_runs_with_the_collector_paused():
    seen = []

    class recorded(sp.Function):  # noqa: N801 - a SymPy function's name
        def fdiff(self, argindex=1):
            seen.append(gc.isenabled())
            return sp.cos(self.args[0])

    x = sp.Symbol("x")
    assert sk.symbolic.jacobian(sp.Matrix([recorded(x)]), [x]) == sp.Matrix([[sp.cos(x)]])
    assert seen and not any(seen)
    assert gc.isenabled()
