"""Workers: a shared listening socket against SO_REUSEPORT, for `ferroloop --workers N`.

    python benchmarks/http/workers.py [--workers 2,4] [--loads c64,c256,close64] [--duration 4]
        [--repeats 3] [--server-cpus 0] [--wrk-cpus 1] [--out DIR]

Three ways for N worker processes to share one port:

- `front` (`--workers N --lane-fast-workers 0`: the default dispatch, without the extra
  fast-lane worker so that every mode runs N workers): a front process owns the socket and
  the idle connections and hands each request to the least busy worker, which hands the
  connection back after the response (docs/server.md#workers).
- `shared` (`--workers N --dispatch kernel`): the parent binds one socket; every worker has it
  in its own epoll set and calls `accept4` when it is readable, so a connection goes to
  whichever worker gets there first.
- `reuseport` (`--workers N --reuse-port`): each worker binds its own `SO_REUSEPORT` socket and
  the kernel picks the socket for each new connection by a hash of its addresses.

What a user feels: how evenly the requests spread over the workers (an overloaded worker is a
slow one), the total requests/s, and p50/p99 latency. Accept distribution matters most when
connections are short, so besides keep-alive loads (wrk `-c64` and `-c256`; connections are
spread once, then each stays with its worker) there is `close64`: 64 wrk connections sending
`Connection: close`, so every request is a new connection that some worker must accept.
`restart` is `close64` with `--limit-max-requests 2000`, so workers are replaced every few hundred
milliseconds: what matters there is wrk's error count (connections lost while a worker goes
away); replaced workers take their counts with them, so there are no per-worker counts.

Every cell (mode x workers x load x repeat, repeats outermost, the two modes alternating first)
starts the server afresh with `benchmarks/http/apps/counting_asgi.py` (hello world that counts
its responses per process), waits until every worker has started, warms up with wrk, asks each
worker for its count (SIGUSR1; the worker writes it to a file), runs wrk for the measured
duration, and asks again: the differences are the requests each worker served in the window,
counted by the workers, not inferred. wrk's requests/s and latency percentiles come from
`wrk.py`. Results: `workers.md` and `workers.json` in `--out` (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/machine.py
import scenarios
import servers
import wrk
from machine import core_busy_seconds, cpu_model, fmt, git_revision

RESULTS = Path(__file__).resolve().parent.parent / "results"
APP = "counting_asgi:app"
MODES = ("front", "shared", "reuseport")
MODE_FLAGS = {
    "front": ["--lane-fast-workers", "0"],
    "shared": ["--dispatch", "kernel"],
    "reuseport": ["--dispatch", "kernel", "--reuse-port"],
}
KEEP_ALIVE = "-- keep-alive: wrk's default request"
CLOSE = 'wrk.headers["Connection"] = "close"'


@dataclass(frozen=True)
class Load:
    conns: int  # wrk -c
    prelude: str  # the request part of wrk's Lua script
    # --limit-max-requests: each worker is replaced after this many responses (the cost of a
    # restart: connections that were waiting for a worker that goes away).
    max_requests: int | None = None


LOADS = {
    "c64": Load(64, KEEP_ALIVE),
    "c256": Load(256, KEEP_ALIVE),
    "close64": Load(64, CLOSE),
    "restart": Load(64, CLOSE, max_requests=2000),
}
COUNT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class WorkersServer:
    """`python -m ferroloop APP --workers N` with the mode's flags, for servers.ServerProcess."""

    workers: int
    mode: str
    max_requests: int | None = None
    name: str = "ferroloop"

    def command(self, app: str, port: int | str) -> list[str]:
        cmd = [*servers.BY_NAME["ferroloop"].command(app, port), "--workers", str(self.workers)]
        if self.max_requests:
            cmd += ["--limit-max-requests", str(self.max_requests)]
        return [*cmd, *MODE_FLAGS[self.mode]]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="2,4", help="comma-separated worker counts (2,4)")
    parser.add_argument("--loads", default=",".join(LOADS), help=f"subset of {','.join(LOADS)}")
    parser.add_argument("--modes", default=",".join(MODES), help=f"subset of {','.join(MODES)}")
    parser.add_argument("--duration", type=int, default=4, help="seconds measured per cell (4)")
    parser.add_argument("--warmup", type=int, default=1, help="seconds of warm-up per cell (1)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per cell (3)")
    parser.add_argument("--server-cpus", default="0", help="taskset list for the server (0)")
    parser.add_argument("--wrk-cpus", default="1", help="taskset list for wrk (1)")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk -t (1)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"output dir ({RESULTS})")
    args = parser.parse_args(argv)
    args.workers = [int(n) for n in args.workers.split(",") if n.strip()]
    args.loads = [name.strip() for name in args.loads.split(",") if name.strip()]
    args.modes = [name.strip() for name in args.modes.split(",") if name.strip()]
    if not set(args.loads) <= set(LOADS) or not set(args.modes) <= set(MODES):
        parser.error(f"loads are {', '.join(LOADS)}; modes are {', '.join(MODES)}")
    if min(args.workers, default=0) < 2 or args.duration < 1 or args.repeats < 1:
        parser.error("--workers needs counts of at least 2; --duration, --repeats at least 1")
    return args


