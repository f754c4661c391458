"""``loop.enable_metrics()`` / ``loop.metrics()``: ferroloop's own counters of its iterations,
polls, busy time and timer lateness. asyncio's loop has no such API, so these run on
ferroloop's loop only; the figures are checked against what each program made the loop do."""

from __future__ import annotations

import asyncio
import math
import time

import ferroloop
import pytest


@pytest.fixture
def loop():
    loop = ferroloop.new_event_loop()
    yield loop
    loop.close()


def test_nothing_is_counted_until_enabled(loop):
    loop.run_until_complete(asyncio.sleep(0.01))
    assert loop.metrics()["enabled"] is False
    assert loop.metrics()["iterations"] == 0
    reference = asyncio.new_event_loop()
    try:
        assert not hasattr(reference, "metrics"), "ferroloop's own API"
    finally:
        reference.close()


def test_iterations_polls_and_waits_are_counted(loop):
    loop.enable_metrics()

    async def sleeper():
        for _ in range(20):
            await asyncio.sleep(0.005)

    started = time.monotonic()
    loop.run_until_complete(sleeper())
    elapsed = time.monotonic() - started
    m = loop.metrics()
    assert m["enabled"] is True
    assert m["iterations"] >= 20 and m["polls"] >= 20
    # Twenty 5 ms sleeps: the loop waited for most of it, and never longer than it ran.
    assert 0.05 <= m["poll_wait_seconds"] <= elapsed
    busy = m["busy_seconds"]
    assert busy["count"] >= 20 and busy["sum"] < elapsed
    bounds = [bound for bound, _ in busy["buckets"]]
    assert bounds == sorted(bounds) and math.isinf(bounds[-1])
    counts = [count for _, count in busy["buckets"]]
    assert counts == sorted(counts) and counts[-1] == busy["count"], "cumulative"


def test_a_callback_that_blocks_shows_as_busy_time_and_late_timers(loop):
    loop.enable_metrics()
    fired = loop.create_future()

    def block():
        time.sleep(0.05)

    loop.call_soon(block)
    loop.call_later(0.001, fired.set_result, None)  # due while block() holds the loop
    loop.run_until_complete(fired)
    m = loop.metrics()
    lag = m["timer_lag_seconds"]
    assert lag["count"] == 1
    assert 0.04 <= lag["sum"] < 5, lag  # dispatched ~49 ms after its deadline
    under_10ms = dict(lag["buckets"])[0.01]
    assert under_10ms == 0, "the late timer is counted above 10 ms"
    busy = m["busy_seconds"]
    assert dict(busy["buckets"])[0.01] < busy["count"], "the 50 ms iteration is above 10 ms"


def test_enabling_again_keeps_the_counts(loop):
    loop.enable_metrics()
    loop.run_until_complete(asyncio.sleep(0.01))
    before = loop.metrics()["iterations"]
    loop.enable_metrics()
    assert loop.metrics()["iterations"] == before > 0
