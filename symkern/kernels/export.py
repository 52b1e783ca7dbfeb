"""kernels: export a kernel without its constants, and load it back with them supplied;
save it with them in one file, and load that.

Imports jax, numpy, json, hashlib, symkern.kernels.values and symkern.errors. The blob is a
JSON header and jax.export's serialized module, bound together by a digest; the file is a
numpy .npz archive read without pickle. Nothing in either is ever evaluated as Python.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap, sequential_vmap

from symkern.errors import ArgumentError, ConstArgsError, DtypeMismatchError
from symkern.kernels.values import as_real_array, broadcast_data

MAGIC = b"SYMKERN-EXPORT\n"
#: 2: the header holds a digest over itself and the program
FORMAT = 2
#: the one-file form (`kernel.save`): an .npz archive of the blob, the const args, a manifest
SAVED_FORMAT = 1
SAVED_KIND = "symkern kernel"
#: the dtypes a kernel computes in
KERNEL_DTYPES = ("float32", "float64", "complex64", "complex128")
#: the dtypes a header may name (a kernel's; const args may be index tables)
_DTYPES = frozenset({*KERNEL_DTYPES, "int32", "int64", "uint8", "bool"})


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
    program = bytes(exported.serialize(vjp_order=1))
    header["sha256"] = _blob_digest(header, program)
    encoded = json.dumps(header, sort_keys=True).encode()
    return MAGIC + len(encoded).to_bytes(8, "little") + encoded + program


def _blob_digest(header: dict[str, Any], program: bytes) -> str:
    fields = {name: value for name, value in header.items() if name != "sha256"}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode() + b"\0")
    digest.update(program)
    return digest.hexdigest()


def _batched_leaves(exported: Any, batch_rank: int) -> list[bool]:
    """Per output leaf of an exported kernel, whether it leads with the batch axes: those
    with a symbolic size do (an unbatched equation of `constant_outputs="unbatched"` has
    none)."""
    return [batch_rank > 0 and any(not isinstance(d, int) for d in aval.shape)
            for aval in exported.out_avals]


def _map_batched(function: Any, tree: Any, batched: list[bool]) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return jax.tree_util.tree_unflatten(
        treedef, [function(leaf) if flag else leaf for leaf, flag in zip(leaves, batched, strict=True)])


def _vmappable_call(call: Any, batch_rank: int, batched: list[bool]) -> Any:
    """The exported `call(const_args, data, ps)` with a batching rule: `jax.vmap` folds a
    mapped axis of the data into the first batch axis of the exported program (whose batch
    sizes are symbolic), where the program has one and only data is mapped; otherwise the
    mapped axis runs as a loop (`lax.map`). Reverse mode goes through the exported
    program's own derivative (its forward pass runs again in the backward pass), as a loop
    over a mapped axis: `jax.export` has no batching rule for an exported call."""

    @custom_vmap
    def folded(const_args: tuple, data: tuple, ps: Any) -> Any:
        return call(const_args, data, ps)

    @folded.def_vmap
    def fold(axis_size: int, in_batched: tuple, const_args: tuple, data: tuple,
             ps: Any) -> tuple[Any, Any]:
        const_batched, data_batched, ps_batched = in_batched
        if (batch_rank and all(data_batched) and not any(const_batched)
                and not any(jax.tree_util.tree_leaves(ps_batched))):
            merged = tuple(d.reshape((axis_size * d.shape[1],) + d.shape[2:]) for d in data)
            out = call(const_args, merged, ps)
            out = _map_batched(lambda leaf: leaf.reshape((axis_size, leaf.shape[0] // axis_size)
                                                         + leaf.shape[1:]), out, batched)
            return out, _map_batched(lambda _: True, jax.tree_util.tree_map(lambda _: False, out),
                                     batched)
        else:
            def one(k: Any) -> Any:
                pick = lambda tree, mapped: jax.tree_util.tree_map(  # noqa: E731
                    lambda leaf, m: jnp.asarray(leaf)[k] if m else leaf, tree, mapped)
                return call(pick(const_args, const_batched), pick(data, data_batched),
                            pick(ps, ps_batched))

            out = jax.lax.map(one, jnp.arange(axis_size))
        return out, jax.tree_util.tree_map(lambda _: True, out)

    @jax.custom_vjp
    def vmappable(const_args: tuple, data: tuple, ps: Any) -> Any:
        return folded(const_args, data, ps)

    def forward(const_args: tuple, data: tuple, ps: Any) -> tuple[Any, Any]:
        return folded(const_args, data, ps), (const_args, data, ps)

    @sequential_vmap
    def backward_pass(inputs: tuple, cotangent: Any) -> tuple:
        return jax.vjp(call, *inputs)[1](cotangent)

    def backward(inputs: tuple, cotangent: Any) -> tuple:
        return backward_pass(inputs, cotangent)

    vmappable.defvjp(forward, backward)
    return vmappable


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
        self._vmappable: Any = None
        self._batch_rank = header["data"][0]["shape"].count(None) if header["data"] else 0
        self._batched = _batched_leaves(exported, self._batch_rank)

    def __call__(self, *args: Any) -> Any:
        _check_x64(self.header)
        count = len(self.header["data"])
        has_params = len(args) == count + 1
        if len(args) not in (count, count + 1):
            raise ArgumentError(f"loaded kernel: expected {count} data argument(s) and ps, "
                                f"got {len(args)} argument(s)")
        data = tuple(jnp.asarray(as_real_array(a, f"x{k + 1}", self.dtype))
                     for k, a in enumerate(args[:count]))
        data = self._broadcast(data)
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
            out = self._call(self.const_args, data, ps)
            return _map_batched(lambda leaf: leaf[tuple(slice(0, n) for n in batch)], out,
                                self._batched)
        return self._call(self.const_args, data, ps)

    def _broadcast(self, data: tuple) -> tuple:
        """Data arrays broadcast to one batch shape (`broadcast_data`), where each has at
        least its per-sample rank; one number for a 1×1 argument taken as its one entry."""
        specs = self.header["data"]
        per_sample = [[d for d in spec["shape"] if d is not None] for spec in specs]
        data = tuple(array.reshape(shape) if not array.shape and math.prod(shape) == 1
                     else array for array, shape in zip(data, per_sample, strict=True))
        if any(array.ndim < len(shape) for array, shape in zip(data, per_sample, strict=True)):
            return data  # the shape check names it
        batches = [tuple(array.shape[:array.ndim - len(shape)])
                   for array, shape in zip(data, per_sample, strict=True)]
        return broadcast_data(data, batches, [f"x{k + 1}" for k in range(len(data))])

    @property
    def _call(self) -> Any:
        if self._vmappable is None:
            self._vmappable = _vmappable_call(self.exported.call, self._batch_rank, self._batched)
        return self._vmappable

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
            array = jnp.asarray(as_real_array(leaf, label, self.dtype))
            if array.shape != shape:
                if (len(shape) == 1 and array.shape == (shape[0], 1)
                        or not array.shape and math.prod(shape) == 1):
                    array = array.reshape(shape)  # an m x 1 leaf given as a column, or 1 x 1 as one number
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


def _refuse(what: str) -> ArgumentError:
    return ArgumentError(f"blob: expected bytes from kernel.export(...); {what}")


def _checked_header(header: Any) -> dict[str, Any]:
    """The header's fields, each of the kind export_function writes, or an ArgumentError."""
    def shape(value: Any, batch: bool = False) -> bool:
        return isinstance(value, list) and all(
            (type(n) is int and n >= 0) or (batch and n is None) for n in value)

    def entries(value: Any, fields: dict[str, Callable[[Any], bool]]) -> bool:
        return isinstance(value, list) and all(
            isinstance(item, dict) and all(check(item.get(name)) for name, check in fields.items())
            for item in value)

    text, dtype = (lambda v: isinstance(v, str)), (lambda v: v in _DTYPES)
    checks = {
        "dtype": lambda v: v in KERNEL_DTYPES,
        "x64": lambda v: isinstance(v, bool),
        "const_args": lambda v: entries(v, {"name": text, "origin": text, "shape": shape,
                                            "dtype": dtype}),
        "data": lambda v: entries(v, {"shape": lambda s: shape(s, batch=True), "dtype": dtype}),
        "params": lambda v: isinstance(v, list) and all(map(text, v)),
    }
    for name, check in checks.items():
        if not check(header.get(name)):
            raise _refuse(f"its header's {name!r} field is malformed")
    return header


