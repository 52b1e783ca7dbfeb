"""Render benchmark results (compare.py JSON) as markdown tables and PNG plots.

Usage: python benchmarks/report.py [RESULTS.json] [--doc docs/benchmarks.md] [--img docs/img]
                                  [--readme README.md]

The tables replace the text between ``<!-- results:begin -->`` and ``<!-- results:end -->``
in the doc (created if missing), and the speed summary the text between
``<!-- speed:begin -->`` and ``<!-- speed:end -->`` in README.md, so the hand-written
sections around them survive a re-render. The headline is a ratio: symkern's throughput
over the best other tool's ("anchor") on the same workload, the same machine, the same run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
SPEED_BEGIN, SPEED_END = "<!-- speed:begin -->", "<!-- speed:end -->"
TOOLS = ["symkern", "symkern-nn", "lambdify-numpy", "lambdify-jax", "symengine", "sympy2jax",
         "jax-hand"]
#: symkern's own rows: never an anchor
OURS = ("symkern", "symkern-nn")


def _ok(result: dict | None) -> bool:
    return bool(result) and result.get("status") == "ok"


def _fmt_rate(v: float | None) -> str:
    if v is None:
        return "–"
    if v >= 1e6:
        return f"{v / 1e6:.3g} M"
    return f"{v / 1e3:.3g} k"


def _mark(result: dict) -> str:
    """† on a throughput from the tool's own process where its workload's tools were
    otherwise timed interleaved (compare.py leaves out very slow builds and calls)."""
    return "†" if result.get("throughput_source") == "isolated" else ""


def _cell(result: dict) -> str:
    if _ok(result):
        return f"{_fmt_rate(result['throughput'])}{_mark(result)} ({result['build_s']:.2g} s)"
    status = result.get("status", "–") if result else "–"
    reason = (result or {}).get("reason", "")
    short = "OOM-risk skip" if "memory" in reason and status == "skipped" else status
    if "timeout" in reason:
        short = "timeout"
    return short


def best_anchor(entry: dict) -> tuple[str | None, float | None]:
    """The fastest tool other than symkern's own on this workload."""
    best = None
    for tool, result in entry["tools"].items():
        if tool not in OURS and _ok(result) and (best is None or result["throughput"] > best[1]):
            best = (tool, result["throughput"])
    return best if best else (None, None)


def fastest_build(entry: dict, tool: str) -> float | None:
    r = entry["tools"].get(tool)
    return r["build_s"] if _ok(r) else None


