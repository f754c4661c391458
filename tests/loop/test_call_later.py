"""call_later: deadline order, FIFO among equal deadlines, arguments, contexts, checks."""

from __future__ import annotations

import contextvars
import decimal
import fractions
import math

import pytest

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


def test_timers_fire_in_deadline_order(loop):
    order = []
    for delay in (0.03, 0.01, 0.02, 0.0, 0.005):
        loop.call_later(delay, order.append, delay)
    loop.call_later(0.04, loop.stop)
    loop.run_forever()
    assert order == [0.0, 0.005, 0.01, 0.02, 0.03]


def test_timers_with_equal_deadlines_fire_in_scheduling_order(loop, loop_name):
    if loop_name == "asyncio":
        pytest.skip(
            "asyncio's heapq does not promise FIFO among equal deadlines; ferroloop does "
            "(crates/core/src/timers.rs)"
        )
    order = []
    when = loop.time() + 0.01
    for i in range(50):
        loop.call_at(when, order.append, i)
    loop.call_at(when, loop.stop)
    loop.run_forever()
    assert order == list(range(50))


def test_timers_with_equal_deadlines_fire_in_one_iteration(loop):
    order = []

    def fire(i):
        order.append(i)
        loop.call_soon(order.append, f"after-{i}")

    when = loop.time() + 0.01
    for i in range(50):
        loop.call_at(when, fire, i)
    loop.call_at(when + 0.01, loop.stop)
    loop.run_forever()
    # Every due timer ran before any callback that the due timers scheduled.
    assert sorted(order[:50]) == list(range(50))
    assert sorted(order[50:]) == sorted(f"after-{i}" for i in range(50))


def test_timers_with_the_same_delay_fire_in_scheduling_order(loop):
    order = []
    for i in range(50):
        loop.call_later(0.01, order.append, i)
    loop.call_later(0.02, loop.stop)
    loop.run_forever()
    assert order == list(range(50))


def test_timer_does_not_fire_before_its_delay_elapsed(loop):
    fired_at = []
    start = loop.time()
    loop.call_later(0.05, lambda: fired_at.append(loop.time()))
    loop.call_later(0.05, loop.stop)
    loop.run_forever()
    assert fired_at
    assert fired_at[0] - start >= 0.05


def test_a_timer_far_enough_out_to_be_waited_for_in_two_legs_is_not_early(loop):
    # ferroloop wakes before a timer more than 50 ms out (short of the kernel's timer slack)
    # and waits again for the rest: the early wake-up must not fire it.
    fired = []
    handle = loop.call_later(0.12, lambda: (fired.append(loop.time()), loop.stop()))
    loop.run_forever()
    assert len(fired) == 1
    assert fired[0] >= handle.when() - 1e-9


def test_timers_never_fire_before_their_deadline(loop):
    early = []
    now = loop.time()

    def check(handle_box):
        # asyncio lets a timer fire up to the clock resolution (1 ns) before its deadline.
        if loop.time() < handle_box[0].when() - 1e-6:
            early.append((handle_box[0].when(), loop.time()))

    for i in range(200):
        box = []
        box.append(loop.call_at(now + (i % 50) / 10_000, check, box))
    loop.call_at(now + 0.006, loop.stop)
    loop.run_forever()
    assert early == []


def test_zero_delay_timer_runs_after_ready_callbacks_of_the_same_iteration(loop):
    order = []
    loop.call_later(0, order.append, "timer")
    loop.call_soon(order.append, "soon")
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    assert order == ["soon", "timer"]


def test_negative_delay_fires(loop):
    fired = []
    loop.call_later(-1, fired.append, "negative")
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    assert fired == ["negative"]


def test_call_later_passes_positional_arguments(loop):
    received = []
    loop.call_later(0, lambda *args: received.append(args), 1, "two", None)
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    assert received == [(1, "two", None)]


def test_call_later_runs_callback_in_given_context(loop):
    context = contextvars.copy_context()
    context.run(request_id.set, "timer-context")
    seen = []
    loop.call_later(0, lambda: seen.append(request_id.get()), context=context)
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    assert seen == ["timer-context"]
    assert request_id.get() == "unset"


