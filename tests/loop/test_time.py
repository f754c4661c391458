"""loop.time(): monotonic, and on the same clock as time.monotonic()."""

from __future__ import annotations

import asyncio
import time

# Generous slack for a clock read that is cached per loop iteration; a loop whose
# clock has another epoch (time.time(), or zero at loop creation) is off by far more.
CLOCK_SLACK = 0.05


def test_time_returns_a_float(loop):
    assert isinstance(loop.time(), float)


def test_time_never_goes_backwards(loop):
    previous = loop.time()
    for _ in range(10_000):
        now = loop.time()
        assert now >= previous
        previous = now


def test_time_never_goes_backwards_while_running(loop):
    readings = []

    def read(remaining):
        readings.append(loop.time())
        if remaining:
            loop.call_soon(read, remaining - 1)
        else:
            loop.stop()

    loop.call_soon(read, 1000)
    loop.run_forever()
    assert readings == sorted(readings)


def test_time_is_on_the_monotonic_clock(loop):
    before = time.monotonic()
    now = loop.time()
    after = time.monotonic()
    assert before - CLOCK_SLACK <= now <= after + CLOCK_SLACK


def test_time_is_on_the_monotonic_clock_inside_a_callback(loop):
    seen = []

    def read():
        before = time.monotonic()
        now = loop.time()
        after = time.monotonic()
        seen.append((before, now, after))
        loop.stop()

    loop.call_soon(read)
    loop.run_forever()
    before, now, after = seen[0]
    assert before - CLOCK_SLACK <= now <= after + CLOCK_SLACK


def test_time_advances_across_a_sleep(loop):
    start = loop.time()
    loop.run_until_complete(asyncio.sleep(0.02))
    assert loop.time() - start >= 0.02


def test_call_at_with_a_monotonic_deadline_fires(loop):
    fired = []
    loop.call_at(time.monotonic() + 0.01, fired.append, "monotonic")
    loop.call_at(time.monotonic() + 0.02, loop.stop)
    loop.run_forever()
    assert fired == ["monotonic"]