def tables(data: dict) -> str:
    """The markdown for one results file."""
    lines: list[str] = []
    cfg = data["config"]
    v = data["versions"]
    rounds = sorted(e["interleaved"]["rounds"] for e in data["workloads"].values()
                    if "rounds" in e.get("interleaved", {}))
    span = "–".join(str(r) for r in dict.fromkeys(rounds[:1] + rounds[-1:]))  # "15–101", "3"
    about = f" (about {cfg['round_seconds']:g} s of calls)" if "round_seconds" in cfg else ""
    timed = (f"median of {span} rounds{about} in which one process calls every tool of the "
             f"workload in turn, after a warm-up; † a tool's own process, median of "
             f"{cfg['repeats']} calls" if rounds else
             f"median of {cfg['repeats']} calls after a warm-up")
    lines.append(f"Profile `{data['profile']}`, batch {cfg['batch']:,} for throughput "
                 f"({timed}), batch {cfg['build_batch']} for the "
                 f"build to a first result; {data['machine']['cpus']} CPUs, {data['machine']['platform']}; "
                 f"jax {v.get('jax')}, sympy {v.get('sympy')}, symengine {v.get('symengine')}, "
                 f"sympy2jax {v.get('sympy2jax')}. JAX tools compute in float32, numpy and symengine in "
                 "float64. Started " + data.get("started", "?") + ".")
    lines.append("")
    lines.append("### Headline: symkern / best anchor")
    lines.append("")
    lines.append("| workload | ops (shared) | symkern | best anchor | throughput ratio | build ratio vs "
                 "lambdify-jax | kernel bytes at copy bandwidth | symkern-nn ratio |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for name, entry in data["workloads"].items():
        sk = entry["tools"].get("symkern")
        tool, rate = best_anchor(entry)
        ratio = f"**{sk['throughput'] / rate:.2f}×**" if _ok(sk) and rate else "–"
        lj = fastest_build(entry, "lambdify-jax")
        build_ratio = f"{sk['build_s'] / lj:.2f}×" if _ok(sk) and lj else "–"
        copy = entry.get("copy_equivalent_throughput")
        copy_frac = f"{sk['throughput'] / copy:.2g}×" if _ok(sk) and copy else "–"
        mark = _mark(entry["tools"].get(tool, {})) if tool else ""
        nn = entry["tools"].get("symkern-nn")
        nn_ratio = f"{nn['throughput'] / rate:.2f}×" if _ok(nn) and rate else "–"
        lines.append(f"| {name} | {entry.get('ops', '?')} ({entry.get('dag_ops', '?')}) | "
                     f"{_cell(sk) if sk else '–'} | {tool or '–'} {_fmt_rate(rate)}{mark} | {ratio} | "
                     f"{build_ratio} | {copy_frac} | {nn_ratio} |")
    lines.append("")
    lines.append("Targets: throughput ≥ 1.0× the best anchor on every workload; memory-bound "
                 "expressions ≥ 0.8× copy bandwidth (last column: symkern's samples/s over the "
                 "samples/s of a `jnp.copy` moving the same input+output bytes); build time ≤ 0.5× "
                 "lambdify-jax. symkern runs the workload's equations through `build_function`; on "
                 "networks, symkern-nn is the same network through `build_nn_function` (an array "
                 "program for a layer above 64 weights), its ratio in the last column.")
    lines.append("")
    lines.append("### Throughput, samples/s (build time to the first result)")
    lines.append("")
    lines.append("| workload | " + " | ".join(TOOLS) + " |")
    lines.append("|---" * (len(TOOLS) + 1) + "|")
    for name, entry in data["workloads"].items():
        lines.append(f"| {name} | " + " | ".join(_cell(entry["tools"].get(t, {})) for t in TOOLS) + " |")
    lines.append("")
    for title, key, fmt in (
        ("Single-sample latency, µs", "latency_s", lambda x: f"{x * 1e6:.0f}"),
        ("Lowered StableHLO size, characters", "hlo_chars", lambda x: f"{x:,}"),
        ("Max relative error vs float64 reference", "max_rel_error", lambda x: f"{x:.1e}"),
        ("Peak RSS of the measuring process, MiB", "peak_rss_mib", lambda x: f"{x:.0f}"),
        ("Compilations when parameter values change", "recompiles_on_new_params", str),
    ):
        lines.append(f"### {title}")
        lines.append("")
        lines.append("| workload | " + " | ".join(TOOLS) + " |")
        lines.append("|---" * (len(TOOLS) + 1) + "|")
        for name, entry in data["workloads"].items():
            cells = []
            for t in TOOLS:
                r = entry["tools"].get(t, {})
                cells.append(fmt(r[key]) if _ok(r) and r.get(key) is not None else "–")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    notes = sorted({(t, r.get("status"), r.get("reason")) for e in data["workloads"].values()
                    for t, r in e["tools"].items() if not _ok(r)})
    if notes:
        lines.append("### Not measured")
        lines.append("")
        for t, status, reason in notes:
            lines.append(f"- {t}: {status} — {reason}")
        lines.append("")
    return "\n".join(lines)


def speed_summary(data: dict) -> str:
    """README's speed summary: symkern's throughput over the best anchor's, per workload.

    Every figure in it is read or computed from the results file alone (tests/test_docs.py
    renders it again and compares).
    """
    cfg, machine = data["config"], data["machine"]
    rows, met = [], 0
    for name, entry in data["workloads"].items():
        sk = entry["tools"].get("symkern")
        tool, rate = best_anchor(entry)
        if not (_ok(sk) and rate):
            continue
        ratio = sk["throughput"] / rate
        met += round(ratio, 2) >= 1.0
        rows.append(f"| {name} | {_fmt_rate(sk['throughput'])} | {tool} {_fmt_rate(rate)} | "
                    f"{ratio:.2f}× |")
    lines = [
        f"Samples per second at batch {cfg['batch']:,} on {machine['cpus']} CPU cores "
        f"(`make bench`, {data.get('started', '?')[:10]}; JAX tools in float32, NumPy and "
        "symengine in float64). The best anchor is the fastest of lambdify (NumPy, JAX), "
        "symengine, sympy2jax and hand-written JAX; each workload's tools are timed in turn "
        "in one process.",
        "",
        "| workload | symkern | best anchor | symkern / best |",
        "|---|---:|---:|---:|",
        *rows,
        "",
        f"symkern is at or above the best anchor on {met} of {len(rows)} workloads "
        "(`docs/benchmarks.md` has every table and the misses).",
    ]
    return "\n".join(lines)


def replace_block(text: str, begin: str, end: str, body: str) -> str:
    """`text` with what lies between the markers `begin` and `end` replaced by `body`."""
    return text[:text.index(begin)] + f"{begin}\n{body}\n{end}" + text[text.index(end) + len(end):]


def plots(data: dict, img: Path) -> list[Path]:
    """Throughput per workload (bars, log scale) and build time against expression size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    img.mkdir(parents=True, exist_ok=True)
    names = list(data["workloads"])
    fig, ax = plt.subplots(figsize=(max(8, len(names) * 1.1), 4.5))
    width = 0.8 / len(TOOLS)
    for k, tool in enumerate(TOOLS):
        values = [data["workloads"][n]["tools"].get(tool, {}) for n in names]
        heights = [r["throughput"] if _ok(r) else 0 for r in values]
        ax.bar(np.arange(len(names)) + k * width, heights, width, label=tool)
    copies = [data["workloads"][n].get("copy_equivalent_throughput") or 0 for n in names]
    ax.scatter(np.arange(len(names)) + 0.4 - width / 2, copies, marker="_", s=400, color="k",
               label="copy of the same bytes")
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names, rotation=30, ha="right")
    ax.set_ylabel(f"samples/s at batch {data['config']['batch']:,}")
    ax.legend(fontsize=7, ncol=3)
    ax.set_title("Throughput per workload (higher is better)")
    fig.tight_layout()
    first = img / f"throughput-{data['profile']}.png"
    fig.savefig(first, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for tool in TOOLS:
        points = [(e.get("ops"), e["tools"][tool]["build_s"]) for e in data["workloads"].values()
                  if _ok(e["tools"].get(tool)) and e.get("ops")]
        if points:
            xs, ys = zip(*sorted(points), strict=True)
            ax.plot(xs, ys, "o-", label=tool, alpha=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("operations in the equations (no CSE)")
    ax.set_ylabel("build time to the first result, s")
    ax.set_title("Build time against expression size")
    ax.legend(fontsize=7)
    fig.tight_layout()
    second = img / f"build-time-{data['profile']}.png"
    fig.savefig(second, dpi=110)
    plt.close(fig)
    return [first, second]


def render(results: Path, doc: Path, img: Path, readme: Path | None = None) -> None:
    data: dict[str, Any] = json.loads(results.read_text())
    body = tables(data)
    try:
        images = plots(data, img)
        body += "\n" + "\n".join(f"![{p.stem}](img/{p.name})" for p in images) + "\n"
    except ImportError:
        body += "\n(matplotlib not installed: no plots)\n"
    stamp = f"<!-- generated by benchmarks/report.py from {results.name}; do not edit -->"
    block = f"{BEGIN}\n{stamp}\n\n{body}\n{END}"
    if doc.exists() and BEGIN in doc.read_text():
        text = doc.read_text()
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = ("# Benchmarks\n\n`python benchmarks/compare.py` then `python benchmarks/report.py`.\n\n"
                + block + "\n")
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    print(f"wrote {doc}")
    if readme is not None and readme.exists() and SPEED_BEGIN in readme.read_text():
        readme.write_text(replace_block(readme.read_text(), SPEED_BEGIN, SPEED_END,
                                        speed_summary(data)))
        print(f"wrote {readme}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", type=Path,
                        default=ROOT / "benchmarks" / "results" / "full.json")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--img", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = parser.parse_args()
    render(args.results, args.doc, args.img, args.readme)


if __name__ == "__main__":
    main()
