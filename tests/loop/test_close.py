"""close / is_closed, closing while running, and using a closed loop."""

from __future__ import annotations

import gc
import os
import threading
import weakref

import pytest


def test_close_marks_the_loop_closed(loop):
    loop.close()
    assert loop.is_closed()
    assert not loop.is_running()


def test_close_twice_is_harmless(loop):
    loop.close()
    loop.close()
    assert loop.is_closed()


def test_close_while_running_raises(loop):
    errors = []

    def close_inside():
        try:
            loop.close()
        except RuntimeError as exc:
            errors.append(str(exc))
        loop.stop()

    loop.call_soon(close_inside)
    loop.run_forever()
    assert errors == ["Cannot close a running event loop"]
    assert not loop.is_closed()


def _open_fds():
    return set(os.listdir("/proc/self/fd"))


def test_close_releases_the_loops_own_fds_while_the_loop_lives_on(loop_factory):
    # asyncio's close() closes its selector and self-pipe: a closed loop that is still
    # referenced (a list of loops, a traceback, a cycle not collected yet) holds no fd.
    before = _open_fds()
    closed = loop_factory()
    closed.call_soon(closed.stop)
    closed.run_forever()
    closed.close()
    assert _open_fds() <= before
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        closed.call_soon_threadsafe(print)


def test_call_soon_threadsafe_racing_close_from_other_threads(loop_factory):
    # Producers that keep calling call_soon_threadsafe while the loop sleeps, stops and closes
    # either queue their callback or get "Event loop is closed"; the closed loop holds no fd.
    before = _open_fds()
    racing = loop_factory()
    stop = threading.Event()
    unexpected = []

    def produce():
        while not stop.is_set():
            try:
                racing.call_soon_threadsafe(len, "")
            except RuntimeError as exc:
                if "closed" not in str(exc):
                    unexpected.append(exc)
            except BaseException as exc:  # any other error is the failure
                unexpected.append(exc)

    producers = [threading.Thread(target=produce) for _ in range(4)]
    for thread in producers:
        thread.start()
    try:
        for _ in range(20):
            racing.call_later(0.001, racing.stop)
            racing.run_forever()
        racing.close()
    finally:
        stop.set()
        for thread in producers:
            thread.join()
    assert unexpected == []
    assert _open_fds() <= before


def test_close_drops_pending_callbacks_without_running_them(loop):
    fired = []
    loop.call_soon(fired.append, "soon")
    loop.call_later(0, fired.append, "timer")
    loop.close()
    assert fired == []


def test_call_soon_after_close_raises(loop):
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_soon(print)


def test_call_later_after_close_raises(loop):
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_later(0, print)


def test_call_at_after_close_raises(loop):
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_at(loop.time(), print)


def test_call_soon_threadsafe_after_close_raises(loop):
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_soon_threadsafe(print)


def test_call_soon_threadsafe_from_another_thread_after_close_raises(loop):
    loop.close()
    errors = []

    def call():
        try:
            loop.call_soon_threadsafe(print)
        except RuntimeError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert errors == ["Event loop is closed"]


def test_run_forever_after_close_raises(loop):
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.run_forever()


def test_run_until_complete_after_close_raises(loop):
    async def main():
        pass

    loop.close()
    coroutine = main()
    try:
        with pytest.raises(RuntimeError, match="Event loop is closed"):
            loop.run_until_complete(coroutine)
    finally:
        coroutine.close()


def test_create_task_after_close_raises(loop):
    async def main():
        pass

    loop.close()
    coroutine = main()
    try:
        with pytest.raises(RuntimeError, match="Event loop is closed"):
            loop.create_task(coroutine)
    finally:
        coroutine.close()


def test_run_in_executor_after_close_raises(loop):
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.run_in_executor(None, print)


def test_close_shuts_down_the_default_executor(loop):
    async def main():
        return await loop.run_in_executor(None, threading.get_ident)

    worker_id = loop.run_until_complete(main())
    (worker,) = [thread for thread in threading.enumerate() if thread.ident == worker_id]
    loop.close()
    # close() shuts the default executor down (without waiting): its worker exits.
    worker.join(timeout=30)
    assert not worker.is_alive()


def test_unclosed_loop_warns_when_collected(loop_factory):
    unclosed = loop_factory()
    with pytest.warns(ResourceWarning, match="unclosed event loop"):
        del unclosed
        gc.collect()


