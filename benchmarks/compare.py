"""symkern side by side with the tools users would pick instead.

Usage::

    python benchmarks/compare.py [--quick | --peers] [--out benchmarks/results/NAME.json]
                                 [--workloads a,b] [--tools a,b] [--timeout S] [--mem-gib G]
                                 [--cpu-memory system | reuse] [--peers --shapes 1e3|1e4]

Tools (each used the way its own documentation shows):

- ``symkern``: ``build_function(eqs, inputs, params=..., functions=..., dtype="float32")``;
  ``symkern-f64`` the same with ``dtype="float64"`` (its process runs with jax_enable_x64);
  ``symkern-c`` and ``symkern-c-f64`` the same with ``BuildOptions(cpu_loop="c")`` (a C loop).
- ``symkern-nn``: networks only, what symkern's documentation has a network's user call:
  ``build_nn_function(snn.output, snn)`` (Jacobian: ``build_nn_function(jacobian(snn.output,
  snn.input), snn)``) for ``snn = SymbolicNetwork(net)`` — an array program when a layer
  holds more than 64 weights (``StructuredNetwork``), else the scalar kernel; float32.
- ``lambdify-numpy``: ``sympy.lambdify((x, p), entries, "numpy", cse=True)``, float64.
- ``lambdify-jax``: ``sympy.lambdify((x, p), eqs, "jax", cse=True)`` under
  ``jax.jit(jax.vmap(f, (0, None)))``, outputs as the printer returns them, float32.
- ``symengine``: ``symengine.Lambdify(x + p, entries, backend="llvm", cse=True)``, float64.
- ``sympy2jax``: ``sympy2jax.SymbolicModule(entries)`` called with one keyword per symbol
  under ``jax.jit``, float32.
- ``jax-hand``: networks only, hand-written ``net.apply`` (Jacobian:
  ``jax.vmap(jax.jacfwd(net.apply))``) under ``jax.jit``, float32.
- ``numba``, ``pytensor-c``, ``pytensor-jax``, ``pytensor-numba`` (and their ``-f32``
  forms), ``casadi``, ``casadi-c``: the peers of ``benchmarks/peers.py`` (the ``peers``
  extra), run by ``--peers`` on the mechanics models, the pendulum and the 4-16-16-4 network.

Each result records its ``dtype``; ratios are read within one dtype (``--peers`` writes
them as ``ratios``: symkern of that dtype over the fastest other tool of that dtype).

``--cpu-memory reuse`` has every measuring process call ``symkern.reuse_cpu_memory()``
before anything runs (glibc keeps freed memory for the next call instead of mapping it
afresh, docs/design/cpu-throughput.md). It is a setting of the process, so every tool
measured in it, the peers included, runs with it; the report's ``config`` records it.

For every workload × tool a worker subprocess (address-space limit ``--mem-gib``, wall
limit ``--timeout``) measures: build time to a first result on a batch of 1024; steady
throughput at a large batch (median of timed calls after a warm-up); single-sample
latency; lowered StableHLO size (JAX tools); compilations triggered by new parameter
values; peak RSS; max relative error against a float64 reference (SymPy lambdify numpy).
Per workload a preparation subprocess builds the SymPy equations once (pickled for the
workers), computes the reference, and times a ``jnp`` copy of the same bytes the kernel
reads and writes (the memory-bandwidth ceiling for a one-pass kernel).

Throughput ratios come from one more subprocess per workload that builds every tool again
and times them round-robin at the throughput batch (``rounds`` calls each, the order
rotating every round): on a shared machine the speed of the cores drifts by 2x between
minutes, which per-tool processes turn into 2x errors in a ratio, while interleaved calls
see the same drift. ``throughput`` is that median; each tool's own process's median is kept
as ``throughput_isolated``.

Results are JSON (``benchmarks/results/``); ``benchmarks/report.py`` renders them.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from peers import PEER_ADAPTERS, PEER_MODULES  # noqa: E402

TOOLS = ["symkern", "symkern-nn", "lambdify-numpy", "lambdify-jax", "symengine", "sympy2jax",
         "jax-hand"]
#: the tools of the --peers profile: symkern in both dtypes, the float64 reference, the peers
PEER_TOOLS = ["symkern", "symkern-f64", "symkern-c", "symkern-c-f64", "lambdify-numpy",
              *PEER_ADAPTERS]
#: which Python modules each optional tool needs.
OPTIONAL = {"symengine": ("symengine",), "sympy2jax": ("sympy2jax",), **PEER_MODULES}

FULL = {
    "workloads": ["pendulum", "net-2-3-2", "net-4-16-16-4", "net-8-32-32-8", "jac-2-3-2",
                  "jac-4-16-16-4", "jac-8-32-32-8", "nlink-3", "table-1MB", "energy-2d",
                  "expr-1e3", "expr-1e4", "expr-1e5"],
    "batch": 100_000, "build_batch": 1024, "repeats": 9, "latency_repeats": 200,
    "timeout": 420.0, "rounds": 15, "round_seconds": 2.0,
}
#: the sympy.physics.mechanics models (each also without its constant entries: like for
#: like), the pendulum and the 4-16-16-4 network and its Jacobian, against the peers
PEERS = {
    "workloads": ["nlink-2", "nlink-2-nonconstant", "nlink-4", "nlink-4-nonconstant", "nlink-8",
                  "nlink-8-nonconstant", "nlink-fixed-2", "pendulum", "net-4-16-16-4", "jac-4-16-16-4"],
    "batch": 100_000, "build_batch": 1024, "repeats": 5, "latency_repeats": 50,
    "timeout": 240.0, "rounds": 15, "round_seconds": 2.0,
}
QUICK = {
    "workloads": ["pendulum", "net-2-3-2", "expr-1e3"],
    "batch": 10_000, "build_batch": 1024, "repeats": 3, "latency_repeats": 20,
    "timeout": 60.0, "rounds": 3, "round_seconds": 0.2,
}
#: tools join a workload's interleaved throughput run when their isolated build and one
#: call at the throughput batch took at most this long (the run builds them again)
INTERLEAVE_MAX_BUILD_S = 120.0
INTERLEAVE_MAX_CALL_S = 2.0
#: more rounds than the profile's `rounds` while all of them take under its `round_seconds`,
#: at most this many: sub-millisecond calls are bimodal on a shared machine, and 15 rounds
#: left their medians 20 % apart between runs
INTERLEAVE_MAX_ROUNDS = 101

#: combinations not run by default, with the reason recorded in the results.
KNOWN_SKIPS = {
    ("jac-8-32-32-8", "lambdify-jax"): "known to exceed memory (ANCHORS.md): >16 GiB in XLA compile",
    ("jac-8-32-32-8", "sympy2jax"): "known to exceed memory (ANCHORS.md): >16 GiB in XLA compile",
}

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


# ==== the tools ===========================================================================
# Each adapter: build() creates the callable; prepare(X) puts a float64 batch (n, d) into
# the tool's native layout and dtype; params(tree) the same for parameter values;
# call(data, ps) evaluates; entries(out, n) returns (n, entries) float64 for checking;
# single(x, ps) evaluates one sample (x: (d,)); hlo(data, ps) the lowered program.


def _block(out: Any) -> Any:
    import jax

    return jax.block_until_ready(out)


def _as_columns(out: Any, n: int) -> np.ndarray:
    """Any pytree of per-sample outputs (batch leading) -> (n, entries) float64."""
    import jax

    leaves = jax.tree_util.tree_leaves(out)
    cols = [np.broadcast_to(np.asarray(leaf, dtype=np.float64), (n,) + np.shape(leaf)[1:]).reshape(n, -1)
            if np.ndim(leaf) else np.full((n, 1), float(leaf)) for leaf in leaves]
    return np.concatenate(cols, axis=1)


class SymkernTool:
    jax, dtype, x64 = True, "float32", False
    #: BuildOptions(cpu_loop=...): "xla" (the default) or "c" (a C loop, `symkern-c` tools)
    cpu_loop = "xla"

    def __init__(self, wl: Any) -> None:
        self.wl = wl

    def build(self) -> None:
        import symkern as sk

        functions = {k: jax_impl for k, (jax_impl, _) in self.wl.functions.items()} or None
        self.kernel = sk.build_function(self.wl.eqs, self.wl.inputs, params=self.wl.params,
                                        functions=functions, dtype=self.dtype,
                                        options=sk.BuildOptions(cpu_loop=self.cpu_loop))

    def prepare(self, X: np.ndarray) -> Any:
        import jax

        return jax.device_put(X.astype(np.float32))

    def params(self, tree: Any) -> Any:
        import jax

        return jax.tree_util.tree_map(lambda v: jax.device_put(np.asarray(v, np.float32)), tree)

    def call(self, data: Any, ps: Any) -> Any:
        return self.kernel(data, ps)

    def entries(self, out: Any, n: int) -> np.ndarray:
        return _as_columns(out, n)

    def single(self, x: np.ndarray, ps: Any) -> Any:
        return self.kernel(x, ps)

    def hlo(self, data: Any, ps: Any) -> str:
        return self.kernel.hlo(data, ps)

    def extra(self) -> dict:
        return {"timings": {k: round(v, 4) for k, v in self.kernel.timings.items()},
                "compilations": self.kernel.compilations, **_assembly_figures(self.kernel)}


def _assembly_figures(kernel: Any) -> dict:
    """How a symkern kernel assembles its outputs (`assembly`, decided at build time) and
    its body's form (`form`); both None for anything else."""
    return {"assembly": getattr(kernel, "assembly", None), "form": getattr(kernel, "form", None)}


