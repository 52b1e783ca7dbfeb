"""The direct path: a repeated call goes straight to its jitted function, checks intact.

After the checked path has run a batch shape fused, `kernel(*args)` hands its arguments to
`Kernel._direct` unchanged; the checks run at trace time, once per argument signature.
These tests hold that a call taking that path still rejects what the checked path rejects,
with the same errors, and computes the same values.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import symkern as sk
from symkern.errors import ArgumentError, DtypeMismatchError

x0, x1, y0, a = sp.symbols("x0 x1 y0 a")
W = sp.Matrix(2, 2, sp.symbols("w:4"))


# two data arguments, a scalar and a matrix parameter leaf, a vector output
OUT = sp.Matrix([sp.sin(x0) * a + W[0, 1] * x1, y0 * W[1, 0] + W[0, 0] * W[1, 1]])


def build():
    return sk.build_function(OUT, [x0, x1], [y0], params={"a": a, "W": W}, dtype="float64")


@pytest.fixture
def kernel():
    return build()


def reference(X, Y, ps):
    w = np.asarray(ps["W"], float)
    return np.stack([np.sin(X[..., 0]) * ps["a"] + w[0, 1] * X[..., 1],
                     Y[..., 0] * w[1, 0] + w[0, 0] * w[1, 1]], axis=-1)


PS = {"a": 2.0, "W": np.array([[1.0, 2.0], [3.0, 4.0]])}


def counting_prepare(kernel, monkeypatch):
    calls = []
    checked = kernel.prepare

    def prepare(args):
        calls.append(len(args))
        return checked(args)

    monkeypatch.setattr(kernel, "prepare", prepare)
    return calls


def test_a_repeated_call_skips_the_python_checks(kernel, monkeypatch):
    X, Y = np.ones((5, 2)), np.ones((5, 1))
    kernel(X, Y, PS)
    calls = counting_prepare(kernel, monkeypatch)
    for _ in range(3):
        np.testing.assert_allclose(kernel(X, Y, PS), reference(X, Y, PS), rtol=1e-14)
    assert calls == []  # neither checked nor traced again
    assert kernel.compilations == 1


def test_a_new_signature_on_the_direct_path_is_checked_at_trace_time(kernel, monkeypatch):
    X, Y = np.ones((5, 2)), np.ones((5, 1))
    kernel(X, Y, PS)
    calls = counting_prepare(kernel, monkeypatch)
    ps32 = {"a": np.float32(2.0), "W": PS["W"].astype(np.float32)}
    np.testing.assert_allclose(kernel(X, Y, ps32), reference(X, Y, PS), rtol=1e-14)
    assert calls == [3]  # once, while tracing the new signature
    kernel(X, Y, ps32)
    assert calls == [3]


@pytest.mark.parametrize("args, message", [
    ((np.ones((5, 2)), np.ones((5, 1)), {"a": 2.0, "W": np.ones((3, 3))}),
     r'ps\["W"\]: expected shape \(2, 2\), got \(3, 3\)'),
    ((np.ones((5, 2)), np.ones((5, 1)), {"a": 2.0}), "ps: expected a tree of the structure"),
    ((np.ones((5, 2)), np.ones((4, 1)), PS), r"batch shape \(4,\) does not broadcast"),
    ((np.ones((5, 2)), np.ones((5, 2)), PS), r"expected shape \(\.\.\., 1\), got \(5, 2\)"),
    ((np.ones((5, 2)), np.ones((5, 1))), r"expected 3 argument\(s\)"),
    ((np.full((5, 2), "x"), np.ones((5, 1)), PS), "expected real numbers"),
    ((np.ones((5, 2)), np.ones((5, 1)), {"a": "2", "W": PS["W"]}), "expected real numbers"),
    ((np.ones((5, 2)), np.ones((5, 1)), {"a": 1j, "W": PS["W"]}), "expected real numbers"),
])
def test_the_direct_path_rejects_what_the_checked_path_rejects(kernel, args, message):
    kernel(np.ones((5, 2)), np.ones((5, 1)), PS)  # shape (5, 2) now takes the direct path
    assert (5, 2) in kernel._direct_shapes
    with pytest.raises(ArgumentError, match=message) as direct:
        kernel(*args)
    fresh = build()
    with pytest.raises(ArgumentError, match=message) as checked:
        fresh(*args)  # the checked path: the same error
    assert str(direct.value) == str(checked.value)


def test_the_dtype_policy_holds_on_the_direct_path(kernel):
    X, Y = np.ones((5, 2)), np.ones((5, 1))
    kernel(X, Y, PS)
    jax.config.update("jax_enable_x64", False)
    try:
        with pytest.raises(DtypeMismatchError, match="jax_enable_x64"):
            kernel(X, Y, PS)
    finally:
        jax.config.update("jax_enable_x64", True)
    np.testing.assert_allclose(kernel(X, Y, PS), reference(X, Y, PS), rtol=1e-14)


def test_bound_and_flat_forms_take_the_direct_path_and_check(kernel):
    X, Y = np.ones((5, 2)), np.ones((5, 1))
    bound = kernel.bind(PS)
    np.testing.assert_allclose(bound(X, Y), reference(X, Y, PS), rtol=1e-14)
    np.testing.assert_allclose(bound(X, Y), reference(X, Y, PS), rtol=1e-14)
    with pytest.raises(ArgumentError, match=r"batch shape \(4,\) does not broadcast"):
        bound(X, np.ones((4, 1)))
    flat = kernel.flat()
    theta = kernel.flatten(PS)
    for _ in range(2):
        np.testing.assert_allclose(flat(X, Y, theta), reference(X, Y, PS), rtol=1e-14)
    assert (5, 2) in flat._direct_shapes
    with pytest.raises(ArgumentError, match=r"theta: expected a float64 buffer of shape \(5,\)"):
        flat(X, Y, theta[:4])
    with pytest.raises(ArgumentError, match="expected 3 argument"):
        flat(X, theta)


def test_the_direct_path_under_jit_grad_and_vmap(kernel):
    X, Y = np.linspace(0, 1, 10).reshape(5, 2), np.ones((5, 1))
    kernel(X, Y, PS)

    def loss(ps):
        return jnp.sum(kernel(X, Y, ps) ** 2)

    got = jax.jit(jax.grad(loss))(PS)
    assert set(got) == {"a", "W"}
    # d/da sum((sin(x0) a + w01 x1)^2) = 2 sum(row0 * sin(x0))
    row0 = reference(X, Y, PS)[:, 0]
    np.testing.assert_allclose(got["a"], 2 * np.sum(row0 * np.sin(X[:, 0])), rtol=1e-12)
    batched = jax.vmap(lambda x: kernel(x, Y, PS))(np.stack([X, X + 1]))
    np.testing.assert_allclose(batched[1], reference(X + 1, Y, PS), rtol=1e-14)


@settings(max_examples=25, deadline=None)
@given(calls=st.lists(st.tuples(st.sampled_from([1, 3, 5]),
                                st.sampled_from(["numpy64", "numpy32", "jax64", "jax32", "int"]),
                                st.sampled_from(["float", "numpy", "jax"])),
                      min_size=1, max_size=8))
def test_any_sequence_of_calls_gives_the_reference(calls):
    kernel = sk.build_function(sp.Matrix([sp.sin(x0) * a + x1, x0 * x1 * W[0, 1]]), [x0, x1],
                               params={"a": a, "W": W}, dtype="float64")
    for n, data_kind, ps_kind in calls:
        X = np.arange(2 * n, dtype=np.float64).reshape(n, 2) - 2
        data = {"numpy64": X, "numpy32": X.astype(np.float32), "jax64": jnp.asarray(X),
                "jax32": jnp.asarray(X, jnp.float32), "int": X.astype(np.int64)}[data_kind]
        ps = {"float": {"a": 1.5, "W": [[1.0, 2.0], [3.0, 4.0]]},
              "numpy": {"a": np.float64(1.5), "W": np.array([[1.0, 2.0], [3.0, 4.0]])},
              "jax": {"a": jnp.float64(1.5), "W": jnp.array([[1.0, 2.0], [3.0, 4.0]])}}[ps_kind]
        out = np.asarray(kernel(data, ps))
        assert out.dtype == np.float64 and out.shape == (n, 2)
        expected = np.stack([np.sin(X[:, 0]) * 1.5 + X[:, 1], X[:, 0] * X[:, 1] * 2.0], axis=-1)
        np.testing.assert_allclose(out, expected, rtol=1e-14, atol=1e-14)
    # one program per batch shape and argument signature, never one per call
    assert kernel.compilations <= 3 * 5 * 3


def separate_kernel():
    """A kernel that runs batches of PROBE_FROM samples or more as two executables."""
    kernel = build()
    kernel.assembly = "separate"  # as if measured (Kernel._probe)
    return kernel


def test_separate_shapes_take_the_direct_path_too(monkeypatch):
    kernel = separate_kernel()
    rng = np.random.default_rng(1)
    X, Y = rng.normal(size=(100, 2)), rng.normal(size=(100, 1))
    np.testing.assert_allclose(kernel(X, Y, PS), reference(X, Y, PS), rtol=1e-14)
    assert (100, 2) in kernel._separate_shapes and (100, 2) not in kernel._direct_shapes
    calls = counting_prepare(kernel, monkeypatch)
    ps = {"a": -1.5, "W": PS["W"] + 1.0}
    for _ in range(3):
        np.testing.assert_allclose(kernel(X, Y, ps), reference(X, Y, ps), rtol=1e-14)
    assert calls == []  # neither checked nor traced again: new values, same signature
    assert kernel.compilations == 1
    bound = kernel.bind(PS)  # device-resident leaves: a new signature, traced once
    for _ in range(2):
        np.testing.assert_allclose(bound(X, Y), reference(X, Y, PS), rtol=1e-14)
    assert calls == [3] and kernel.compilations == 2


@pytest.mark.parametrize("args, message", [
    ((np.ones((100, 2)), np.ones((100, 1)), {"a": 2.0, "W": np.ones((3, 3))}),
     r'ps\["W"\]: expected shape \(2, 2\), got \(3, 3\)'),
    ((np.ones((100, 2)), np.ones((99, 1)), PS), r"batch shape \(99,\) does not broadcast"),
    ((np.ones((100, 2)), np.ones((100, 1))), r"expected 3 argument\(s\)"),
    ((np.ones((100, 2)), np.ones((100, 1)), {"a": "2", "W": PS["W"]}), "expected real numbers"),
])
def test_the_separate_direct_path_rejects_what_the_checked_path_rejects(args, message):
    kernel = separate_kernel()
    kernel(np.ones((100, 2)), np.ones((100, 1)), PS)
    assert (100, 2) in kernel._separate_shapes
    with pytest.raises(ArgumentError, match=message) as direct:
        kernel(*args)
    with pytest.raises(ArgumentError, match=message) as checked:
        separate_kernel()(*args)
    assert str(direct.value) == str(checked.value)


def test_the_probe_registers_the_shape_with_the_assembly_it_chose():
    kernel = build()
    X, Y = np.ones((100, 2)), np.ones((100, 1))
    kernel(X, Y, PS)  # the first call of >= PROBE_FROM samples measures both
    chosen = kernel._direct_shapes if kernel.assembly == "fused" else kernel._separate_shapes
    other = kernel._separate_shapes if kernel.assembly == "fused" else kernel._direct_shapes
    assert (100, 2) in chosen and (100, 2) not in other
    np.testing.assert_allclose(kernel(X, Y, PS), reference(X, Y, PS), rtol=1e-14)
