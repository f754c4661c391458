"""Timers: how fast call_later schedules, and how late timers fire.

Timeouts, keep-alive deadlines and retries put thousands of timers in flight on a busy server;
scheduling them is paid on every request, and lateness is added to every timeout the user waits
for. N timers (10k and 100k) are scheduled from a running coroutine with delays spread evenly
over 1 s, in a scrambled order so the timer heap sees out-of-order inserts. The first deadline
is 0.5 s out, after the scheduling burst has ended, so lateness is the loop's timer dispatch
(100k timers: 100 due per ms), not the time spent scheduling.

- scheduling rate: call_later calls per second.
- lateness, loop clock: `loop.time()` in the callback minus the handle's `when()`, in ms. This
  is the loop's own account; a loop whose clock ticks in whole ms (uvloop) reports 0 or 1 ms.
- lateness, wall clock: perf_counter() in the callback minus (perf_counter() at the call_later
  call + delay), in ms: what `await asyncio.sleep(d)` costs the user beyond d, whatever the
  loop's clock says. Call times are read once per 10 calls (midpoint), an error of a few µs.
"""

from __future__ import annotations

import asyncio
from time import perf_counter

from metric import Metric, percentile

METRICS = (
    Metric("schedule_per_s", "call_later scheduling rate", "calls/s", True),
    Metric("late_p50_ms", "timer lateness p50, loop clock", "ms", False),
    Metric("late_p99_ms", "timer lateness p99, loop clock", "ms", False),
    Metric("wall_late_p50_ms", "timer lateness p50, wall clock", "ms", False),
    Metric("wall_late_p99_ms", "timer lateness p99, wall clock", "ms", False),
)
CASES = {
    "10k": ({"n": 10_000, "lead_s": 0.5, "spread_s": 1.0},) * 2,
    "100k": ({"n": 100_000, "lead_s": 0.5, "spread_s": 1.0},) * 2,
    # Dense: every timer due within one 10 ms window (issue 29's shape: a burst of timeouts
    # set together). Lateness here is how fast due timers are dispatched in one pass.
    "10k in 10 ms": ({"n": 10_000, "lead_s": 0.5, "spread_s": 0.01},) * 2,
}
CHUNK = 10  # call_later calls per perf_counter() read while scheduling
EARLY_TOLERANCE_MS = 0.001  # asyncio itself fires up to its clock resolution early


def _measure(loop: asyncio.AbstractEventLoop, n: int, lead_s: float, spread_s: float) -> tuple:
    # 7919 is prime, so i * 7919 % n visits every slot once: evenly spread, scrambled order.
    delays = [lead_s + (i * 7919 % n) / n * spread_s for i in range(n)]
    fired_loop = [0.0] * n
    fired_wall = [0.0] * n
    done = loop.create_future()
    remaining = n
    now = loop.time

    def on_timer(i: int) -> None:
        nonlocal remaining
        fired_wall[i] = perf_counter()
        fired_loop[i] = now()
        remaining -= 1
        if remaining == 0:
            done.set_result(None)

    async def schedule() -> tuple:
        call_later = loop.call_later
        handles: list = [None] * n
        stamps = []
        t0 = perf_counter()
        for start in range(0, n, CHUNK):
            stamps.append(perf_counter())
            for i in range(start, min(start + CHUNK, n)):
                handles[i] = call_later(delays[i], on_timer, i)
        stamps.append(perf_counter())
        rate = n / (stamps[-1] - t0)
        await done
        return rate, handles, stamps

    rate, handles, stamps = loop.run_until_complete(schedule())
    late_loop = [(fired_loop[i] - h.when()) * 1e3 for i, h in enumerate(handles)]
    late_wall = [
        (fired_wall[i] - (stamps[i // CHUNK] + stamps[i // CHUNK + 1]) / 2 - delays[i]) * 1e3
        for i in range(n)
    ]
    return rate, late_loop, late_wall


def run(loop: asyncio.AbstractEventLoop, params: dict) -> dict:
    n, lead_s, spread_s = params["n"], params["lead_s"], params["spread_s"]
    _measure(loop, n // 10, lead_s / 10, spread_s / 10)  # warm-up
    rate, late_loop, late_wall = _measure(loop, n, lead_s, spread_s)
    problems = []
    early = [x for x in late_loop if x < -EARLY_TOLERANCE_MS]
    if early:
        problems.append(
            f"{len(early)} of {n} timers fired before their when() by loop.time() "
            f"(earliest by {-min(early):.3f} ms)"
        )
    metrics = {
        "schedule_per_s": rate,
        "late_p50_ms": percentile(late_loop, 50),
        "late_p99_ms": percentile(late_loop, 99),
        "wall_late_p50_ms": percentile(late_wall, 50),
        "wall_late_p99_ms": percentile(late_wall, 99),
    }
    info = {"late_max_ms": max(late_loop), "wall_late_max_ms": max(late_wall)}
    return {"metrics": metrics, "problems": problems, "info": info}