def _parse_blob(blob: bytes) -> tuple[dict[str, Any], bytes]:
    start = len(MAGIC)
    if len(blob) < start + 8:
        raise _refuse(f"got {len(blob)} bytes, too few for a header")
    length = int.from_bytes(blob[start:start + 8], "little")
    if length > len(blob) - start - 8:
        raise _refuse("it is truncated (its header runs past its end)")
    try:
        header = json.loads(blob[start + 8:start + 8 + length])
    except ValueError:
        raise _refuse("its header is not JSON (the blob is damaged)") from None
    if not isinstance(header, dict):
        raise _refuse("its header is not a JSON object (the blob is damaged)")
    if header.get("format") != FORMAT:
        raise ArgumentError(f"blob: unsupported export format {header.get('format')!r} "
                            f"(this symkern reads format {FORMAT}); export the kernel again")
    program = blob[start + 8 + length:]
    if header.get("sha256") != _blob_digest(header, program):
        raise _refuse("its digest does not match its content (the blob is damaged or altered)")
    return _checked_header(header), program


def _deserialized(program: bytes, header: dict[str, Any]) -> Any:
    try:
        exported = jax.export.deserialize(bytearray(program))
        parts = exported.in_tree.children()[0].children()
        counts = [len(parts[0].children()), len(parts[1].children()), parts[2].num_leaves]
    except Exception as error:  # noqa: BLE001 - whatever the deserializer raises on bad bytes
        raise _refuse(f"its program cannot be read ({type(error).__name__})") from None
    if counts != [len(header["const_args"]), len(header["data"]), len(header["params"])]:
        raise _refuse("its program's arguments do not match its header")
    return exported


