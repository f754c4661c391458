"""ferroloop's native objects take part in garbage collection: cycles through the loop's queues
and handles are collected (pyclasses implement ``__traverse__``/``__clear__``)."""

from __future__ import annotations

import gc
import socket
import warnings
import weakref

import ferroloop


def _abandon(populate) -> weakref.ref:
    loop = ferroloop.new_event_loop()
    populate(loop)
    return weakref.ref(loop)


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

    ref = _abandon(populate)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # "unclosed event loop" from __del__
        gc.collect()
    assert ref() is None


def test_unclosed_loop_with_a_reader_cycle_is_collected():
    a, b = socket.socketpair()
    try:

        def populate(loop):
            loop.add_reader(a.fileno(), lambda: loop)

        ref = _abandon(populate)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        assert ref() is None
    finally:
        a.close()
        b.close()


def test_unclosed_loop_that_created_futures_is_collected():
    # create_future caches {"loop": loop} on the loop: a cycle the loop's traversal must report.
    def populate(loop):
        loop.create_future()

    ref = _abandon(populate)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    assert ref() is None


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
