"""Tasks with gather: create small coroutine tasks in batches with asyncio.gather; tasks/second.

Fan-out is how applications use concurrency (fetch N things, handle N connections): each unit of
work becomes a Task that is created, stepped at least twice and completed, and gather collects
the results. Each task awaits `asyncio.sleep(0)` once, so it suspends and is rescheduled through
the loop rather than finishing on its first step. Batches of 1000 tasks, N tasks in total.
"""

from __future__ import annotations

import asyncio
from time import perf_counter

from metric import Metric

METRICS = (Metric("tasks_per_s", "tasks with gather", "tasks/s", True),)
CASES = {"": ({"n": 200_000, "batch": 1000}, {"n": 50_000, "batch": 1000})}


async def _small(i: int) -> int:
    await asyncio.sleep(0)
    return i


async def _batches(n: int, batch: int) -> int:
    wrong = 0
    for _ in range(n // batch):
        results = await asyncio.gather(*[_small(i) for i in range(batch)])
        if results != list(range(batch)):
            wrong += 1
    return wrong


def _measure(loop: asyncio.AbstractEventLoop, n: int, batch: int) -> tuple[float, int]:
    t0 = perf_counter()
    wrong = loop.run_until_complete(_batches(n, batch))
    return perf_counter() - t0, wrong


def run(loop: asyncio.AbstractEventLoop, params: dict) -> dict:
    n, batch = params["n"], params["batch"]
    _measure(loop, n // 10, batch)  # warm-up
    elapsed, wrong = _measure(loop, n, batch)
    problems = [f"{wrong} gather batches returned wrong results"] if wrong else []
    return {"metrics": {"tasks_per_s": n // batch * batch / elapsed}, "problems": problems}
