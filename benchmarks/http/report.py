"""Turning the samples into tables: markdown, JSON and a PNG of grouped bars.

Conventions as in benchmarks/loop/report.py: a column per server (ferroloop last), medians with
min and max over the repeats, ratios ferroloop ÷ peer computed from medians, and every failed
run, error and problem listed under the tables, never dropped. A run in which wrk counted socket
errors or error responses (status >= 400) still counts in the statistics, and is flagged where
it is shown.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/machine.py
from machine import fmt

FLAG = "⚠"
NOISY = 0.10  # share of a pinned core taken by other work above which the header warns


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _values(samples: list[dict], key: str) -> list[float]:
    return [s[key] for s in samples if s.get(key) is not None]


def _stats(samples: list[dict]) -> dict:
    ok = [s for s in samples if "error" not in s]
    rps = _values(ok, "rps")
    return {
        "rps": {
            "min": min(rps, default=None),
            "median": _median(rps),
            "max": max(rps, default=None),
        },
        "p50_ms": _median([s["latency_us"]["p50"] / 1000 for s in ok]),
        "p99_ms": _median([s["latency_us"]["p99"] / 1000 for s in ok]),
        "server_cpu_us_per_request": _median(_values(ok, "server_cpu_us_per_request")),
        "server_busy": _median(_values(ok, "server_busy")),
        "client_busy": _median(_values(ok, "client_busy")),
        "other_busy_server_core": _median(_values(ok, "other_busy_server_core")),
        "other_busy_wrk_core": _median(_values(ok, "other_busy_wrk_core")),
        "runs": len(samples),
        "failed": len(samples) - len(ok),
        "missing": sum(1 for s in samples if s.get("missing")),
        "with_errors": sum(1 for s in ok if s["error_count"]),
    }


def summarize(cases: list[dict], titles: dict[str, str]) -> list[dict]:
    """One entry per (scenario, connections): stats per server and ferroloop/peer ratios.

    `titles` maps each scenario's name to the title its tables get."""
    tables = []
    for case in cases:
        stats = {name: _stats(samples) for name, samples in case["runs"].items()}
        title = titles[case["scenario"]]
        ferro = stats.get("ferroloop", {})
        rps_ratio, p99_ratio = {}, {}
        for peer in (name for name in stats if name != "ferroloop"):
            if ferro.get("rps", {}).get("median") and stats[peer]["rps"]["median"]:
                rps_ratio[peer] = ferro["rps"]["median"] / stats[peer]["rps"]["median"]
            if ferro.get("p99_ms") and stats[peer]["p99_ms"]:
                p99_ratio[peer] = ferro["p99_ms"] / stats[peer]["p99_ms"]
        tables.append(
            {
                "scenario": case["scenario"],
                "conns": case["conns"],
                "title": f"{title}, {case['conns']} connections",
                "stats": stats,
                "ferroloop_over_peer_rps": rps_ratio,
                "ferroloop_over_peer_p99": p99_ratio,
            }
        )
    return tables


def _cell(s: dict, value: float | None, count_failures: bool) -> str:
    if s["missing"] == s["runs"]:
        return "missing"
    text = fmt(value)
    if count_failures:
        if s["failed"] - s["missing"]:
            text += f" ({s['failed'] - s['missing']} of {s['runs']} failed)"
        if s["with_errors"]:
            text += f" {FLAG} {s['with_errors']} of {s['runs']} with errors"
    return text