class SymkernTool64(SymkernTool):
    """symkern in float64 (the process enables jax_enable_x64 before anything is built)."""

    dtype, x64 = "float64", True

    def prepare(self, X: np.ndarray) -> Any:
        import jax

        return jax.device_put(X.astype(np.float64))

    def params(self, tree: Any) -> Any:
        import jax

        return jax.tree_util.tree_map(lambda v: jax.device_put(np.asarray(v, np.float64)), tree)


class SymkernCTool(SymkernTool):
    """symkern with `BuildOptions(cpu_loop="c")`: each call one C loop over the batch."""

    cpu_loop = "c"


class SymkernCTool64(SymkernTool64):
    """`symkern-c` in float64."""

    cpu_loop = "c"


class SymkernNetworkTool(SymkernTool):
    """symkern's network entry point on the network the workload's equations scalarize."""

    def build(self) -> None:
        import symkern as sk

        snn = sk.SymbolicNetwork(self.wl.make_net())
        eqs = sk.jacobian(snn.output, snn.input) if self.wl.jacobian else snn.output
        self.kernel = sk.build_nn_function(eqs, snn)


class LambdifyNumpyTool:
    jax = False

    def __init__(self, wl: Any) -> None:
        self.wl = wl

    def build(self) -> None:
        import sympy as sp

        modules = [{k: np_impl for k, (_, np_impl) in self.wl.functions.items()}, "numpy"]
        # A list of entries, not the Matrix: the Matrix form builds a ragged array when an
        # entry is constant (sympy#5642), and the list form is equally documented.
        self.f = sp.lambdify((self.wl.inputs, self.wl.flat_param_symbols()), self.wl.flat_entries(),
                             modules=modules, cse=True)

    def prepare(self, X: np.ndarray) -> Any:
        # Columns contiguous: lambdify unpacks the first axis into the input symbols.
        return np.ascontiguousarray(X.T)

    def params(self, tree: Any) -> Any:
        from workloads import _tree_leaves

        leaves = _tree_leaves(tree)
        return np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in leaves]) if leaves else []

    def call(self, data: Any, ps: Any) -> Any:
        return self.f(data, ps)

    def entries(self, out: Any, n: int) -> np.ndarray:
        return np.stack([np.broadcast_to(np.asarray(e, np.float64), (n,)) for e in out], axis=1)

    def single(self, x: np.ndarray, ps: Any) -> Any:
        return self.f(x, ps)

    def hlo(self, data: Any, ps: Any) -> None:
        return None


