"""Turning per-process samples into tables: markdown, JSON and a PNG bar chart.

One table per metric (per case): a column per loop with median, min and max over the repeats,
and a row of ratios ferroloop / peer computed from medians. Failed runs and problems a child
reported (wrong results, loop exception handler calls) are listed under the tables, never
silently dropped; a loop that lacks a feature a benchmark needs shows `unsupported`.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/machine.py
import loops
from machine import fmt


def summarize(cases: list[dict], modules: dict) -> list[dict]:
    """One entry per (case, metric): stats per loop and the ferroloop/peer ratios."""
    tables = []
    for case in cases:
        for metric in modules[case["bench"]].METRICS:
            if not metric.applies_to(case["case"]):
                continue
            stats = {name: _stats(samples, metric.key) for name, samples in case["runs"].items()}
            ratios = {}
            ferro = stats.get("ferroloop", {}).get("median")
            for peer in loops.PEERS:
                peer_median = stats.get(peer, {}).get("median")
                if ferro is not None and peer_median:
                    ratios[peer] = ferro / peer_median
            title = f"{metric.title} ({case['case']})" if case["case"] else metric.title
            table = {
                "bench": case["bench"],
                "case": case["case"],
                "metric": metric.key,
                "title": title,
                "unit": metric.unit,
                "higher_is_better": metric.higher_is_better,
                "stats": stats,
                "ferroloop_over_peer": ratios,
            }
            if "floor" in case:  # the same work in C with no Python (echo_floor.py)
                table["floor"] = _stats(case["floor"], metric.key)
            tables.append(table)
    return tables


def _stats(samples: list[dict], key: str) -> dict:
    """Median, min and max of one metric over the samples that did not fail."""
    values = [s["metrics"][key] for s in samples if "error" not in s]
    values = [v for v in values if v == v]  # drop NaN
    return {
        "min": min(values, default=None),
        "median": statistics.median(values) if values else None,
        "max": max(values, default=None),
        "runs": len(samples),
        "failed": len(samples) - len(values),
        "unsupported": sum(1 for s in samples if s.get("unsupported")),
    }


def _floor_lines(t: dict) -> list[str]:
    """Under an echo table: the C server's figure, each loop against it (echo_floor.py)."""
    floor = t.get("floor")
    if floor is None:
        return []
    if floor["median"] is None:
        return [f"C floor (`echo_floor.c`): not measured ({floor['failed']} failed runs).", ""]
    line = (
        f"C floor (`echo_floor.c`, the same echo served in C with no Python, same client and "
        f"pinning, a run after each repeat's loops): median {fmt(floor['median'])} {t['unit']} "
        f"(min {fmt(floor['min'])}, max {fmt(floor['max'])})"
    )
    if floor["failed"]:
        line += f", {floor['failed']} of {floor['runs']} runs failed"
    shares = [
        f"{name} {s['median'] / floor['median']:.0%}"
        for name, s in t["stats"].items()
        if s["median"] is not None
    ]
    if shares:
        line += f". Each loop's median as a share of it: {', '.join(shares)}"
    return [line + ".", ""]


def _ratio_note(higher_is_better: bool) -> str:
    if higher_is_better:
        return "Higher is better; a ratio above 1 means ferroloop is faster."
    return "**Lower is better**; a ratio below 1 means ferroloop is better."


