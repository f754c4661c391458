"""run_forever / stop / is_running, and the running-loop bookkeeping around them."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest


def test_loop_is_an_abstract_event_loop(loop):
    assert isinstance(loop, asyncio.AbstractEventLoop)


def test_loop_repr_shows_running_closed_and_debug(loop):
    assert repr(loop).endswith(" running=False closed=False debug=False>")
    seen = []
    loop.call_soon(lambda: seen.append(repr(loop)))
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert seen[0].endswith(" running=True closed=False debug=False>")
    loop.set_debug(True)
    loop.close()
    assert repr(loop).endswith(" running=False closed=True debug=True>")


def test_new_loop_is_neither_running_nor_closed(loop):
    assert not loop.is_running()
    assert not loop.is_closed()


def test_is_running_inside_a_callback(loop):
    seen = []
    loop.call_soon(lambda: seen.append(loop.is_running()))
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert seen == [True]
    assert not loop.is_running()


def test_stop_before_run_forever_runs_one_iteration(loop):
    order = []
    loop.call_soon(order.append, 1)
    loop.call_soon(lambda: loop.call_soon(order.append, "next-iteration"))
    loop.stop()
    loop.run_forever()
    assert order == [1]
    loop.stop()
    loop.run_forever()
    assert order == [1, "next-iteration"]


def test_stop_before_run_forever_with_nothing_scheduled_returns(loop):
    loop.stop()
    loop.run_forever()
    assert not loop.is_running()


def test_stop_twice_still_stops_once(loop):
    order = []

    def stop_twice():
        loop.stop()
        loop.stop()

    loop.call_soon(stop_twice)
    loop.run_forever()
    loop.call_soon(order.append, "second run")
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert order == ["second run"]


def test_stop_finishes_callbacks_already_ready(loop):
    order = []
    loop.call_soon(loop.stop)
    loop.call_soon(order.append, "after-stop")
    loop.run_forever()
    assert order == ["after-stop"]


def test_run_forever_can_run_again_after_stop(loop):
    runs = []
    for i in range(3):
        loop.call_soon(runs.append, i)
        loop.call_soon(loop.stop)
        loop.run_forever()
    assert runs == [0, 1, 2]


def test_stop_from_a_timer_leaves_later_timers_pending(loop):
    fired = []
    loop.call_later(0.01, loop.stop)
    loop.call_later(0.05, fired.append, "later")
    loop.run_forever()
    assert fired == []
    loop.call_later(0.06, loop.stop)
    loop.run_forever()
    assert fired == ["later"]


def test_nested_run_forever_raises(loop):
    errors = []

    def nested():
        try:
            loop.run_forever()
        except RuntimeError as exc:
            errors.append(str(exc))
        loop.stop()

    loop.call_soon(nested)
    loop.run_forever()
    assert errors == ["This event loop is already running"]


def test_nested_run_until_complete_raises(loop):
    errors = []

    async def inner():
        return 1

    def nested():
        coroutine = inner()
        try:
            loop.run_until_complete(coroutine)
        except RuntimeError as exc:
            errors.append(str(exc))
        finally:
            coroutine.close()
        loop.stop()

    loop.call_soon(nested)
    loop.run_forever()
    assert errors == ["This event loop is already running"]


def test_run_forever_while_another_loop_runs_in_this_thread_raises(loop, loop_factory):
    other = loop_factory()
    errors = []

    def run_other():
        try:
            other.run_forever()
        except RuntimeError as exc:
            errors.append(str(exc))
        loop.stop()

    try:
        loop.call_soon(run_other)
        loop.run_forever()
    finally:
        other.close()
    assert errors == ["Cannot run the event loop while another loop is running"]


def test_run_forever_from_another_thread_while_running_raises(loop):
    errors = []

    def run_in_thread():
        try:
            loop.run_forever()
        except RuntimeError as exc:
            errors.append(str(exc))

    def start_thread():
        thread = threading.Thread(target=run_in_thread)
        thread.start()
        thread.join()
        loop.stop()

    loop.call_soon(start_thread)
    loop.run_forever()
    assert errors == ["This event loop is already running"]


def test_get_running_loop_inside_a_callback_is_the_loop(loop):
    seen = []
    loop.call_soon(lambda: seen.append(asyncio.get_running_loop()))
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert seen == [loop]


def test_get_event_loop_inside_a_callback_is_the_loop(loop):
    seen = []
    loop.call_soon(lambda: seen.append(asyncio.get_event_loop()))
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert seen[0] is loop


def test_no_running_loop_after_run_forever_returns(loop):
    loop.call_soon(loop.stop)
    loop.run_forever()
    with pytest.raises(RuntimeError, match="no running event loop"):
        asyncio.get_running_loop()


def test_asyncgen_hooks_are_installed_while_running_and_restored_after(loop):
    before = sys.get_asyncgen_hooks()
    seen = []
    loop.call_soon(lambda: seen.append(sys.get_asyncgen_hooks()))
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert seen[0].firstiter is not None
    assert seen[0].finalizer is not None
    assert sys.get_asyncgen_hooks() == before


def test_loop_runs_in_a_non_main_thread(loop_factory):
    results = []

    def run():
        thread_loop = loop_factory()
        try:
            thread_loop.call_soon(results.append, threading.current_thread().name)
            thread_loop.call_soon(thread_loop.stop)
            thread_loop.run_forever()
        finally:
            thread_loop.close()

    thread = threading.Thread(target=run, name="loop-thread")
    thread.start()
    thread.join()
    assert results == ["loop-thread"]


def test_loops_run_in_two_threads_at_once(loop_factory):
    barrier = threading.Barrier(2)
    results = []

    def run(name):
        thread_loop = loop_factory()

        async def main():
            # Both loops are running at the same time when the barrier opens.
            await thread_loop.run_in_executor(None, barrier.wait)
            return name

        try:
            results.append(thread_loop.run_until_complete(main()))
            thread_loop.run_until_complete(thread_loop.shutdown_default_executor())
        finally:
            thread_loop.close()

    threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == ["a", "b"]