class LambdifyJaxTool(LambdifyNumpyTool):
    jax = True

    def build(self) -> None:
        import jax
        import sympy as sp

        modules = [{k: jax_impl for k, (jax_impl, _) in self.wl.functions.items()}, "jax"]
        self.f = sp.lambdify((self.wl.inputs, self.wl.flat_param_symbols()), self.wl.eqs,
                             modules=modules, cse=True)
        self.batched = jax.jit(jax.vmap(self.f, in_axes=(0, None)))
        self.one = jax.jit(self.f)

    def prepare(self, X: np.ndarray) -> Any:
        import jax

        return jax.device_put(X.astype(np.float32))

    def params(self, tree: Any) -> Any:
        import jax

        return jax.device_put(np.asarray(LambdifyNumpyTool.params(self, tree), np.float32))

    def call(self, data: Any, ps: Any) -> Any:
        return self.batched(data, ps)

    def entries(self, out: Any, n: int) -> np.ndarray:
        return _as_columns(out, n)

    def single(self, x: np.ndarray, ps: Any) -> Any:
        return self.one(x, ps)

    def hlo(self, data: Any, ps: Any) -> str:
        return self.batched.lower(data, ps).as_text()


def _plain_symbols(wl: Any) -> dict:
    """Dummy -> Symbol with a unique name: symengine's LLVM backend rejects a Dummy."""
    import sympy as sp

    symbols = list(wl.inputs) + wl.flat_param_symbols()
    return {s: sp.Symbol(f"s{k}_{s.name}") for k, s in enumerate(symbols) if isinstance(s, sp.Dummy)}


class SymengineTool:
    jax = False

    def __init__(self, wl: Any) -> None:
        self.wl = wl

    def build(self) -> None:
        import symengine as se

        rename = _plain_symbols(self.wl)
        args = [rename.get(s, s) for s in list(self.wl.inputs) + self.wl.flat_param_symbols()]
        exprs = [e.xreplace(rename) for e in self.wl.flat_entries()]
        self.f = se.Lambdify(args, exprs, backend="llvm", cse=True)

    def prepare(self, X: np.ndarray) -> Any:
        return X.astype(np.float64)

    def params(self, tree: Any) -> Any:
        from workloads import _tree_leaves

        leaves = _tree_leaves(tree)
        if not leaves:
            return np.zeros(0)
        return np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in leaves])

    def call(self, data: Any, ps: Any) -> Any:
        # symengine takes one row per sample holding every argument: the parameters are
        # copied into every row (the cost its users pay; done per call, as they would).
        rows = np.empty((data.shape[0], data.shape[1] + ps.size))
        rows[:, :data.shape[1]] = data
        rows[:, data.shape[1]:] = ps
        return self.f(rows)

    def entries(self, out: Any, n: int) -> np.ndarray:
        return np.asarray(out, np.float64).reshape(n, -1)

    def single(self, x: np.ndarray, ps: Any) -> Any:
        return self.f(np.concatenate([x, ps]))

    def hlo(self, data: Any, ps: Any) -> None:
        return None