class Payload:
    """An object that a pending callback holds and that holds the loop: a reference cycle."""

    def __init__(self, loop):
        self.loop = loop


def schedule_pending(loop, kind):
    payload = Payload(loop)
    if kind == "call_soon":
        loop.call_soon(print, payload)
    elif kind == "call_later":
        loop.call_later(3600, print, payload)
    else:
        loop.call_soon(loop.stop)


PENDING_KINDS = ["call_soon", "call_later", "bound_method_of_the_loop"]


def closed_loop_is_collected(loop_factory, prepare) -> bool:
    """Whether a new loop, given to ``prepare`` and then closed, is freed by the collector."""
    closed = loop_factory()
    prepare(closed)
    closed.close()
    ref = weakref.ref(closed)
    del closed
    gc.collect()
    return ref() is None


@pytest.mark.parametrize("kind", PENDING_KINDS)
def test_closed_loop_with_pending_callbacks_is_collected(loop_factory, kind):
    assert closed_loop_is_collected(loop_factory, lambda closed: schedule_pending(closed, kind))


def test_closed_loop_in_a_cycle_through_its_own_attributes_is_collected(loop_factory):
    # ferroloop.Loop's attributes live in a dict that CPython manages for the Python subclass
    # (LoopCore has none of its own): the collector must see through it.
    def own_cycle(closed):
        closed.me = closed
        closed.payload = Payload(closed)

    assert closed_loop_is_collected(loop_factory, own_cycle)


def test_loop_instance_attributes_are_set_read_listed_and_deleted(loop):
    loop.custom = 1
    assert (loop.custom, vars(loop)["custom"]) == (1, 1)
    del loop.custom
    assert not hasattr(loop, "custom")
    # Set by BaseEventLoop.__init__ (asyncio's own attributes): in asyncio's instance dict, in a
    # slot of ferroloop's loop (tests/native/test_loop_attributes.py).
    assert "_ready" in dir(loop)
    assert hasattr(loop, "_ready")

    # The attributes are read from C too (the C Future asks loop.get_debug and loop.call_soon).
    async def main():
        fut = loop.create_future()
        loop.call_soon(fut.set_result, 5)
        return await fut

    assert loop.run_until_complete(main()) == 5


def unclosed_loop_in_a_cycle(loop_factory, kind):
    """A weak reference to a loop that only a reference cycle keeps alive."""
    unclosed = loop_factory()
    schedule_pending(unclosed, kind)
    return weakref.ref(unclosed)


@pytest.mark.parametrize("kind", ["call_soon", "bound_method_of_the_loop"])
def test_unclosed_loop_in_a_cycle_with_its_callbacks_is_collected(loop_factory, kind):
    # asyncio's loop is an ordinary gc-tracked object: the collector breaks the cycle,
    # __del__ warns about the unclosed loop and closes it.
    with pytest.warns(ResourceWarning, match="unclosed event loop"):
        ref = unclosed_loop_in_a_cycle(loop_factory, kind)
        gc.collect()
    assert ref() is None


def test_unclosed_loop_in_a_cycle_with_a_pending_timer_is_collected(loop_factory):
    with pytest.warns(ResourceWarning, match="unclosed event loop"):
        ref = unclosed_loop_in_a_cycle(loop_factory, "call_later")
        gc.collect()
    assert ref() is None


def unclosed_loop_with_a_pending_threadsafe_callback(loop_factory):
    unclosed = loop_factory()
    payload = Payload(unclosed)

    def schedule_from_another_thread_then_stop():
        thread = threading.Thread(target=unclosed.call_soon_threadsafe, args=(print, payload))
        thread.start()
        thread.join()
        unclosed.stop()

    unclosed.call_soon(schedule_from_another_thread_then_stop)
    unclosed.run_forever()
    return weakref.ref(unclosed)


def test_unclosed_loop_with_a_pending_threadsafe_callback_is_collected(loop_factory):
    with pytest.warns(ResourceWarning, match="unclosed event loop"):
        ref = unclosed_loop_with_a_pending_threadsafe_callback(loop_factory)
        gc.collect()
    assert ref() is None


def test_time_still_works_after_close(loop):
    loop.close()
    assert isinstance(loop.time(), float)
