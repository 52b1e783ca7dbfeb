"""A loaded kernel (`symkern.load(kernel.export(...), kernel.const_args)`) behaves like the
kernel it came from: gradients through it, an empty batch, checked parameters. References:
the kernel itself and hand-written jax.numpy."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import symkern as sk

x0, x1, a = sp.symbols("x0 x1 a")
W = sp.MatrixSymbol("W", 2, 2)


@pytest.fixture(scope="module")
def pair():
    eqs = [sp.sin(x0) * a + x1**2, W * sp.Matrix([x0, x1])]
    kernel = sk.build_function(eqs, [x0, x1], params={"a": a, "W": W})
    ps = {"a": np.float32(2.0), "W": np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)}
    X = np.random.default_rng(0).normal(size=(6, 2)).astype(np.float32)
    return kernel, sk.load(kernel.export(X, ps), kernel.const_args), ps, X


def _hand(X, ps):
    return [jnp.sin(X[..., 0]) * ps["a"] + X[..., 1] ** 2, X @ ps["W"].T]


def test_gradients_through_a_loaded_kernel(pair) -> None:
    kernel, loaded, ps, X = pair

    def loss(f):
        return lambda X, ps: sum(jnp.sum(leaf**2) for leaf in f(X, ps))

    for argnums in (0, 1):
        expected = jax.grad(loss(_hand), argnums)(X, ps)
        for f in (kernel, loaded, jax.jit(loaded)):
            got = jax.grad(loss(f), argnums)(X, ps)
            for e, g in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(got),
                            strict=True):
                np.testing.assert_allclose(g, e, rtol=2e-5, atol=1e-5)


@given(batch=st.lists(st.integers(0, 3), min_size=1, max_size=3))
@settings(max_examples=15, deadline=None)
def test_loaded_kernel_takes_every_batch_of_its_rank(pair, batch) -> None:
    """The batch sizes are symbolic (`b0 >= 1` for jax.export); an empty batch still comes
    back empty, in the kernel's shapes."""
    kernel, _, ps, X = pair
    example = np.zeros(tuple(batch) + (2,), np.float32)
    loaded = sk.load(kernel.export(example, ps), kernel.const_args)
    data = np.random.default_rng(len(batch)).normal(size=tuple(batch) + (2,)).astype(np.float32)
    expected, got = kernel(data, ps), loaded(data, ps)
    for e, g in zip(expected, got, strict=True):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)


def test_loaded_kernel_checks_its_parameters(pair) -> None:
    _, loaded, ps, X = pair
    with pytest.raises(sk.ArgumentError, match=r"ps: expected a tree of the structure"):
        loaded(X, {"a": 1.0})
    with pytest.raises(sk.ArgumentError, match=r'ps\["W"\]: expected shape \(2, 2\), got \(3,\)'):
        loaded(X, {"a": 1.0, "W": np.ones(3)})
    with pytest.raises(sk.ArgumentError, match=r'ps\["a"\]: expected shape \(\), got \(1,\)'):
        loaded(X, {"a": [1.0], "W": ps["W"]})
    np.testing.assert_allclose(loaded(X, {"a": 2, "W": ps["W"].tolist()})[0],
                               loaded(X, ps)[0], rtol=1e-6)


# ---- arguments are checked as the kernel checks them ---------------------------------------

@pytest.mark.parametrize(("data", "pattern"), [
    ("complex", r"x1: expected real numbers, got dtype complex64"),
    (None, r"x1: expected an array of real numbers, got NoneType None"),
    (np.array([object(), object()]), r"x1: expected an array of real numbers, got object"),
    ("ab", r"x1: expected real numbers, got dtype str64"),
    ([[1.0, 2.0], [3.0]], r"x1: expected an array of numbers, got a ragged list"),
])
def test_a_loaded_kernel_refuses_data_as_the_kernel_does(pair, data, pattern) -> None:
    kernel, loaded, ps, X = pair
    value = X + 1j if isinstance(data, str) and data == "complex" else data
    for f in (kernel, loaded):
        with pytest.raises(sk.ArgumentError, match=pattern):
            f(value, ps)


def test_a_loaded_kernel_refuses_a_string_parameter(pair) -> None:
    kernel, loaded, ps, X = pair
    for f in (kernel, loaded):
        with pytest.raises(sk.ArgumentError,
                           match=r"ps\[\"a\"\]: expected real numbers, got dtype str32"):
            f(X, {"a": "2", "W": ps["W"]})
        np.testing.assert_allclose(f(X, {"a": sp.pi, "W": ps["W"]})[0],
                                   np.sin(X[:, 0]) * np.pi + X[:, 1] ** 2, rtol=1e-6)


# ---- damaged and altered blobs -------------------------------------------------------------

@pytest.fixture(scope="module")
def blob(pair):
    kernel, _, ps, X = pair
    return kernel.export(X, ps)


def _header_end(blob: bytes) -> int:
    start = len(b"SYMKERN-EXPORT\n")
    return start + 8 + int.from_bytes(blob[start:start + 8], "little")


@pytest.mark.parametrize("damage", [
    lambda b: b[:10],
    lambda b: b[:20],
    lambda b: b[:_header_end(b) - 5],
    lambda b: b[:_header_end(b) + 100],
    lambda b: b[:-1],
    lambda b: b[:15] + (10**9).to_bytes(8, "little") + b[23:],
    lambda b: b[:15] + (2).to_bytes(8, "little") + b[23:],
    lambda b: b[:15] + (6).to_bytes(8, "little") + b"[1, 2]" + b[_header_end(b):],
    lambda b: b[:25] + bytes([b[25] ^ 0x80]) + b[26:],
    lambda b: b[:-50] + bytes([b[-50] ^ 1]) + b[-49:],
    lambda b: b.replace(b'"params"', b'"paramz"', 1),
], ids=["magic-only", "header-cut", "header-truncated", "program-truncated", "last-byte",
        "length-huge", "length-small", "header-list", "header-not-utf8", "program-byte",
        "header-field"])