class _JittedBatchTool:
    """Tools whose batched evaluation is one jitted `self.fn(data, ps)`."""

    def call(self, data: Any, ps: Any) -> Any:
        return self.fn(data, ps)

    def entries(self, out: Any, n: int) -> np.ndarray:
        return _as_columns(out, n)

    def hlo(self, data: Any, ps: Any) -> str:
        return self.fn.lower(data, ps).as_text()


class Sympy2JaxTool(_JittedBatchTool):
    jax = True

    def __init__(self, wl: Any) -> None:
        self.wl = wl

    def build(self) -> None:
        import jax
        import sympy as sp
        import sympy2jax

        extra = {sp.Function(k): jax_impl for k, (jax_impl, _) in self.wl.functions.items()} or None
        self.module = sympy2jax.SymbolicModule(self.wl.flat_entries(), extra_funcs=extra)
        names_in = [str(s.name) for s in self.wl.inputs]
        names_p = [str(s.name) for s in self.wl.flat_param_symbols()]
        module = self.module

        def evaluate(X: Any, P: Any) -> Any:
            symbols = {name: X[..., i] for i, name in enumerate(names_in)}
            symbols.update({name: P[j] for j, name in enumerate(names_p)})
            return module(**symbols)

        self.fn = jax.jit(evaluate)

    prepare = LambdifyJaxTool.prepare
    params = LambdifyJaxTool.params


    def single(self, x: np.ndarray, ps: Any) -> Any:
        return self.fn(x, ps)



class JaxHandTool(_JittedBatchTool):
    jax = True

    def __init__(self, wl: Any) -> None:
        self.wl = wl

    def build(self) -> None:
        import jax

        net = self.wl.make_net()
        if self.wl.jacobian:
            self.fn = jax.jit(jax.vmap(jax.jacfwd(net.apply), in_axes=(0, None)))
            self.one = jax.jit(jax.jacfwd(net.apply))
        else:
            self.fn = self.one = jax.jit(net.apply)

    prepare = SymkernTool.prepare
    params = SymkernTool.params


    def single(self, x: np.ndarray, ps: Any) -> Any:
        return self.one(x, ps)



ADAPTERS = {"symkern": SymkernTool, "symkern-f64": SymkernTool64, "symkern-c": SymkernCTool,
            "symkern-c-f64": SymkernCTool64, "symkern-nn": SymkernNetworkTool,
            "lambdify-numpy": LambdifyNumpyTool, "lambdify-jax": LambdifyJaxTool,
            "symengine": SymengineTool, "sympy2jax": Sympy2JaxTool, "jax-hand": JaxHandTool,
            **PEER_ADAPTERS}


def _dtype(tool: Any) -> str:
    """The dtype a tool computes in: its own `dtype`, else float32 for JAX, float64 for NumPy."""
    return getattr(tool, "dtype", "float32" if tool.jax else "float64")


def _enable_x64_for(tools: list[str]) -> bool:
    """Turn jax_enable_x64 on in this process when one of `tools` computes in float64 under
    JAX (before anything is built); the float32 tools name their dtype, so they stay float32."""
    import jax

    needed = any(getattr(ADAPTERS[t], "x64", False) for t in tools)
    if needed:
        jax.config.update("jax_enable_x64", True)
    return needed


# ==== measurement (inside a subprocess) ===================================================


def _compile_counter() -> list[int]:
    """A list whose first item counts XLA backend compilations from now on."""
    import jax

    count = [0]

    def listener(event: str, duration: float, **_: Any) -> None:
        if event == COMPILE_EVENT:
            count[0] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    return count


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    """max over entries of max|got - ref| / max|ref| (per output entry, over the batch)."""
    scale = np.maximum(np.abs(ref).max(axis=0), 1e-12)
    return float(np.nanmax(np.abs(got - ref).max(axis=0) / scale))


def _median_time(fn: Any, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def job(name: str, directory: Path, tools: list[str], cfg: dict) -> dict:
    """In one subprocess: prepare the workload unless done, then measure each tool.

    The full profile runs one tool per process (isolated memory figures and failures);
    --quick runs a workload's tools together (process start-up dominates small cases).
    """
    out: dict[str, Any] = {"tools": {}}
    x64 = _enable_x64_for(tools)
    path = directory / f"{name}.pkl"
    if not path.exists():
        out["prepare"] = prepare_workload(name, directory, cfg)
    if tools:
        compiles = _compile_counter()
        with open(path, "rb") as fh:
            wl = pickle.load(fh)
        prepared = np.load(path.with_suffix(".npz"))
        X, ref = prepared["X"], (prepared["ref"] if "ref" in prepared else None)
        built: dict[str, Any] = {}
        for tool in tools:
            try:
                out["tools"][tool] = worker(tool, wl, X, ref, compiles, cfg, built)
                out["tools"][tool]["x64"] = x64
            except Exception as exc:  # noqa: BLE001 - recorded per tool
                out["tools"][tool] = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:400]}
        if len(built) > 1:
            out["interleaved"] = interleave(built, wl, cfg)
    return out


