"""symkern.codegen.passes: the pipeline as data, and BuildOptions, the one value of a build.

The pass table in docs/codegen.md is the one `describe_passes()` prints; each pass reads the
body's form from `GeneratedCode.form`; every option is shown by `repr(kernel)`, kept on the
kernel and part of the codegen cache key.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import sympy as sp

import symkern as sk
from symkern.codegen import passes

DOCS = Path(__file__).resolve().parents[2] / "docs" / "codegen.md"
x0, x1, a = sp.symbols("x0 x1 a")


def test_docs_open_with_the_generated_pass_table():
    text = DOCS.read_text()
    table = re.search(r"<!-- passes:begin -->\n(.*?)\n<!-- passes:end -->", text, re.S)
    assert table is not None and table.group(1) == passes.describe_passes()
    assert text.index("<!-- passes:begin -->") < text.index("## Stage 1")


def test_the_passes_run_in_their_listed_order_and_name_a_gate_and_a_reason():
    names = [p.name for p in passes.PASSES]
    assert names == ["contract", "vectorize", "packed_sums", "interpret", "split", "materialize",
                     "scalar_factors", "decide_assembly", "polynomial_trig"]
    assert len(set(names)) == len(names)
    for step in passes.PASSES:
        assert step.gate and step.reason and step.changes
    assert [p.name for p in passes.PASSES[:passes.CACHED_PASSES]] == ["contract", "vectorize"]


def test_a_pass_whose_gate_is_closed_returns_the_program_unchanged():
    kernel = sk.build_function(sp.sin(x0) + x1, [x0, x1], dtype="float64")
    generated = kernel.program.generated
    context = passes.PassContext(kernel.options, 1)
    for step in passes.PASSES:
        if not step.opens(generated, context):
            assert step(generated, context) is generated


def test_the_form_is_a_field_not_a_name():
    kernel = sk.build_function(sp.Matrix([sp.sin(x0) * a, x1]), [x0, x1], params={"a": a})
    assert kernel.form == kernel.program.generated.form == "scalar"
    # a body that happens to use a generated-looking name keeps its form
    renamed = dataclasses.replace(kernel.program.generated,
                                  source=kernel.source.replace("_d0", "_levels"))
    assert renamed.form == "scalar"


def test_options_are_shown_kept_and_validated():
    options = sk.BuildOptions(contract=False, materialize=False, trig="library",
                              assembly="separate")
    kernel = sk.build_function(sp.Matrix([sp.sin(x0) * a, x1]), [x0, x1], params={"a": a},
                               options=options, cse=False)
    assert kernel.options.contract is False and kernel.options.cse is False
    assert kernel.options.trig == "library" and kernel.assembly == "separate"
    assert "BuildOptions(" in repr(kernel) and "contract=False" in repr(kernel)
    assert "separate assembly" in repr(kernel)
    with pytest.raises(sk.BuildError, match="trig: expected one of"):
        sk.BuildOptions(trig="fast")
    with pytest.raises(sk.BuildError, match="tile_chunk: expected a positive int"):
        sk.BuildOptions(tile_chunk=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.contract = True


def test_keyword_arguments_replace_the_options_fields():
    kernel = sk.build_function(x0 * a, [x0], params={"a": a},
                               options=sk.BuildOptions(cse=False, embed_max_bytes=8),
                               embed_max_bytes=64, dtype="float64")
    assert kernel.options.cse is False and kernel.options.embed_max_bytes == 64
    assert kernel.options.dtype == "float64"
    # a field given in options= holds unless a keyword replaces it
    kept = sk.build_function(x0 * a, [x0], params={"a": a},
                             options=sk.BuildOptions(dtype="float32"))
    assert kept.dtype == np.float32 and kept.options.dtype == "float32"
    snn = sk.StructuredNetwork(sk.Chain(sk.Dense(2, 40, "tanh"), sk.Linear(40, 1)))
    structured = sk.build_nn_function(snn.output, snn, options=sk.BuildOptions(dtype="float32"))
    assert structured.dtype == np.float32


def test_every_option_is_part_of_the_cache_key(tmp_path):
    """A cached build with other options is another entry (the contract switch was not)."""
    from symkern.codegen.contract import is_contracted

    x = list(sp.symbols("n0:5"))
    W = sp.Matrix(16, 5, lambda i, j: sp.Symbol(f"W_{i}_{j}"))
    eqs = sp.Matrix([sp.tanh(sum(W[i, j] * x[j] for j in range(5))) for i in range(16)])
    values = {"W": np.random.default_rng(0).normal(size=(16, 5))}
    sk.enable_cache(tmp_path)
    try:
        on = sk.build_function(eqs, x, params={"W": W}, dtype="float64")
        off = sk.build_function(eqs, x, params={"W": W}, dtype="float64",
                                options=sk.BuildOptions(contract=False))
        again = sk.build_function(eqs, x, params={"W": W}, dtype="float64",
                                  options=sk.BuildOptions(contract=False))
    finally:
        sk.disable_cache()
    assert on.form == "contracted" and is_contracted(on.program.generated.module)
    assert off.form == again.form == "scalar" and "tensordot" not in again.source
    assert "cache_load" in again.timings and "cache_load" not in off.timings
    X = np.random.default_rng(1).normal(size=(7, 5))
    np.testing.assert_allclose(on(X, values), again(X, values), rtol=1e-12)
    assert set(dataclasses.asdict(sk.BuildOptions())) == set(sk.BuildOptions().key())


def test_the_passes_sets_derive_from_the_one_callee_table():
    """A function added to CALLEE_TABLE is known to every pass by its row's fields."""
    from symkern.codegen import callee, contract, materialize, vectorize

    rows = callee.CALLEE_TABLE.values()
    assert {r.target for r in rows if r.vectorizable} <= vectorize.ELEMENTWISE
    assert contract.ELEMENTWISE == {r.target[4:] for r in rows if r.blockwise}
    assert {r.target for r in rows if r.costly} <= materialize.COSTLY_CALLS
    assert not {r.target for r in rows if not r.costly} & materialize.COSTLY_CALLS
    for row in rows:  # a row a pass may apply must be elementwise
        assert row.elementwise or not (row.vectorizable or row.blockwise), row
    assert "jnp.select" not in callee.ELEMENTWISE_TARGETS and "jnp.sin" in callee.ELEMENTWISE_TARGETS
    # the special functions symkern writes in JAX are costly: shared ones are computed once
    assert all(r.costly for r in rows if r.target.startswith("special."))