def test_a_damaged_or_altered_blob_is_an_argument_error(pair, blob, damage) -> None:
    kernel = pair[0]
    with pytest.raises(sk.ArgumentError, match=r"^blob: "):
        sk.load(damage(blob), kernel.const_args)


def test_a_blob_without_the_digest_field_is_refused(blob) -> None:
    import json

    end = _header_end(blob)
    header = json.loads(blob[23:end])
    del header["sha256"]
    encoded = json.dumps(header).encode()
    forged = blob[:15] + len(encoded).to_bytes(8, "little") + encoded + blob[end:]
    with pytest.raises(sk.ArgumentError, match="its digest does not match its content"):
        sk.load(forged, ())


@pytest.fixture(scope="module")
def saved_bytes(pair, tmp_path_factory) -> bytes:
    kernel, _, ps, X = pair
    return kernel.save(tmp_path_factory.mktemp("saved") / "kernel.npz", X, ps).read_bytes()


#: random tamperings per run (SYMKERN_SLOW=1: the long run)
TAMPER_EXAMPLES = 300 if os.environ.get("SYMKERN_SLOW") else 25

@given(data=st.data())
@settings(max_examples=TAMPER_EXAMPLES, deadline=None)
def test_tampered_bytes_of_a_blob_or_file_give_a_right_kernel_or_a_clear_error(
        pair, blob, saved_bytes, tmp_path_factory, data) -> None:
    kernel, _, ps, X = pair
    saved = tmp_path_factory.mktemp("tampered") / "kernel.npz"
    in_file = data.draw(st.booleans())
    content = bytearray(saved_bytes if in_file else blob)
    how = data.draw(st.sampled_from(["flip", "cut", "insert"]))
    offset = data.draw(st.integers(0, len(content) - 1))
    if how == "flip":
        content[offset] ^= data.draw(st.integers(1, 255))
    elif how == "cut":
        del content[offset:]
    else:
        content[offset:offset] = data.draw(st.binary(min_size=1, max_size=8))
    try:
        if in_file:
            saved.write_bytes(bytes(content))
            loaded = sk.load(saved)
        else:
            loaded = sk.load(bytes(content), kernel.const_args)
    except sk.SymkernError:
        return
    for e, g in zip(kernel(X, ps), loaded(X, ps), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)


# ---- one file: the program and its const args ----------------------------------------------

@pytest.fixture(scope="module")
def with_constants():
    table = sp.Array([0.25 * k - 1 for k in range(16)])  # a const arg (128 bytes)
    kernel = sk.build_function([sp.Function("pick")(table, x0) * x1, sp.sin(x0) * a],
                               [x0, x1], params={"a": a},
                               functions={"pick": lambda t, v: t[3] * v + t[15]})
    assert kernel.const_args
    return kernel


def test_a_saved_kernel_loads_from_its_path_alone(with_constants, tmp_path) -> None:
    kernel = with_constants
    X = np.random.default_rng(1).normal(size=(5, 2)).astype(np.float32)
    path = kernel.save(tmp_path / "kernel.skk")
    assert path == tmp_path / "kernel.skk" and path.exists()  # the name is kept as given
    for loaded in (sk.load(path), sk.load(str(path))):
        for e, g in zip(kernel(X, {"a": 1.5}), loaded(X, {"a": 1.5}), strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)
    # an ordinary numpy archive, read without pickle
    with np.load(path, allow_pickle=False) as stored:
        assert sorted(stored.files) == ["const_0", "manifest", "program"]
        np.testing.assert_array_equal(stored["const_0"], np.asarray(kernel.const_args[0].value))
    # the batch rank of example arguments is kept
    kernel.save(tmp_path / "rank2.skk", X.reshape(5, 1, 2), {"a": 1.0})
    assert sk.load(tmp_path / "rank2.skk")(X.reshape(5, 1, 2), {"a": 1.5})[1].shape == (5, 1)


def test_a_saved_kernel_refuses_other_const_args(with_constants, tmp_path) -> None:
    path = with_constants.save(tmp_path / "kernel.npz")
    with pytest.raises(sk.ConstArgsError, match="holds its const args; pass only the path"):
        sk.load(path, with_constants.const_args)


def test_a_damaged_saved_file_is_an_argument_error(with_constants, tmp_path) -> None:
    path = with_constants.save(tmp_path / "kernel.npz")
    good = path.read_bytes()
    cases = {
        "missing": None,
        "empty": b"",
        "not an archive": b"hello",
        "truncated": good[: len(good) // 2],
    }
    for name, content in cases.items():
        target = tmp_path / f"{name}.npz"
        if content is not None:
            target.write_bytes(content)
        with pytest.raises(sk.ArgumentError, match=r"^path: "):
            sk.load(target)
    # a foreign archive, and one whose const arg was changed
    np.savez(tmp_path / "foreign.npz", program=np.zeros(3, np.uint8))
    with pytest.raises(sk.ArgumentError, match="it has no symkern manifest"):
        sk.load(tmp_path / "foreign.npz")
    with np.load(path) as stored:
        parts = {name: stored[name] for name in stored.files}
    parts["const_0"] = parts["const_0"] + 1
    np.savez(tmp_path / "altered.npz", **parts)
    with pytest.raises(sk.ArgumentError, match="its digest does not match its content"):
        sk.load(tmp_path / "altered.npz")
