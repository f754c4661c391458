"""Isolation under large uploads: do cheap requests stay fast while 25 MB JSON bodies are parsed?

    python benchmarks/isolation/run.py [--servers granian,uvicorn,gunicorn,ferroloop]
        [--workers 1,2] [--shapes keepalive,close] [--bodies list,string] [--duration 12]
        [--repeats 1] [--quick] [--out DIR] [--small-rate R] [--upload-rate R] [--tls]
        [--name NAME]

The scenario users describe when they leave uvicorn: a FastAPI app (`upload_app.py`) with a
pydantic endpoint taking large JSON uploads, and a `GET /ping` that must stay fast meanwhile.
For every repeat, worker count, body kind, small-client shape and server (servers rotated each
repeat, so drift spreads over every column), one cell:

1. start the server fresh with `--workers N` and wait until every worker has the app loaded;
2. unloaded: the small client alone for `--unloaded` seconds after a 1 s warm-up;
3. loaded: the large client's 2 connections post the body in a closed loop, and after
   `--warmup` seconds the small client measures for `--duration` seconds;
4. check `/ping` once more and stop the server (its whole process group, even on error).

The small client (`small_client.c`, compiled with cc at start) keeps one `GET /ping` in flight,
on one keep-alive connection or on a new connection per request, and records every latency.
The large client (`large_client.py`) sends pre-built body bytes on raw sockets. Results:
benchmarks/results/isolation.{md,json,png}; see benchmarks/README.md.

`--small-rate` and `--upload-rate` pace the clients instead of running them in a closed loop
(requests or uploads per second), so every server is asked for the same work: with a closed
loop, a server that answers small requests faster is asked for more of them, and on 2 cores
that CPU comes out of the uploads' share (and the other way round). A paced run is written
under `--name` (default `isolation_paced` when a rate is set).

`--tls` serves HTTPS (a throwaway certificate from `trustme`, benchmarks/certs.py) and both
clients speak TLS: the small client is then compiled with OpenSSL (`libssl-dev`), and in
`close` mode each of its latencies includes a full handshake. Written as `isolation_tls`
(`isolation_tls_paced`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import http.client
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/machine.py
# After this directory, whose report.py shadows benchmarks/http's: only servers.py comes from there.
sys.path.append(str(Path(__file__).resolve().parent.parent / "http"))
import commands
import report
import servers
from certs import make_certificates
from machine import core_busy_seconds, fmt, run_meta

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results"
APP = "upload_app:app"
LARGE_CONNS = 2
BODY_BYTES = 25_000_000
UNLOADED_WARMUP_S = 1.0
SETUP_S = 0.3  # from launching the clients to their window's start, beyond the warm-up
CLIENT_GRACE_S = 15.0  # a client still running this long after its END_NS is killed
SHAPES = ("keepalive", "close")


class WrongResponse(Exception):
    """The server answered, but not with the expected 200."""


class ClientFailed(Exception):
    """A load client exited with an error or printed no result."""


def body_kinds() -> dict[str, dict]:
    """The two bodies: the same 25 MB, expensive (many short strings) or cheap (one string)."""
    prefix, suffix = b'{"items":[', b"]}"
    items = (BODY_BYTES - len(prefix) - len(suffix) + 1) // 14  # `"item0000000",` is 14 bytes
    string = BODY_BYTES - len(b'{"data":""}')
    return {
        "list": {
            "path": "/upload/list",
            "count": items,
            "title": f"list of {items / 1e6:.2f} M short strings",
            "build": lambda: prefix + b",".join(b'"item%07d"' % i for i in range(items)) + suffix,
        },
        "string": {
            "path": "/upload/string",
            "count": string,
            "title": "one long string",
            "build": lambda: b'{"data":"' + b"x" * string + b'"}',
        },
    }


def csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    kinds = tuple(body_kinds())
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", default=",".join(commands.NAMES),
                        help=f"subset of {','.join(commands.NAMES)} (default: all)")  # fmt: skip
    parser.add_argument("--workers", default="1,2", help="worker counts (1,2)")
    parser.add_argument(
        "--shapes", default=",".join(SHAPES), help="keepalive, close (new connection per request)"
    )
    parser.add_argument("--bodies", default=",".join(kinds), help=f"subset of {','.join(kinds)}")
    parser.add_argument("--duration", type=float, default=12, help="loaded seconds measured (12)")
    parser.add_argument("--warmup", type=float, default=2, help="loaded warm-up seconds (2)")
    parser.add_argument("--unloaded", type=float, default=3, help="unloaded seconds measured (3)")
    parser.add_argument("--repeats", type=int, default=1, help="cells per combination (1)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: list body, 4 s loaded, 2 s unloaded"
    )
    parser.add_argument("--client-cpus", default="1", help="taskset list for the clients (1)")
    parser.add_argument(
        "--small-rate", type=float, default=0, help="pace the small client (req/s; 0: closed loop)"
    )
    parser.add_argument(
        "--upload-rate", type=float, default=0, help="pace the uploads (per s; 0: closed loop)"
    )
    parser.add_argument("--tls", action="store_true", help="serve and measure over HTTPS")
    parser.add_argument("--name", default="", help="result file name (isolation[_tls][_paced])")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"output dir ({RESULTS})")
    args = parser.parse_args(argv)
    if args.quick:
        args.bodies, args.duration, args.warmup, args.unloaded = "list", 4, 1, 2
    paced = args.small_rate > 0 or args.upload_rate > 0
    args.name = args.name or "isolation" + ("_tls" if args.tls else "") + (
        "_paced" if paced else ""
    )
    args.servers = [n for n in commands.NAMES if n in csv(args.servers)]
    args.bodies = [k for k in kinds if k in csv(args.bodies)]
    args.shapes = [s for s in SHAPES if s in csv(args.shapes)]
    args.workers = sorted({int(n) for n in csv(args.workers)})
    if not args.servers or not args.bodies or not args.shapes or not args.workers:
        parser.error("nothing to run (check --servers, --bodies, --shapes, --workers)")
    if min(args.workers) < 1 or args.repeats < 1 or min(args.duration, args.unloaded) <= 0:
        parser.error("--workers, --repeats, --duration and --unloaded must be positive")
    return args


def server_cpus(workers: int) -> str:
    """The cores the server may use: core 0 for one worker; for N workers the first N cores
    (on this 2-core machine, both: the clients then share core 1 with a worker)."""
    return f"0-{min(workers, os.cpu_count() or 1) - 1}"


def unverified_tls() -> ssl.SSLContext:
    """The clients' TLS context: the benchmark's throwaway certificate is not checked."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def check_ping(host: str, port: int, timeout: float = 5.0, tls: bool = False) -> None:
    if tls:
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=unverified_tls())
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/ping")
        response = conn.getresponse()
        body = response.read()
        if response.status != 200 or json.loads(body) != {"ping": "pong"}:
            raise WrongResponse(f"GET /ping: {response.status} {body[:200]!r}")
    finally:
        conn.close()


