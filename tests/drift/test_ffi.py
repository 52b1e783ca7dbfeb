"""What `BuildOptions(cpu_loop="c")` assumes of JAX's FFI (symkern.kernels.c_loop): the Python
functions it calls, with the parameters it passes, and the C++ header and macro the printed
loop includes (symkern.codegen.c_loop). Checked without a compiler."""

from __future__ import annotations

import inspect
from pathlib import Path

import jax


def test_the_ffi_functions_take_what_the_loop_passes():
    register = inspect.signature(jax.ffi.register_ffi_target).parameters
    assert {"name", "fn", "platform"} <= set(register)
    call = inspect.signature(jax.ffi.ffi_call).parameters
    assert {"target_name", "result_shape_dtypes", "vmap_method"} <= set(call)
    assert callable(jax.ffi.pycapsule)


def test_the_ffi_header_defines_what_the_loop_uses():
    header = Path(jax.ffi.include_dir()) / "xla" / "ffi" / "api" / "ffi.h"
    api = Path(jax.ffi.include_dir()) / "xla" / "ffi" / "api" / "api.h"
    assert header.is_file(), header
    text = header.read_text() + api.read_text()
    for name in ("XLA_FFI_DEFINE_HANDLER_SYMBOL", "ResultBuffer", "typed_data", "dimensions",
                 "Attr", "Bind", "Success"):
        assert name in text, name
