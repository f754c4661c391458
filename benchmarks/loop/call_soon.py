"""call_soon throughput: ready callbacks the loop runs per second.

Every resumed task, finished future and protocol event reaches user code as a ready callback, so
the cost of queueing one with call_soon and dispatching it is paid on every step of every request.
1000 chains each re-schedule themselves with `loop.call_soon(step)` until N callbacks have run in
total, so each loop iteration drains a batch of ready work and then polls for I/O (with a zero
timeout, as a real loop does while work is pending) before the next batch.
"""

from __future__ import annotations

import asyncio
from time import perf_counter

from metric import Metric

METRICS = (Metric("callbacks_per_s", "call_soon throughput", "callbacks/s", True),)
# case label -> (full params, --quick params)
CASES = {"": ({"n": 1_000_000, "chains": 1000}, {"n": 200_000, "chains": 1000})}


def _measure(loop: asyncio.AbstractEventLoop, n: int, chains: int) -> tuple[int, float]:
    done = loop.create_future()
    count = 0

    def step() -> None:
        nonlocal count
        count += 1
        if count < n:
            loop.call_soon(step)
        elif count == n:
            done.set_result(None)

    t0 = perf_counter()
    for _ in range(chains):
        loop.call_soon(step)
    loop.run_until_complete(done)
    # Chains still queued when the N-th callback ran have run too (count > n): count them all.
    return count, perf_counter() - t0


def run(loop: asyncio.AbstractEventLoop, params: dict) -> dict:
    n, chains = params["n"], params["chains"]
    _measure(loop, max(n // 10, chains), chains)  # warm-up: allocator, free lists, caches
    count, elapsed = _measure(loop, n, chains)
    problems = [] if n <= count < n + chains else [f"ran {count} callbacks, expected ~{n}"]
    return {"metrics": {"callbacks_per_s": count / elapsed}, "problems": problems}
