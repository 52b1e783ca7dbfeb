"""kernels: export a kernel without its constants, and load it back with them supplied.

Imports jax, numpy, json and symkern.errors. The blob is a JSON header and jax.export's
serialized module; nothing in it is ever evaluated as Python.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from symkern.errors import ArgumentError, ConstArgsError, DtypeMismatchError

MAGIC = b"SYMKERN-EXPORT\n"
FORMAT = 1


def _spec(array: Any) -> dict[str, Any]:
    return {"shape": list(np.shape(array)), "dtype": np.dtype(array.dtype).name}


def export_function(
    function: Callable[[tuple, tuple, Any], Any],
    const_args: Sequence[Any],
    const_descriptions: Sequence[dict[str, Any]],
    data: Sequence[Any],
    per_sample_ranks: Sequence[int],
    ps: Any,
    dtype: np.dtype,
    parameter_labels: Sequence[str] = (),
) -> bytes:
    """Serialize `function(const_args, data, ps)` with a symbolic batch shape, and its
    first-order derivative (so `jax.grad` goes through the loaded kernel).

    The const args are ordinary exported arguments, so the blob holds their shapes and
    dtypes, never their values. `parameter_labels` name the `ps` leaves in errors.
    """
    batch_rank = len(np.shape(data[0])) - per_sample_ranks[0] if data else 0
    batch = ",".join(f"b{k}" for k in range(batch_rank))
    symbolic = jax.export.symbolic_shape(batch) if batch_rank else ()
    data_specs = tuple(
        jax.ShapeDtypeStruct(tuple(symbolic) + tuple(np.shape(d))[batch_rank:], d.dtype)
        for d in data
    )
    const_specs = tuple(jax.ShapeDtypeStruct(np.shape(c), c.dtype) for c in const_args)
    ps_specs = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), ps)
    exported = jax.export.export(jax.jit(function))(const_specs, data_specs, ps_specs)
    header = {
        "format": FORMAT,
        "dtype": np.dtype(dtype).name,
        "x64": bool(jax.config.jax_enable_x64),
        "const_args": [dict(description, **_spec(c))
                       for description, c in zip(const_descriptions, const_args, strict=True)],
        "data": [{"shape": [None] * batch_rank + list(np.shape(d))[batch_rank:],
                  "dtype": np.dtype(d.dtype).name} for d in data],
        "params": list(parameter_labels),
    }
    encoded = json.dumps(header, sort_keys=True).encode()
    return (MAGIC + len(encoded).to_bytes(8, "little") + encoded
            + bytes(exported.serialize(vjp_order=1)))


class LoadedKernel:
    """An exported kernel loaded back, with its const args supplied by the caller.

    Call it like the kernel it came from: `loaded(*data, ps)`.
    """

    def __init__(self, header: dict[str, Any], exported: Any, const_args: tuple[Any, ...]) -> None:
        self.header = header
        self.exported = exported
        self.const_args = const_args
        self.dtype = np.dtype(header["dtype"])
        # the exported function's arguments are ((const_args, data, ps), {})
        self._ps_treedef = exported.in_tree.children()[0].children()[2]
        avals = exported.in_avals  # const args, data, then the ps leaves
        self._ps_shapes = [tuple(aval.shape)
                           for aval in avals[len(avals) - self._ps_treedef.num_leaves:]]

    def __call__(self, *args: Any) -> Any:
        _check_x64(self.header)
        count = len(self.header["data"])
        has_params = len(args) == count + 1
        if len(args) not in (count, count + 1):
            raise ArgumentError(f"loaded kernel: expected {count} data argument(s) and ps, "
                                f"got {len(args)} argument(s)")
        data = tuple(jnp.asarray(a, self.dtype) for a in args[:count])
        for k, (array, spec) in enumerate(zip(data, self.header["data"], strict=True)):
            expected = spec["shape"]
            if len(array.shape) != len(expected) or any(
                    e is not None and e != d for e, d in zip(expected, array.shape, strict=True)):
                shown = ", ".join("b" if e is None else str(e) for e in expected)
                raise ArgumentError(f"x{k + 1}: this kernel was exported for shape ({shown}), "
                                    f"got {tuple(array.shape)}")
        ps = self._parameters(args[count] if has_params else None)
        batch = data[0].shape[:self.header["data"][0]["shape"].count(None)] if data else ()
        if 0 in batch:
            # symbolic batch sizes are at least 1: run one sample of zeros, keep none of it
            ones = tuple(max(n, 1) for n in batch)
            data = tuple(jnp.zeros(ones + a.shape[len(batch):], a.dtype) for a in data)
            out = self.exported.call(self.const_args, data, ps)
            return jax.tree_util.tree_map(
                lambda leaf: leaf[tuple(slice(0, n) for n in batch)], out)
        return self.exported.call(self.const_args, data, ps)

    def _parameters(self, ps: Any) -> Any:
        """`ps` as the exported function takes it, checked against its tree and shapes."""
        leaves, treedef = jax.tree_util.tree_flatten(ps)
        if treedef != self._ps_treedef:
            try:
                leaves = self._ps_treedef.flatten_up_to(ps)
            except (ValueError, TypeError) as error:
                raise ArgumentError(f"ps: expected a tree of the structure {self._ps_treedef}, "
                                    f"got {treedef}") from error
        labels = self.header.get("params") or [f"ps leaf {k}" for k in range(len(leaves))]
        arrays = []
        for label, leaf, shape in zip(labels, leaves, self._ps_shapes, strict=True):
            array = jnp.asarray(leaf, self.dtype)
            if array.shape != shape:
                if len(shape) == 1 and array.shape == (shape[0], 1):
                    array = array.reshape(shape)  # an m x 1 leaf given as a column
                else:
                    raise ArgumentError(f"{label}: expected shape {shape}, got {array.shape}")
            arrays.append(array)
        return jax.tree_util.tree_unflatten(self._ps_treedef, arrays)

    def __repr__(self) -> str:
        return (f"LoadedKernel({len(self.header['data'])} data argument(s), "
                f"{len(self.const_args)} const arg(s), {self.dtype.name})")


def _check_x64(header: dict[str, Any]) -> None:
    if header["x64"] != bool(jax.config.jax_enable_x64):
        raise DtypeMismatchError(
            f"this kernel was lowered with jax_enable_x64={header['x64']} and is executed with "
            f"jax_enable_x64={bool(jax.config.jax_enable_x64)}; the dtype policy at lowering must "
            "equal the one at execution (set jax.config.update('jax_enable_x64', ...))"
        )


def load(blob: bytes, const_args: Sequence[Any] | None = None) -> LoadedKernel:
    """Load an exported kernel; `const_args` must be the ones it was exported with.

    Pass `kernel.const_args` (or arrays of the same shapes and dtypes, in order).
    """
    if not isinstance(blob, (bytes, bytearray)) or not bytes(blob).startswith(MAGIC):
        raise ArgumentError("blob: expected bytes from kernel.export(...)")
    blob = bytes(blob)
    start = len(MAGIC)
    length = int.from_bytes(blob[start:start + 8], "little")
    header = json.loads(blob[start + 8:start + 8 + length])
    if header.get("format") != FORMAT:
        raise ArgumentError(f"blob: unsupported export format {header.get('format')!r}")
    _check_x64(header)
    expected = header["const_args"]
    described = ", ".join(f"{c['name']}: {c['dtype']}{c['shape']} ({c['origin']})" for c in expected)
    supplied = tuple(const_args or ())
    if len(supplied) != len(expected):
        raise ConstArgsError(
            f"const_args: this kernel was exported without its {len(expected)} const arg(s) "
            f"[{described}]; got {len(supplied)}. Pass const_args=kernel.const_args."
        )
    values = []
    for description, value in zip(expected, supplied, strict=True):
        array = getattr(value, "value", value)
        shape, dtype = list(np.shape(array)), np.dtype(getattr(array, "dtype", np.float64)).name
        if shape != description["shape"] or dtype != description["dtype"]:
            raise ConstArgsError(
                f"const_args: {description['name']} expected {description['dtype']}"
                f"{description['shape']}, got {dtype}{shape}"
            )
        values.append(jax.device_put(array))
    exported = jax.export.deserialize(bytearray(blob[start + 8 + length:]))
    return LoadedKernel(header, exported, tuple(values))
