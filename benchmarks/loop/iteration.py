"""The loop iteration's cost curve: time per iteration with K ready callbacks, K = 1, 2, 10, 1000.

An iteration is what every awaited result costs at least once: a program that awaits one thing
at a time runs iterations of one or two callbacks, a busy server iterations of hundreds. K chains
each re-schedule themselves with `call_soon` (a bound method kept in a local), so every
iteration runs exactly K callbacks that do nothing else; the first chain counts iterations and
stops the loop after N. Per iteration minus K times the per-callback cost at K = 1000 is the
iteration's fixed cost: the poll (or its absence), the clock read, the timer check, taking the
batch. The same workload is `shapes.py ready`, for counting system calls (`syscalls.py`) and
instructions (`shape_instructions.py`).
"""

from __future__ import annotations

import asyncio
from time import perf_counter

from metric import Metric
from shapes import ready

METRICS = (
    Metric("ns_per_iteration", "loop iteration with K ready callbacks", "ns", False),
    Metric("ns_per_callback", "the same, per callback", "ns", False),
)
# case label (K) -> (full params, --quick params); N iterations: about 1 M callbacks in all.
CASES = {
    str(k): ({"k": k, "n": max(1_000_000 // k, 1000)}, {"k": k, "n": max(200_000 // k, 200)})
    for k in (1, 2, 10, 1000)
}


def run(loop: asyncio.AbstractEventLoop, params: dict) -> dict:
    k, n = params["k"], params["n"]
    ready(loop, max(n // 10, 10), k)  # warm-up
    t0 = perf_counter()
    ready(loop, n, k)
    elapsed = perf_counter() - t0
    per_iteration = elapsed / n * 1e9
    return {"metrics": {"ns_per_iteration": per_iteration, "ns_per_callback": per_iteration / k}}