def interleave_job(name: str, directory: Path, tools: list[str], cfg: dict) -> dict:
    """In one subprocess: build `tools` again and time them round-robin (`interleave`)."""
    x64 = _enable_x64_for(tools)
    with open(directory / f"{name}.pkl", "rb") as fh:
        wl = pickle.load(fh)
    built, failed = {}, {}
    for tool_name in tools:
        try:
            tool = ADAPTERS[tool_name](wl)
            tool.build()
            built[tool_name] = tool
        except Exception as exc:  # noqa: BLE001 - recorded per tool
            failed[tool_name] = f"{type(exc).__name__}: {exc}"[:300]
    result = interleave(built, wl, cfg)
    result["failed"] = failed
    result["x64"] = x64
    return result


def round_robin(calls: dict[str, Any], rounds: int) -> dict[str, list[float]]:
    """Seconds each of `calls` took in each of `rounds` rounds. A round calls every one once,
    starting one later than the round before, so no call always follows the same neighbour.
    The calls block until their results are ready (also this script's experiments use it)."""
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - t0)
    return times


def interleave(built: dict[str, Any], wl: Any, cfg: dict) -> dict:
    """Throughput of already built tools, timed round-robin in this process.

    Each round calls every tool once at the throughput batch, starting one tool later than
    the round before, so no tool always follows the same neighbour; the profile's `rounds`
    at least, more while all rounds take under its `round_seconds`. Returns the median
    samples/s per tool and every time.
    """
    batch = wl.sample(cfg["batch"], seed=1)
    calls = {}
    for name, tool in built.items():
        data, ps = tool.prepare(batch), tool.params(wl.param_values)
        calls[name] = (lambda tool=tool, data=data, ps=ps: _block(tool.call(data, ps)))
        calls[name]()
        calls[name]()  # compiled for this batch and warm
    names = list(calls)
    started = time.perf_counter()
    for name in names:
        calls[name]()
    one_round = time.perf_counter() - started
    rounds = int(min(max(cfg["rounds"], cfg["round_seconds"] / max(one_round, 1e-9)),
                     INTERLEAVE_MAX_ROUNDS))
    times = round_robin(calls, rounds)
    return {"rounds": rounds, "batch": cfg["batch"], "tools": {
        name: {"throughput": cfg["batch"] / statistics.median(ts),
               "times_s": [round(t, 9) for t in ts],
               **_assembly_figures(getattr(built[name], "kernel", None))}
        for name, ts in times.items()}}


def _apply_interleaved(entry: dict, interleaved: dict) -> None:
    """`throughput` becomes the interleaved median; the isolated one is kept beside it."""
    entry["interleaved"] = {k: v for k, v in interleaved.items() if k != "tools"}
    for r in entry["tools"].values():
        if r.get("status") == "ok":
            r["throughput_source"] = "isolated"
    for name, figures in interleaved.get("tools", {}).items():
        r = entry["tools"].get(name)
        if r and r.get("status") == "ok":
            r["throughput_source"] = "interleaved"
            r["throughput_isolated"] = r["throughput"]
            r["throughput"] = figures["throughput"]
            r["interleaved_times_s"] = figures["times_s"]
            if figures.get("assembly") is not None:
                r["interleaved_assembly"] = figures["assembly"]
                r["interleaved_form"] = figures["form"]


def worker(tool_name: str, wl: Any, X: np.ndarray, ref: np.ndarray | None, compiles: list[int],
           cfg: dict, keep: dict | None = None) -> dict:
    """Measure one tool on one workload."""
    import jax

    result: dict[str, Any] = {"rss_start_mib": round(_rss_mib(), 1)}
    tool = ADAPTERS[tool_name](wl)
    result["dtype"] = _dtype(tool)

    # -- build to the first result ---------------------------------------------------------
    t0 = time.perf_counter()
    tool.build()
    built = time.perf_counter()
    data = tool.prepare(X)
    ps = tool.params(wl.param_values)
    out = _block(tool.call(data, ps))
    result["build_s"] = time.perf_counter() - t0
    result["output_dtypes"] = sorted({str(np.asarray(leaf).dtype) for leaf in jax.tree_util.tree_leaves(out)
                                      if np.ndim(leaf)})
    result["build_python_s"] = built - t0
    result["build_compiles"] = compiles[0]
    if ref is not None:
        result["max_rel_error"] = _rel_error(tool.entries(out, X.shape[0]), ref)
    if tool.jax:
        try:
            result["hlo_chars"] = len(tool.hlo(data, ps))
        except Exception as exc:  # noqa: BLE001 - a figure, not a failure
            result["hlo_error"] = f"{type(exc).__name__}: {exc}"[:200]

    # -- parameter values change: must not recompile ---------------------------------------
    before = compiles[0]
    _block(tool.call(data, tool.params(wl.perturbed_values())))
    result["recompiles_on_new_params"] = compiles[0] - before if tool.jax else 0

    # -- steady throughput ------------------------------------------------------------------
    big = tool.prepare(wl.sample(cfg["batch"], seed=1))
    _block(tool.call(big, ps))
    median, times = _median_time(lambda: _block(tool.call(big, ps)), cfg["repeats"])
    result["batch"] = cfg["batch"]
    result["throughput"] = cfg["batch"] / median
    result["throughput_times_s"] = [round(t, 6) for t in times]
    big = None  # free the large batch before the latency loop

    # -- single-sample latency ----------------------------------------------------------------
    x = tool.prepare(X[:1])[0] if tool.jax else X[0].copy()
    for _ in range(3):
        _block(tool.single(x, ps))
    result["latency_s"], _ = _median_time(lambda: _block(tool.single(x, ps)), cfg["latency_repeats"])

    result["peak_rss_mib"] = round(_rss_mib(), 1)
    if hasattr(tool, "extra"):
        result.update(tool.extra())
    result["jax_version"] = jax.__version__
    result["status"] = "ok"
    if keep is not None:  # the quick profile times the tools it built in turn afterwards
        keep[tool_name] = tool
    return result