def test_call_later_without_context_copies_the_current_context(loop):
    seen = []
    token = request_id.set("at-schedule-time")
    try:
        loop.call_later(0, lambda: seen.append(request_id.get()))
    finally:
        request_id.reset(token)
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    assert seen == ["at-schedule-time"]


def test_timer_scheduled_while_running_fires(loop):
    order = []

    def schedule():
        loop.call_later(0.01, order.append, "inner")
        loop.call_later(0.02, loop.stop)

    loop.call_soon(schedule)
    loop.run_forever()
    assert order == ["inner"]


def test_earlier_timer_scheduled_later_fires_first(loop):
    order = []
    loop.call_later(0.05, order.append, "late")
    loop.call_soon(lambda: loop.call_later(0.01, order.append, "early"))
    loop.call_later(0.06, loop.stop)
    loop.run_forever()
    assert order == ["early", "late"]


def test_loop_sleeps_until_next_timer_when_nothing_is_ready(loop):
    # With no ready callbacks, the loop must wake for the timer by itself.
    loop.call_later(0.02, loop.stop)
    loop.run_forever()
    assert not loop.is_running()


def test_infinite_delay_never_fires_and_does_not_block_other_timers(loop):
    fired = []
    never = loop.call_later(float("inf"), fired.append, "never")
    loop.call_later(0.01, fired.append, "soon")
    loop.call_later(0.02, loop.stop)
    loop.run_forever()
    assert fired == ["soon"]
    assert never.when() == float("inf")
    never.cancel()


@pytest.mark.parametrize("method", ["call_later", "call_at"])
def test_nan_deadline_fires_at_the_next_iteration(loop, method):
    # asyncio's heap finds a NaN deadline not later than the clock and runs it at once; a heap
    # ordered by total order would put it after +inf and never run it.
    fired = []
    timer = getattr(loop, method)(float("nan"), fired.append, "nan")
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert fired == ["nan"]
    assert math.isnan(timer.when())


class _FloatOnly:
    def __float__(self):
        return 0.0


class _IndexOnly:
    def __index__(self):
        return 0


@pytest.mark.parametrize("delay", [decimal.Decimal("0.001"), _FloatOnly(), _IndexOnly()], ids=type)
def test_call_later_refuses_a_delay_that_cannot_be_added_to_the_time(loop, delay):
    # asyncio computes loop.time() + delay: float + Decimal and float + an object with only
    # __float__ or __index__ are TypeErrors, not conversions.
    with pytest.raises(TypeError, match="unsupported operand type"):
        loop.call_later(delay, print)


def test_call_later_takes_a_delay_that_adds_to_a_float(loop):
    fired = []
    loop.call_later(fractions.Fraction(1, 1000), fired.append, "fraction")
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    assert fired == ["fraction"]


def test_call_later_rejects_none_delay(loop):
    with pytest.raises(TypeError, match="delay must not be None"):
        loop.call_later(None, print)


def test_many_timers_all_fire_in_order(loop):
    fired = []
    start = loop.time()
    # Deadlines scheduled in a scrambled order.
    delays = [((i * 7919) % 1000) / 100_000 for i in range(1000)]
    for i, delay in enumerate(delays):
        loop.call_at(start + delay, fired.append, (delay, i))
    loop.call_at(start + 0.011, loop.stop)
    loop.run_forever()
    assert fired == sorted(fired)
    assert len(fired) == 1000


def test_call_later_accepts_its_arguments_by_keyword(loop):
    fired = []
    loop.call_later(delay=0, callback=lambda: fired.append("later"), context=None)
    loop.call_at(when=loop.time(), callback=lambda: fired.append("at"))
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    assert sorted(fired) == ["at", "later"]


def test_call_at_with_extra_positional_arguments(loop):
    got = []
    loop.call_at(loop.time(), lambda *a: got.append(a), 1, 2, context=None)
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    assert got == [(1, 2)]


def test_call_later_with_an_unknown_keyword_raises_type_error(loop):
    with pytest.raises(TypeError):
        loop.call_later(0, print, delay_ms=1)


def test_call_at_without_a_callback_raises_type_error(loop):
    with pytest.raises(TypeError):
        loop.call_at(loop.time())