def _summary(tables: list[dict], key: str, title: str, note: str) -> list[str]:
    names = list(tables[0]["stats"]) if tables else []
    peers = [n for n in names if n != "ferroloop"]
    ratios = "ferroloop" in names and peers
    ratio_key = "ferroloop_over_peer_rps" if key == "rps" else "ferroloop_over_peer_p99"
    head = ["scenario", "conns", *names] + [f"ferroloop ÷ {p}" for p in peers if ratios]
    lines = [f"## {title}", "", note, "", "| " + " | ".join(head) + " |"]
    lines.append("|---|---:|" + "---:|" * (len(head) - 2))
    for t in tables:
        cells = []
        for name in names:
            s = t["stats"][name]
            value = s["rps"]["median"] if key == "rps" else s[key]
            cell = "missing" if s["missing"] == s["runs"] else fmt(value)
            if s["with_errors"] and cell != "missing":
                cell += f" {FLAG}"
            cells.append(cell)
        if ratios:
            cells += [f"{t[ratio_key][p]:.2f}" if p in t[ratio_key] else "—" for p in peers]
        lines.append(f"| {t['scenario']} | {t['conns']} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _detail(t: dict) -> list[str]:
    names = list(t["stats"])
    rows = [
        ("requests/s, median", lambda s: s["rps"]["median"], True),
        ("requests/s, min", lambda s: s["rps"]["min"], False),
        ("requests/s, max", lambda s: s["rps"]["max"], False),
        ("latency p50, ms (median)", lambda s: s["p50_ms"], False),
        ("latency p99, ms (median)", lambda s: s["p99_ms"], False),
        ("server CPU per request, µs", lambda s: s["server_cpu_us_per_request"], False),
    ]
    lines = [
        f"### {t['title']}",
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for label, get, flagged in rows:
        cells = [_cell(t["stats"][n], get(t["stats"][n]), flagged) for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for label, key in (
        ("server core busy with the server", "server_busy"),
        ("wrk core busy with wrk", "client_busy"),
        ("server core busy with anything else", "other_busy_server_core"),
        ("wrk core busy with anything else", "other_busy_wrk_core"),
    ):
        cells = []
        for name in names:
            s = t["stats"][name]
            value = s[key]
            cells.append("missing" if s["missing"] == s["runs"] else
                         "—" if value is None else f"{value:.0%}")  # fmt: skip
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if "ferroloop" in names:
        for label, key in (
            ("ferroloop ÷ this server, requests/s", "ferroloop_over_peer_rps"),
            ("ferroloop ÷ this server, p99 (lower is better)", "ferroloop_over_peer_p99"),
        ):
            cells = [f"{t[key][n]:.2f}" if n in t[key] else "—" for n in names]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _notes(cases: list[dict]) -> list[str]:
    lines = []
    for case in cases:
        where = f"{case['scenario']} c{case['conns']}"
        for name, samples in case["runs"].items():
            missing = [s["error"] for s in samples if s.get("missing")]
            if missing:  # the same reason every run: say it once
                lines += [f"- **{name}**, {where}: missing (every run)", "", "  ```"]
                lines += [f"  {line}" for line in missing[0].splitlines()] + ["  ```"]
            for sample in samples:
                run = f"- **{name}**, {where}, run {sample['repeat']}"
                if "error" in sample and not sample.get("missing"):
                    lines += [f"{run}: failed", "", "  ```"]
                    lines += [f"  {line}" for line in sample["error"].splitlines()] + ["  ```"]
                for problem in sample.get("problems", []):
                    first, *rest = problem.splitlines()
                    lines.append(f"{run}: {first}")
                    lines += [f"  {line}" for line in rest]
    return ["## Failures, errors and problems", "", *(lines or ["None."]), ""]


def _noise_line(cases: list[dict]) -> list[str]:
    """How much of the two pinned cores other processes and interrupts took while measuring."""
    ok = [s for case in cases for runs in case["runs"].values() for s in runs if "error" not in s]
    server, client = _values(ok, "other_busy_server_core"), _values(ok, "other_busy_wrk_core")
    if not server or not client:
        return []
    server_share, client_share = statistics.median(server), statistics.median(client)
    line = (
        f"- CPU taken by anything else while measuring (median over runs): {server_share:.0%} of "
        f"the server's core, {client_share:.0%} of wrk's core"
    )
    if max(server_share, client_share) > NOISY:
        line += " (**a busy machine: these numbers are noisy; rerun on an idle one**)"
    return [line]


def _tls_line(meta: dict) -> list[str]:
    """What TLS version and cipher each server's checks negotiated (HTTPS suites only)."""
    if "tls_negotiated" not in meta:
        return []
    negotiated = meta["tls_negotiated"]
    parts = [
        f"{name} {' / '.join(negotiated[name]) if negotiated.get(name) else 'no handshake'}"
        for name in meta["servers"]
    ]
    return ["- TLS negotiated by the check's handshakes: " + "; ".join(parts)]


def markdown(meta: dict, cases: list[dict], tables: list[dict], what: str) -> str:
    versions = []
    for name, info in meta["servers"].items():
        extra = [f"{k} {v}" for k, v in info.items() if k not in ("version", "debug_build")]
        versions.append(f"{name} {info['version']}" + (f" ({', '.join(extra)})" if extra else ""))
    pinning = "pinned: server on core 0, wrk on core 1" if meta["pinned"] else "NOT pinned"
    before, after = meta["load_avg_1min"]
    lines = [
        f"# {what} benchmarks",
        "",
        f"- date: {meta['date']}, {meta['duration_s']} s; command: `{meta['command']}`",
        f"- revision: {meta['revision']}; machine: {meta['cpu']}, {meta['platform']}",
        f"- Python {meta['python']}; {meta['wrk']}",
        f"- servers: {'; '.join(versions)}",
        *[f"- missing: {name} ({why})" for name, why in meta["missing"].items()],
        *[f"- {note}" for note in meta.get("notes", [])],
        *_tls_line(meta),
        f"- 1 worker each, started fresh for every run; {pinning}; "
        f"`wrk -t1 -c{{N}} -d{meta['wrk_duration_s']}s --latency` after a "
        f"{meta['warmup_s']} s warm-up; {meta['repeats']} run(s) per cell, interleaved",
        f"- machine load (1-minute load average): {before:.2f} at start, {after:.2f} at end, "
        f"on {meta['cpus']} CPUs (the run itself adds about 2)",
        *_noise_line(cases),
        "- commands:",
        *[f"  - `{command}`" for command in meta["commands"].values()],
        "",
        "Medians, minima and maxima are over the runs. See benchmarks/README.md.",
        "",
    ]
    flag_note = (
        f"{FLAG}: at least one run had socket errors or error responses (status >= 400); they "
        "count in the numbers and are listed at the end."
    )
    lines += _summary(
        tables,
        "rps",
        "Requests per second (median)",
        "Higher is better; a ratio above 1 means ferroloop serves more. " + flag_note,
    )
    lines += _summary(
        tables,
        "p99_ms",
        "Latency p99, ms (median)",
        "**Lower is better**; a ratio below 1 means ferroloop's p99 is lower. " + flag_note,
    )
    lines += ["## Per scenario", ""]
    for t in tables:
        lines += _detail(t)
    return "\n".join(lines + _notes(cases))


def plot(meta: dict, tables: list[dict], path: Path, what: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenario_names = list(dict.fromkeys(t["scenario"] for t in tables))
    conns = list(dict.fromkeys(t["conns"] for t in tables))
    # A server with no successful run anywhere gets no bar slot; the title names it.
    names = [
        name
        for name in (tables[0]["stats"] if tables else [])
        if any(t["stats"][name]["rps"]["median"] is not None for t in tables)
    ]
    absent = [name for name in (tables[0]["stats"] if tables else []) if name not in names]
    colors = {
        "granian": "tab:green",
        "uvicorn": "tab:blue",
        "hypercorn": "tab:purple",
        "gunicorn": "tab:brown",
    }
    by_key = {(t["scenario"], t["conns"]): t for t in tables}
    fig, axes = plt.subplots(
        2, len(scenario_names), figsize=(4.6 * len(scenario_names), 7.4), squeeze=False
    )
    width = 0.8 / max(1, len(names))
    for col, scenario in enumerate(scenario_names):
        for row, key in enumerate(("rps", "p99_ms")):
            ax = axes[row][col]
            values = []
            for i, name in enumerate(names):
                xs, med, low, high, labels = [], [], [], [], []
                for j, c in enumerate(conns):
                    s = by_key[(scenario, c)]["stats"][name]
                    value = s["rps"]["median"] if key == "rps" else s[key]
                    if value is None:
                        continue
                    xs.append(j + (i - (len(names) - 1) / 2) * width)
                    med.append(value)
                    labels.append(fmt(value) + (f" {FLAG}" if s["with_errors"] else ""))
                    if key == "rps":
                        low.append(value - s["rps"]["min"])
                        high.append(s["rps"]["max"] - value)
                if not med:
                    continue
                values += med
                color = "tab:orange" if name == "ferroloop" else colors.get(name, "tab:gray")
                errors = [low, high] if key == "rps" else None
                bars = ax.bar(xs, med, width, yerr=errors, capsize=3, color=color, label=name)
                ax.bar_label(bars, labels=labels, fontsize=6, padding=2)
            ax.set_xticks(range(len(conns)), [f"c{c}" for c in conns])
            positive = [v for v in values if v > 0]
            scale = ""
            if positive and max(positive) > 30 * min(positive):  # one bar would flatten the rest
                ax.set_yscale("log")
                scale = ", log scale"
            if key == "rps":
                metric = "requests/s (median; bars span min to max), higher is better"
            else:
                metric = "latency p99, ms (median), lower is better"
            title = meta["scenarios"][scenario]
            ax.set_title(f"{title}\n{metric}{scale}", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.margins(y=0.12)
    if names:
        axes[0][0].legend(fontsize=7)
    fig.suptitle(
        f"{what}s, 1 worker, wrk -t1 -d{meta['wrk_duration_s']}s, "
        f"{meta['repeats']} run(s) per bar ({meta['date'][:10]}, {meta['cpu']})"
        + (f"; no result: {', '.join(absent)}" if absent else "")
        + f"; {FLAG}: a run had socket errors or error responses",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(out: Path, meta: dict, cases: list[dict], stem: str, what: str) -> str:
    """Write STEM.md, STEM.json and STEM.png to `out`; `what` ("HTTP server") titles them.
    Returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    tables = summarize(cases, meta["scenarios"])
    text = markdown(meta, cases, tables, what)
    (out / f"{stem}.md").write_text(text)
    payload = {"meta": meta, "tables": tables, "cases": cases}
    (out / f"{stem}.json").write_text(json.dumps(payload, indent=1) + "\n")
    plot(meta, tables, out / f"{stem}.png", what)
    return text