def prepare_workload(name: str, directory: Path, cfg: dict) -> dict:
    """Build the workload once, pickle it, compute the float64 reference and the copy figure."""
    import jax
    import jax.numpy as jnp
    import sympy as sp
    import workloads

    t0 = time.perf_counter()
    wl = workloads.build(name)
    meta: dict[str, Any] = {"symbolic_s": time.perf_counter() - t0, "ops": wl.ops, "note": wl.note,
                            "inputs": len(wl.inputs), "entries": len(wl.flat_entries()),
                            "params": len(wl.flat_param_symbols())}
    from symkern.codegen.linearize import count_operations

    meta["dag_ops"] = int(count_operations(wl.flat_entries(), dag=True))
    path = directory / f"{name}.pkl"
    with open(path, "wb") as fh:
        pickle.dump(wl, fh)
    X = wl.sample(cfg["build_batch"], seed=0)
    arrays = {"X": X}
    try:
        t0 = time.perf_counter()
        modules = [{k: np_impl for k, (_, np_impl) in wl.functions.items()}, "numpy"]
        f = sp.lambdify((wl.inputs, wl.flat_param_symbols()), wl.flat_entries(), modules=modules, cse=True)
        out = f(np.ascontiguousarray(X.T), wl.flat_param_values())
        arrays["ref"] = np.stack([np.broadcast_to(np.asarray(e, np.float64), (X.shape[0],)) for e in out],
                                 axis=1)
        meta["reference"] = "sympy.lambdify numpy float64, cse=True"
        meta["reference_s"] = time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001 - recorded; errors are then not checked
        meta["reference_error"] = f"{type(exc).__name__}: {exc}"[:300]
    np.savez(path.with_suffix(".npz"), **arrays)

    # Copy ceiling: the kernel reads n*inputs and writes n*entries float32 values once; a
    # copy of a buffer that size reads and writes it, i.e. moves twice the bytes.
    n = cfg["batch"]
    values = n * (meta["inputs"] + meta["entries"])
    buffer = jax.device_put(np.ones(values, np.float32))
    copy = jax.jit(jnp.copy)
    jax.block_until_ready(copy(buffer))
    median, _ = _median_time(lambda: jax.block_until_ready(copy(buffer)), max(cfg["repeats"], 7))
    meta["kernel_bytes"] = values * 4
    meta["copy_s"] = median
    meta["copy_bandwidth_gbs"] = 2 * values * 4 / median / 1e9
    # samples/s of a kernel that moved its bytes at copy bandwidth
    meta["copy_equivalent_throughput"] = n / (median / 2)
    return meta


# ==== orchestration ===========================================================================


def _limit(mem_bytes: int) -> Any:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
        os.setsid()  # its own process group: a timeout kills it and any children

    return apply


