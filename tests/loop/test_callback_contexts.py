"""The context copy each callback runs in, and the handles call_soon queues, over many rounds.

ferroloop reuses the context copies and the handle objects of callbacks that ran when nothing
else refers to them (crates/py/src/context_pool.rs, handle_alloc.rs), and keeps a queued
call_soon handle out of the collector's lists (handle.rs). asyncio makes a new one of each
every time; what a program can observe must not differ.
"""

from __future__ import annotations

import contextvars
import gc
import weakref

VAR: contextvars.ContextVar[object] = contextvars.ContextVar("var", default="unset")


class _Value:
    """A value a context variable holds: weakly referenceable, and in no reference cycle."""


def _run_queued(loop) -> None:
    loop.call_soon(loop.stop)
    loop.run_forever()


def test_a_callbacks_variable_changes_stay_in_its_own_context_copy(loop):
    # Each round's callback sets the variable in its copy and schedules a check from there; a
    # callback scheduled from outside must see none of it, however the copies are reused.
    seen_inside: list[object] = []
    seen_outside: list[object] = []

    def check_inside(expected):
        seen_inside.append(VAR.get() == expected)

    def setter(n):
        VAR.set(n)
        loop.call_soon(check_inside, n)

    for n in range(200):
        loop.call_soon(setter, n)
        loop.call_soon(lambda: seen_outside.append(VAR.get()))
        if n % 7 == 0:
            _run_queued(loop)
    _run_queued(loop)
    _run_queued(loop)
    assert seen_inside == [True] * 200
    assert seen_outside == ["unset"] * 200
    assert VAR.get() == "unset"


def test_each_callback_sees_the_context_at_the_time_it_was_scheduled(loop):
    seen: list[object] = []
    for n in range(100):
        token = VAR.set(n)
        loop.call_soon(lambda: seen.append(VAR.get()))
        VAR.reset(token)
        if n % 10 == 9:
            _run_queued(loop)
    assert seen == list(range(100))


def test_a_value_only_a_callbacks_context_copy_held_is_released_once_it_ran(loop):
    refs: list[weakref.ref] = []

    def schedule():
        value = _Value()
        refs.append(weakref.ref(value))
        VAR.set(value)
        loop.call_soon(lambda: None)

    for _ in range(20):
        contextvars.copy_context().run(schedule)
    assert all(ref() is not None for ref in refs)  # the queued handles' copies hold them
    _run_queued(loop)
    # No collection needed: reference counting alone frees them, as for asyncio's copies.
    assert [ref() for ref in refs] == [None] * 20


def test_what_only_a_queued_handles_context_copy_holds_survives_collections(loop):
    seen: list[object] = []
    refs: list[weakref.ref] = []

    def schedule():
        value = _Value()
        value.me = value  # a cycle: only the collector could free it
        refs.append(weakref.ref(value))
        VAR.set(value)
        loop.call_soon(lambda: seen.append(VAR.get()))

    _run_queued(loop)  # warm the reuse: later copies and handles are recycled ones
    for _ in range(5):
        contextvars.copy_context().run(schedule)
    for _ in range(3):
        gc.collect()
    assert all(ref() is not None for ref in refs)
    _run_queued(loop)
    assert seen == [ref() for ref in refs]


def test_a_context_the_caller_took_from_a_handle_is_never_handed_to_another(loop):
    handle = loop.call_soon(lambda: VAR.set("changed inside"))
    context = handle.get_context() if hasattr(handle, "get_context") else handle._context
    del handle
    _run_queued(loop)
    assert context.get(VAR) == "changed inside"
    later = [loop.call_soon(lambda: None) for _ in range(50)]
    contexts = [h._context for h in later]
    assert all(c is not context for c in contexts)
    assert len({id(c) for c in contexts}) == 50
    _run_queued(loop)
    assert context.get(VAR) == "changed inside"
    assert [c.get(VAR, "unset") for c in contexts] == ["unset"] * 50


def test_a_handle_the_caller_holds_is_tracked_and_intact_after_it_ran(loop):
    ran: list[int] = []
    handles = [loop.call_soon(ran.append, n) for n in range(10)]
    handles[3].cancel()
    _run_queued(loop)
    assert ran == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert all(gc.is_tracked(h) for h in handles)
    # New handles never reuse one the caller still holds.
    newer = [loop.call_soon(ran.append, n) for n in range(10)]
    assert not {id(h) for h in newer} & {id(h) for h in handles}
    assert [h.cancelled() for h in handles] == [n == 3 for n in range(10)]
    assert all("append" in repr(h) for h in handles if not h.cancelled())
    _run_queued(loop)


def test_the_handle_an_exception_handler_kept_stays_intact(loop, exception_handler_calls):
    def fail():
        raise ValueError("boom")

    loop.call_soon(fail)
    _run_queued(loop)
    (context,) = exception_handler_calls.consume()
    kept = context["handle"]
    assert gc.is_tracked(kept)
    newer = [loop.call_soon(len, "") for _ in range(20)]
    assert all(h is not kept for h in newer)
    _run_queued(loop)
    assert "fail" in repr(kept)
    assert not kept.cancelled()


class _Cyclic:
    """Holds its own handle: holder -> handle -> bound method -> holder."""

    def method(self):
        pass


def test_a_cycle_through_a_queued_handle_is_collected_once_the_loop_closed(loop_factory):
    lp = loop_factory()
    holder = _Cyclic()
    holder.handle = lp.call_soon(holder.method)
    ref = weakref.ref(holder.handle)
    del holder
    lp.close()  # the handle leaves the ready queue unrun, its cycle intact
    gc.collect()
    assert ref() is None


def test_a_cycle_through_a_handle_that_ran_is_collected(loop):
    holder = _Cyclic()
    holder.handle = loop.call_soon(holder.method)
    ref = weakref.ref(holder.handle)
    del holder
    _run_queued(loop)
    gc.collect()
    assert ref() is None
