"""The collector pause around builds and derivatives (symkern.symbolic.allocation): the
collector is off inside, back as it was after, also when the work raises."""

from __future__ import annotations

import gc

import pytest
import sympy as sp

import symkern as sk
from symkern.symbolic.allocation import paused_collection


def test_the_collector_is_paused_inside_and_restored_after():
    assert gc.isenabled()
    with paused_collection():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled():
    gc.disable()
    try:
        with paused_collection():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


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