def _run_child(args: list[str], timeout: float, mem_gib: float) -> tuple[dict | None, str]:
    """Run this script with `args` in a limited subprocess; (result, failure reason)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_limit(int(mem_gib * 2**30)))
    except OSError as exc:
        return None, f"could not start: {exc}"
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        return None, f"timeout after {timeout:.0f} s"
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:]), ""
    tail = (stderr or "").strip().splitlines()[-3:]
    if proc.returncode < 0 or any("MemoryError" in t or "bad_alloc" in t or "RESOURCE_EXHAUSTED" in t
                                  for t in tail):
        return None, (f"failed (exit {proc.returncode}; memory limit {mem_gib:g} GiB?): "
                      f"{' | '.join(tail)[-300:]}")
    return None, f"failed (exit {proc.returncode}): {' | '.join(tail)[-400:]}"


def _available(tool: str) -> str | None:
    for module in OPTIONAL.get(tool, ()):
        try:
            __import__(module)
        except ImportError:
            extra = "peers" if tool in PEER_ADAPTERS else "bench"
            return f"not installed (pip install {module}; the `{extra}` extra)"
    return None


def _versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("jax", "jaxlib", "sympy", "numpy", "symengine", "sympy2jax", "numba", "pytensor",
                 "casadi", "symkern"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _skip_reason(name: str, tool: str, include_known_failures: bool) -> str | None:
    reason = _available(tool)
    if reason is None and tool == "jax-hand" and not name.startswith(("net-", "jac-")):
        reason = "no hand-written jax.numpy reference for this workload"
    if reason is None and tool == "symkern-nn" and not name.startswith(("net-", "jac-")):
        reason = "not a network: build_nn_function takes a SymbolicNetwork"
    if reason is None and tool == "symengine" and name == "table-1MB":
        reason = "symengine's Lambdify cannot call a user-defined (Python) function"
    if reason is None and (name, tool) in KNOWN_SKIPS and not include_known_failures:
        reason = KNOWN_SKIPS[(name, tool)]
    return reason


def _print_line(tool: str, r: dict) -> None:
    if r.get("status") != "ok":
        print(f"  {tool:15s} {r.get('status')}: {r.get('reason')}", flush=True)
        return
    err = r.get("max_rel_error")
    print(f"  {tool:15s} build {r['build_s']:7.2f} s  {r['throughput'] / 1e6:9.2f} M/s"
          f"  latency {r['latency_s'] * 1e6:8.1f} us  err {err if err is None else f'{err:.1e}'}"
          f"  rss {r['peak_rss_mib']:.0f} MiB", flush=True)


def _interleave_workload(name: str, entry: dict, tmp: str, cfg: dict, mem_gib: float) -> None:
    """Time the tools that measured fine round-robin in one subprocess (`interleave_job`)."""
    members, left_out = [], {}
    for tool, r in entry["tools"].items():
        if r.get("status") != "ok":
            continue
        call_s = cfg["batch"] / r["throughput"]
        if r["build_s"] > INTERLEAVE_MAX_BUILD_S or call_s > INTERLEAVE_MAX_CALL_S:
            left_out[tool] = f"build {r['build_s']:.0f} s, one call {call_s:.2f} s: isolated figure"
        else:
            members.append(tool)
    if len(members) < 2:
        return
    budget = sum(2 * entry["tools"][t]["build_s"]
                 + (cfg["rounds"] + 4) * 2 * cfg["batch"] / entry["tools"][t]["throughput"]
                 for t in members) + 2 * cfg["round_seconds"] + 120.0
    result, why = _run_child(["--interleave-job", name, tmp, ",".join(members),
                              "--config", json.dumps(cfg)], budget, mem_gib)
    if result is None:
        entry["interleaved"] = {"error": why}
        print(f"  interleaved throughput: {why}", flush=True)
        return
    _apply_interleaved(entry, result)
    entry["interleaved"]["left_out"] = left_out
    rates = ", ".join(f"{t} {entry['tools'][t]['throughput'] / 1e6:.3g} M/s" for t in result["tools"])
    print(f"  interleaved ({result['rounds']} rounds): {rates}"
          + (f"; left out: {', '.join(left_out)}" if left_out else ""), flush=True)


def same_dtype_ratios(report: dict) -> dict:
    """Per workload and dtype: symkern's throughput over the fastest other tool computing in
    that dtype (interleaved figures where the workload has them), and which tool that was."""
    out: dict[str, dict] = {}
    for name, entry in report["workloads"].items():
        by_dtype: dict[str, dict[str, float]] = {}
        for tool, r in entry.get("tools", {}).items():
            if r.get("status") == "ok":
                by_dtype.setdefault(r["dtype"], {})[tool] = r["throughput"]
        rows = {}
        for dtype, rates in by_dtype.items():
            ours = {t: v for t, v in rates.items() if t.startswith("symkern")}
            others = {t: v for t, v in rates.items() if not t.startswith("symkern")}
            if ours and others:
                symkern, best = max(ours, key=ours.get), max(others, key=others.get)
                rows[dtype] = {"symkern": symkern, "symkern_throughput": ours[symkern],
                               "best_peer": best, "best_peer_throughput": others[best],
                               "ratio": round(ours[symkern] / others[best], 3),
                               # each of symkern's forms (the default, cpu_loop="c") apart
                               "ratios": {t: round(v / others[best], 3)
                                          for t, v in sorted(ours.items())}}
        if rows:
            out[name] = rows
    return out


def _configure_process(cfg: dict) -> None:
    """What a measuring process sets before anything runs: the allocator of `--cpu-memory`
    (a setting of the process, so every tool measured in it shares it)."""
    if cfg.get("cpu_memory", "system") == "reuse":
        import symkern as sk

        sk.reuse_cpu_memory()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small profile (< 60 s), for smoke tests")
    parser.add_argument("--peers", action="store_true",
                        help="numba, PyTensor and CasADi on the mechanics models (the `peers` extra)")
    parser.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/<profile>.json)")
    parser.add_argument("--workloads", help="comma-separated subset")
    parser.add_argument("--tools", help="comma-separated subset")
    parser.add_argument("--timeout", type=float, help="seconds per tool and workload")
    parser.add_argument("--mem-gib", type=float, default=10.0, help="address-space limit per subprocess")
    parser.add_argument("--batch", type=int, help="throughput batch size")
    parser.add_argument("--shapes", metavar="1e3|1e4",
                        help="with --peers: the five random expression shapes of this many "
                             "operations instead of the mechanics models "
                             "(workloads.SHAPE_WORKLOADS)")
    parser.add_argument("--cpu-memory", choices=("system", "reuse"), default="system",
                        help="every measuring process's allocator: glibc's defaults, or "
                             "symkern.reuse_cpu_memory() before anything runs (all tools share it)")
    parser.add_argument("--include-known-failures", action="store_true",
                        help="also run the combinations ANCHORS.md measured above 16 GiB")
    parser.add_argument("--job", nargs=3, metavar=("WORKLOAD", "DIR", "TOOLS"), help=argparse.SUPPRESS)
    parser.add_argument("--interleave-job", nargs=3, metavar=("WORKLOAD", "DIR", "TOOLS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.interleave_job:
        sys.setrecursionlimit(100_000)
        name, directory, tools = args.interleave_job
        _configure_process(json.loads(args.config))
        result = interleave_job(name, Path(directory), tools.split(","), json.loads(args.config))
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    if args.job:
        sys.setrecursionlimit(100_000)  # pickled deep expressions
        name, directory, tools = args.job
        _configure_process(json.loads(args.config))
        result = job(name, Path(directory), [t for t in tools.split(",") if t], json.loads(args.config))
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    if args.quick and args.peers:
        parser.error("--quick and --peers are two profiles: name one")
    cfg = dict(QUICK if args.quick else PEERS if args.peers else FULL)
    if args.timeout:
        cfg["timeout"] = args.timeout
    if args.batch:
        cfg["batch"] = args.batch
    cfg["cpu_memory"] = args.cpu_memory
    if args.shapes and not args.peers:
        parser.error("--shapes goes with --peers")
    if args.shapes:
        import workloads

        if args.shapes not in workloads.SHAPE_WORKLOADS:
            parser.error(f"--shapes: expected one of {', '.join(workloads.SHAPE_WORKLOADS)}, "
                         f"got {args.shapes!r}")
        cfg["workloads"] = workloads.SHAPE_WORKLOADS[args.shapes]
    workload_names = args.workloads.split(",") if args.workloads else cfg["workloads"]
    tool_names = args.tools.split(",") if args.tools else PEER_TOOLS if args.peers else TOOLS
    unknown = sorted(set(tool_names) - set(ADAPTERS))
    if unknown:
        parser.error(f"unknown tools {', '.join(unknown)}; the tools are {', '.join(ADAPTERS)}")
    profile = ("quick" if args.quick else "peers-shapes" if args.shapes else "peers" if args.peers
               else "full")
    out_path = args.out or HERE / "results" / f"{profile}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "profile": profile, "config": cfg, "versions": _versions(), "machine": {
            "platform": platform.platform(), "cpus": os.cpu_count(), "processor": platform.processor()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "tools": tool_names, "workloads": {},
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="symkern-bench-") as tmp:
        for name in workload_names:
            entry: dict[str, Any] = {"tools": {}}
            report["workloads"][name] = entry
            runnable = [t for t in tool_names if _skip_reason(name, t, args.include_known_failures) is None]
            # --quick: one process prepares the workload and runs every tool (start-up
            # dominates small cases); full: preparation, then one process per tool.
            first = runnable if args.quick else []
            t0 = time.perf_counter()
            result, why = _run_child(["--job", name, tmp, ",".join(first), "--config", json.dumps(cfg)],
                                     max(cfg["timeout"], 120.0) * (3 + len(first)), args.mem_gib)
            if result is None or "prepare" not in result:
                entry["error"] = f"workload preparation {why}"
                print(f"{name}: {entry['error']}", flush=True)
                for tool in tool_names:
                    entry["tools"][tool] = {"status": "error", "reason": entry["error"]}
                continue
            meta = result["prepare"]
            entry.update(meta)
            print(f"{name}: {meta['ops']} ops ({meta['dag_ops']} shared), "
                  f"symbolic {meta['symbolic_s']:.1f} s", flush=True)
            for tool, r in result["tools"].items():
                r["wall_s"] = time.perf_counter() - t0
                r["note"] = "--quick: tools share one process; peak_rss is cumulative"
                entry["tools"][tool] = r
            if "interleaved" in result:
                _apply_interleaved(entry, result["interleaved"])
            for tool in tool_names:
                reason = _skip_reason(name, tool, args.include_known_failures)
                if reason is not None:
                    entry["tools"][tool] = {"status": "skipped", "reason": reason}
                elif tool not in entry["tools"]:
                    t0 = time.perf_counter()
                    result, why = _run_child(["--job", name, tmp, tool, "--config", json.dumps(cfg)],
                                             cfg["timeout"], args.mem_gib)
                    entry["tools"][tool] = result["tools"][tool] if result else {"status": "error",
                                                                                 "reason": why}
                    entry["tools"][tool]["wall_s"] = time.perf_counter() - t0
                if not args.quick:
                    _print_line(tool, entry["tools"][tool])
            if not args.quick:
                _interleave_workload(name, entry, tmp, cfg, args.mem_gib)
            for tool in tool_names if args.quick else ():
                _print_line(tool, entry["tools"][tool])
            out_path.write_text(json.dumps(report, indent=1))  # partial results survive a crash
    report["elapsed_s"] = time.perf_counter() - started
    report["ratios"] = same_dtype_ratios(report)
    out_path.write_text(json.dumps(report, indent=1))
    print(f"wrote {out_path} ({report['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
