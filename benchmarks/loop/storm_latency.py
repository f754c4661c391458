"""I/O latency under a callback storm: how long a socket waits while ready work never runs out.

A loop that skips polling for I/O while callbacks are ready (ferroloop does, for a bounded time:
`ferroloop_core::poll_budget`) trades latency for fewer system calls; asyncio polls on every
iteration. This measures what the trade costs the user. In the loop's process, `tasks`
coroutines each loop on `await asyncio.sleep(0)` (every step a `call_soon` of the task: the
storm; 0 for none), while a TCP echo on 127.0.0.1 answers through `add_reader` (recv, send back
at once). A client process (plain blocking sockets, no loop, pinned to the other core when the
runner pins) sends one byte, waits for it to come back, and records the round trip with
`perf_counter`; then it sleeps `gap_s`, so every probe finds the loop mid-storm, not waiting on
the previous one. Reported: round trip p50 and p99 in µs, and the storm's task steps per second
over the same window (what the storm got done meanwhile; none without a storm).

    python benchmarks/loop/storm_latency.py LOOP [TASKS] [POLL_INTERVAL_S]

runs one case directly (`POLL_INTERVAL_S` sets ferroloop's budget through `_set_poll_interval`).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from time import perf_counter

from metric import Metric, percentile

METRICS = (
    Metric("rtt_p50_us", "echo round trip under a callback storm, p50", "µs", False),
    Metric("rtt_p99_us", "echo round trip under a callback storm, p99", "µs", False),
    Metric("storm_steps_per_s", "storm task steps meanwhile", "steps/s", True, ("1", "100")),
)
# case label (storm tasks) -> (full params, --quick params)
CASES = {
    str(tasks): (
        {"tasks": tasks, "samples": 2000, "gap_s": 0.0005},
        {"tasks": tasks, "samples": 300, "gap_s": 0.0005},
    )
    for tasks in (0, 1, 100)
}
WARMUP = 100

CLIENT = """
import json, socket, sys, time
from time import perf_counter
port, samples, gap = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for i in range(samples):
    time.sleep(gap)
    t0 = perf_counter()
    s.sendall(b"x")
    if s.recv(1) != b"x":
        sys.exit("bad echo")
    rtts.append(perf_counter() - t0)
s.close()
print(json.dumps(rtts))
"""


def _client_cmd(port: int, samples: int, gap_s: float) -> list[str]:
    pin = ["taskset", "-c", "1"] if os.environ.get("STORM_PIN_CLIENT", "1") == "1" else []
    if pin and not {0, 1} <= os.sched_getaffinity(0):
        pin = []
    return [*pin, sys.executable, "-c", CLIENT, str(port), str(samples), str(gap_s)]


def _measure(loop: asyncio.AbstractEventLoop, tasks: int, samples: int, gap_s: float) -> dict:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    client = subprocess.Popen(_client_cmd(port, samples, gap_s), stdout=subprocess.PIPE, text=True)
    conn, _ = listener.accept()
    listener.close()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.setblocking(False)
    steps = 0
    stop = False
    done = loop.create_future()

    def on_readable() -> None:
        try:
            data = conn.recv(64)
        except BlockingIOError:  # a spurious wake-up (rloop 0.5 reports some)
            return
        if not data:
            loop.remove_reader(conn.fileno())
            if not done.done():
                done.set_result(None)
            return
        conn.send(data)

    async def spin() -> None:
        nonlocal steps
        while not stop:
            steps += 1
            await asyncio.sleep(0)

    async def main() -> float:
        nonlocal stop
        spinners = [asyncio.ensure_future(spin()) for _ in range(tasks)]
        loop.add_reader(conn.fileno(), on_readable)
        t0 = perf_counter()
        await done
        elapsed = perf_counter() - t0
        stop = True
        await asyncio.gather(*spinners)
        return elapsed

    try:
        elapsed = loop.run_until_complete(main())
        out, _ = client.communicate(timeout=60)
    finally:
        conn.close()
        if client.poll() is None:
            client.kill()
    rtts = json.loads(out)[WARMUP:]
    return {
        "rtt_p50_us": percentile(rtts, 50) * 1e6,
        "rtt_p99_us": percentile(rtts, 99) * 1e6,
        "storm_steps_per_s": steps / elapsed,
        "rtt_max_us": max(rtts) * 1e6,
    }


def run(loop: asyncio.AbstractEventLoop, params: dict) -> dict:
    interval = params.get("poll_interval")
    if interval is not None and hasattr(loop, "_set_poll_interval"):
        loop._set_poll_interval(interval)
    result = _measure(loop, params["tasks"], params["samples"] + WARMUP, params["gap_s"])
    metrics = {m.key: result[m.key] for m in METRICS if m.applies_to(str(params["tasks"]))}
    return {"metrics": metrics, "info": {"rtt_max_us": result["rtt_max_us"]}}


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import loops

    name = argv[0]
    params: dict = {"tasks": int(argv[1]) if len(argv) > 1 else 100, "samples": 1000}
    params["gap_s"] = 0.0005
    if len(argv) > 2:
        params["poll_interval"] = float(argv[2])
    loop = loops.factory(name)()
    try:
        result = run(loop, params)
    finally:
        loop.close()
    print(json.dumps({"loop": name, **params, **result["metrics"], **result["info"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
