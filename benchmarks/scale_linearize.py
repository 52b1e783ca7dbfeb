"""Scale of symkern.codegen.linearize against sympy.cse, and of printing its output.

Usage: python benchmarks/scale_linearize.py [--quick] [--timeout SECONDS]

For each workload: time of ``linearize(cse=True)`` (and ``cse=False``), of ``sympy.cse``
(with its Add/Mul "opt_cse" pre-pass) and of SymPy's ``tree_cse`` alone (no opt pass),
the operation count of each result (``count_operations``, iterative), then the time of
printing ``linearize``'s output with SymPy's JAX printer (``_EvaluatorPrinter``) and of
``ast.parse`` + ``compile`` of the printed source. Every measurement runs in a forked child
with a time limit (default 120 s); one that runs over is reported as ``>LIMIT``, one
that fails by its exception's name (``RecursionError``).
"""

from __future__ import annotations

import argparse
import ast
import multiprocessing as mp
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import sympy as sp
from sympy.printing.numpy import JaxPrinter
from sympy.simplify.cse_main import tree_cse
from sympy.utilities.lambdify import _EvaluatorPrinter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from symkern.codegen.linearize import count_operations, linearize  # noqa: E402

sys.setrecursionlimit(1000)  # the default; what users run with


# --- bounded measurement in a forked child ----------------------------------------------


def _child(conn, fn):
    try:
        t0 = time.perf_counter()
        extra = fn()
        conn.send(("ok", time.perf_counter() - t0, extra))
    except BaseException as exc:  # noqa: BLE001 - reported, not handled
        conn.send(("err", type(exc).__name__, traceback.format_exc(limit=3)[-300:]))
    conn.close()


