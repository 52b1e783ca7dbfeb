"""The code-generation cache: a second process skips emit, CSE and rewrite, same results."""

import json
import subprocess
import sys
import textwrap

import numpy as np
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


def run(directory, script=SCRIPT):
    done = subprocess.run([sys.executable, "-c", script, str(directory)], capture_output=True,
                          text=True, timeout=600, check=True)
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


# ---- compiled pieces of split kernels --------------------------------------------------------

SPLIT_SCRIPT = textwrap.dedent("""
    import json, sys
    TERMS = 80
    import jax, numpy as np, sympy as sp, symkern as sk
    jax.config.update("jax_enable_x64", True)
    from symkern.batching import build
    from symkern.codegen import passes
    sk.enable_cache(sys.argv[1])
    xs = sp.symbols("x0:6"); a = sp.Symbol("a")
    # > 400 operations: compiled as pieces of 200 with the limits lowered (the defaults,
    # passes.SPLIT_ABOVE_OPERATIONS and PIECE_OPERATIONS, are higher) when not vectorized
    passes.SPLIT_ABOVE_OPERATIONS, build.PIECE_OPERATIONS = 400, 200
    eqs = sp.Matrix([sp.Add(*[sp.sin(xs[i % 6] * (i + 1 + k)) * a * xs[(i + k) % 6]
                              for i in range(TERMS)]) for k in range(2)])
    kernel = sk.build_function(eqs, xs, params={"a": a}, dtype="float64", vectorize=False)
    X = np.linspace(-1, 1, 18).reshape(3, 6)
    out = np.asarray(kernel(X, {"a": 1.5}))
    want = np.array([[sum(np.sin(X[n, i % 6] * (i + 1 + k)) * 1.5 * X[n, (i + k) % 6]
                          for i in range(TERMS)) for k in range(2)] for n in range(3)])
    # a traced call compiles the whole body's Python function then (lazily)
    traced = np.asarray(jax.jit(lambda X: kernel(X, {"a": 1.5}))(X))
    print(json.dumps({"timings": kernel.timings, "pieces": len(kernel._pieces.split.pieces),
                      "error": float(max(np.max(np.abs(out - want)),
                                         np.max(np.abs(traced - want))))}))
""")


def run_split(directory):
    return run(directory, SPLIT_SCRIPT)


def test_a_second_process_loads_the_compiled_pieces_and_neither_traces_nor_lowers(tmp_path):
    first = run_split(tmp_path)
    assert first["pieces"] > 1 and first["error"] < 1e-10
    assert "xla_compile" in first["timings"] and "executable_load" not in first["timings"]
    (stored,) = list((tmp_path / "executables").glob("*/*.npz"))
    with np.load(stored, allow_pickle=False) as archive:  # no pickle in it
        assert "manifest" in archive.files and "executable_0" in archive.files
    second = run_split(tmp_path)
    assert "executable_load" in second["timings"] and "trace_and_lower" not in second["timings"]
    assert second["error"] < 1e-10
    # an unreadable or altered entry is a cache miss, removed: compiled again, same values;
    # pieces JAX took from its own cache are not stored again (they would not load whole)
    content = stored.read_bytes()
    stored.write_bytes(content[:-9] + bytes([content[-9] ^ 1]) + content[-8:])
    third = run_split(tmp_path)
    assert "xla_compile" in third["timings"] and third["error"] < 1e-10
    assert not stored.exists()
    fourth = run_split(tmp_path)
    assert "executable_load" not in fourth["timings"] and fourth["error"] < 1e-10


VECTORIZED = textwrap.dedent("""
    import json, sys
    import numpy as np, sympy as sp, symkern as sk
    sk.enable_cache(sys.argv[1])
    xs = sp.symbols("x0:4"); a = sp.Symbol("a")
    eqs = sp.Matrix([sp.Add(*[sp.sin(xs[i % 4] * (i + k)) * a * xs[(i + k) % 4]
                              for i in range(20)]) for k in range(3)])
    kernel = sk.build_function(eqs, xs, params={"a": a}, vectorize=True)
    out = kernel(np.linspace(0, 1, 8, dtype=np.float32).reshape(2, 4), {"a": 2.0})
    print(json.dumps({"timings": kernel.timings, "source": kernel.source,
                      "out": np.asarray(out).tolist(),
                      "tables": {c.name: str(np.asarray(c.value).dtype) for c in kernel.const_args}}))
""")


def test_a_vectorized_body_and_its_index_tables_come_back_from_the_cache(tmp_path):
    first = run(tmp_path, VECTORIZED)
    second = run(tmp_path, VECTORIZED)
    assert "vectorize" in first["timings"] and "cache_load" in second["timings"]
    assert "vectorize" not in second["timings"]
    assert "vec.chunked" in second["source"] and second["source"] == first["source"]
    assert second["tables"] == first["tables"] and "int32" in second["tables"].values()
    assert second["out"] == first["out"]


@pytest.mark.parametrize("source, complaint", [
    ("def kernel(x1):\n    def _levels(_R):\n        import os\n        return _R\n    return (x1,)",
     "unexpected statement"),
    ("def kernel(x1):\n    @jnp.vectorize\n    def _levels(_R):\n        return _R\n    return (x1,)",
     "unexpected signature"),
    ("def kernel(x1):\n    def _levels(_R, n=1):\n        return _R\n    return (x1,)",
     "unexpected signature"),
    ("def kernel(x1):\n    def _levels(_R):\n        return open\n    return (x1,)",
     "unexpected name 'open'"),
])
def test_the_cache_refuses_local_functions_that_are_not_plain(source, complaint):
    import ast

    from symkern.codegen.cache import verify_kernel_module
    from symkern.errors import CodegenDriftError

    with pytest.raises(CodegenDriftError, match=complaint):
        verify_kernel_module(ast.parse(source))
    verify_kernel_module(ast.parse(
        "def kernel(x1):\n    def _levels(_R):\n        _g0 = jnp.sin(_R)\n        return _g0\n"
        "    return (vec.chunked(_levels, x1),)"))
