"""Property: every random kernel (expressions, shapes, dtypes, parameter trees, hostile
names) agrees with SymPy's float64 evaluation. The strategy and the check live in
tools/fuzz.py; the long campaign is `python tools/fuzz.py --examples 2000` (or
SYMKERN_SLOW=1 here). Each finding becomes a test in test_fuzz_regressions.py.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings

_PATH = Path(__file__).resolve().parents[2] / "tools" / "fuzz.py"
_spec = importlib.util.spec_from_file_location("symkern_tools_fuzz", _PATH)
fuzz = sys.modules.setdefault("symkern_tools_fuzz", importlib.util.module_from_spec(_spec))
if not hasattr(fuzz, "run_case"):
    _spec.loader.exec_module(fuzz)

EXAMPLES = 400 if os.environ.get("SYMKERN_SLOW") else 15


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.filter_too_much])
@given(fuzz.cases())
def test_random_kernels_match_sympy(case):
    fuzz.run_case(case)


def test_hostile_names_include_the_brief():
    for name in ("x1", "ps", "jnp", "lambda", "__import__('os')", "_a0", "_c0", "_k0", "gate",
                 "functions", "a b", "it's", "λ_1"):
        assert name in fuzz.HOSTILE_NAMES
