"""ferroloop's native objects take part in garbage collection: cycles through the loop's queues
and handles are collected (pyclasses implement ``__traverse__``/``__clear__``)."""

from __future__ import annotations

import gc
import socket
import warnings
import weakref

import ferroloop
import pytest


def _abandon(populate) -> weakref.ref:
    loop = ferroloop.new_event_loop()
    populate(loop)
    return weakref.ref(loop)


def _abandon_and_collect(populate) -> weakref.ref:
    """`_abandon`, then two full collections ("unclosed event loop" warnings ignored).

    The loop's finalizer closes it, and closing tracks again the handles it drops that
    something else still holds: the collector sees them, and what they reach, as resurrected,
    so the loop is freed by the next collection. CPython up to 3.14 cleared the weak reference
    in the first one anyway; 3.15 clears it only when the object is freed.
    """
    ref = _abandon(populate)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # from the loop's __del__
        gc.collect()
        gc.collect()
    return ref


def test_unclosed_loop_with_a_timer_cycle_is_collected():
    def populate(loop):
        # loop -> timer heap -> handle -> bound method -> holder -> loop
        class Holder:
            def __init__(self, lp):
                self.loop = lp

            def cb(self):
                pass

        loop.call_later(3600, Holder(loop).cb)
        loop.call_soon(Holder(loop).cb)

    assert _abandon_and_collect(populate)() is None


def test_unclosed_loop_with_a_reader_cycle_is_collected():
    a, b = socket.socketpair()
    try:

        def populate(loop):
            loop.add_reader(a.fileno(), lambda: loop)

        assert _abandon_and_collect(populate)() is None
    finally:
        a.close()
        b.close()


def test_unclosed_loop_that_created_futures_is_collected():
    # create_future caches {"loop": loop} on the loop: a cycle the loop's traversal must report.
    def populate(loop):
        loop.create_future()

    assert _abandon_and_collect(populate)() is None


def test_pending_timer_handles_are_out_of_the_collectors_lists():
    # handle.rs: a TimerHandle in the heap is untracked (the loop's traversal stands in for it),
    # and tracked again once it fired, was cancelled or the loop closed.
    loop = ferroloop.new_event_loop()
    try:
        fired = loop.call_later(0, len, "")
        cancelled = loop.call_later(3600, print)
        assert not gc.is_tracked(fired) and not gc.is_tracked(cancelled)
        assert any(r is print for r in gc.get_referents(cancelled))  # it still traverses
        cancelled.cancel()
        assert gc.is_tracked(cancelled)
        loop.run_until_complete(__import__("asyncio").sleep(0.01))
        assert gc.is_tracked(fired)
        at_close = loop.call_later(3600, print)
        assert not gc.is_tracked(at_close)
    finally:
        loop.close()
    assert gc.is_tracked(at_close)


def test_call_soon_handles_are_out_of_the_collectors_lists_while_queued():
    # handle.rs: a call_soon handle waits in the ready queue untracked (the loop's traversal
    # visits what it holds in its place), and is tracked once it leaves the queue while anything
    # else still holds it: run, skipped as cancelled, or dropped when the loop closes.
    loop = ferroloop.new_event_loop()
    try:
        ran = loop.call_soon(len, "")
        cancelled = loop.call_soon(print)
        assert not gc.is_tracked(ran) and not gc.is_tracked(cancelled)
        assert any(r is print for r in gc.get_referents(cancelled))  # it still traverses
        cancelled.cancel()
        assert not gc.is_tracked(cancelled)  # still queued
        loop.call_soon(loop.stop)
        loop.run_forever()
        assert gc.is_tracked(ran) and gc.is_tracked(cancelled)
        at_close = loop.call_soon(print)
        assert not gc.is_tracked(at_close)
    finally:
        loop.close()
    assert gc.is_tracked(at_close)


def test_an_unclosed_loop_with_a_cycle_through_a_held_queued_handle_is_collected():
    # loop -> ready queue -> handle (untracked) -> lambda -> loop, the handle also held by a
    # list in the cycle.
    def populate(loop):
        held = []
        held.append(loop.call_soon(lambda: (loop, held)))

    assert _abandon_and_collect(populate)() is None


