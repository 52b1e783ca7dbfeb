"""Code-generation cache entries are bound to their key and content: a damaged, altered,
swapped or foreign entry is a cache miss that rebuilds with a CacheWarning, never an error
and never run; a cache directory others can write is refused. References: the kernel built
without the cache, and numpy."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import symkern as sk
from symkern.codegen.cache import entry_digest

x0, x1, a = sp.symbols("x0 x1 a")
first = sp.Function("first")
TABLE = [0.5 * k for k in range(10)]
X = np.linspace(-1, 1, 6).reshape(3, 2)


def build(equation: str = "sin"):
    """A kernel with a hoisted literal (the table, a const arg) and a parameter."""
    head = {"sin": sp.sin, "cos": sp.cos}[equation]
    return sk.build_function({"value": head(x0) * a + x1, "table": first(sp.Array(TABLE), x0)},
                             [x0, x1], params={"a": a},
                             functions={"first": lambda t, v: t[3] * v + t[9]})


def expected(equation: str = "sin") -> dict:
    head = {"sin": np.sin, "cos": np.cos}[equation]
    return {"value": head(X[:, 0]) * 2.0 + X[:, 1], "table": TABLE[3] * X[:, 0] + TABLE[9]}


def assert_right(kernel, equation: str = "sin") -> None:
    out = kernel(X, {"a": 2.0})
    for name, want in expected(equation).items():
        np.testing.assert_allclose(np.asarray(out[name]), want, rtol=1e-6, atol=1e-6)


@pytest.fixture
def cache(tmp_path):
    directory = sk.enable_cache(tmp_path / "cache")
    assert directory is not None
    try:
        yield directory
    finally:
        sk.disable_cache()


def entry(directory: Path, equation: str = "sin") -> Path:
    """The folder of `build(equation)`'s entry (built now if missing)."""
    before = set(directory.glob("codegen/*/*"))
    build(equation)
    (folder,) = set(directory.glob("codegen/*/*")) - before or before
    return folder


def rebuild_warned(equation: str = "sin"):
    """Build again; the warnings it gave and the kernel."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel = build(equation)
    return [w for w in caught if issubclass(w.category, sk.CacheWarning)], kernel


def assert_rebuilt(equation: str = "sin", reason: str = "") -> None:
    caught, kernel = rebuild_warned(equation)
    assert caught, "no CacheWarning for a damaged entry"
    assert "is not used" in str(caught[0].message) and reason in str(caught[0].message)
    assert "cache_load" not in kernel.timings and "cse" in kernel.timings
    assert_right(kernel, equation)
    # the entry is rewritten: the next build loads it, silently
    again, kernel = rebuild_warned(equation)
    assert not again and "cache_load" in kernel.timings
    assert_right(kernel, equation)


def redigest(folder: Path, meta: dict) -> None:
    """Write `meta` with a digest that matches it: what the loader's other checks face."""
    with np.load(folder / "literals.npz") as stored:
        names = [item["name"] for item in meta["literals"]]
        values = [stored[name] for name in names]
    meta["digest"] = entry_digest(meta["key"], meta, names, values)
    (folder / "meta.json").write_text(json.dumps(meta))


def test_an_intact_entry_is_loaded(cache):
    folder = entry(cache)
    caught, kernel = rebuild_warned()
    assert not caught and "cache_load" in kernel.timings
    assert_right(kernel)
    assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0
    assert stat.S_IMODE((folder / "meta.json").stat().st_mode) & 0o077 == 0


@pytest.mark.parametrize("planted", ["jnp.save('{marker}', x1)", "jnp.load('{marker}', allow_pickle=True)"])
@pytest.mark.parametrize("digest", ["stale", "recomputed"])
def test_an_edited_source_is_never_run(cache, tmp_path, planted, digest):
    folder = entry(cache)
    marker = tmp_path / "ran.npy"
    np.save(marker, np.zeros(1))  # so a planted jnp.load would find a file
    meta = json.loads((folder / "meta.json").read_text())
    line = planted.format(marker=marker)
    meta["source"] = meta["source"].replace("    return", f"    _planted = {line}\n    return", 1)
    assert "_planted" in meta["source"]
    if digest == "recomputed":
        redigest(folder, meta)
    else:
        (folder / "meta.json").write_text(json.dumps(meta))
    marker.unlink()
    assert_rebuilt(reason="digest" if digest == "stale" else "unexpected attribute")
    assert not marker.exists() and not Path("ran.npy").exists()


def test_swapped_entries_are_not_used(cache):
    sin_folder, cos_folder = entry(cache, "sin"), entry(cache, "cos")
    swap = cache / "swap"
    shutil.move(sin_folder, swap)
    shutil.move(cos_folder, sin_folder)
    shutil.move(swap, cos_folder)
    assert_rebuilt("sin", "another key")
    assert_rebuilt("cos", "another key")


def test_literals_of_another_shape_are_not_used(cache):
    folder = entry(cache)
    with np.load(folder / "literals.npz") as stored:
        arrays = {name: np.concatenate([stored[name], stored[name]]) for name in stored.files}
    np.savez(folder / "literals.npz", **arrays)
    assert_rebuilt(reason="digest")


def test_more_outputs_in_the_source_are_not_used(cache):
    folder = entry(cache)
    meta = json.loads((folder / "meta.json").read_text())
    meta["source"] = meta["source"].replace("    return ", "    return x1[..., 0], ", 1)
    assert meta["source"] != json.loads((folder / "meta.json").read_text())["source"]
    (folder / "meta.json").write_text(json.dumps(meta))
    assert_rebuilt(reason="digest")