def _table(t: dict) -> list[str]:
    names = list(t["stats"])
    lines = [
        f"### {t['title']}: {t['unit']}",
        "",
        _ratio_note(t["higher_is_better"]),
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for row in ("median", "min", "max"):
        cells = []
        for name in names:
            s = t["stats"][name]
            cell = fmt(s[row])
            if s.get("unsupported") and s["unsupported"] == s["runs"]:
                cell = "unsupported" if row == "median" else "—"
            elif row == "median" and s["failed"]:
                cell += f" ({s['failed']} of {s['runs']} failed)"
            cells.append(cell)
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    if "ferroloop" in names:
        cells = [
            f"{t['ferroloop_over_peer'][n]:.3g}" if n in t["ferroloop_over_peer"] else "—"
            for n in names
        ]
        lines.append("| ferroloop ÷ this loop (medians) | " + " | ".join(cells) + " |")
    return [*lines, "", *_floor_lines(t)]


def _notes(cases: list[dict]) -> list[str]:
    lines = []
    for case in cases:
        name = f"{case['bench']} {case['case']}".strip()
        for loop_name, samples in case["runs"].items():
            unsupported = [s["error"] for s in samples if s.get("unsupported")]
            if unsupported:  # the same reason every run: say it once
                lines.append(f"- **{loop_name}**, {name}: {unsupported[0]} (every run)")
            for i, sample in enumerate(samples, 1):
                if "error" in sample and not sample.get("unsupported"):
                    lines += [f"- **{loop_name}**, {name}, run {i}: failed", "", "  ```"]
                    lines += [f"  {line}" for line in sample["error"].splitlines()] + ["  ```"]
                for problem in sample.get("problems", []):
                    lines.append(f"- **{loop_name}**, {name}, run {i}: {problem}")
        for i, sample in enumerate(case.get("floor", []), 1):
            if "error" in sample:
                lines += [f"- **C floor**, {name}, run {i}: failed", "", "  ```"]
                lines += [f"  {line}" for line in sample["error"].splitlines()] + ["  ```"]
            for problem in sample.get("problems", []):
                lines.append(f"- **C floor**, {name}, run {i}: {problem}")
    return ["## Failures and problems", "", *(lines or ["None."]), ""]


def _echo_client_line(cases: list[dict]) -> list[str]:
    """Which client drove each echo case, and how busy its core was (median over the runs)."""
    shares = []
    for case in cases:
        infos = [
            s["info"]
            for samples in case["runs"].values()
            for s in samples
            if "client_busy" in s.get("info", {})
        ]
        if infos:
            share = statistics.median(i["client_busy"] for i in infos)
            clients = ", ".join(sorted({i["client_loop"] for i in infos}))
            shares.append(f"{case['bench']} {case['case']}".strip() + f" {share:.0%} ({clients})")
    if not shares:
        return []
    return [
        "- echo client per benchmark and its core's busy share (median over all runs; near 100% "
        f"means the client, not the server, limits messages/s): {', '.join(shares)}"
    ]


def _wake_floor_line(meta: dict) -> list[str]:
    """The kernel's floor under the wake latency (benchmarks/loop/wake_floor.py), if measured."""
    floor = meta.get("wake_floor")
    if floor is None:
        return []
    if "error" in floor:
        return [f"- wake latency floor: not measured ({floor['error']})"]
    return [
        f"- wake latency floor, the same wake-up in C with no Python (`wake_floor.c`, same "
        f"pinning, median of the runs): p50 {floor['p50_us']:.2f} µs, p99 {floor['p99_us']:.2f} µs"
    ]


def markdown(meta: dict, cases: list[dict], tables: list[dict]) -> str:
    versions = ", ".join(
        f"{name} {info['version']} (`{info['class']}`"
        + (f", native {info['native_sha256']})" if "native_sha256" in info else ")")
        for name, info in meta["loops"].items()
    )
    pinning = "pinned: loop on core 0, echo client on core 1" if meta["pinned"] else "NOT pinned"
    lines = [
        "# Event loop benchmarks" + (" (--quick smoke test: not for comparison)" * meta["quick"]),
        "",
        f"- date: {meta['date']}, {meta['duration_s']} s; command: `{meta['command']}`",
        f"- revision: {meta['revision']}; machine: {meta['cpu']}, {meta['platform']}",
        f"- Python {meta['python']}",
        f"- loops: {versions}",
        f"- {meta['repeat']} fresh process(es) per loop and benchmark; {pinning}",
    ]
    if "load_avg_1min" in meta:
        before, after = meta["load_avg_1min"]
        lines.append(
            f"- machine load (1-minute load average): {before:.2f} at start, {after:.2f} at end, "
            f"on {meta['cpus']} CPUs (the run itself adds about 1 to 2)"
        )
    lines += [f"- skipped {name}: {why}" for name, why in meta["skipped"].items()]
    skipped_benchmarks = meta.get("skipped_benchmarks", {})
    lines += [f"- skipped benchmark {name}: {why}" for name, why in skipped_benchmarks.items()]
    lines += _echo_client_line(cases)
    lines += _wake_floor_line(meta)
    lines += ["", "Medians, minima and maxima are over the repeats. See benchmarks/README.md.", ""]
    for t in tables:
        lines += _table(t)
    return "\n".join(lines + _notes(cases))


def plot(tables: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 4
    rows = -(-len(tables) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, t in zip(axes.flat, tables, strict=False):
        names = [n for n in t["stats"] if t["stats"][n]["median"] is not None]
        med = [t["stats"][n]["median"] for n in names]
        low = [m - t["stats"][n]["min"] for n, m in zip(names, med, strict=True)]
        high = [t["stats"][n]["max"] - m for n, m in zip(names, med, strict=True)]
        colors = ["tab:orange" if n == "ferroloop" else "tab:blue" for n in names]
        ax.bar(names, med, yerr=[low, high], capsize=4, color=colors)
        better = "higher" if t["higher_is_better"] else "lower"
        positive = [m for m in med if m > 0]
        scale = ""
        if positive and max(positive) > 30 * min(positive):  # one bar would flatten the rest
            ax.set_yscale("log")
            scale = ", log scale"
        ax.set_title(f"{t['title']}\n{t['unit']}, {better} is better{scale}", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.flat[len(tables) :]:
        ax.axis("off")
    fig.suptitle("median over repeats; error bars span min to max", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(out: Path, meta: dict, cases: list[dict], modules: dict) -> str:
    out.mkdir(parents=True, exist_ok=True)
    tables = summarize(cases, modules)
    text = markdown(meta, cases, tables)
    (out / "loop.md").write_text(text)
    payload = {"meta": meta, "tables": tables, "cases": cases}
    (out / "loop.json").write_text(json.dumps(payload, indent=1) + "\n")
    plot(tables, out / "loop.png")
    return text
