"""Stage timings are exposed and logged; the progress bar can be turned off."""

import logging

import numpy as np
import sympy as sp

import symkern as sk

x0, x1, a = sp.symbols("x0 x1 a")


def test_every_stage_is_timed_and_logged(caplog):
    with caplog.at_level(logging.INFO, logger="symkern"):
        kernel = sk.build_function(sp.sin(x0) * a + x1, [x0, x1], params={"a": a}, progress=False)
        kernel(np.ones((3, 2)), {"a": 1.0})
    for stage in ("cse", "emit", "rewrite", "python_compile", "trace", "lower", "xla_compile"):
        assert kernel.timings[stage] >= 0.0, stage
        assert any(f": {stage} took" in record.getMessage() for record in caplog.records), stage
    assert kernel.timings["build"] >= kernel.timings["emit"]


def test_progress_bar_is_drawn_only_when_asked(capsys):
    sk.build_function(x0 * 2, [x0], progress=True)
    assert "symkern build" in capsys.readouterr().err
    sk.build_function(x0 * 3, [x0], progress=False)
    assert capsys.readouterr().err == ""
