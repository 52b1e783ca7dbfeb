"""Streaming: array, memmap and iterable sources equal the in-memory evaluation; memory stays bounded.

Files are written under pytest's tmp_path only. The peak-memory runs happen in a subprocess
that reads its own peak resident set (VmHWM) before and after streaming.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import sympy as sp

import symkern as sk
from symkern.batching.stream import stream

x0, x1, a = sp.symbols("x0 x1 a")


@pytest.fixture(scope="module")
def kernel():
    return sk.build_function(sp.sin(x0) * a + x1**2, [x0, x1], params={"a": a}, dtype="float64")


@pytest.fixture(scope="module")
def X():
    return np.random.default_rng(0).normal(size=(1000, 2))


def test_an_array_source_written_into_out_and_yielded(kernel, X):
    expected = np.asarray(kernel(X, {"a": 2.0}))
    out = stream(kernel, X, {"a": 2.0}, chunk=128, out=np.zeros(1000), progress=False)
    np.testing.assert_allclose(out, expected, rtol=1e-12)
    parts = list(stream(kernel, X, {"a": 2.0}, chunk=128, progress=False))
    assert [len(p) for p in parts] == [128] * 7 + [104]
    np.testing.assert_allclose(np.concatenate(parts), expected, rtol=1e-12)


def test_a_memmap_source_into_a_memmap_out(kernel, X, tmp_path):
    np.save(tmp_path / "x.npy", X)
    source = np.load(tmp_path / "x.npy", mmap_mode="r")
    out = np.lib.format.open_memmap(tmp_path / "y.npy", mode="w+", dtype=np.float64, shape=(1000,))
    assert stream(kernel, source, {"a": 2.0}, chunk=300, out=out, progress=False) is out
    out.flush()
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), kernel(X, {"a": 2.0}), rtol=1e-12)
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), X)   # the source is untouched


def test_an_iterable_of_uneven_chunks_is_rechunked(kernel, X):
    pieces = [X[:10], X[10:500], X[500:501], X[501:]]
    parts = list(stream(kernel, iter(pieces), {"a": 2.0}, chunk=256, progress=False))
    assert [len(p) for p in parts] == [256, 256, 256, 232]
    np.testing.assert_allclose(np.concatenate(parts), kernel(X, {"a": 2.0}), rtol=1e-12)
    # tuples of one array work too; and one compiled executable serves every block
    fresh = sk.build_function(sp.sin(x0) * a + x1**2, [x0, x1], params={"a": a}, dtype="float64")
    out = stream(fresh, [(X[:600],), (X[600:],)], {"a": 2.0}, chunk=256, out=np.zeros(1000),
                 progress=False)
    assert fresh.compilations == 1
    np.testing.assert_allclose(out, kernel(X, {"a": 2.0}), rtol=1e-12)


def test_several_data_arguments_and_an_equation_pytree(X):
    y0, y1 = sp.symbols("y0 y1")
    kernel = sk.build_function({"s": x0 * a, "m": sp.Matrix([[x0, y0], [y1, a]])}, x0, [y0, y1],
                               params={"a": a}, dtype="float64")
    first, second = X[:, 0], X[:, ::-1]
    expected = kernel(first, second, {"a": 3.0})
    out = {"s": np.zeros(1000), "m": np.zeros((1000, 2, 2))}
    got = stream(kernel, (first, second), {"a": 3.0}, chunk=64, out=out, progress=False)
    assert got is out
    for key in ("s", "m"):
        np.testing.assert_allclose(out[key], expected[key], rtol=1e-12)
    parts = list(stream(kernel, [(first[:500], second[:500]), (first[500:], second[500:])],
                        {"a": 3.0}, chunk=400, progress=False))
    assert set(parts[0]) == {"s", "m"} and parts[0]["m"].shape == (400, 2, 2)
    np.testing.assert_allclose(np.concatenate([p["m"] for p in parts]), expected["m"], rtol=1e-12)


def test_a_bound_kernel_and_a_kernel_without_parameters(kernel, X):
    bound = kernel.bind({"a": 2.0})
    np.testing.assert_allclose(stream(bound, X, chunk=100, out=np.zeros(1000), progress=False),
                               kernel(X, {"a": 2.0}), rtol=1e-12)
    plain = sk.build_function(x0 * x1, [x0, x1], dtype="float64")
    np.testing.assert_allclose(np.concatenate(list(stream(plain, X, chunk=333, progress=False))),
                               X[:, 0] * X[:, 1], rtol=1e-12)


def test_bad_arguments_are_named(kernel, X):
    with pytest.raises(sk.ArgumentError, match="chunk"):
        stream(kernel, X, {"a": 2.0}, chunk=0)
    with pytest.raises(sk.ArgumentError, match="out: expected 1000 rows"):
        stream(kernel, X, {"a": 2.0}, out=np.zeros(999), progress=False)
    with pytest.raises(sk.ArgumentError, match=r"ps\["):
        stream(kernel, X, {"a": np.zeros(3)}, progress=False)
    with pytest.raises(sk.ArgumentError, match="x1"):
        list(stream(kernel, np.zeros((10, 3)), {"a": 2.0}, progress=False))
    with pytest.raises(sk.ArgumentError, match="source"):
        stream(kernel, "data.npy", {"a": 2.0})
    with pytest.raises(sk.ArgumentError, match="the source gave more"):
        stream(kernel, [X], {"a": 2.0}, out=np.zeros(10), progress=False)


def test_no_progress_bar_off_a_terminal(kernel, X, capsys):
    stream(kernel, X, {"a": 2.0}, chunk=100, out=np.zeros(1000), progress=True)
    assert capsys.readouterr().err == ""


# ---- bounded memory ------------------------------------------------------------------------------
PEAK = textwrap.dedent("""
    import json, sys, time
    import numpy as np, sympy as sp
    import symkern as sk
    from symkern.batching.stream import stream

    def peak_mb():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024

    source_path, out_path = sys.argv[1], sys.argv[2]
    x0, x1 = sp.symbols("x0 x1")
    kernel = sk.build_function(sp.sin(x0) * x1 + x0**2, [x0, x1])
    source = np.load(source_path, mmap_mode="r")
    list(stream(kernel, np.zeros((65536, 2), np.float32), progress=False))   # compile first
    before = peak_mb()
    out = np.lib.format.open_memmap(out_path, "w+", np.float32, (source.shape[0],))
    start = time.perf_counter()
    stream(kernel, source, out=out, progress=False)
    seconds = time.perf_counter() - start
    growth = peak_mb() - before
    rows = np.arange(0, source.shape[0], 9973)
    X = np.asarray(source[rows], np.float64)
    error = float(np.max(np.abs(out[rows] - (np.sin(X[:, 0]) * X[:, 1] + X[:, 0] ** 2))))
    print(json.dumps({"growth_mb": growth, "seconds": seconds, "max_error": error,
                      "source_mb": source.nbytes / 2**20}))
