"""The `jax_ffi` drift check (symkern.codegen.drift): what `BuildOptions(cpu_loop="c")`
assumes of JAX's FFI holds with the installed jaxlib, and a header that lost a name the loop
uses is reported as drift. Runs without a compiler."""

from __future__ import annotations

import jax

from symkern.codegen import drift


def _ffi_check() -> drift.DriftCheck:
    return next(check for check in drift.CHECKS if check.name == "jax_ffi")


def test_the_installed_ffi_is_what_the_loop_uses():
    result = drift.run_checks([_ffi_check()])[0]
    assert result.ok, result.message()


def test_a_header_without_the_handler_macro_is_drift(tmp_path, monkeypatch):
    api = tmp_path / "xla" / "ffi" / "api"
    api.mkdir(parents=True)
    (api / "ffi.h").write_text("struct ResultBuffer; typed_data dimensions Attr Bind Success")
    monkeypatch.setattr(jax.ffi, "include_dir", lambda: str(tmp_path))
    result = drift.run_checks([_ffi_check()])[0]
    assert not result.ok
    assert "no XLA_FFI_DEFINE_HANDLER_SYMBOL" in result.found
