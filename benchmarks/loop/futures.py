"""Futures churn: create a future, resolve it from a callback, await it; futures per second.

This is the shape of every awaited I/O operation: the loop hands out a future, something
resolves it later from a callback, and the awaiting task is woken through the future's done
callbacks. 100 tasks churn concurrently (N futures in total), so each loop iteration wakes a
batch of tasks as it would under load.
"""

from __future__ import annotations

import asyncio
from time import perf_counter

from metric import Metric

METRICS = (Metric("futures_per_s", "futures churn", "futures/s", True),)
CASES = {"": ({"n": 300_000, "workers": 100}, {"n": 60_000, "workers": 100})}


async def _churn(loop: asyncio.AbstractEventLoop, count: int) -> int:
    wrong = 0
    for i in range(count):
        fut = loop.create_future()
        loop.call_soon(fut.set_result, i)
        if await fut != i:
            wrong += 1
    return wrong


def _measure(loop: asyncio.AbstractEventLoop, n: int, workers: int) -> tuple[float, int]:
    async def main() -> int:
        results = await asyncio.gather(*(_churn(loop, n // workers) for _ in range(workers)))
        return sum(results)

    t0 = perf_counter()
    wrong = loop.run_until_complete(main())
    return perf_counter() - t0, wrong


def run(loop: asyncio.AbstractEventLoop, params: dict) -> dict:
    n, workers = params["n"], params["workers"]
    _measure(loop, n // 10, workers)  # warm-up
    elapsed, wrong = _measure(loop, n, workers)
    problems = [f"{wrong} futures resolved to the wrong value"] if wrong else []
    total = n // workers * workers
    return {"metrics": {"futures_per_s": total / elapsed}, "problems": problems}