""")


def write_source(path, rows):
    """A float32 (rows, 2) .npy written in pieces, so that this process never holds it."""
    np.lib.format.open_memmap(path, "w+", np.float32, (rows, 2))
    offset = np.load(path, mmap_mode="r").offset
    period = 7000 * 128                  # x0 = (i % 1000) / 1000, x1 = i % 7 repeat every 7000 rows
    i = np.arange(period)
    pattern = np.stack([(i % 1000) / 1000.0, i % 7], axis=1).astype(np.float32).tobytes()
    with open(path, "r+b") as f:
        f.seek(offset)
        for start in range(0, rows, period):
            f.write(pattern[: min(period, rows - start) * 8])


def peak_growth(tmp_path, rows):
    if not os.path.exists("/proc/self/status"):
        pytest.skip("peak resident memory is read from /proc/self/status (Linux)")
    write_source(tmp_path / "x.npy", rows)
    done = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                          env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(report)
    assert report["max_error"] < 1e-5
    return report


def test_a_200_mb_memmap_streams_in_bounded_memory(tmp_path):
    report = peak_growth(tmp_path, 26_214_400)          # float32 (26,214,400 x 2) = 200 MiB
    assert report["growth_mb"] < 120, report


@pytest.mark.slow
def test_a_1_gib_memmap_streams_in_bounded_memory(tmp_path):
    report = peak_growth(tmp_path, 134_217_728)         # float32 (134,217,728 x 2) = 1 GiB
    assert report["source_mb"] == 1024
    assert report["growth_mb"] < 600, report


@pytest.mark.parametrize("rows", [np.ones((7, 2), np.float32), np.ones(3, np.float32)])
def test_stream_reports_the_shape_the_caller_passed(rows):
    """A wrong per-sample shape is reported as given, before the rows are blocked."""
    y0, y1, y2 = sp.symbols("y0 y1 y2")
    k = sk.build_function(y0 * y1 + y2, [y0, y1, y2])
    shown = re.escape(str(rows.shape))
    with pytest.raises(sk.ArgumentError, match=rf"source x1: expected shape \(rows, 3\), got {shown}"):
        list(k.stream(rows, progress=False))
    with pytest.raises(sk.ArgumentError, match=rf"source\[0\] x1: expected shape \(rows, 3\), got {shown}"):
        list(k.stream(iter([rows]), progress=False))
