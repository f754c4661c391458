"""HTTP server benchmarks: ferroloop against granian, uvicorn and hypercorn in one run.

    python benchmarks/http/run.py [--servers ferroloop,granian,uvicorn,hypercorn] [--duration 8]
        [--repeats 3] [--connections 64,256] [--scenarios hello,fastapi,echo10k] [--out DIR]

For every repeat, scenario, connection count and server (servers rotated each repeat, repeats
outermost, so machine drift spreads over every column): start the server fresh on core 0, wait
until it answers the scenario's request correctly, run wrk on core 1 for a 2 s warm-up and then
for the measured duration, check the answer again, stop the server. Results:
benchmarks/results/http.{md,json,png}. `wsgi.py` runs the same functions with another `Suite`
(WSGI apps and servers), `tls.py` with the same apps over HTTPS. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import functools
import os
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/machine.py
import report
import scenarios
import servers
import wrk
from machine import core_busy_seconds, cpu_pins, fmt, run_meta

RESULTS = Path(__file__).resolve().parent.parent / "results"
WARMUP_S = 2
# Measured per cell beyond warm-up + duration: server start to its first correct answer (0.2 s
# for uvicorn, up to 1 s for hypercorn and for the FastAPI app), wrk's start, the checks, the stop.
OVERHEAD_S = 1.1


@dataclass(frozen=True)
class Suite:
    """What a runner compares, and where it reports: `run.py` is HTTP (ASGI), `wsgi.py` WSGI,
    `tls.py` HTTPS."""

    script: str  # recorded as the results' command
    description: str  # the first line of --help
    servers: dict[str, servers.Server]  # in column order, ferroloop last
    scenarios: dict[str, scenarios.Scenario]  # in row order
    stem: str  # results go to STEM.md, STEM.json, STEM.png
    what: str  # "HTTP server": titles the report and the plot
    # HTTPS: the servers' commands enable TLS, and the checks trust their certificate with this
    # context (wrk does not verify it). None: plain HTTP.
    ssl_context: ssl.SSLContext | None = None
    notes: tuple[str, ...] = ()  # more lines for the report's header


HTTP = Suite(
    script="benchmarks/http/run.py",
    description=__doc__.split("\n")[0],
    servers=servers.BY_NAME,
    scenarios=scenarios.BY_NAME,
    stem="http",
    what="HTTP server",
)


def csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv: list[str], suite: Suite) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=suite.description)
    names, scenario_names = tuple(suite.servers), tuple(suite.scenarios)
    parser.add_argument(
        "--servers",
        default=",".join(names),
        help=f"comma-separated subset of {','.join(names)} (default: all)",
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(scenario_names),
        help=f"comma-separated subset of {','.join(scenario_names)} (default: all)",
    )
    parser.add_argument("--duration", type=int, default=8, help="seconds per measurement (8)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per cell (3)")
    parser.add_argument(
        "--connections", default="64,256", help="comma-separated wrk -c values (64,256)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"output dir (default {RESULTS})")
    args = parser.parse_args(argv)
    args.servers = csv(args.servers)
    unknown = sorted(set(args.servers) - set(names))
    if unknown:
        parser.error(f"unknown server(s) {', '.join(unknown)}; choose from {names}")
    # Table columns always in the canonical order, whatever order was asked for.
    args.servers = [name for name in names if name in args.servers]
    args.scenarios = csv(args.scenarios)
    unknown = sorted(set(args.scenarios) - set(scenario_names))
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {scenario_names}")
    args.scenarios = [name for name in scenario_names if name in args.scenarios]
    try:
        args.connections = [int(c) for c in csv(args.connections)]
    except ValueError:
        parser.error("--connections takes integers, e.g. 64,256")
    if not args.connections or min(args.connections) < 1:
        parser.error("--connections needs at least one positive count")
    if args.duration < 1 or args.repeats < 1:
        parser.error("--duration and --repeats must be at least 1")
    if not args.servers or not args.scenarios:
        parser.error("nothing to run")
    return args


def probe_servers(names: list[str], suite: Suite) -> tuple[dict, dict]:
    """{name: version info} for the servers that can run, {name: why not} for the rest."""
    available, missing = {}, {}
    for name in names:
        try:
            available[name] = servers.probe(suite.servers[name])
        except (LookupError, subprocess.TimeoutExpired) as exc:
            missing[name] = str(exc)
    debug = available.get("ferroloop", {}).get("debug_build", False)
    if debug is None:
        sys.exit("ferroloop._native has no DEBUG_BUILD constant; cannot rule out a debug build.")
    if debug:
        sys.exit(
            "ferroloop is a debug build (ferroloop._native.DEBUG_BUILD is True); its numbers would "
            "mislead. Build a release build with `make build` and run again."
        )
    return available, missing


def measure(
    server, scenario, conns: int, args, pins, workdir: Path, ssl_context: ssl.SSLContext | None
) -> dict:
    """One cell: a fresh server, the correctness check, warm-up, measurement, check, stop."""
    script = workdir / f"{scenario.name}.lua"
    log_path = workdir / f"{server.name}-{scenario.name}-c{conns}.log"
    check = functools.partial(scenario.check, ssl_context=ssl_context)
    scheme = "http" if ssl_context is None else "https"
    sample: dict = {}
    with servers.ServerProcess(server, scenario.app, pins[0], log_path) as proc:
        sample["startup_s"] = round(proc.wait_ready(check), 3)
        url = f"{scheme}://{servers.HOST}:{proc.port}{scenario.path}"
        warm = wrk.run(pins[1], url, conns, WARMUP_S, script)
        sample["warmup"] = {"rps": round(warm["rps"], 1), "errors": warm["errors"]}
        window = -time.monotonic()
        cores_before = [core_busy_seconds(0), core_busy_seconds(1)]
        cpu_before = proc.cpu_seconds()
        result = wrk.run(pins[1], url, conns, args.duration, script)
        cpu = proc.cpu_seconds() - cpu_before
        cores = [after - before for after, before in zip(
            [core_busy_seconds(0), core_busy_seconds(1)], cores_before, strict=True
        )]  # fmt: skip
        window += time.monotonic()  # wrk's run plus its start and exit: what the CPU counts span
        if not proc.alive():
            raise servers.ServerDied(f"exited during the measurement\n{proc.log_tail()}")
        try:
            negotiated = check(servers.HOST, proc.port)
        except (OSError, scenarios.WrongResponse) as exc:
            # The measured responses were probably wrong too: the run does not count.
            raise scenarios.WrongResponse(
                f"after the measurement ({result['rps']:.0f} requests/s): {exc}"
            ) from None
        problems = []
        status = proc.stop()
        if status not in (0, -15):  # -15: died of the SIGTERM it was sent
            problems.append(f"exit status {status} after SIGTERM\n{proc.log_tail(5)}")
    requests = result["requests"]
    pinned = bool(pins[0])
    sample.update(
        rps=round(result["rps"], 1),
        requests=requests,
        bytes=result["bytes"],
        bytes_per_response=round(result["bytes"] / requests, 1) if requests else None,
        latency_us=result["latency_us"],
        errors=result["errors"],
        error_count=wrk.error_count(result),
        client_busy=result["client_busy"],
        server_cpu_s=round(cpu, 2),
        server_busy=round(cpu / window, 3),
        server_cpu_us_per_request=round(cpu / requests * 1e6, 2) if requests else None,
        # What else ran on the two cores meanwhile (other processes, interrupts): the noise.
        other_busy_server_core=round(max(0.0, cores[0] - cpu) / window, 3) if pinned else None,
        other_busy_wrk_core=(
            round(max(0.0, cores[1] - result["client_cpu_s"]) / window, 3) if pinned else None
        ),
        wrk_output=result["output"],
    )
    if sample["error_count"]:
        problems.append(wrk.describe_errors(result))
    if requests and result["bytes"] / requests < scenario.min_response_bytes():
        problems.append(
            f"short responses: {result['bytes'] / requests:.0f} bytes read per response, "
            f"less than the {scenario.min_response_bytes()}-byte body"
        )
    if problems:
        sample["problems"] = problems
    if negotiated is not None:
        sample["tls"] = negotiated
    return sample


def progress(what: str, sample: dict) -> None:
    if sample.get("missing"):
        shown = "missing: " + sample["error"].splitlines()[0]
    elif "error" in sample:
        shown = "FAILED: " + sample["error"].splitlines()[0]
    else:
        lat = sample["latency_us"]
        shown = (
            f"{fmt(sample['rps']):>6} rps  p50 {lat['p50'] / 1000:.3g} ms  "
            f"p99 {lat['p99'] / 1000:.3g} ms  server core {sample['server_busy']:.0%}  "
            f"wrk core {sample['client_busy']:.0%}"
        )
        if sample.get("problems"):
            shown += f"  [{len(sample['problems'])} problem(s): {sample['problems'][0]}]"
    print(f"  {what}  {shown}", file=sys.stderr, flush=True)


def run_all(
    args, suite: Suite, names: list[str], missing_servers: dict, pins, workdir: Path
) -> list[dict]:
    chosen = [suite.scenarios[name] for name in args.scenarios]
    cases = [
        {"scenario": s.name, "conns": c, "runs": {n: [] for n in names}}
        for s in chosen
        for c in args.connections
    ]
    by_key = {(case["scenario"], case["conns"]): case for case in cases}
    # A server whose first start for a scenario fails is missing for that scenario: it would fail
    # the same way every time (not installed, no such option, app not importable).
    missing: dict[tuple[str, str], str] = {}
    started: set[tuple[str, str]] = set()
    runnable = [n for n in names if n not in missing_servers]
    for scenario in chosen:
        script = workdir / f"{scenario.name}.lua"
        wrk.write_script(script, scenario.wrk_prelude())
        reason = scenario.missing()
        if reason:
            for name in runnable:
                missing[(name, scenario.name)] = f"the {scenario.name} app {reason}"
    for name, reason in missing_servers.items():
        for scenario in chosen:
            missing[(name, scenario.name)] = reason
    for rep in range(args.repeats):
        shift = rep % len(names)
        for scenario in chosen:
            for conns in args.connections:
                for name in names[shift:] + names[:shift]:
                    key = (name, scenario.name)
                    what = f"{scenario.name:<8} c{conns:<4} {rep + 1}/{args.repeats}  {name:<10}"
                    if key in missing:
                        sample = {"error": missing[key], "missing": True}
                    else:
                        try:
                            sample = measure(
                                suite.servers[name], scenario, conns, args, pins, workdir,
                                suite.ssl_context,
                            )  # fmt: skip
                        except servers.StartFailed as exc:
                            sample = {"error": f"{name} failed to start: {exc}"}
                            if key not in started:
                                missing[key] = sample["error"]
                                sample["missing"] = True
                        except (
                            servers.ServerDied, wrk.WrkFailed, scenarios.WrongResponse,
                            OSError, ValueError,
                        ) as exc:  # fmt: skip
                            sample = {"error": f"{type(exc).__name__}: {exc}"}
                        started.add(key)
                    sample["repeat"] = rep + 1
                    by_key[(scenario.name, conns)]["runs"][name].append(sample)
                    progress(what, sample)
    return cases


def negotiated_tls(cases: list[dict]) -> dict[str, list[str]]:
    """{server: ["TLSv1.3 TLS_AES_256_GCM_SHA384"]}: what the checks' handshakes settled on,
    each distinct pair once (one per server unless a server changed its mind)."""
    seen: dict[str, list[str]] = {}
    for case in cases:
        for name, samples in case["runs"].items():
            for sample in samples:
                if "tls" in sample:
                    pair = f"{sample['tls']['version']} {sample['tls']['cipher']}"
                    if pair not in seen.setdefault(name, []):
                        seen[name].append(pair)
    return seen


def main(argv: list[str], suite: Suite = HTTP) -> int:
    args = parse_args(argv, suite)
    reason = wrk.available()
    if reason:
        sys.exit(reason)
    pin0, pin1, pin_warning = cpu_pins()
    if pin_warning:
        print(f"warning: {pin_warning}", file=sys.stderr)
    available, missing_servers = probe_servers(args.servers, suite)
    for name, why in missing_servers.items():
        print(f"{name}: missing ({why})", file=sys.stderr)
    if not available:
        sys.exit("none of the servers can run here")
    cells = len(args.scenarios) * len(args.connections) * len(available) * args.repeats
    estimate = cells * (WARMUP_S + args.duration + OVERHEAD_S) / 60
    print(f"{cells} measurements, about {estimate:.0f} min", file=sys.stderr, flush=True)
    started, load_before = time.time(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix=f"ferroloop-{suite.stem}-bench-") as tmp:
        cases = run_all(args, suite, args.servers, missing_servers, (pin0, pin1), Path(tmp))
    meta = {
        **run_meta(suite.script, argv, started, load_before, pin_warning is None),
        "cpus": os.cpu_count(),
        "wrk": wrk.version(),
        "wrk_duration_s": args.duration,
        "warmup_s": WARMUP_S,
        "repeats": args.repeats,
        "connections": args.connections,
        "servers": available,
        "missing": missing_servers,
        "commands": {
            name: " ".join(["python", *suite.servers[name].command("APP", "PORT")[1:]])
            for name in args.servers
        },
        "scenarios": {name: suite.scenarios[name].title for name in args.scenarios},
    }
    if suite.notes:
        meta["notes"] = list(suite.notes)
    if suite.ssl_context is not None:
        meta["tls_negotiated"] = negotiated_tls(cases)
    text = report.write_all(args.out, meta, cases, suite.stem, suite.what)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