def cpu_list(text: str) -> list[int]:
    """`"0"`, `"0,2"`, `"0-3"` -> core numbers (taskset's list syntax)."""
    cores: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        cores.extend(range(int(low), int(high or low) + 1))
    return cores


def wait_for_workers(count_dir: Path, n: int, proc: servers.ServerProcess) -> list[int]:
    """The PIDs of the n workers, once each has imported the app."""
    deadline = time.monotonic() + servers.STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        pids = sorted(int(p.stem) for p in count_dir.glob("*.ready"))
        if len(pids) >= n:
            return pids
        if not proc.alive():
            raise servers.StartFailed(f"exited before all workers started\n{proc.log_tail()}")
        time.sleep(0.05)
    raise servers.StartFailed(f"only {len(pids)} of {n} workers started\n{proc.log_tail()}")


def read_counts(count_dir: Path, pids: list[int]) -> list[int]:
    """SIGUSR1 to each worker, then its count of responses so far, in `pids` order."""
    for path in count_dir.glob("*.count"):
        path.unlink()
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + COUNT_TIMEOUT_S
    while time.monotonic() < deadline:
        files = [count_dir / f"{pid}.count" for pid in pids]
        if all(f.exists() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.02)
    raise servers.ServerDied("a worker did not report its count (died or stopped answering?)")


def spread(counts: list[int]) -> dict:
    """How evenly the requests went to the workers: max/min and the coefficient of variation."""
    if not counts:
        return {"max_over_min": None, "cv": None, "shares": []}
    mean = statistics.fmean(counts)
    return {
        "max_over_min": round(max(counts) / min(counts), 3) if min(counts) > 0 else None,
        "cv": round(statistics.pstdev(counts) / mean, 4) if mean else None,
        "shares": [round(c / sum(counts), 4) for c in sorted(counts, reverse=True)],
    }