@pytest.mark.cpython_loan("context_layout")
def test_context_copies_are_reused_on_ferroloop():
    # The pool (context_pool.rs) turns itself off if CPython's layouts are not the ones it
    # reads; tests/loop/test_callback_contexts.py would then pass without exercising it.
    from ferroloop import _native

    assert _native.CONTEXT_POOL


class _BlockedLoop:
    """A loop running in another thread, held inside one callback: what other threads queue
    meanwhile waits in its injector (call_soon_threadsafe's cross-thread path). With
    `stop_inside`, the held callback stops the loop when released, so what was queued stays in
    the injector after run_forever returns."""

    def __init__(self, loop, stop_inside=False):
        import threading

        self.loop = loop
        self.stop_inside = stop_inside
        self.entered = threading.Event()
        self.release = threading.Event()
        loop.call_soon(self._hold)
        self.thread = threading.Thread(target=loop.run_forever)
        self.thread.start()
        assert self.entered.wait(10)

    def _hold(self):
        self.entered.set()
        self.release.wait(10)
        if self.stop_inside:
            self.loop.stop()

    def finish(self):
        if not self.stop_inside:
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.release.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


def test_handles_queued_from_other_threads_are_out_of_the_collectors_lists():
    # handle.rs: a handle waiting in the loop's injector (and then in its ready queue) is
    # untracked (the loop's traversal stands in for it) and tracked again once it ran, as it is
    # still held here, or when the loop closes.
    loop = ferroloop.new_event_loop()
    try:
        blocked = _BlockedLoop(loop)
        queued = loop.call_soon_threadsafe(len, "")
        assert not gc.is_tracked(queued)
        assert any(r is len for r in gc.get_referents(queued))  # it still traverses
        blocked.finish()
        assert gc.is_tracked(queued)
        blocked = _BlockedLoop(loop, stop_inside=True)
        at_close = loop.call_soon_threadsafe(print)
        blocked.finish()
        assert not gc.is_tracked(at_close)  # still queued: the loop stopped before draining
    finally:
        loop.close()
    assert gc.is_tracked(at_close)


def test_unclosed_loop_with_a_cycle_through_a_handle_queued_from_a_thread_is_collected():
    # loop -> injector -> handle (untracked) -> lambda -> loop: only the loop's traversal, which
    # visits what the handle holds in its place, lets the collector see this cycle.
    def populate(loop):
        blocked = _BlockedLoop(loop, stop_inside=True)
        loop.call_soon_threadsafe(lambda: loop)
        blocked.finish()

    assert _abandon_and_collect(populate)() is None


def test_a_freed_loop_leaves_its_queued_handles_tracked():
    def populate(loop):
        blocked = _BlockedLoop(loop, stop_inside=True)
        held.append(loop.call_soon_threadsafe(print))
        blocked.finish()

    held = []
    ref = _abandon_and_collect(populate)
    # The collector ran the loop's finalizer, which closed it and let the handle out of its
    # queue: tracked again (it was untracked while queued, the test above). The handle keeps
    # its loop alive, as asyncio's keeps its `_loop` (CPython up to 3.14 cleared the weak
    # reference anyway), until it goes too.
    assert gc.is_tracked(held[0])
    held.clear()
    gc.collect()
    assert ref() is None


@pytest.mark.cpython_loan("task_layout")
def test_pending_native_task_in_a_garbage_cycle_is_freed_by_one_collection():
    # task -> coroutine -> awaited future -> its done callback (the task's wake-up) -> task.
    # The collector clears the task with no PyO3 frame on the stack: what it drops must be
    # released then, not queued until PyO3 is next entered, or the cycle outlives the
    # collection (and on 3.14 the cleared task stays in the list asyncio.all_tasks() walks).
    import asyncio

    loop = ferroloop.new_event_loop()
    reports = []
    loop.set_exception_handler(lambda _loop, context: reports.append(context["message"]))

    async def wait_forever():
        await loop.create_future()

    def native_tasks() -> int:
        return sum(1 for obj in gc.get_objects() if type(obj) is ferroloop.Task)

    try:
        before = native_tasks()  # other tests' tasks the suite still holds
        task = ferroloop.Task(wait_forever(), loop=loop)
        loop.run_until_complete(asyncio.sleep(0))
        del task
        gc.collect()
        assert native_tasks() == before
        assert reports == ["Task was destroyed but it is pending!"]
        assert asyncio.all_tasks(loop) == set()
    finally:
        loop.close()