def measure(fn: Callable[[], object], limit: float) -> tuple[str, object]:
    """Run ``fn`` in a forked child (inherits the inputs); ``(cell text, fn's result)``."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn))
    proc.start()
    child.close()
    if not parent.poll(limit):
        proc.kill()
        proc.join()
        return f">{limit:.0f}s", None
    status, a, b = parent.recv()
    proc.join()
    if status == "ok":
        return f"{a:.2f}s", b
    return str(a), None


# --- workloads --------------------------------------------------------------------------


def wide_sum(n_terms: int, n_vars: int = 16):
    """sum_i c[i] * sin(x_{i mod n}) * x_{(i+1) mod n}, built unevaluated (SymPy's own
    evaluated Add of 10^5 terms takes ~30 s to construct, more than everything below)."""
    x = sp.symbols(f"x0:{n_vars}")
    c = sp.IndexedBase("c")
    sins = [sp.sin(v) for v in x]
    terms = [
        sp.Mul(c[i], sins[i % n_vars], x[(i + 1) % n_vars], evaluate=False)
        for i in range(n_terms)
    ]
    return [sp.Add(*terms, evaluate=False)], [c, *x]


def deep_nest(depth: int):
    """sin(x1 + sin(x0 + sin(...))) and x0*(x1 + x2*(x3 + ...)), each ``depth`` deep."""
    x = sp.symbols("x0:4")
    e1 = e2 = x[0]
    for i in range(depth):
        e1 = sp.sin(sp.Add(x[i % 4], e1, evaluate=False), evaluate=False)
        e2 = (sp.Add if i % 2 else sp.Mul)(x[i % 4], e2, evaluate=False)
    return [e1, e2], list(x)


def pendulum(n: int, jacobian: bool):
    """Mass matrix of sympy's n-link pendulum on a cart (q(t), u(t) -> plain symbols),
    or its Jacobian w.r.t. the generalized coordinates."""
    from sympy.physics.mechanics import models

    kane = models.n_link_pendulum_on_cart(n, cart_force=True, joint_torques=False)
    q = [sp.Symbol(f"q{i}") for i in range(len(kane.q))]
    u = [sp.Symbol(f"u{i}") for i in range(len(kane.u))]
    subs = dict(zip(kane.q, q, strict=True)) | dict(zip(kane.u, u, strict=True))
    m = kane.mass_matrix_full.xreplace(subs)
    if jacobian:
        m = m.reshape(m.rows * m.cols, 1).jacobian(q)
    params = sorted(m.free_symbols - set(q) - set(u), key=str)
    return list(m), [*q, *u, *params]


def _num(v: int) -> str:
    return str(v) if v < 10**7 else f"{v:.2e}"


# --- one row ----------------------------------------------------------------------------


def _printed(args, repl, reduced, order=None):
    # order="none": print Add/Mul args in .args order instead of sorting them by sort_key
    # (uncached and recursive: the printer's main cost on nested sums).
    printer = JaxPrinter(
        {
            "fully_qualified_modules": False,
            "inline": True,
            "allow_unknown_functions": True,
            "order": order,
        }
    )
    return _EvaluatorPrinter(printer, False).doprint("_f", args, reduced, cses=repl)


def run_case(name: str, build: Callable[[], tuple[list, list]], limit: float, sympy_cse: bool):
    t0 = time.perf_counter()
    exprs, args = build()
    t_build = time.perf_counter() - t0
    row = {"case": name, "build": f"{t_build:.1f}s"}
    t0 = time.perf_counter()
    row["ops (tree/dag)"] = f"{_num(count_operations(exprs))}/{count_operations(exprs, dag=True)}"
    t_count = time.perf_counter() - t0

    def lin(cse):
        def fn():
            repl, red = linearize(exprs, cse=cse, symbols=sp.numbered_symbols("_c"))
            return repl, red
        return fn

    def ops(result):
        if result is None:
            return "-"
        repl, red = result
        return f"{count_operations([r for _, r in repl] + list(red))} ({len(repl)} asg)"

    # linearize runs in the parent too: its output feeds the printing measurement.
    t0 = time.perf_counter()
    lin_result = linearize(exprs, cse=True, symbols=sp.numbered_symbols("_c"))
    row["lin cse"] = f"{time.perf_counter() - t0:.2f}s"
    row["lin ops"] = ops(lin_result)
    row["lin nocse"], nocse = measure(lin(False), limit)
    row["nocse ops"] = ops(nocse)
    if sympy_cse:
        row["sympy.cse"], res = measure(lambda: sp.cse(exprs, list=True), limit)
        row["sympy ops"] = ops(res)
        row["tree_cse"], res = measure(
            lambda: tree_cse(exprs, sp.numbered_symbols("_t"), opt_subs={}, order="canonical"),
            limit,
        )
        row["tree_cse ops"] = ops(res)
    else:
        row["sympy.cse"] = row["sympy ops"] = row["tree_cse"] = row["tree_cse ops"] = "skip"

    def print_only():
        return len(_printed(args, *lin_result))

    def print_compile():
        src = _printed(args, *lin_result)
        t0 = time.perf_counter()
        compile(ast.parse(src), "<linearized>", "exec")
        return time.perf_counter() - t0

    def print_unsorted():
        return len(_printed(args, *lin_result, order="none"))

    row["print"], _ = measure(print_only, limit)
    row["print order=none"], _ = measure(print_unsorted, limit)
    cell, t_compile = measure(print_compile, limit)
    row["parse+compile"] = f"{t_compile:.2f}s" if t_compile is not None else cell

    def raw_print_compile():
        src = _printed(args, [], exprs)
        compile(ast.parse(src), "<raw>", "exec")

    if sympy_cse:
        row["raw print+compile"], _ = measure(raw_print_compile, limit)
    else:
        row["raw print+compile"] = "skip"
    row["count"] = f"{t_count:.2f}s"
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per measurement")
    ap.add_argument("--only", default="", help="run cases whose name contains this")
    opts = ap.parse_args()
    limit = opts.timeout
    cases: list[tuple[str, Callable, bool]] = [
        ("wide 1e4", lambda: wide_sum(10_000), True),
        ("deep 1e4 (x2)", lambda: deep_nest(10_000), True),
    ]
    for n in (3, 5, 8):
        cases.append((f"pendulum M n={n}", lambda n=n: pendulum(n, False), True))
        cases.append((f"pendulum dM/dq n={n}", lambda n=n: pendulum(n, True), True))
    if not opts.quick:
        cases.insert(1, ("wide 1e5", lambda: wide_sum(100_000), True))
        cases.insert(2, ("wide 1e6", lambda: wide_sum(1_000_000), False))
    rows = []
    for name, build, with_sympy in cases:
        if opts.only and opts.only not in name:
            continue
        row = run_case(name, build, limit, with_sympy)
        rows.append(row)
        print(" | ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    cols = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print()
    print("| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True))
              + " |")


if __name__ == "__main__":
    main()
