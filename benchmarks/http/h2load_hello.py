"""HTTP/2 hello world: h2load against ferroloop and granian `--http 2`, one worker each.

    python benchmarks/http/h2load_hello.py   # needs h2load (Debian's nghttp2-client) and
                                             # granian with uvloop in the same environment

What it measures: req/s and the latency percentiles h2load reports for `GET /` of
`apps/hello_asgi.py` over h2c with prior knowledge, `h2load -c64 -m10` (64 connections, 10
concurrent streams each, issue 31's shape) for `--duration` seconds after a 1 s warm-up. The
server is pinned to core 0 and h2load to core 1 (taskset), as the HTTP/1.1 benchmarks pin
them; `--rounds` rounds with the servers' order rotated each round; medians with the ratio to
granian. A server is started fresh for every measurement and stopped with SIGTERM.

granian runs `--interface asgi --loop uvloop --workers 1 --runtime-threads 1 --http 2`, its
best single-worker ASGI configuration (benchmarks/http/servers.py uses the same with
`--http 1`); ferroloop runs `--no-access-log` with its default `--http auto`.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

APPS = Path(__file__).resolve().parent / "apps"
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def command(name: str, port: int) -> list[str]:
    py = [sys.executable, "-m"]
    if name == "granian":
        return [
            *py, "granian", "--interface", "asgi", "--loop", "uvloop", "--host", HOST,
            "--port", str(port), "--workers", "1", "--runtime-threads", "1", "--http", "2",
            "--no-access-log", "--log-level", "warning", "hello_asgi:app",
        ]  # fmt: skip
    return [*py, "ferroloop", "hello_asgi:app", "--host", HOST, "--port", str(port),
            "--no-access-log"]  # fmt: skip


def h2load(port: int, duration: int, connections: int, streams: int) -> str:
    args = [
        "taskset", "-c", "1", "h2load", "-c", str(connections), "-m", str(streams),
        "-D", str(duration), "--warm-up-time", "1", f"http://{HOST}:{port}/",
    ]  # fmt: skip
    return subprocess.run(args, capture_output=True, text=True, check=False).stdout


def measure(name: str, args: argparse.Namespace) -> tuple[float, str, str]:
    """(req/s, h2load's request-latency line, its status line)."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(APPS))
    proc = subprocess.Popen(
        ["taskset", "-c", "0", *command(name, port)],
        cwd=APPS,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        for _ in range(200):
            try:
                socket.create_connection((HOST, port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(1.0)
        out = h2load(port, args.duration, args.connections, args.streams)
        found = re.search(r"finished in [\d.]+\w*, ([\d.]+) req/s", out)
        latency = re.search(r"^time for request:.*$", out, re.M)
        status = re.search(r"^status codes:.*$", out, re.M)
        return (
            float(found.group(1)) if found else 0.0,
            latency.group(0) if latency else "",
            status.group(0) if status else out[-400:],
        )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--servers", default="ferroloop,granian")
    args = parser.parse_args()
    names = args.servers.split(",")
    results: dict[str, list[float]] = {}
    for rnd in range(args.rounds):
        for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
            rps, latency, status = measure(name, args)
            results.setdefault(name, []).append(rps)
            print(rnd, name, round(rps), "|", latency, "|", status, flush=True)
    print()
    base = statistics.median(results["granian"]) if "granian" in results else None
    for name, runs in results.items():
        median = statistics.median(runs)
        ratio = f", ÷ granian {median / base:.2f}" if base else ""
        print(f"{name:10} median {median:9.0f} req/s{ratio}, runs {[round(r) for r in runs]}")


if __name__ == "__main__":
    main()