def _write(name: str, content):
    def damage(folder: Path) -> None:
        path = folder / name
        if content is None:
            path.unlink()
        elif content == "directory":
            path.unlink()
            path.mkdir()
        elif content == "truncate":
            path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
        else:
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return damage


def _replace_field(field: str, value):
    def damage(folder: Path) -> None:
        meta = json.loads((folder / "meta.json").read_text())
        meta[field] = value
        (folder / "meta.json").write_text(json.dumps(meta))
    return damage


@pytest.mark.parametrize("damage", [
    _write("meta.json", "{}"),
    _write("meta.json", "[1, 2]"),
    _write("meta.json", "not json"),
    _write("meta.json", b"\x00"),
    _write("meta.json", "directory"),
    _write("meta.json", "truncate"),
    _replace_field("source", "this is not Python ("),
    _replace_field("source", "def kernel(x1, ps):\x00\n    return (x1,)"),
    _replace_field("source", 3),
    _replace_field("literals", [{"name": "_k0"}, {"name": "../x"}]),
    _replace_field("user_functions", {"first": 1}),
    _write("literals.npz", None),
    _write("literals.npz", "truncate"),
    _write("literals.npz", "directory"),
    _write("literals.npz", b"PK\x03\x04 not a zip"),
], ids=["empty-object", "list", "not-json", "nul", "meta-directory", "meta-truncated",
        "not-python", "nul-in-source", "source-not-string", "bad-literal-names",
        "bad-user-functions", "literals-missing", "literals-truncated", "literals-directory",
        "literals-not-zip"])
def test_a_malformed_entry_is_rebuilt_with_a_warning(cache, damage):
    damage(entry(cache))
    assert_rebuilt()


def test_an_entry_others_can_write_is_not_used(cache):
    folder = entry(cache)
    (folder / "meta.json").chmod(0o666)
    caught, kernel = rebuild_warned()
    assert caught and "writable by its group or by others" in str(caught[0].message)
    assert "cache_load" not in kernel.timings
    assert_right(kernel)


#: random tamperings per run (SYMKERN_SLOW=1: the long run)
TAMPER_EXAMPLES = 300 if os.environ.get("SYMKERN_SLOW") else 25

@given(data=st.data())
@settings(max_examples=TAMPER_EXAMPLES, deadline=None)
def test_tampered_bytes_of_an_entry_give_a_right_kernel_or_a_rebuild(tmp_path_factory, data):
    """Random bytes of random entry files changed, cut or added: each build is either the
    right kernel from the cache or, with a CacheWarning, the right kernel rebuilt."""
    directory = tmp_path_factory.mktemp("tamper") / "cache"
    assert sk.enable_cache(directory) is not None
    try:
        folder = entry(directory)
        name = data.draw(st.sampled_from(["meta.json", "literals.npz"]))
        content = bytearray((folder / name).read_bytes())
        how = data.draw(st.sampled_from(["flip", "cut", "append"]))
        offset = data.draw(st.integers(0, len(content) - 1))
        if how == "flip":
            content[offset] ^= data.draw(st.integers(1, 255))
        elif how == "cut":
            del content[offset:]
        else:
            content[offset:offset] = data.draw(st.binary(min_size=1, max_size=8))
        (folder / name).write_bytes(bytes(content))
        caught, kernel = rebuild_warned()
        assert ("cache_load" in kernel.timings) != bool(caught)
        assert_right(kernel)
    finally:
        sk.disable_cache()


# ---- the cache directory -------------------------------------------------------------------

def refused(directory) -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sk.enable_cache(directory) is None
    from symkern.batching.caching import active_cache

    assert active_cache() is None
    (warning,) = [w for w in caught if issubclass(w.category, sk.CacheWarning)]
    return str(warning.message)


def test_a_cache_directory_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    message = refused(shared)
    assert "writable by its group or by others (mode 777)" in message
    assert "the cache holds code that runs" in message and "Caching is off" in message
    private = tmp_path / "private"
    assert sk.enable_cache(private) == private
    (private / "codegen").mkdir(mode=0o700)
    (private / "codegen").chmod(0o770)
    sk.disable_cache()
    assert "codegen is writable by its group" in refused(private)


def _no_home(*args):
    raise RuntimeError("Could not determine home directory")


def test_a_cache_directory_under_an_unknown_home_is_refused(monkeypatch):
    monkeypatch.delenv("SYMKERN_CACHE_DIR", raising=False)
    monkeypatch.setattr(Path, "expanduser", _no_home)  # what pathlib does without a home
    assert "cannot be created (Could not determine home directory)" in refused(None)


def test_a_file_or_unwritable_place_as_cache_directory_is_refused(tmp_path):
    plain = tmp_path / "file"
    plain.write_text("")
    assert "cannot be created" in refused(plain)
    assert "cannot be created" in refused(plain / "below")
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert "cannot be created" in refused(locked / "cache") or \
            "not writable" in refused(locked)


@pytest.mark.parametrize("kind", ["file", "group-writable"])
def test_import_with_a_bad_cache_variable_warns_and_works(tmp_path, kind):
    target = tmp_path / "target"
    if kind == "file":
        target.write_text("")
    else:
        target.mkdir()
        target.chmod(0o775)
    script = ("import numpy as np, sympy as sp, symkern as sk; x = sp.Symbol('x');"
              "print(sk.build_function(sp.sin(x), x)(np.zeros(2)).tolist())")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "SYMKERN_CACHE_DIR": str(target)})
    assert done.returncode == 0, done.stderr
    assert "CacheWarning: SYMKERN_CACHE_DIR: the cache directory is refused" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout.strip() == "[0.0, 0.0]"