def load(source: bytes | str | os.PathLike, const_args: Sequence[Any] | None = None
         ) -> LoadedKernel:
    """Load a kernel: the bytes of `kernel.export(...)` with its `const_args`, or the path
    of a file `kernel.save(path)` wrote, which holds its const args itself.

    For a blob, pass `kernel.const_args` (or arrays of the same shapes and dtypes, in
    order). A damaged or altered blob or file is an ArgumentError, never a wrong kernel.
    """
    if isinstance(source, (str, os.PathLike)):
        if const_args is not None:
            raise ConstArgsError("const_args: a kernel saved with kernel.save holds its const "
                                 "args; pass only the path")
        return _load_saved(Path(source))
    if not isinstance(source, (bytes, bytearray)) or not bytes(source).startswith(MAGIC):
        raise ArgumentError("blob: expected bytes from kernel.export(...) or the path of a "
                            "file from kernel.save(path)")
    header, program = _parse_blob(bytes(source))
    _check_x64(header)
    values = _checked_const_args(header, const_args)
    return LoadedKernel(header, _deserialized(program, header), values)


def _checked_const_args(header: dict[str, Any], const_args: Sequence[Any] | None) -> tuple:
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
    return tuple(values)


# ---- one file: the blob and its const args -------------------------------------------------

def _saved_digest(program: bytes, arrays: Sequence[np.ndarray]) -> str:
    digest = hashlib.sha256(b"symkern saved kernel\0")
    digest.update(hashlib.sha256(program).digest())
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(json.dumps([array.dtype.str, list(array.shape)]).encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def example_arguments(data_shapes: Sequence[tuple[int, ...]], parameter_treedef: Any,
                      parameter_shapes: Sequence[tuple[int, ...]], dtype: np.dtype) -> tuple:
    """Zeros for each data argument with one batch dimension, then the parameter tree
    (when `parameter_treedef` is not None): what `kernel.save(path)` exports with."""
    data = tuple(np.zeros((1, *shape), dtype) for shape in data_shapes)
    if parameter_treedef is None:
        return data
    leaves = [np.zeros(shape, dtype) for shape in parameter_shapes]
    return (*data, jax.tree_util.tree_unflatten(parameter_treedef, leaves))


def save_file(path: str | os.PathLike, blob: bytes, const_args: Sequence[Any]) -> Path:
    """Write `blob` (from `export_function`) and its const args to one .npz file at `path`.

    The archive holds `program` (the blob's bytes), `const_0`, `const_1`, ... (the arrays)
    and `manifest` (JSON: kind, format, const-arg count and a digest over all of them);
    `np.load(path, allow_pickle=False)` reads every part.
    """
    arrays = [np.asarray(getattr(c, "value", c)) for c in const_args]
    program = bytes(blob)
    manifest = {"kind": SAVED_KIND, "format": SAVED_FORMAT, "const_args": len(arrays),
                "sha256": _saved_digest(program, arrays)}
    parts = {"manifest": np.frombuffer(json.dumps(manifest).encode(), np.uint8),
             "program": np.frombuffer(program, np.uint8)}
    parts.update({f"const_{k}": array for k, array in enumerate(arrays)})
    path = Path(path)
    with open(path, "wb") as handle:
        np.savez(handle, **parts)
    return path


def _load_saved(path: Path) -> LoadedKernel:
    def refuse(what: str) -> ArgumentError:
        return ArgumentError(f"path: {str(path)!r} is not a kernel saved by kernel.save(path): "
                             f"{what}")

    try:
        with open(path, "rb") as handle:
            content = handle.read()
    except OSError as error:
        raise ArgumentError(f"path: {str(path)!r} cannot be read "
                            f"({error.strerror or error})") from None
    try:
        with np.load(io.BytesIO(content), allow_pickle=False) as stored:
            names = set(stored.files)
            manifest = json.loads(stored["manifest"].tobytes()) if "manifest" in names else None
            if not isinstance(manifest, dict) or manifest.get("kind") != SAVED_KIND:
                raise refuse("it has no symkern manifest")
            if manifest.get("format") != SAVED_FORMAT:
                raise refuse(f"unsupported format {manifest.get('format')!r}; save it again")
            count = manifest.get("const_args")
            expected = {"manifest", "program"} | {f"const_{k}" for k in range(count)} \
                if type(count) is int and 0 <= count <= len(names) else None
            if names != expected:
                raise refuse("its parts are not a program, a manifest and const args")
            program = stored["program"]
            if program.dtype != np.uint8 or program.ndim != 1:
                raise refuse("its program is not bytes")
            program = program.tobytes()
            arrays = [stored[f"const_{k}"] for k in range(count)]
    except ArgumentError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever numpy and zipfile raise on bad bytes
        raise refuse(f"it is damaged ({type(error).__name__}: {str(error)[:120]})") from None
    if manifest.get("sha256") != _saved_digest(program, arrays):
        raise refuse("its digest does not match its content (the file is damaged or altered)")
    return load(program, arrays)
