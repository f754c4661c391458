"""No load, --workers 2: hello and FastAPI req/s of granian and of ferroloop's dispatch modes.

    python benchmarks/http/dispatch_noload.py   # needs wrk and granian (`make bench-http`
                                                # installs both)

A first, small measurement of what the dispatching front costs (issue 27: "hello and FastAPI
req/s with --workers 2 at least 2x granian --workers 2"): `wrk -t1 -c64 -d5s` after a 1 s
warm-up, 3 rounds with the servers rotated each round, nothing pinned (workers, front and wrk
share the 2 cores), medians printed with the ratio to granian. ferroloop runs as the front
with its default fast-lane worker (3 workers), as the front with `--lane-fast-workers 0` (2
workers), and with `--dispatch kernel` (2 workers accepting on the shared socket).
"""

from __future__ import annotations

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
ROUNDS = 3
GRANIAN = [
    "-m", "granian", "--interface", "asgi", "--loop", "uvloop", "--host", "127.0.0.1",
    "--workers", "2", "--runtime-threads", "1", "--http", "1", "--no-access-log",
    "--log-level", "warning",
]  # fmt: skip
FERROLOOP = ["-m", "ferroloop", "--workers", "2", "--no-access-log"]
SERVERS = {
    "granian-w2": (GRANIAN, []),
    "ferroloop-front-w2": (FERROLOOP, []),
    "ferroloop-front-w2-fast0": (FERROLOOP, ["--lane-fast-workers", "0"]),
    "ferroloop-kernel-w2": (FERROLOOP, ["--dispatch", "kernel"]),
}
SCENARIOS = {"hello": ("hello_asgi:app", "/"), "fastapi": ("ping_fastapi:app", "/ping")}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def command(name: str, app: str, port: int) -> list[str]:
    base, extra = SERVERS[name]
    if name.startswith("granian"):
        return [sys.executable, *base, "--port", str(port), app]
    return [sys.executable, *base, app, "--port", str(port), *extra]


def measure(name: str, app: str, path: str) -> tuple[float, bool]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(APPS))
    proc = subprocess.Popen(
        command(name, app, port),
        cwd=APPS,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(1.5)  # every worker has imported the app
        url = f"http://127.0.0.1:{port}{path}"
        subprocess.run(["wrk", "-t1", "-c64", "-d1s", url], capture_output=True, check=False)
        out = subprocess.run(
            ["wrk", "-t1", "-c64", "-d5s", url], capture_output=True, text=True, check=False
        ).stdout
        found = re.search(r"Requests/sec:\s+([\d.]+)", out)
        rps = float(found.group(1)) if found else 0.0
        return rps, "Socket errors" in out or "Non-2xx" in out
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def main() -> None:
    results: dict[tuple[str, str], list[float]] = {}
    names = list(SERVERS)
    for rnd in range(ROUNDS):
        for scenario, (app, path) in SCENARIOS.items():
            for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
                rps, errors = measure(name, app, path)
                results.setdefault((scenario, name), []).append(rps)
                print(rnd, scenario, name, rps, "ERRORS" if errors else "", flush=True)
    print()
    for scenario in SCENARIOS:
        granian = statistics.median(results[(scenario, "granian-w2")])
        for name in SERVERS:
            runs = results[(scenario, name)]
            median = statistics.median(runs)
            print(
                f"{scenario:8} {name:26} median {median:9.0f} req/s, "
                f"÷ granian-w2 {median / granian:.2f}, runs {[round(r) for r in runs]}"
            )


if __name__ == "__main__":
    main()