def wait_for_workers(ready_dir: Path, n: int, proc: servers.ServerProcess) -> None:
    """Until n processes have run the app's lifespan startup (each writes `{pid}.ready`)."""
    deadline = time.monotonic() + servers.STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if len(list(ready_dir.glob("*.ready"))) >= n:
            return
        if not proc.alive():
            raise servers.StartFailed(f"exited before its workers started\n{proc.log_tail()}")
        time.sleep(0.05)
    raise servers.StartFailed(f"fewer than {n} workers started\n{proc.log_tail()}")


def client_result(proc: subprocess.Popen, end_ns: int, what: str) -> dict:
    """Wait for a client (bounded), then parse its `RESULT {...}` line."""
    left = (end_ns - time.monotonic_ns()) / 1e9 + CLIENT_GRACE_S
    try:
        out, err = proc.communicate(timeout=max(1.0, left))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise ClientFailed(f"{what} did not end by itself; killed") from None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise ClientFailed(f"{what} exited with {proc.returncode}: {servers.tail(err, 5)}")


def latency_stats(samples: array, window_s: float, unfinished_ns: int) -> dict:
    """Percentiles (nearest rank) in ms, the max (the request unfinished at the end counts as
    at least the time it had waited), requests/s, and the CDF at report.QUANTILES."""
    ordered = sorted(samples)
    n = len(ordered)

    def q(p: float) -> float | None:
        return ordered[min(n - 1, int(p * n))] / 1e6 if n else None

    top = max(ordered[-1] if n else 0, unfinished_ns) / 1e6
    return {
        "count": n,
        "rps": round(n / window_s, 1),
        "p50_ms": q(0.50),
        "p95_ms": q(0.95),
        "p99_ms": q(0.99),
        "max_ms": top if n or unfinished_ns else None,
        "unfinished_ms": round(unfinished_ns / 1e6, 3),
        "cdf_ms": [round(q(p), 4) for p in report.QUANTILES] if n else [],
    }