def measure(mode: str, n: int, load: str, args, workdir: Path) -> dict:
    conns, restarts = LOADS[load].conns, LOADS[load].max_requests is not None
    script = wrk.write_script(workdir / f"{load}.lua", LOADS[load].prelude)
    count_dir = Path(tempfile.mkdtemp(dir=workdir, prefix=f"{mode}-{n}-{load}-"))
    server = WorkersServer(n, mode, LOADS[load].max_requests)
    log_path = count_dir / "server.log"
    env = {"FERROLOOP_BENCH_COUNT_DIR": str(count_dir)}
    pin_server, pin_wrk = ["taskset", "-c", args.server_cpus], ["taskset", "-c", args.wrk_cpus]
    with servers.ServerProcess(server, APP, pin_server, log_path, env=env) as proc:
        proc.wait_ready(scenarios.BY_NAME["hello"].check)
        pids = wait_for_workers(count_dir, n, proc)
        url = f"http://{servers.HOST}:{proc.port}/"
        wrk.run(pin_wrk, url, conns, args.warmup, script, threads=args.wrk_threads)
        # Replaced workers take their counts with them: with restarts, no counts.
        before = [] if restarts else read_counts(count_dir, pids)
        cores = cpu_list(args.server_cpus) + cpu_list(args.wrk_cpus)
        busy_before = sum(map(core_busy_seconds, cores))
        cpu_before, t0 = proc.cpu_seconds(), time.monotonic()
        result = wrk.run(pin_wrk, url, conns, args.duration, script, threads=args.wrk_threads)
        window = time.monotonic() - t0
        busy = sum(map(core_busy_seconds, cores)) - busy_before
        server_cpu = proc.cpu_seconds() - cpu_before
        after = [] if restarts else read_counts(count_dir, pids)
        problem = None
        try:
            scenarios.BY_NAME["hello"].check(servers.HOST, proc.port)
        except OSError as exc:
            if not restarts:
                raise
            # Between two workers, a connection can be refused: that is what is measured.
            problem = f"the check after the measurement failed: {exc}"
        proc.stop()
    counts = [a - b for a, b in zip(after, before, strict=True)]
    sample = {
        "rps": round(result["rps"], 1),
        "requests": result["requests"],
        "latency_us": result["latency_us"],
        "errors": result["errors"],
        "error_count": wrk.error_count(result),
        "counts": counts,
        "counted": sum(counts),
        "server_cpu_s": round(server_cpu, 2),
        "wrk_busy": result["client_busy"],
        # What else ran on the measured cores (the other engineers' builds, interrupts).
        "other_busy": round(
            max(0.0, busy - server_cpu - result["client_cpu_s"]) / (window * len(cores)), 3
        ),
        **spread(counts),
    }
    # The workers count every response they sent; wrk counts the ones it read back before it
    # stopped (up to one per connection still in flight is missing). More apart than that
    # means the counting is wrong, and the cell says so.
    if counts and abs(sample["counted"] - sample["requests"]) > conns + sample["requests"] // 100:
        problem = f"workers counted {sample['counted']}, wrk {sample['requests']}"
    if problem:
        sample["problem"] = problem
    return sample


def run_all(args, workdir: Path) -> dict:
    """{(mode, workers, load): [sample, ...]}, repeats outermost, modes alternating first."""
    cells: dict[tuple[str, int, str], list[dict]] = {}
    for rep in range(args.repeats):
        modes = args.modes[rep % len(args.modes) :] + args.modes[: rep % len(args.modes)]
        for n in args.workers:
            for load in args.loads:
                for mode in modes:
                    try:
                        sample = measure(mode, n, load, args, workdir)
                    except (
                        servers.StartFailed, servers.ServerDied, wrk.WrkFailed,
                        scenarios.WrongResponse, OSError, ValueError,
                    ) as exc:  # fmt: skip
                        sample = {"error": f"{type(exc).__name__}: {exc}"}
                    sample["repeat"] = rep + 1
                    cells.setdefault((mode, n, load), []).append(sample)
                    progress(f"{mode:<9} w{n} {load:<8} {rep + 1}/{args.repeats}", sample)
    return cells


def progress(what: str, sample: dict) -> None:
    if "error" in sample:
        shown = "FAILED: " + sample["error"].splitlines()[0]
    else:
        lat = sample["latency_us"]
        shown = (
            f"{fmt(sample['rps']):>6} rps  p50 {lat['p50'] / 1000:.3g} ms  p99 "
            f"{lat['p99'] / 1000:.3g} ms  per worker {sample['counts']}  "
            f"max/min {sample['max_over_min']}  other load {sample['other_busy']:.0%}"
        )
        if sample["error_count"]:
            shown += f"  [{wrk.describe_errors(sample)}]"
        if "problem" in sample:
            shown += f"  [{sample['problem']}]"
    print(f"  {what}  {shown}", file=sys.stderr, flush=True)


def min_med_max(values: list[float], digits: int = 3) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    if digits == 0:
        return " / ".join(fmt(v) for v in (min(values), statistics.median(values), max(values)))
    return " / ".join(
        f"{v:.{digits}g}" for v in (min(values), statistics.median(values), max(values))
    )


def row(n: int, load: str, mode: str, samples: list[dict]) -> str:
    ok = [s for s in samples if "error" not in s]
    failed = len(samples) - len(ok)
    if not ok:
        return f"| {n} | {load} | {mode} | all {failed} runs failed | | | | | | |"
    errors = str(sum(s["error_count"] for s in ok)) + (f" ({failed} runs failed)" if failed else "")
    cols = [
        min_med_max([s["rps"] for s in ok], 0),
        min_med_max([s["latency_us"]["p50"] / 1000 for s in ok]),
        min_med_max([s["latency_us"]["p99"] / 1000 for s in ok]),
        # A worker that served nothing makes max/min infinite; it counts, as the worst case.
        min_med_max([s["max_over_min"] or math.inf for s in ok if s["counts"]]),
        min_med_max([s["cv"] for s in ok], 2),
        errors,
        f"{statistics.median([s['other_busy'] for s in ok]):.0%}",
    ]
    return f"| {n} | {load} | {mode} | " + " | ".join(cols) + " |"


