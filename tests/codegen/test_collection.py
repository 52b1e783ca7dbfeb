"""The garbage collector is paused while a build runs and enabled again after it."""

import gc
import threading

import sympy as sp

import symkern as sk
from symkern.codegen import pipeline
from symkern.codegen.collection import collection_paused


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
