"""Probe of issue 27 point 3: small requests on one worker while two clients upload 25 MB JSON.

A reproduction, not the official harness: the FastAPI app in `app.py` (`POST /upload/items`, a
list of about 1.8M short strings; `POST /upload/text`, one 25 MB string; `GET /ping`), two
upload clients and one small-request client from `clients.py`, each its own process, on
keep-alive connections in closed loops. The servers run alternately, ROUNDS rounds of SECONDS
each, and the medians are printed: small requests served, their p50/p99/max latency in ms, and
uploads completed (serving more uploads also leaves less time for the small requests). The
server is pinned to core 0, the clients to core 1 (`PROBE_SERVER_CPU`, `PROBE_CLIENT_CPU`).

    python run.py KIND [SECONDS] [ROUNDS] [SERVER...]

KIND is `items` or `text`; a SERVER is `uvicorn` (uvloop + httptools), `ferroloop`, or
`ferroloop@DIR`: ferroloop with DIR first on PYTHONPATH, to compare another build of the
package (a copy of `python/ferroloop` with its native module).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable
PORT = int(os.environ.get("PROBE_PORT", "8771"))
SERVER_CPU = os.environ.get("PROBE_SERVER_CPU", "0")
CLIENT_CPU = os.environ.get("PROBE_CLIENT_CPU", "1")
STARTUP_TIMEOUT_S = 30.0


def server_cmd(name: str) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    common = ["app:app", "--app-dir", str(HERE), "--port", str(PORT), "--no-access-log"]
    if name.startswith("ferroloop"):
        _, _, where = name.partition("@")
        if where:
            env["PYTHONPATH"] = where
        return [PY, "-m", "ferroloop", *common], env
    if name == "uvicorn":
        extra = ["--loop", "uvloop", "--http", "httptools", "--log-level", "warning"]
        return [PY, "-m", "uvicorn", *common, *extra], env
    raise SystemExit(f"unknown server {name!r}")


def wait_ready() -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", PORT), timeout=1) as s:
                s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if s.recv(100).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server did not start")


def one_run(name: str, kind: str, seconds: float) -> dict[str, float]:
    cmd, env = server_cmd(name)
    server = subprocess.Popen(
        ["taskset", "-c", SERVER_CPU, *cmd],
        start_new_session=True,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        wait_ready()
        client = ["taskset", "-c", CLIENT_CPU, PY, str(HERE / "clients.py")]
        upload = [*client, "upload", kind, str(PORT), str(seconds + 1.0)]
        ups = [subprocess.Popen(upload, stdout=subprocess.PIPE) for _ in range(2)]
        time.sleep(0.5)
        pinger = subprocess.Popen(
            [*client, "ping", str(PORT), str(seconds)], stdout=subprocess.PIPE
        )
        out = pinger.communicate(timeout=seconds + 60)[0]
        lat = sorted(json.loads(out)["latencies"])
        uploads = sum(json.loads(u.communicate(timeout=seconds + 60)[0])["uploads"] for u in ups)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()

    def ms(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000

    return {
        "small": len(lat),
        "p50": ms(0.5),
        "p99": ms(0.99),
        "max": lat[-1] * 1000,
        "uploads": uploads,
    }


def show(res: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.1f}" for k, v in res.items())


def main() -> None:
    kind = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    names = sys.argv[4:] or ["ferroloop", "uvicorn"]
    results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            res = one_run(name, kind, seconds)
            results[name].append(res)
            print(f"round {r} {name:28s} {show(res)}", flush=True)
    print(f"medians over {rounds} rounds, {kind}, {seconds:.0f} s:")
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"  {name:28s} {show(med)}", flush=True)


if __name__ == "__main__":
    main()