def table(cells: dict, args) -> str:
    head = (
        "| workers | load | mode | req/s min / med / max | p50 ms | p99 ms | "
        "max/min requests per worker | CV | errors | other load |\n"
        "|---:|---|---|---|---|---|---|---|---:|---:|\n"
    )
    rows = [
        row(n, load, mode, cells.get((mode, n, load), []))
        for n in args.workers
        for load in args.loads
        for mode in args.modes
    ]
    failures = [
        f"- {mode}, {n} workers, {load}, repeat {s['repeat']}: {s['error'].splitlines()[0]}"
        for (mode, n, load), samples in cells.items()
        for s in samples
        if "error" in s
    ]
    if failures:
        rows.append("\nFailed runs:\n\n" + "\n".join(failures))
    return head + "\n".join(rows) + "\n"


def noise_warning(cells: dict) -> str:
    """A warning line when other processes took more than 10% of the measured cores."""
    other = [s["other_busy"] for samples in cells.values() for s in samples if "other_busy" in s]
    if not other or statistics.median(other) <= 0.10:
        return ""
    return (
        f"**A busy machine:** other processes took {statistics.median(other):.0%} of the measured "
        f"cores (median; {min(other):.0%} to {max(other):.0%}); requests/s and latencies are "
        f"noisy, rerun on an idle machine. The spread over workers and the error counts are "
        f"less affected.\n\n"
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    reason = wrk.available()
    if reason:
        sys.exit(reason)
    info = servers.probe(servers.BY_NAME["ferroloop"])
    if info.get("debug_build") is not False:
        sys.exit("ferroloop is a debug build (or says nothing); run `make build` first.")
    cells_count = len(args.modes) * len(args.workers) * len(args.loads) * args.repeats
    estimate = cells_count * (args.warmup + args.duration + 2.0) / 60
    print(f"{cells_count} measurements, about {estimate:.0f} min", file=sys.stderr, flush=True)
    started, load_before = time.time(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ferroloop-workers-bench-") as tmp:
        cells = run_all(args, Path(tmp))
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "command": " ".join(["python", "benchmarks/http/workers.py", *argv]),
        "revision": git_revision(),
        "ferroloop": info,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "load_avg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "server_cpus": args.server_cpus,
        "wrk_cpus": args.wrk_cpus,
        "wrk": f"{wrk.version()}, -t{args.wrk_threads}",
        "duration": args.duration,
        "warmup": args.warmup,
        "repeats": args.repeats,
    }
    text = (
        f"# Workers: shared accept against SO_REUSEPORT\n\n"
        f"`{meta['command']}` at {meta['date']}, revision `{meta['revision']}`, Python "
        f"{meta['python']}, {meta['cpu']} ({meta['cpus']} CPUs). Server (all workers) pinned to "
        f"CPUs {args.server_cpus}, wrk ({meta['wrk']}) to CPUs {args.wrk_cpus}; "
        f"{args.warmup} s warm-up and {args.duration} s measured per cell, {args.repeats} "
        f"interleaved repeats; load average {meta['load_avg_1min'][0]} at the start, "
        f"{meta['load_avg_1min'][1]} at the end. Loads: `c64`/`c256` keep-alive connections; "
        f"`close64`: 64 connections sending `Connection: close` (a new connection per request); "
        f"`restart`: `close64` with `--limit-max-requests 2000` (workers replaced all the time; "
        f"see the errors). "
        f"Requests per worker are counted by the workers themselves. max/min: the busiest "
        f"worker's count over the idlest's (1 is even); CV: standard deviation over mean of the "
        f'counts. "other load": the share of the measured CPUs used by neither the server nor '
        f"wrk (noise).\n\n" + noise_warning(cells) + table(cells, args)
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "workers.md").write_text(text)
    raw = [
        {"mode": mode, "workers": n, "load": load, "samples": samples}
        for (mode, n, load), samples in cells.items()
    ]
    (args.out / "workers.json").write_text(json.dumps({"meta": meta, "cells": raw}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