def cpu_snapshot(server: servers.ServerProcess, clients: list[subprocess.Popen]) -> list[float]:
    """[server tree CPU s, clients' CPU s, all cores' busy s] at this moment."""
    return [
        server.cpu_seconds(),
        sum(servers.tree_cpu_seconds(c.pid) for c in clients),
        sum(core_busy_seconds(core) for core in range(os.cpu_count() or 1)),
    ]


def measure_phase(exe: str, proc: servers.ServerProcess, shape: str, warmup_s: float,
                  duration_s: float, pin: list[str], workdir: Path,
                  large_cmd: list[str] | None = None, small_rate: float = 0,
                  upload_rate: float = 0, tls: bool = False) -> dict:  # fmt: skip
    """One phase: optional large clients from now on, the small client measuring after the
    warm-up for duration_s; returns the small client's stats, the large uploads answered in
    the window, and the CPU shares."""
    begin_ns = time.monotonic_ns()
    start_ns = begin_ns + int((SETUP_S + warmup_s) * 1e9)
    end_ns = start_ns + int(duration_s * 1e9)
    large = small = None
    try:
        if large_cmd is not None:
            large = subprocess.Popen(
                [*pin, *large_cmd, str(end_ns), str(upload_rate), *(["tls"] if tls else [])],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
        samples_path = workdir / "samples.bin"
        small = subprocess.Popen(
            [*pin, exe, str(proc.port), shape, str(start_ns), str(end_ns), str(samples_path),
             str(small_rate), *(["tls"] if tls else [])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        clients = [small] + ([large] if large else [])
        time.sleep(max(0.0, (start_ns - time.monotonic_ns()) / 1e9))
        before = cpu_snapshot(proc, clients)
        time.sleep(max(0.0, (end_ns - time.monotonic_ns()) / 1e9))
        after = cpu_snapshot(proc, clients)
        small_out = client_result(small, end_ns, "the small client")
        large_out = client_result(large, end_ns, "the large client") if large else None
    finally:
        for client in (small, large):
            if client is not None and client.poll() is None:
                client.kill()
                client.wait()
    window_s = duration_s
    samples = array("Q")
    with open(samples_path, "rb") as f:
        samples.frombytes(f.read())
    server_cpu, client_cpu, busy = (a - b for a, b in zip(after, before, strict=True))
    cores = os.cpu_count() or 1
    phase = {
        "small": latency_stats(samples, window_s, small_out["unfinished_ns"]),
        "small_errors": small_out["errors"],
        "small_first_error": small_out["first_error"],
        "small_reconnects": small_out["reconnects"],
        "small_warmup_requests": small_out["warmup"],
        "small_worker_pid": small_out["worker_pid"] or None,
        "server_cpu_share": round(server_cpu / window_s, 3),  # in cores: up to `cores`
        "client_cpu_share": round(client_cpu / window_s, 3),
        "other_busy": round(max(0.0, busy - server_cpu - client_cpu) / (window_s * cores), 3),
    }
    if large_out is not None:
        served = [d for d in large_out["done"] if start_ns <= d[1] <= end_ns]
        phase["large"] = {
            "served": len(served),
            "rps": round(len(served) / window_s, 3),
            "latency_s": [round((d[1] - d[0]) / 1e9, 3) for d in served],
            "errors": large_out["errors"],
            "first_error": large_out["first_error"],
            "in_flight_at_end": large_out["in_flight"],
            "warmup_served": sum(1 for d in large_out["done"] if d[1] < start_ns),
            "worker_pids": large_out["pids"],
        }
        # keep-alive: how many upload connections were served by the /ping connection's worker
        if small_out["worker_pid"]:
            phase["uploads_on_ping_worker"] = large_out["pids"].count(small_out["worker_pid"])
    return phase


def measure(name: str, workers: int, shape: str, kind: str, args, exe: str, workdir: Path,
            bodies: dict) -> dict:  # fmt: skip
    """One cell: a fresh server, unloaded phase, loaded phase, check, stop."""
    server = dataclasses.replace(commands.BY_NAME[name], workers=workers, tls=args.certs)
    check = functools.partial(check_ping, tls=args.tls)
    cell_dir = Path(tempfile.mkdtemp(dir=workdir, prefix=f"{name}-w{workers}-{shape}-{kind}-"))
    env = {"ISOLATION_READY_DIR": str(cell_dir), "PYTHONPATH": str(HERE)}
    pin_server = ["taskset", "-c", server_cpus(workers)] if args.pinned else []
    pin_clients = ["taskset", "-c", args.client_cpus] if args.pinned else []
    body = bodies[kind]
    large_cmd = [
        sys.executable, str(HERE / "large_client.py"), "PORT", body["path"], str(body["file"]),
        str(body["count"]), str(LARGE_CONNS),
    ]  # fmt: skip
    sample: dict = {}
    log_path = cell_dir / "server.log"
    with servers.ServerProcess(server, APP, pin_server, log_path, env=env) as proc:
        sample["startup_s"] = round(proc.wait_ready(check), 3)
        wait_for_workers(cell_dir, workers, proc)
        large_cmd[2] = str(proc.port)
        sample["unloaded"] = measure_phase(
            exe, proc, shape, UNLOADED_WARMUP_S, args.unloaded, pin_clients, cell_dir,
            small_rate=args.small_rate, tls=args.tls,
        )  # fmt: skip
        sample["loaded"] = measure_phase(
            exe, proc, shape, args.warmup, args.duration, pin_clients, cell_dir, large_cmd,
            small_rate=args.small_rate, upload_rate=args.upload_rate, tls=args.tls,
        )  # fmt: skip
        if not proc.alive():
            raise servers.ServerDied(f"exited during the measurement\n{proc.log_tail()}")
        check(servers.HOST, proc.port)
        status = proc.stop()
        if status not in (0, -15):
            sample["problems"] = [f"exit status {status} after SIGTERM\n{proc.log_tail(5)}"]
    problems = sample.setdefault("problems", [])
    for phase in ("unloaded", "loaded"):
        p = sample[phase]
        if p["small_errors"]:
            problems.append(f"{phase}: {p['small_errors']} small errors ({p['small_first_error']})")
    large = sample["loaded"]["large"]
    if large["errors"]:
        problems.append(f"{large['errors']} upload errors ({large['first_error']})")
    if not problems:
        del sample["problems"]
    return sample


def progress(what: str, sample: dict) -> None:
    if "error" in sample:
        shown = ("missing: " if sample.get("missing") else "FAILED: ") + sample["error"]
        shown = shown.splitlines()[0]
    else:
        u, lo = sample["unloaded"]["small"], sample["loaded"]["small"]
        large = sample["loaded"]["large"]
        shown = (
            f"unloaded {fmt(u['rps']):>5} rps p99 {fmt(u['p99_ms'])} ms | loaded "
            f"{fmt(lo['rps']):>5} rps p50 {fmt(lo['p50_ms'])} p99 {fmt(lo['p99_ms'])} max "
            f"{fmt(lo['max_ms'])} ms | large {large['served']} "
            f"| other load {sample['loaded']['other_busy']:.0%}"
        )
        if sample.get("problems"):
            shown += f"  [{sample['problems'][0].splitlines()[0]}]"
    print(f"  {what}  {shown}", file=sys.stderr, flush=True)


def run_all(args, names: list[str], missing: dict, exe: str, workdir: Path, bodies) -> list:
    cells = {
        (w, k, s): {"workers": w, "body": k, "shape": s, "runs": {n: [] for n in names}}
        for w in args.workers
        for k in args.bodies
        for s in args.shapes
    }
    failed_start: dict[str, str] = {}
    for rep in range(args.repeats):
        shift = rep % len(names)
        for w in args.workers:
            for k in args.bodies:
                for s in args.shapes:
                    for name in names[shift:] + names[:shift]:
                        what = f"w{w} {k:<6} {s:<9} {rep + 1}/{args.repeats} {name:<9}"
                        reason = missing.get(name) or failed_start.get(name)
                        if reason:
                            sample = {"error": reason, "missing": True}
                        else:
                            try:
                                sample = measure(name, w, s, k, args, exe, workdir, bodies)
                            except servers.StartFailed as exc:
                                sample = {"error": f"{name} failed to start: {exc}"}
                                failed_start[name] = sample["error"]
                            except (servers.ServerDied, WrongResponse, ClientFailed, OSError,
                                    ValueError, http.client.HTTPException) as exc:  # fmt: skip
                                sample = {"error": f"{type(exc).__name__}: {exc}"}
                        sample["repeat"] = rep + 1
                        cells[(w, k, s)]["runs"][name].append(sample)
                        progress(what, sample)
    return list(cells.values())


def build_client(workdir: Path, tls: bool) -> str:
    exe = workdir / "small_client"
    openssl = ["-DSMALL_CLIENT_TLS", "-lssl", "-lcrypto"] if tls else []
    built = subprocess.run(
        ["cc", "-O2", "-Wall", "-Wextra", str(HERE / "small_client.c"), "-o", str(exe),
         *openssl],
        capture_output=True, text=True,
    )  # fmt: skip
    if built.returncode != 0:
        if tls:
            sys.exit(f"compiling small_client.c with OpenSSL failed (libssl-dev?):\n{built.stderr}")
        sys.exit(f"compiling small_client.c failed:\n{built.stderr}")
    return str(exe)


def probe_servers(names: list[str]) -> tuple[dict, dict]:
    available, missing = {}, {}
    for name in names:
        try:
            available[name] = servers.probe(commands.BY_NAME[name])
        except (LookupError, subprocess.TimeoutExpired) as exc:
            missing[name] = str(exc)
    if available.get("ferroloop", {}).get("debug_build", False) is not False:
        sys.exit("ferroloop is a debug build (or says nothing); run `make build` first.")
    return available, missing


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.pinned = (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None
    available, missing = probe_servers(args.servers)
    for name, why in missing.items():
        print(f"{name}: missing ({why})", file=sys.stderr)
    cells = len(args.workers) * len(args.bodies) * len(args.shapes) * len(available)
    per_cell = 3.5 + UNLOADED_WARMUP_S + args.unloaded + args.warmup + args.duration
    print(f"{cells * args.repeats} cells, about {cells * args.repeats * per_cell / 60:.0f} min",
          file=sys.stderr, flush=True)  # fmt: skip
    started, load_before = time.time(), os.getloadavg()[0]
    kinds = body_kinds()
    with tempfile.TemporaryDirectory(prefix="ferroloop-isolation-bench-") as tmp:
        workdir = Path(tmp)
        exe = build_client(workdir, args.tls)
        args.certs = None
        if args.tls:
            certs = make_certificates(workdir)
            args.certs = (str(certs.cert), str(certs.key))
        bodies = {}
        for kind in args.bodies:
            data = kinds[kind]["build"]()
            path = workdir / f"{kind}.json"
            path.write_bytes(data)
            bodies[kind] = {**kinds[kind], "file": path, "bytes": len(data)}
            del bodies[kind]["build"]
        results = run_all(args, args.servers, missing, exe, workdir, bodies)
    tls_shown = ("CERT", "KEY") if args.tls else None
    meta = {
        **run_meta("benchmarks/isolation/run.py", argv, started, load_before, args.pinned),
        "cpus": os.cpu_count(),
        "servers": available,
        "missing": missing,
        "commands": {
            n: " ".join(
                [
                    "python",
                    *dataclasses.replace(commands.BY_NAME[n], tls=tls_shown).command(APP, "PORT")[
                        1:
                    ],
                ]
            ).replace("--workers 1", "--workers N")
            for n in args.servers
        },
        "bodies": {
            k: {key: b[key] for key in ("path", "bytes", "count", "title")}
            for k, b in bodies.items()
        },
        "duration_s_loaded": args.duration,
        "warmup_s_loaded": args.warmup,
        "duration_s_unloaded": args.unloaded,
        "warmup_s_unloaded": UNLOADED_WARMUP_S,
        "large_connections": LARGE_CONNS,
        "repeats": args.repeats,
        "server_cpus": {w: server_cpus(w) for w in args.workers},
        "client_cpus": args.client_cpus,
        "small_rate": args.small_rate,
        "upload_rate": args.upload_rate,
        "tls": args.tls,
    }
    text = report.write_all(args.out, meta, results, args.name)
    print(text)
    print(f"total time: {meta['duration_s'] / 60:.1f} min", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
