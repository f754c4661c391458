"""call_soon: FIFO order, argument passing, contexts, and argument checking."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import inspect
import warnings
import weakref

import pytest

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


def test_call_soon_runs_callbacks_in_fifo_order(loop):
    order = []
    for i in range(100):
        loop.call_soon(order.append, i)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert order == list(range(100))


def test_call_soon_passes_positional_arguments(loop):
    received = []

    def callback(*args):
        received.append(args)

    loop.call_soon(callback)
    loop.call_soon(callback, 1)
    loop.call_soon(callback, "a", None, (2, 3))
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert received == [(), (1,), ("a", None, (2, 3))]


def test_call_soon_passes_the_very_same_argument_objects(loop):
    marker = object()
    received = []
    loop.call_soon(received.append, marker)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert received[0] is marker


def test_call_soon_runs_callback_in_given_context(loop):
    context = contextvars.copy_context()
    context.run(request_id.set, "from-context")
    seen = []
    loop.call_soon(lambda: seen.append(request_id.get()), context=context)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert seen == ["from-context"]
    assert request_id.get() == "unset"


def _schedule(loop, method, *args, context):
    when = () if method in ("call_soon", "call_soon_threadsafe") else (0,)
    if method == "call_at":
        when = (loop.time(),)
    return getattr(loop, method)(*when, *args, context=context)


@pytest.mark.parametrize("method", ["call_soon", "call_soon_threadsafe", "call_later", "call_at"])
def test_a_context_that_is_not_a_context_is_asked_to_run_the_callback(
    loop, method, exception_handler_calls
):
    # asyncio's Handle runs `self._context.run(callback, *args)` whatever context= was: an
    # object with a run method is used, anything else fails there, in the exception handler.
    class RunsIt:
        def __init__(self):
            self.calls = []

        def run(self, callback, *args):
            self.calls.append(args)
            return callback(*args)

    runner, fired = RunsIt(), []
    _schedule(loop, method, fired.append, "ran", context=runner)
    _schedule(loop, method, fired.append, "lost", context=42)
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    assert (fired, runner.calls) == (["ran"], [("ran",)])
    (context,) = exception_handler_calls.consume()
    assert isinstance(context["exception"], AttributeError)
    assert "'int' object has no attribute 'run'" in str(context["exception"])


def test_call_soon_callback_changes_stay_in_given_context(loop):
    context = contextvars.copy_context()
    loop.call_soon(request_id.set, "changed", context=context)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert context[request_id] == "changed"
    assert request_id.get() == "unset"


def test_call_soon_without_context_copies_the_current_context(loop):
    seen = []
    token = request_id.set("at-schedule-time")
    try:
        loop.call_soon(lambda: seen.append(request_id.get()))
        loop.call_soon(request_id.set, "set-by-callback")
    finally:
        request_id.reset(token)
    loop.call_soon(lambda: seen.append(request_id.get()))
    loop.call_soon(loop.stop)
    loop.run_forever()
    # Each callback ran in its own copy taken when it was scheduled.
    assert seen == ["at-schedule-time", "unset"]
    assert request_id.get() == "unset"


def test_callback_scheduled_by_a_callback_runs_in_a_later_iteration(loop):
    order = []

    def first():
        order.append("first")
        loop.call_soon(order.append, "scheduled-by-first")
        loop.stop()

    loop.call_soon(first)
    loop.call_soon(order.append, "second")
    loop.run_forever()
    # stop() finishes the current iteration only: the new callback waits.
    assert order == ["first", "second"]
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert order == ["first", "second", "scheduled-by-first"]


def test_call_soon_handle_cancel_prevents_the_call(loop):
    called = []
    handle = loop.call_soon(called.append, "cancelled")
    loop.call_soon(called.append, "kept")
    handle.cancel()
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert called == ["kept"]


def test_callback_cancelling_a_later_ready_callback_suppresses_it(loop):
    called = []
    handles = []
    loop.call_soon(lambda: handles[0].cancel())
    handles.append(loop.call_soon(called.append, "victim"))
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert called == []
    assert handles[0].cancelled()


def test_call_soon_accepts_callable_objects(loop):
    class Callable:
        def __init__(self):
            self.calls = 0

        def __call__(self):
            self.calls += 1

    callable_object = Callable()
    loop.call_soon(callable_object)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert callable_object.calls == 1


def test_call_soon_many_callbacks_all_run(loop):
    count = 0

    def bump():
        nonlocal count
        count += 1

    for _ in range(10_000):
        loop.call_soon(bump)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert count == 10_000


@pytest.mark.parametrize("method", ["call_soon", "call_later"])
def test_non_callable_outside_debug_mode_fails_when_run(loop, exception_handler_calls, method):
    args = (0,) if method == "call_later" else ()
    getattr(loop, method)(*args, 42)
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    (context,) = exception_handler_calls.consume()
    assert isinstance(context["exception"], TypeError)
    assert context["message"].startswith("Exception in callback 42")


def test_call_soon_without_a_callback_raises_type_error(loop):
    with pytest.raises(TypeError):
        loop.call_soon()


def test_call_soon_with_an_unknown_keyword_raises_type_error(loop):
    with pytest.raises(TypeError, match="unexpected keyword argument 'delay'"):
        loop.call_soon(print, delay=1)


def test_call_soon_passes_many_positional_arguments_in_order(loop):
    got = []
    loop.call_soon(lambda *a: got.append(a), 1, "two", None, 4.0, context=None)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert got == [(1, "two", None, 4.0)]


def test_subclass_call_soon_is_looked_up_for_task_steps_and_done_callbacks(loop_factory):
    # asyncio's C Task and Future look loop.call_soon up for each step and done callback.
    # ferroloop hands them a cached bound method, but only from its own descriptor: a subclass's
    # method is found first and looked up on each call, as asyncio does, so even a change made
    # to the class after the loop was created is seen.
    scheduled = []
    probe = loop_factory()
    probe.close()
    base = type(probe)

    class Recording(base):  # type: ignore[misc, valid-type]
        def call_soon(self, callback, *args, context=None):
            return super().call_soon(callback, *args, context=context)

    loop = Recording()
    try:

        def recording_call_soon(self, callback, *args, context=None):
            scheduled.append(callback)
            return base.call_soon(self, callback, *args, context=context)

        Recording.call_soon = recording_call_soon  # type: ignore[method-assign]

        async def main():
            return 42

        task = loop.create_task(main())
        done = []
        task.add_done_callback(done.append)
        assert loop.run_until_complete(task) == 42
        assert done == [task]
        assert done.append in scheduled  # the done callback went through the new method
        assert len(scheduled) >= 2  # and so did the task's first step
    finally:
        loop.close()


def test_call_soon_of_a_closed_loop_raises(loop_factory):
    loop = loop_factory()
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_soon(print)


def test_call_soon_replaced_on_the_loop_class_is_seen_by_an_existing_loop(loop, monkeypatch):
    # The C Task's steps and the Future's done callbacks find the replacement too: nothing on
    # the instance shadows the class attribute.
    cls = type(loop)
    original = cls.call_soon
    scheduled = []

    async def main():
        return 1

    assert loop.run_until_complete(main()) == 1  # the loop has handed out call_soon before

    def recording_call_soon(self, callback, *args, context=None):
        scheduled.append(callback)
        return original(self, callback, *args, context=context)

    monkeypatch.setattr(cls, "call_soon", recording_call_soon)
    task = loop.create_task(main())
    done = []
    task.add_done_callback(done.append)
    assert loop.run_until_complete(task) == 1
    assert done == [task]
    assert done.append in scheduled
    loop.call_soon(scheduled.append, "direct")
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert "direct" in scheduled


def test_call_soon_read_from_the_class_is_an_unbound_method(loop):
    cls = type(loop)
    got = []
    handle = cls.call_soon(loop, got.append, 1)
    assert not handle.cancelled()
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert got == [1]
    assert cls.call_soon.__name__ == "call_soon"
    assert {"callback", "context"} <= set(inspect.signature(cls.call_soon).parameters)
    assert {"callback", "context"} <= set(inspect.signature(loop.call_soon).parameters)
    with pytest.raises((TypeError, AttributeError)):  # ferroloop's type check; asyncio's lookup
        cls.call_soon(object(), print)


def test_a_loop_that_ran_tasks_is_collected_without_close(loop_factory):
    # Handing out call_soon to Tasks must not keep the loop alive once nothing else refers to it.
    loop = loop_factory()

    async def main():
        await asyncio.sleep(0)
        running = asyncio.get_running_loop()
        fut = running.create_future()
        running.call_soon(fut.set_result, 2)
        return await fut

    assert loop.run_until_complete(main()) == 2
    ref = weakref.ref(loop)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del loop
        for _ in range(3):
            gc.collect()
    assert ref() is None
