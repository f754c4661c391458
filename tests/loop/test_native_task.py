"""ferroloop.Task, the native asyncio Task: the same behaviour as asyncio's C Task.

Every test runs four times: with asyncio's Task and with ferroloop.Task (the ``Task`` fixture,
tests/loop/conftest.py), each on asyncio's loop and on ferroloop's (``loop``). The asyncio.Task
runs prove the test itself right; the ferroloop.Task runs must then give the same outcomes.
The fixture also installs the matching task factory, so the tasks that ``run`` and
``create_task`` make inside a test are of the kind under test too. Cancellation, and the
asyncio and anyio machinery built on it: test_native_task_cancellation.py.

ferroloop.Task is a subclass of asyncio.Task (``test_task_is_an_asyncio_task_and_future``) that
defines every name asyncio's Task and Future define.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import io
import re
import sys
import types
import weakref
from typing import Any

import pytest

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


@types.coroutine
def bare_yield():
    """What asyncio.sleep(0) does: give the loop one turn."""
    yield


@types.coroutine
def yield_value(value):
    yield value


def has_get_context(task) -> bool:
    """Task.get_context() is new in 3.12; ferroloop.Task has it on 3.11 as well."""
    return type(task) is not asyncio.Task or sys.version_info >= (3, 12)


async def return_value(value):
    return value


async def wait_on(future):
    return await future


async def return_value_after_a_yield():
    await bare_yield()
    return "yielded once"


# --- construction and plain attributes -------------------------------------------------------


def test_task_runs_its_coroutine_to_the_result(loop, Task):
    task = Task(return_value("done"), loop=loop)
    assert not task.done()
    assert loop.run_until_complete(task) == "done"
    assert task.done() and not task.cancelled()
    assert task.result() == "done"
    assert task.exception() is None
    assert task._state == "FINISHED"
    assert task._result == "done"


def test_task_without_loop_takes_the_running_loop(loop, run, Task):
    async def main():
        task = Task(return_value(1))
        assert task.get_loop() is asyncio.get_running_loop()
        return await task

    assert run(main()) == 1


def test_task_without_loop_outside_the_loop_takes_the_current_loop(loop, Task):
    asyncio.set_event_loop(loop)
    try:
        task = Task(return_value(2))
    finally:
        asyncio.set_event_loop(None)
    assert task.get_loop() is loop
    assert task._loop is loop
    assert loop.run_until_complete(task) == 2


@pytest.mark.parametrize("not_a_coroutine", [1, None, return_value, "coro"])
def test_task_rejects_a_non_coroutine(loop, Task, not_a_coroutine):
    expected = f"a coroutine was expected, got {not_a_coroutine!r}"
    with pytest.raises(TypeError, match=re.escape(expected)):
        Task(not_a_coroutine, loop=loop)


def test_task_name_default_given_and_set(loop, Task):
    coros = [return_value(i) for i in range(3)]
    unnamed = Task(coros[0], loop=loop)
    named = Task(coros[1], loop=loop, name="worker")
    assert re.fullmatch(r"Task-\d+", unnamed.get_name())
    assert named.get_name() == "worker"
    named.set_name(42)
    assert named.get_name() == "42"
    numbered = Task(coros[2], loop=loop, name=7)
    assert numbered.get_name() == "7"
    loop.run_until_complete(asyncio.gather(unnamed, named, numbered))


def test_task_exposes_its_coroutine_loop_and_context(loop, Task):
    coro = return_value(None)
    context = contextvars.copy_context()
    task = Task(coro, loop=loop, context=context)
    assert task.get_coro() is coro
    assert task._coro is coro
    assert task.get_loop() is loop
    if has_get_context(task):
        assert task.get_context() is context
    loop.run_until_complete(task)
    assert task.get_coro() is coro


def test_task_private_fields_of_a_fresh_task(loop, Task):
    task = Task(return_value(None), loop=loop)
    assert task._state == "PENDING"
    assert task._must_cancel is False
    assert task._fut_waiter is None
    assert task._callbacks is None
    assert task._source_traceback is None
    assert task._exception is None
    assert task._result is None
    assert task._cancel_message is None
    assert task._log_traceback is False
    assert task._log_destroy_pending is True
    assert task._asyncio_future_blocking is False
    task._asyncio_future_blocking = True
    assert task._asyncio_future_blocking is True
    task._asyncio_future_blocking = False
    loop.run_until_complete(task)


def test_debug_mode_records_where_the_task_was_created(loop, Task):
    loop.set_debug(True)
    task = Task(return_value(1), loop=loop)
    assert isinstance(task._source_traceback, list)
    filename, _lineno, function, *_ = task._source_traceback[-1]
    assert (filename, function) == (__file__, "test_debug_mode_records_where_the_task_was_created")
    loop.run_until_complete(task)


def test_task_is_weakly_referenceable_hashable_and_takes_attributes(loop, Task):
    task = Task(return_value(None), loop=loop)
    ref = weakref.ref(task)
    assert ref() is task
    assert hash(task) == hash(task)
    assert {task: 1}[task] == 1
    assert task != Task(wait_on(task), loop=loop)
    task.request_tag = "abc"
    assert task.request_tag == "abc"
    loop.run_until_complete(asyncio.gather(*asyncio.all_tasks(loop)))
    del task
    gc.collect()
    assert ref() is None


class Holder:
    task: Any = None


async def return_a_holder_of_the_task():
    holder = Holder()
    holder.task = asyncio.current_task()
    return holder


async def fail_with_the_task_in_the_frame():
    task = asyncio.current_task()
    raise ValueError(f"the frame holds {task.get_name()}")


@pytest.mark.parametrize(
    "body", [return_a_holder_of_the_task, fail_with_the_task_in_the_frame], ids=["result", "exc"]
)
def test_task_in_a_reference_cycle_is_collected(loop, Task, body):
    # task -> result (or exception -> traceback -> frame) -> task: only the cycle collector
    # can free it, and only if the task's class traverses what it holds.
    task = Task(body(), loop=loop)
    loop.run_until_complete(asyncio.wait([task]))
    task.exception()
    ref = weakref.ref(task)
    del task
    gc.collect()
    assert ref() is None


def test_task_set_result_and_set_exception_are_refused(loop, Task):
    task = Task(return_value(None), loop=loop)
    with pytest.raises(RuntimeError, match=r"^Task does not support set_result operation$"):
        task.set_result(1)
    with pytest.raises(RuntimeError, match=r"^Task does not support set_exception operation$"):
        task.set_exception(ValueError())
    assert loop.run_until_complete(task) is None


def test_task_is_an_asyncio_task_and_future(loop, Task):
    task = Task(return_value(None), loop=loop)
    assert asyncio.isfuture(task)
    assert asyncio.iscoroutine(task) is False
    assert isinstance(task, asyncio.Task)
    assert isinstance(task, asyncio.Future)
    loop.run_until_complete(task)


@pytest.mark.cpython_loan("task_layout")
def test_every_name_of_asyncio_task_is_the_native_tasks_own():
    # ferroloop.Task subclasses asyncio.Task but never initialises the C Task's part of the
    # object (crates/py/src/task_base.rs): a name it inherited from asyncio.Task or
    # asyncio.Future would run C code on that unused part instead of the native task's state.
    from ferroloop import Task

    inherited = (set(vars(asyncio.Task)) | set(vars(asyncio.Future))) - set(vars(Task))
    # 3.14's `_asyncio_awaited_by` (asyncio.capture_call_graph) reads the C Future's
    # fut_awaited_by, which 3.14's future_add_to_awaited_by keeps in the C part of any
    # subclass's instance, this one's included: that part of the C state is the task's own.
    assert inherited <= {"__doc__", "__module__", "_asyncio_awaited_by"}, sorted(inherited)


@pytest.mark.cpython_loan("task_layout")
@pytest.mark.skipif(sys.version_info < (3, 14), reason="asyncio.capture_call_graph is new in 3.14")
def test_call_graph_shows_native_tasks_awaited_by_gather(loop):
    from ferroloop import Task

    graphs = []

    async def leaf():
        await asyncio.sleep(0)
        graphs.append(asyncio.capture_call_graph(asyncio.current_task()))

    async def parent():
        await asyncio.gather(Task(leaf(), loop=loop, name="leaf"))

    loop.run_until_complete(Task(parent(), loop=loop, name="parent"))
    (graph,) = graphs
    assert graph.future.get_name() == "leaf"
    assert [g.future.get_name() for g in graph.awaited_by] == ["parent"]


def test_task_attributes_live_in_an_instance_dict(loop, Task):
    task = Task(return_value(None), loop=loop)
    task.label = "mine"
    assert task.label == "mine"
    assert loop.run_until_complete(task) is None
    assert task.label == "mine"


def test_task_in_a_cycle_through_its_instance_dict_is_collected(loop, Task):
    # The instance dict is the base class's: the collector must see it through the task.
    task = Task(return_value(None), loop=loop)
    loop.run_until_complete(task)
    task.me = task
    ref = weakref.ref(task)
    del task
    gc.collect()
    assert ref() is None


def test_freed_tasks_leave_their_class_referenced_as_before(loop, Task):
    # Each instance holds one reference to its class; on CPython 3.12+ asyncio.Task's own
    # tp_dealloc releases it too, so the native task's must not release it twice.
    async def make_many():
        for _ in range(2000):
            await Task(return_value(None), loop=loop)

    gc.collect()
    before = sys.getrefcount(Task)
    loop.run_until_complete(make_many())
    gc.collect()
    assert sys.getrefcount(Task) == before


def test_task_result_and_exception_while_pending(loop, Task):
    task = Task(return_value(None), loop=loop)
    with pytest.raises(asyncio.InvalidStateError, match=r"^Result is not set.$"):
        task.result()
    with pytest.raises(asyncio.InvalidStateError, match=r"^Exception is not set.$"):
        task.exception()
    loop.run_until_complete(task)


# --- repr -------------------------------------------------------------------------------------


def test_task_repr_matches_asyncio_through_its_life(loop, Task):
    future = loop.create_future()
    ours = Task(wait_on(future), loop=loop, name="twin")
    oracle = asyncio.Task(wait_on(future), loop=loop, name="twin")
    assert repr(ours) == repr(oracle)
    assert re.fullmatch(
        r"<Task pending name='twin' coro=<wait_on\(\) running at .*:\d+>>", repr(ours)
    )
    loop.run_until_complete(bare_yield())
    assert repr(ours) == repr(oracle)
    assert "wait_for=<Future pending cb=[" in repr(ours)
    future.set_result("value")
    loop.run_until_complete(asyncio.gather(ours, oracle))
    assert repr(ours) == repr(oracle)
    assert repr(ours).startswith("<Task finished name='twin' coro=<wait_on() done, defined at ")
    assert repr(ours).endswith(" result='value'>")


def test_task_repr_while_cancelling_and_cancelled_matches_asyncio(loop, Task):
    future = loop.create_future()
    ours = Task(wait_on(future), loop=loop, name="twin")
    oracle = asyncio.Task(wait_on(future), loop=loop, name="twin")
    ours.cancel()
    oracle.cancel()
    assert repr(ours) == repr(oracle)
    assert repr(ours).startswith("<Task cancelling name='twin' ")
    loop.run_until_complete(asyncio.wait([ours, oracle]))
    assert repr(ours) == repr(oracle)
    assert repr(ours).startswith("<Task cancelled name='twin' ")
    future.cancel()


def test_task_repr_with_exception_matches_asyncio(loop, Task):
    async def fail():
        raise ValueError("bad")

    ours = Task(fail(), loop=loop, name="twin")
    oracle = asyncio.Task(fail(), loop=loop, name="twin")
    loop.run_until_complete(asyncio.wait([ours, oracle]))
    assert repr(ours) == repr(oracle)
    assert repr(ours).endswith(" exception=ValueError('bad')>")
    assert isinstance(ours.exception(), ValueError)
    oracle.exception()


def test_task_repr_with_done_callback_matches_asyncio(loop, Task):
    def on_done(task):
        pass

    ours = Task(return_value(1), loop=loop, name="twin")
    oracle = asyncio.Task(return_value(1), loop=loop, name="twin")
    ours.add_done_callback(on_done)
    oracle.add_done_callback(on_done)
    assert repr(ours) == repr(oracle)
    assert " cb=[test_task_repr_with_done_callback_matches_asyncio.<locals>.on_done() at " in repr(
        ours
    )
    loop.run_until_complete(asyncio.gather(ours, oracle))


# --- the step: running the coroutine ----------------------------------------------------------


def test_current_task_is_the_task_while_its_coroutine_runs(loop, Task):
    seen = []

    async def body():
        seen.append(asyncio.current_task())
        await bare_yield()
        seen.append(asyncio.current_task())

    task = Task(body(), loop=loop)
    loop.run_until_complete(task)
    assert seen == [task, task]
    assert asyncio.current_task(loop) is None


def test_coroutine_runs_in_the_tasks_own_context_copy(loop, run, Task):
    async def body():
        assert request_id.get() == "outer"
        request_id.set("inner")
        await bare_yield()
        return request_id.get()

    async def main():
        request_id.set("outer")
        task = Task(body())
        assert await task == "inner"
        if has_get_context(task):
            assert task.get_context().get(request_id) == "inner"
        return request_id.get()

    assert run(main()) == "outer"


def test_coroutine_runs_in_the_given_context(loop, Task):
    context = contextvars.copy_context()
    context.run(request_id.set, "given")

    async def body():
        value = request_id.get()
        request_id.set("changed")
        return value

    task = Task(body(), loop=loop, context=context)
    assert loop.run_until_complete(task) == "given"
    assert context[request_id] == "changed"
    assert request_id.get() == "unset"


def test_bare_yields_interleave_tasks_round_robin(loop, Task):
    order = []

    async def worker(name):
        for step in range(3):
            order.append(f"{name}{step}")
            await bare_yield()

    first = Task(worker("a"), loop=loop)
    second = Task(worker("b"), loop=loop)
    loop.run_until_complete(asyncio.gather(first, second))
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_steps_and_done_callbacks_go_through_an_overridden_call_soon(loop, Task):
    class Counting(type(loop)):
        def call_soon(self, callback, *args, context=None):
            self.scheduled += 1
            return super().call_soon(callback, *args, context=context)

    counting = Counting()
    counting.scheduled = 0
    try:
        task = Task(return_value_after_a_yield(), loop=counting)
        task.add_done_callback(lambda t: None)
        assert counting.run_until_complete(task) == "yielded once"
    finally:
        counting.close()
    # The first step, the step after the yield, the done callback, run_until_complete's own.
    assert counting.scheduled == 4


def test_bare_yield_resumes_after_the_callbacks_already_scheduled(loop, Task):
    order = []

    async def body():
        loop.call_soon(order.append, "callback scheduled before the yield")
        await bare_yield()
        order.append("task resumed")

    loop.run_until_complete(Task(body(), loop=loop))
    assert order == ["callback scheduled before the yield", "task resumed"]


def test_awaiting_a_future_resumes_with_its_result(loop, Task):
    future = loop.create_future()
    task = Task(wait_on(future), loop=loop)
    loop.run_until_complete(bare_yield())
    assert task._fut_waiter is future
    future.set_result("resolved")
    assert loop.run_until_complete(task) == "resolved"
    assert task._fut_waiter is None


def test_awaiting_a_failed_future_raises_in_the_coroutine(loop, Task):
    future = loop.create_future()

    async def body():
        try:
            await future
        except KeyError as exc:
            return f"caught {exc.args[0]}"

    task = Task(body(), loop=loop)
    loop.call_soon(future.set_exception, KeyError("k"))
    assert loop.run_until_complete(task) == "caught k"


def test_tasks_of_both_kinds_await_each_other(loop, run, Task):
    async def main():
        ours = Task(return_value("ours"))
        theirs = asyncio.Task(wait_on(ours))
        ours_again = Task(wait_on(theirs))
        return await ours_again, await theirs, await ours

    assert run(main()) == ("ours", "ours", "ours")


def test_task_exception_is_stored_and_raised_by_result(loop, Task):
    async def fail():
        await bare_yield()
        raise ValueError("broken")

    task = Task(fail(), loop=loop)
    with pytest.raises(ValueError, match=r"^broken$"):
        loop.run_until_complete(task)
    assert task.done() and not task.cancelled()
    assert isinstance(task.exception(), ValueError)
    assert task._exception is task.exception()
    with pytest.raises(ValueError, match=r"^broken$"):
        task.result()


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_keyboard_interrupt_and_system_exit_propagate_out_of_the_loop(loop, Task, exc_type):
    async def interrupt():
        await bare_yield()
        raise exc_type("stop")

    task = Task(interrupt(), loop=loop)
    with pytest.raises(exc_type):
        loop.run_until_complete(task)
    assert task.done()
    assert isinstance(task.exception(), exc_type)


def test_bad_yield_is_a_runtime_error_in_the_task(loop, Task):
    async def body():
        await yield_value("not a future")

    task = Task(body(), loop=loop)
    with pytest.raises(RuntimeError, match=r"^Task got bad yield: 'not a future'$"):
        loop.run_until_complete(task)


def test_yield_instead_of_yield_from_a_future_is_a_runtime_error(loop, Task):
    future = loop.create_future()
    future.set_result(1)

    async def body():
        await yield_value(future)

    task = Task(body(), loop=loop, name="yielder")
    with pytest.raises(RuntimeError) as caught:
        loop.run_until_complete(task)
    message = str(caught.value)
    assert message.startswith("yield was used instead of yield from in task <Task pending ")
    assert message.endswith(" with <Future finished result=1>")


def test_task_awaiting_itself_is_a_runtime_error(loop, Task):
    async def body():
        await asyncio.current_task()

    task = Task(body(), loop=loop, name="selfish")
    with pytest.raises(
        RuntimeError, match=r"^Task cannot await on itself: <Task pending name='selfish'"
    ):
        loop.run_until_complete(task)


def test_future_of_another_loop_is_a_runtime_error(loop, Task):
    other = asyncio.new_event_loop()
    try:
        foreign = other.create_future()
        task = Task(wait_on(foreign), loop=loop, name="lost")
        pattern = (
            r"^Task <Task pending name='lost' .*> got Future <Future pending> "
            r"attached to a different loop$"
        )
        with pytest.raises(RuntimeError, match=pattern):
            loop.run_until_complete(task)
    finally:
        other.close()


def test_yielded_future_gets_the_task_wakeup_as_done_callback(loop, Task):
    future = loop.create_future()
    context = contextvars.copy_context()
    task = Task(wait_on(future), loop=loop, context=context)
    loop.run_until_complete(bare_yield())
    callbacks = future._callbacks
    assert len(callbacks) == 1
    _callback, callback_context = callbacks[0]
    assert callback_context is context
    future.set_result(None)
    loop.run_until_complete(task)


def test_a_waited_future_is_no_longer_marked_blocking(loop, Task):
    # The task clears `_asyncio_future_blocking` of the future it waits on (asyncio's
    # `Future.__await__` sets it), and is woken with the future's result.
    future = loop.create_future()
    task = Task(wait_on(future), loop=loop)
    loop.run_until_complete(bare_yield())
    assert future._asyncio_future_blocking is False
    assert not task.done()
    future.set_result("woken")
    assert loop.run_until_complete(task) == "woken"


def test_the_collector_sees_what_a_task_holds(loop, Task):
    # gc.get_referents runs the type's tp_traverse: ferroloop.Task has its own.
    context = contextvars.copy_context()
    coro = return_value(1)
    task = Task(coro, loop=loop, context=context)
    marker = object()
    task.attribute = marker
    referents = gc.get_referents(task)
    assert any(r is coro for r in referents)
    assert any(r is context for r in referents)
    assert any(r is loop for r in referents)
    assert any(isinstance(r, dict) and r.get("attribute") is marker for r in referents)
    loop.run_until_complete(task)


def test_a_cycle_through_a_finished_task_is_collected(loop, Task):
    class Holder:
        pass

    refs = []
    for _ in range(10):
        holder = Holder()
        holder.task = Task(return_value(holder), loop=loop)  # holder -> task -> result -> holder
        loop.run_until_complete(holder.task)
        refs.append(weakref.ref(holder))
    del holder
    gc.collect()
    assert [ref() for ref in refs] == [None] * 10


# --- done callbacks ---------------------------------------------------------------------------


def test_done_callbacks_are_scheduled_in_order_after_the_result(loop, Task):
    events = []

    async def body():
        events.append("body")
        return "r"

    task = Task(body(), loop=loop)
    task.add_done_callback(lambda t: events.append(("first", t.result())))
    task.add_done_callback(lambda t: events.append(("second", t is task)))
    loop.run_until_complete(task)
    events.append("run_until_complete returned")
    loop.run_until_complete(bare_yield())
    assert events[0] == "body"
    assert ("first", "r") in events and ("second", True) in events
    assert events.index(("first", "r")) < events.index(("second", True))


def test_done_callback_added_to_a_done_task_is_scheduled_not_called(loop, Task):
    task = Task(return_value(1), loop=loop)
    loop.run_until_complete(task)
    calls = []
    task.add_done_callback(calls.append)
    assert calls == []
    loop.run_until_complete(bare_yield())
    assert calls == [task]


def test_done_callbacks_run_in_their_context(loop, Task):
    seen = []
    context = contextvars.copy_context()
    context.run(request_id.set, "callback context")
    request_id_token = request_id.set("added here")
    try:
        task = Task(return_value(1), loop=loop)
        task.add_done_callback(lambda t: seen.append(("given", request_id.get())), context=context)
        task.add_done_callback(lambda t: seen.append(("default", request_id.get())))
    finally:
        request_id.reset(request_id_token)
    loop.run_until_complete(task)
    loop.run_until_complete(bare_yield())
    assert seen == [("given", "callback context"), ("default", "added here")]


def test_done_callback_runs_outside_the_task(loop, Task):
    seen = []
    task = Task(return_value(1), loop=loop)
    task.add_done_callback(lambda t: seen.append(asyncio.current_task(loop)))
    loop.run_until_complete(task)
    loop.run_until_complete(bare_yield())
    assert seen == [None]


def test_done_callback_exception_goes_to_the_exception_handler(loop, Task, exception_handler_calls):
    def on_done(task):
        raise ValueError("from the callback")

    task = Task(return_value(1), loop=loop, name="twin")
    task.add_done_callback(on_done)
    loop.run_until_complete(task)
    loop.run_until_complete(bare_yield())
    (context,) = exception_handler_calls.consume()
    # The callback's arguments (the task, shortened by reprlib) are hidden on 3.13.
    assert re.fullmatch(
        r"Exception in callback .*<locals>\.on_done\(.*\) at .*test_native_task\.py:\d+",
        context["message"],
    )
    assert isinstance(context["exception"], ValueError)


def test_remove_done_callback_compares_by_equality(loop, Task):
    class Owner:
        def on_done(self, task):
            pass

    owner = Owner()
    task = Task(return_value(1), loop=loop)
    task.add_done_callback(owner.on_done)
    task.add_done_callback(owner.on_done)
    # Each attribute access makes a new bound method: equal, not identical.
    assert task.remove_done_callback(owner.on_done) == 2
    assert task._callbacks is None
    loop.run_until_complete(task)


def test_remove_done_callback_removes_every_registration(loop, Task):
    calls = []

    def first(task):
        calls.append("first")

    def second(task):
        calls.append("second")

    task = Task(return_value(1), loop=loop)
    task.add_done_callback(first)
    task.add_done_callback(second)
    task.add_done_callback(first)
    assert len(task._callbacks) == 3
    assert task.remove_done_callback(first) == 2
    assert task.remove_done_callback(first) == 0
    assert [cb for cb, _ in task._callbacks] == [second]
    loop.run_until_complete(task)
    loop.run_until_complete(bare_yield())
    assert calls == ["second"]


# --- introspection ----------------------------------------------------------------------------


def test_all_tasks_includes_pending_tasks(loop, run, Task):
    async def main():
        future = asyncio.get_running_loop().create_future()
        task = Task(wait_on(future))
        await bare_yield()
        found = asyncio.all_tasks()
        future.set_result(None)
        await task
        return found, task, asyncio.current_task(), asyncio.all_tasks()

    found, task, main_task, after = run(main())
    assert task in found and main_task in found
    assert task not in after


def test_get_stack_of_a_suspended_task_is_its_coroutine_frame(loop, Task):
    future = loop.create_future()
    task = Task(wait_on(future), loop=loop, name="stacked")
    loop.run_until_complete(bare_yield())
    frames = task.get_stack()
    assert [frame.f_code.co_name for frame in frames] == ["wait_on"]
    assert task.get_stack(limit=1) == frames
    out = io.StringIO()
    task.print_stack(file=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("Stack for <Task pending name='stacked' ")
    assert lines[0].endswith(" (most recent call last):")
    assert lines[1].strip().endswith(", in wait_on")
    future.set_result(None)
    loop.run_until_complete(task)
    assert task.get_stack() == []


def test_get_stack_of_a_failed_task_walks_the_traceback(loop, Task):
    async def fail():
        await bare_yield()
        raise ValueError("x")

    task = Task(fail(), loop=loop, name="failed")
    loop.run_until_complete(asyncio.wait([task]))
    names = [frame.f_code.co_name for frame in task.get_stack()]
    assert names[-1] == "fail"
    assert [frame.f_code.co_name for frame in task.get_stack(limit=1)] == ["fail"]
    out = io.StringIO()
    task.print_stack(limit=1, file=out)
    text = out.getvalue()
    assert text.startswith("Traceback for <Task finished name='failed' ")
    assert text.endswith("ValueError: x\n")
    task.exception()


def test_unretrieved_exception_is_reported_when_the_task_is_collected(
    loop, Task, exception_handler_calls
):
    async def fail():
        raise ValueError("nobody looked")

    task = Task(fail(), loop=loop)
    loop.run_until_complete(asyncio.wait([task]))
    assert task._log_traceback is True
    del task
    gc.collect()
    (context,) = exception_handler_calls.consume()
    assert context["message"] == "Task exception was never retrieved"
    assert isinstance(context["exception"], ValueError)
    assert asyncio.isfuture(context["future"])


def test_retrieved_exception_is_not_reported(loop, Task, exception_handler_calls):
    async def fail():
        raise ValueError("seen")

    task = Task(fail(), loop=loop)
    loop.run_until_complete(asyncio.wait([task]))
    task.exception()
    assert task._log_traceback is False
    del task
    gc.collect()
    assert exception_handler_calls.consume() == []


def test_pending_task_collected_is_reported_as_destroyed(loop, Task, exception_handler_calls):
    future = loop.create_future()
    task = Task(wait_on(future), loop=loop)
    loop.run_until_complete(bare_yield())
    del task, future
    gc.collect()
    (context,) = exception_handler_calls.consume()
    assert context["message"] == "Task was destroyed but it is pending!"


def test_pending_task_not_logged_when_log_destroy_pending_is_false(
    loop, Task, exception_handler_calls
):
    future = loop.create_future()
    task = Task(wait_on(future), loop=loop)
    task._log_destroy_pending = False
    loop.run_until_complete(bare_yield())
    del task, future
    gc.collect()
    assert exception_handler_calls.consume() == []


def test_await_and_iter_drive_the_task(loop, run, Task):
    @types.coroutine
    def yield_from(task):
        return (yield from task)

    async def main():
        task = Task(return_value("awaited"))
        iterator = task.__await__()
        assert iter(iterator) is iterator
        first = await task
        second = await yield_from(Task(return_value("iterated")))
        return first, second

    assert run(main()) == ("awaited", "iterated")


# --- ferroloop.Task only ----------------------------------------------------------------------


@pytest.mark.cpython_loan("task_layout")
def test_native_task_refuses_eager_start(loop):
    import ferroloop

    coro = return_value(1)
    with pytest.raises(TypeError):
        ferroloop.Task(coro, loop=loop, eager_start=True)
    coro.close()
    task = ferroloop.Task(return_value(1), loop=loop, eager_start=False)
    assert loop.run_until_complete(task) == 1


@pytest.mark.cpython_loan("task_layout")
def test_native_task_factory_makes_native_tasks(loop):
    import ferroloop

    loop.set_task_factory(ferroloop.task_factory)
    context = contextvars.copy_context()
    task = loop.create_task(return_value("made"), name="factory-made", context=context)
    assert type(task) is ferroloop.Task
    assert task.get_name() == "factory-made"
    assert task.get_context() is context
    assert loop.run_until_complete(task) == "made"
