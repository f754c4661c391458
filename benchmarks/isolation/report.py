"""The isolation benchmark's report: targets, tables, JSON and a latency CDF plot.

    python benchmarks/isolation/report.py [DIR]   # rewrite DIR/isolation.{md,png} from its .json

Conventions as in benchmarks/http/report.py: a row per server (ferroloop last), medians over
the repeats, ratios ferroloop ÷ peer from medians, and every failed run and problem listed under
the tables, never dropped. The targets of issue 27 are computed from the data, each PASS or
FAIL with the numbers it was decided on.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/machine.py
from machine import fmt

# The points of each small-latency CDF kept in isolation.json and plotted: fine in the tail,
# where the servers differ. Every sample is measured; these are read off all of them.
QUANTILES = (
    0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99,
    0.995, 0.998, 0.999, 0.9995, 0.9999,
)  # fmt: skip
NOISY = 0.10  # share of the machine taken by other work above which the header warns
P99_LIMIT_MS = 10.0
COLORS = {"granian": "tab:green", "uvicorn": "tab:blue", "gunicorn": "tab:brown"}


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(cell: dict) -> dict:
    """{server: medians over the cell's successful runs} for one (workers, body, shape)."""
    out = {}
    for name, runs in cell["runs"].items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            out[name] = {"runs": len(runs), "ok": 0, "missing": any(r.get("missing") for r in runs)}
            continue

        def med(phase: str, key: str) -> float | None:
            return _median([r[phase]["small"][key] for r in ok])  # noqa: B023 (called at once)

        s = {"runs": len(runs), "ok": len(ok), "missing": False}
        for key in ("p50_ms", "p95_ms", "p99_ms", "max_ms", "rps"):
            s[f"loaded_{key}"] = med("loaded", key)
        s["unloaded_rps"] = med("unloaded", "rps")
        s["unloaded_p99_ms"] = med("unloaded", "p99_ms")
        s["loaded_over_unloaded_rps"] = _median(
            [
                r["loaded"]["small"]["rps"] / r["unloaded"]["small"]["rps"]
                for r in ok
                if r["unloaded"]["small"]["rps"]
            ]
        )
        s["large_served"] = _median([r["loaded"]["large"]["served"] for r in ok])
        s["large_rps"] = _median([r["loaded"]["large"]["rps"] for r in ok])
        s["large_latency_s"] = _median(
            [statistics.median(r["loaded"]["large"]["latency_s"] or [None]) for r in ok]
        )
        s["small_errors"] = sum(r["loaded"]["small_errors"] + r["unloaded"]["small_errors"]
                                for r in ok)  # fmt: skip
        s["large_errors"] = sum(r["loaded"]["large"]["errors"] for r in ok)
        s["uploads_on_ping_worker"] = [r["loaded"].get("uploads_on_ping_worker") for r in ok]
        s["server_cpu_share"] = _median([r["loaded"]["server_cpu_share"] for r in ok])
        s["other_busy"] = _median([r["loaded"]["other_busy"] for r in ok])
        for phase in ("loaded", "unloaded"):
            curves = [r[phase]["small"]["cdf_ms"] for r in ok if r[phase]["small"]["cdf_ms"]]
            s[f"{phase}_cdf_ms"] = [_median(list(v)) for v in zip(*curves, strict=True)]
        out[name] = s
    return out


def targets(cells: list[dict], summaries: list[dict]) -> list[dict]:
    """The targets of issue 27, each decided from the medians: PASS, FAIL or n/a."""
    rows = []

    def add(cell, target, value, limit, ok, how):
        rows.append({
            "workers": cell["workers"], "body": cell["body"], "shape": cell["shape"],
            "target": target, "ferroloop": value, "limit": limit, "how": how,
            "result": "n/a" if value is None or limit is None else ("PASS" if ok else "FAIL"),
        })  # fmt: skip

    for cell, s in zip(cells, summaries, strict=True):
        f, u = s.get("ferroloop", {}), s.get("uvicorn", {})
        f = f if f.get("ok") else {}
        u = u if u.get("ok") else {}
        fv, uv = f.get, u.get
        if cell["workers"] == 2:
            p99 = fv("loaded_p99_ms")
            add(cell, "small p99 under load ≤ 10 ms", p99, P99_LIMIT_MS,
                p99 is not None and p99 <= P99_LIMIT_MS, "ms")  # fmt: skip
            ratio = fv("loaded_over_unloaded_rps")
            add(cell, "small req/s under load ≥ ½ unloaded", ratio, 0.5,
                ratio is not None and ratio >= 0.5, "loaded ÷ unloaded, same server")  # fmt: skip
            served, ref = fv("large_served"), uv("large_served")
            add(cell, "large served ≥ 0.9 x uvicorn --workers 2", served,
                None if ref is None else 0.9 * ref,
                served is not None and ref is not None and served >= 0.9 * ref,
                f"uploads answered in the window; uvicorn {fmt(ref)}")  # fmt: skip
        if cell["workers"] == 1:
            rps, ref = fv("loaded_rps"), uv("loaded_rps")
            add(cell, "small served under load ≥ uvicorn's", rps, ref,
                rps is not None and ref is not None and rps >= ref, "req/s")  # fmt: skip
            p99, ref = fv("loaded_p99_ms"), uv("loaded_p99_ms")
            add(cell, "small p99 under load ≤ uvicorn's", p99, ref,
                p99 is not None and ref is not None and p99 <= ref, "ms")  # fmt: skip
    return rows


def _targets_md(rows: list[dict]) -> list[str]:
    lines = [
        "## Targets (issue 27)",
        "",
        "Decided from the medians in the tables below; `n/a` where ferroloop or uvicorn has no "
        "result.",
        "",
        "| workers | body | small client | target | ferroloop | limit | result |",
        "|---:|---|---|---|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workers']} | {r['body']} | {r['shape']} | {r['target']} | "
            f"{fmt(r['ferroloop'])} | {fmt(r['limit'])} ({r['how']}) | **{r['result']}** |"
        )
    passed = sum(r["result"] == "PASS" for r in rows)
    decided = sum(r["result"] != "n/a" for r in rows)
    return [*lines, "", f"{passed} of {decided} decided targets pass.", ""]


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "—"


def _cell_md(cell: dict, s: dict, meta: dict) -> list[str]:
    body = meta["bodies"][cell["body"]]
    shape = "keep-alive" if cell["shape"] == "keepalive" else "a new connection per request"
    lines = [
        f"### --workers {cell['workers']}, {body['title']} ({body['bytes'] / 1e6:.1f} MB), "
        f"small client on {shape}",
        "",
        "| server | unloaded req/s | unloaded p99 | p50 | p95 | p99 | max | small req/s | "
        "loaded ÷ unloaded | large served (/s) | upload time, s | uploads on /ping's worker | "
        "server CPU | other load | ferroloop ÷ this: p99, small req/s, large |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    f = s.get("ferroloop", {})
    for name, x in s.items():
        if not x["ok"]:
            why = "missing" if x["missing"] else f"all {x['runs']} run(s) failed"
            lines.append(f"| {name} | {why} |" + " |" * 13)
            continue
        ratios = "—"
        if name != "ferroloop" and f.get("ok"):
            ratios = " / ".join(
                (
                    _ratio(f["loaded_p99_ms"], x["loaded_p99_ms"]),
                    _ratio(f["loaded_rps"], x["loaded_rps"]),
                    _ratio(f["large_served"], x["large_served"]),
                )
            )
        shared = ", ".join("—" if n is None else str(n) for n in x["uploads_on_ping_worker"])
        errors = ""
        if x["small_errors"] or x["large_errors"]:
            errors = f" ⚠ {x['small_errors']} small / {x['large_errors']} upload errors"
        lines.append(
            f"| {name}{errors} | {fmt(x['unloaded_rps'])} | {fmt(x['unloaded_p99_ms'])} | "
            f"{fmt(x['loaded_p50_ms'])} | {fmt(x['loaded_p95_ms'])} | {fmt(x['loaded_p99_ms'])} | "
            f"{fmt(x['loaded_max_ms'])} | {fmt(x['loaded_rps'])} | "
            f"{fmt(x['loaded_over_unloaded_rps'])} | {fmt(x['large_served'])} "
            f"({fmt(x['large_rps'])}) | {fmt(x['large_latency_s'])} | {shared} | "
            f"{fmt(x['server_cpu_share'])} | {x['other_busy']:.0%} | {ratios} |"
        )
    return [*lines, ""]


def _notes(cells: list[dict]) -> list[str]:
    lines = []
    for cell in cells:
        where = f"--workers {cell['workers']}, {cell['body']}, {cell['shape']}"
        for name, runs in cell["runs"].items():
            for r in runs:
                run = f"- **{name}**, {where}, run {r['repeat']}"
                if "error" in r:
                    lines += [f"{run}: {'missing' if r.get('missing') else 'failed'}", "", "  ```"]
                    lines += [f"  {line}" for line in r["error"].splitlines()[:15]] + ["  ```"]
                for problem in r.get("problems", []):
                    first, *rest = problem.splitlines()
                    lines += [f"{run}: {first}", *[f"  {line}" for line in rest]]
    return ["## Failures, errors and problems", "", *(lines or ["None."]), ""]


def markdown(meta: dict, cells: list[dict], summaries: list[dict], rows: list[dict]) -> str:
    versions = []
    for name, info in meta["servers"].items():
        extra = [f"{k} {v}" for k, v in info.items() if k not in ("version", "debug_build")]
        versions.append(f"{name} {info['version']}" + (f" ({', '.join(extra)})" if extra else ""))
    other = [s[n]["other_busy"] for s in summaries for n in s if s[n].get("ok")]
    other_line = ""
    if other:
        other_line = (
            f"- CPU taken by other processes while loaded (median over cells): "
            f"{statistics.median(other):.0%} of the machine ({min(other):.0%} to {max(other):.0%})"
        )
        if statistics.median(other) > NOISY:
            other_line += " (**a busy machine: these numbers are noisy; rerun on an idle one**)"
    pins = ", ".join(f"--workers {w}: CPUs {c}" for w, c in meta["server_cpus"].items())
    pinning = (
        f"server pinned ({pins}), clients on CPUs {meta['client_cpus']}"
        if meta["pinned"]
        else "NOT pinned"
    )
    before, after = meta["load_avg_1min"]
    upload_rate, small_rate = meta.get("upload_rate", 0), meta.get("small_rate", 0)
    uploads = f"paced at {upload_rate:g} uploads/s in all" if upload_rate else "in a closed loop"
    paced = []
    if upload_rate or small_rate:
        paced = [
            "- **paced run**: "
            + (f"the small client sends {small_rate:g} requests/s" if small_rate else
               "the small client runs a closed loop")
            + "; issue 27's targets are defined for the closed loop (benchmarks/results/"
            "isolation.md): the rows below apply them to this run only for comparison",
        ]  # fmt: skip
    lines = [
        "# Isolation: small requests while large JSON uploads are parsed",
        "",
        f"- date: {meta['date']}, {meta['duration_s'] / 60:.1f} min; command: `{meta['command']}`",
        f"- revision: {meta['revision']}; machine: {meta['cpu']}, {meta['platform']}, "
        f"{meta['cpus']} CPUs; Python {meta['python']}",
        f"- servers: {'; '.join(versions)}",
        *[f"- missing: {name} ({why})" for name, why in meta["missing"].items()],
        f"- {pinning}",
        f"- machine load (1-minute load average): {before:.2f} at start, {after:.2f} at end "
        f"(the run itself adds about 2-3)",
        *([other_line] if other_line else []),
        *paced,
        *(
            [
                "- **over TLS**: every server serves HTTPS with the same throwaway ECDSA P-256 "
                "certificate; both clients speak TLS (OpenSSL, not verified); in `close` mode each "
                "small latency includes a full handshake"
            ]
            if meta.get("tls")
            else []
        ),
        f"- per cell: a fresh server; unloaded: {meta['warmup_s_unloaded']} s warm-up, "
        f"{meta['duration_s_unloaded']} s measured; loaded: {meta['large_connections']} upload "
        f"connections {uploads}, {meta['warmup_s_loaded']} s warm-up, "
        f"{meta['duration_s_loaded']} s measured; {meta['repeats']} run(s) per cell, "
        f"interleaved",
        "- bodies: "
        + "; ".join(
            f"`{k}` POST {b['path']}, {b['title']}, {b['bytes']:,} bytes"
            for k, b in meta["bodies"].items()
        ),
        "- commands:",
        *[f"  - `{command}`" for command in meta["commands"].values()],
        "",
        "Small client: one `GET /ping` in flight, on one keep-alive connection or a new "
        "connection per request; latencies in ms over every request sent in the window (max "
        "counts a request still unanswered at the end). `large served`: uploads answered in the "
        "loaded window (per second in brackets). `uploads on /ping's worker` (keep-alive only, one "
        "number per run): how many of the upload connections the worker serving the /ping "
        "connection also served; with 2 workers this is down to which worker accepted which "
        "connection, and decides most of the loaded numbers. `server CPU`: cores used by the "
        "server's processes while loaded. `other load`: share of the machine used by neither "
        "the server nor the clients. See benchmarks/README.md.",
        "",
        *_targets_md(rows),
        "## Per cell (medians over the runs)",
        "",
    ]
    for cell, s in zip(cells, summaries, strict=True):
        lines += _cell_md(cell, s, meta)
    return "\n".join(lines + _notes(cells))


def plot(meta: dict, cells: list[dict], summaries: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    groups = list(dict.fromkeys((c["workers"], c["body"]) for c in cells))
    shapes = list(dict.fromkeys(c["shape"] for c in cells))
    by_key = {(c["workers"], c["body"], c["shape"]): s for c, s in zip(cells, summaries,
                                                                       strict=True)}  # fmt: skip
    fig, axes = plt.subplots(len(groups), len(shapes), figsize=(6 * len(shapes),
                             3.6 * len(groups)), squeeze=False)  # fmt: skip
    for row, (workers, body) in enumerate(groups):
        for col, shape in enumerate(shapes):
            ax = axes[row][col]
            for name, s in by_key[(workers, body, shape)].items():
                if not s.get("ok"):
                    continue
                color = "tab:orange" if name == "ferroloop" else COLORS.get(name, "tab:gray")
                for phase, style, width in (("unloaded", ":", 1.0), ("loaded", "-", 1.8)):
                    curve = s[f"{phase}_cdf_ms"]
                    if curve:
                        label = name if phase == "loaded" else None
                        ax.plot(curve, QUANTILES, style, color=color, lw=width, label=label)
            ax.axvline(P99_LIMIT_MS, color="black", lw=0.6, ls="--")
            ax.set_xscale("log")
            ax.set_yscale("logit")
            ax.set_ylim(QUANTILES[0], QUANTILES[-1])
            ticks = (0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)
            ax.set_yticks(ticks, [f"{t * 100:g}%" for t in ticks])
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.grid(True, which="major", lw=0.3)
            shape_title = "keep-alive" if shape == "keepalive" else "new connection per request"
            ax.set_title(f"--workers {workers}, {meta['bodies'][body]['title']}, {shape_title}",
                         fontsize=8)  # fmt: skip
            ax.set_xlabel("small request latency, ms (log)", fontsize=7)
            ax.set_ylabel("share of requests answered within x", fontsize=7)
            ax.tick_params(labelsize=6)
            ax.legend(fontsize=6, loc="lower right")
    fig.suptitle(
        f"GET /ping latency CDF while {meta['large_connections']} clients upload 25 MB JSON "
        f"(solid) and unloaded (dotted); dashed line: 10 ms "
        f"({meta['date'][:10]}, {meta['cpu']}, {meta['cpus']} CPUs)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_all(out: Path, meta: dict, cells: list[dict], name: str = "isolation") -> str:
    """Write NAME.md, NAME.json and NAME.png to `out`; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    summaries = [summarize(cell) for cell in cells]
    rows = targets(cells, summaries)
    text = markdown(meta, cells, summaries, rows)
    (out / f"{name}.md").write_text(text)
    payload = {"meta": meta, "targets": rows, "summaries": summaries, "cells": cells}
    (out / f"{name}.json").write_text(json.dumps(payload, indent=1) + "\n")
    plot(meta, cells, summaries, out / f"{name}.png")
    return text


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "results"
    name = argv[1] if len(argv) > 1 else "isolation"
    payload = json.loads((out / f"{name}.json").read_text())
    print(write_all(out, payload["meta"], payload["cells"], name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
