"""The handle call_soon_threadsafe returns (asyncio 3.14's _ThreadSafeHandle): cancel() and
cancelled() from another thread wait for a callback that is already running; from the callback's
own thread they do not. ferroloop does this on every Python version; asyncio's loop from 3.14."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest

# How long a callback keeps running once it started: long enough that a thread that does not
# wait calls cancel() while it runs. A correct loop passes whatever this is.
RUNNING_WINDOW_S = 0.2


@pytest.fixture
def waits(loop_name: str) -> None:
    if loop_name == "asyncio" and sys.version_info < (3, 14):
        pytest.skip("asyncio's loop waits for a running callback from 3.14 on")


def _run_with_thread(loop, target) -> None:
    """Runs ``loop`` until ``target`` (run in a thread) has returned and stopped it; ``target``'s
    exception, if any, is raised here."""
    failure: list[BaseException] = []

    def body() -> None:
        try:
            target()
        except BaseException as e:
            failure.append(e)
        finally:
            loop.call_soon_threadsafe(loop.stop)

    thread = threading.Thread(target=body)
    thread.start()
    try:
        loop.run_forever()
    finally:
        thread.join()
    if failure:
        raise failure[0]


def test_cancel_from_another_thread_waits_for_the_running_callback(loop, waits):
    events: list[str] = []
    started = threading.Event()

    def callback() -> None:
        started.set()
        time.sleep(RUNNING_WINDOW_S)
        events.append("callback returned")

    def other_thread() -> None:
        handle = loop.call_soon_threadsafe(callback)
        started.wait()
        handle.cancel()
        events.append("cancel returned")
        assert handle.cancelled()

    _run_with_thread(loop, other_thread)
    assert events == ["callback returned", "cancel returned"]


def test_cancelled_from_another_thread_waits_and_says_not_cancelled(loop, waits):
    events: list[str] = []
    started = threading.Event()
    answers: list[bool] = []

    def callback() -> None:
        started.set()
        time.sleep(RUNNING_WINDOW_S)
        events.append("callback returned")

    def other_thread() -> None:
        handle = loop.call_soon_threadsafe(callback)
        started.wait()
        answers.append(handle.cancelled())
        events.append("cancelled returned")

    _run_with_thread(loop, other_thread)
    assert events == ["callback returned", "cancelled returned"]
    assert answers == [False]


def test_a_callback_cancelling_its_own_handle_runs_to_its_end(loop):
    handle_box: list = []
    got_handle = threading.Event()
    events: list[str] = []

    def callback() -> None:
        got_handle.wait()
        handle = handle_box[0]
        handle.cancel()  # from the thread that runs it: must not wait for itself
        events.append(f"cancelled inside: {handle.cancelled()}")

    def other_thread() -> None:
        handle_box.append(loop.call_soon_threadsafe(callback))
        got_handle.set()

    _run_with_thread(loop, other_thread)
    assert events == ["cancelled inside: True"]
    assert handle_box[0].cancelled()


def test_cancel_from_another_thread_before_the_run_stops_the_callback(loop):
    ran: list[str] = []
    cancelled = threading.Event()
    # The loop is held in a callback of its own until the other thread has cancelled.
    loop.call_soon(cancelled.wait)

    def other_thread() -> None:
        handle = loop.call_soon_threadsafe(ran.append, "ran")
        handle.cancel()
        assert handle.cancelled()
        cancelled.set()

    _run_with_thread(loop, other_thread)
    assert ran == []


def test_cancel_of_a_queued_handle_after_close_does_not_wait(loop_factory):
    loop = loop_factory()
    handles: list = []
    thread = threading.Thread(target=lambda: handles.append(loop.call_soon_threadsafe(print)))
    thread.start()
    thread.join()
    loop.close()
    # Never run, never running: cancel() and cancelled() from any thread return at once.
    canceller = threading.Thread(target=handles[0].cancel)
    canceller.start()
    canceller.join(timeout=10)
    assert not canceller.is_alive()
    assert handles[0].cancelled()


def test_many_threads_cancel_or_ask_while_their_callbacks_run(loop, run, waits):
    # Each producer queues callbacks and, once each has started, cancels it or asks whether it
    # was cancelled: every answer comes after the callback returned, never while it runs.
    producers = 4
    per_producer = 25
    lock = threading.Lock()
    started = [threading.Event() for _ in range(producers * per_producer)]
    finished: set[int] = set()
    violations: list[str] = []
    settled = 0
    all_settled = threading.Event()

    def callback(i: int) -> None:
        started[i].set()
        time.sleep(0.001)  # releases the GIL: the producer asks meanwhile
        with lock:
            finished.add(i)

    def producer(p: int) -> None:
        nonlocal settled
        for k in range(per_producer):
            i = p * per_producer + k
            handle = loop.call_soon_threadsafe(callback, i)
            if not started[i].wait(10):
                violations.append(f"callback {i} never started")
                continue
            if k % 2:
                handle.cancel()
            elif handle.cancelled():
                violations.append(f"handle {i} says cancelled; nobody cancelled it")
            with lock:
                if i not in finished:
                    violations.append(f"callback {i} still running when the handle answered")
        with lock:
            settled += 1
            if settled == producers:
                all_settled.set()

    threads = [threading.Thread(target=producer, args=(p,)) for p in range(producers)]

    async def main() -> None:
        for t in threads:
            t.start()
        while not all_settled.is_set():
            await asyncio.sleep(0.005)

    try:
        run(main())
    finally:
        for t in threads:
            t.join()
    assert violations == []
    assert len(finished) == producers * per_producer
