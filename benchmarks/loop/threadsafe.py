"""call_soon_threadsafe wake latency: time from a thread's call to the callback running, in µs.

Thread pools (run_in_executor, to_thread), signal handlers and other threads hand results to
the loop with call_soon_threadsafe. When the loop is idle it is asleep in poll, so the latency
the user sees is the wake-up path: write to the waker, return from poll, take the GIL, run the
callback. A Python thread calls `loop.call_soon_threadsafe(cb, t0)` about every 0.5 ms, only
after the previous callback has run, so the loop is idle each time; `cb` records
`perf_counter() - t0`. The loop has no timers or I/O, so it sleeps in poll with no timeout.
Both threads share one core, as they would on a busy machine.

The burst rate is the other side of the same path: one thread calls
`loop.call_soon_threadsafe(cb)` back to back (`burst` times) while the loop runs them; the rate
is callbacks per second from the first call to the last callback. A loop that wakes (or hands
over the GIL) once per call instead of once per batch shows here.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from time import perf_counter

from metric import Metric, percentile

METRICS = (
    Metric("wake_p50_us", "call_soon_threadsafe wake latency p50", "µs", False),
    Metric("wake_p99_us", "call_soon_threadsafe wake latency p99", "µs", False),
    Metric("burst_per_s", "call_soon_threadsafe burst from one thread", "callbacks/s", True),
)
CASES = {
    "": (
        {"samples": 2000, "gap_s": 0.0005, "burst": 300_000},
        {"samples": 500, "gap_s": 0.0005, "burst": 50_000},
    )
}
WARMUP_SAMPLES = 100
STALL_S = 10.0  # a wake-up that takes this long is a hang: stop sending and report it
STALL_MESSAGE = (
    f"callback {{i}} had not run {STALL_S:.0f} s after call_soon_threadsafe while the loop "
    "was idle in poll (lost wake-up?)"
)


def _sender(loop, samples: int, gap_s: float, latencies: list, cb, stalled: list) -> None:
    for i in range(samples):
        time.sleep(gap_s)
        waited = 0.0
        while len(latencies) < i:  # the previous callback has not run yet: the loop is busy
            time.sleep(gap_s / 5)
            waited += gap_s / 5
            if waited > STALL_S:
                stalled.append(i)
                print(f"threadsafe: {STALL_MESSAGE.format(i=i - 1)}", file=sys.stderr, flush=True)
                loop.call_soon_threadsafe(cb, None)
                return
        loop.call_soon_threadsafe(cb, perf_counter())


def _measure(loop: asyncio.AbstractEventLoop, samples: int, gap_s: float) -> tuple[list, list]:
    latencies: list[float] = []
    stalled: list[int] = []
    done = loop.create_future()

    def cb(t0: float | None) -> None:
        if t0 is None:
            done.set_result(None)
            return
        latencies.append(perf_counter() - t0)
        if len(latencies) == samples:
            done.set_result(None)

    async def main() -> None:
        args = (loop, samples, gap_s, latencies, cb, stalled)
        thread = threading.Thread(target=_sender, args=args, daemon=True)
        thread.start()
        await done
        thread.join()

    loop.run_until_complete(main())
    return latencies, stalled


def _burst(loop: asyncio.AbstractEventLoop, n: int) -> float:
    """Callbacks per second while one thread calls call_soon_threadsafe `n` times in a row."""
    ran = 0
    done = loop.create_future()

    def cb() -> None:
        nonlocal ran
        ran += 1
        if ran == n:
            done.set_result(perf_counter())

    def produce() -> None:
        for _ in range(n):
            loop.call_soon_threadsafe(cb)

    async def main() -> float:
        thread = threading.Thread(target=produce, daemon=True)
        t0 = perf_counter()
        thread.start()
        end = await asyncio.wait_for(done, STALL_S * 3)
        thread.join()
        return n / (end - t0)

    return loop.run_until_complete(main())


def run(loop: asyncio.AbstractEventLoop, params: dict) -> dict:
    latencies, stalled = _measure(loop, params["samples"] + WARMUP_SAMPLES, params["gap_s"])
    problems = []
    if stalled:
        problems.append(STALL_MESSAGE.format(i=stalled[0] - 1))
    us = [x * 1e6 for x in latencies[WARMUP_SAMPLES:]] or [float("nan")]
    metrics = {
        "wake_p50_us": percentile(us, 50),
        "wake_p99_us": percentile(us, 99),
        "burst_per_s": _burst(loop, params["burst"]),
    }
    return {"metrics": metrics, "problems": problems, "info": {"wake_max_us": max(us)}}
