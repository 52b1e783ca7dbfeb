"""The code-generation cache: a second process skips emit, CSE and rewrite, same results."""

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, sympy as sp, symkern as sk
    sk.enable_cache(sys.argv[1])
    xs = sp.symbols("x0:4"); a = sp.Symbol("a")
    table = sp.Function("first")
    eqs = {"sum": sp.Add(*[sp.sin(xs[i % 4] * (i + 1)) * a for i in range(60)]),
           "table": table(sp.Array([0.5 * k for k in range(10)]), xs[0])}
    kernel = sk.build_function(eqs, xs, params={"a": a}, dtype="float32",
                               functions={"first": lambda t, v: t[3] * v})
    out = kernel(np.linspace(0, 1, 8, dtype=np.float32).reshape(2, 4), {"a": 2.0})
    print(json.dumps({"timings": kernel.timings, "source": kernel.source,
                      "sum": np.asarray(out["sum"]).tolist(),
                      "table": np.asarray(out["table"]).tolist(),
                      "const_args": [c.name for c in kernel.const_args]}))
""")


def run(directory):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(directory)], capture_output=True,
                          text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_generated_code_from_the_cache(tmp_path):
    first = run(tmp_path)
    second = run(tmp_path)
    assert "cse" in first["timings"] and "cache_load" not in first["timings"]
    assert "cache_load" in second["timings"] and "cse" not in second["timings"]
    assert second["source"] == first["source"]
    assert second["sum"] == pytest.approx(first["sum"]) and second["table"] == first["table"]
    assert second["const_args"] == first["const_args"] == ["_k0"]
    assert any((tmp_path / "xla").iterdir())


def test_a_corrupted_cache_entry_is_refused(tmp_path):
    run(tmp_path)
    (meta,) = list((tmp_path / "codegen").glob("*/*/meta.json"))
    entry = json.loads(meta.read_text())
    entry["source"] = "import os\n" + entry["source"]
    meta.write_text(json.dumps(entry))
    with pytest.raises(subprocess.CalledProcessError) as failure:
        run(tmp_path)
    assert "codegen cache: expected one kernel function definition" in failure.value.stderr
