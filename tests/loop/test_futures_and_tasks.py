"""create_future and create_task (name=, context=), and the asyncio task machinery on top."""

from __future__ import annotations

import asyncio
import contextvars

import ferroloop
import pytest

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


def test_create_future_is_bound_to_the_loop(loop):
    future = loop.create_future()
    assert asyncio.isfuture(future)
    assert future.get_loop() is loop
    assert not future.done()
    future.cancel()


def test_create_future_argument_forms_match_asyncio(loop):
    # Through the class as well as bound (ferroloop's is a raw native entry on the class).
    future = type(loop).create_future(loop)
    assert future.get_loop() is loop
    future.cancel()
    with pytest.raises(TypeError):
        loop.create_future(None)
    with pytest.raises(TypeError):
        loop.create_future(loop=loop)


def test_create_future_subclass_override_is_used(loop):
    made = []

    class Recording(type(loop)):
        def create_future(self):
            future = super().create_future()
            made.append(future)
            return future

    other = Recording()
    try:
        future = other.create_future()
        assert made == [future]
        assert future.get_loop() is other
        future.cancel()
    finally:
        other.close()


def test_loop_methods_work_through_the_class_and_on_a_plain_subclass(loop):
    # ferroloop's fast methods are descriptors of ferroloop.Loop (crates/py/src/fastcall.rs):
    # CPython hands them exactly that class's instances and its subclasses' alike.
    cls = type(loop)

    class Plain(cls):  # type: ignore[misc, valid-type]
        pass

    async def main(lp):
        future = cls.create_future(lp)
        cls.call_soon(lp, future.set_result, "soon")
        later = lp.create_future()
        cls.call_later(lp, 0, later.set_result, "later")
        cls.call_at(lp, lp.time(), lambda: None)
        task = cls.create_task(lp, asyncio.sleep(0, "task"))
        return cls.get_debug(lp), await future, await later, await task

    other = Plain()
    try:
        results = [loop.run_until_complete(main(loop)), other.run_until_complete(main(other))]
    finally:
        other.close()
    assert results == [(False, "soon", "later", "task")] * 2


def test_future_done_callbacks_run_through_the_loop(loop):
    future = loop.create_future()
    order = []
    future.add_done_callback(lambda f: order.append(("callback", f.result())))
    future.set_result("value")
    order.append("set_result returned")
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert order == ["set_result returned", ("callback", "value")]


def test_await_future_resolved_by_a_timer(loop):
    async def main():
        future = loop.create_future()
        loop.call_later(0.01, future.set_result, "from timer")
        return await future

    assert loop.run_until_complete(main()) == "from timer"


def test_create_task_runs_the_coroutine(loop):
    async def compute():
        await asyncio.sleep(0)
        return 7

    task = loop.create_task(compute())
    # ferroloop's loop makes its native Task (docs/usage.md), asyncio's its own.
    assert isinstance(task, asyncio.Task) or type(task) is ferroloop.Task
    assert asyncio.isfuture(task)
    assert task.get_loop() is loop
    assert loop.run_until_complete(task) == 7


def test_create_task_name(loop):
    async def noop():
        pass

    task = loop.create_task(noop(), name="my-task")
    assert task.get_name() == "my-task"
    loop.run_until_complete(task)


def test_create_task_default_name(loop):
    async def noop():
        pass

    task = loop.create_task(noop())
    assert task.get_name().startswith("Task-")
    loop.run_until_complete(task)


def test_create_task_runs_in_given_context(loop):
    context = contextvars.copy_context()
    context.run(request_id.set, "task-context")

    async def read():
        await asyncio.sleep(0)
        value = request_id.get()
        request_id.set("changed-by-task")
        return value

    task = loop.create_task(read(), context=context)
    assert loop.run_until_complete(task) == "task-context"
    assert context[request_id] == "changed-by-task"
    assert request_id.get() == "unset"


def test_create_task_with_name_and_context_then_without_name(loop):
    # ferroloop reuses one keyword dict for tasks created with context=; the name given to one
    # task must not stick to the next.
    context = contextvars.copy_context()
    context.run(request_id.set, "ctx")

    async def read():
        return request_id.get(), asyncio.current_task().get_name()

    named = loop.create_task(read(), name="named", context=context)
    unnamed = loop.create_task(read(), context=context)
    assert loop.run_until_complete(named) == ("ctx", "named")
    value, name = loop.run_until_complete(unnamed)
    assert value == "ctx"
    assert name.startswith("Task-")


def test_create_task_argument_forms_match_asyncio(loop):
    # ferroloop has a fast entry for create_task(coro); every other form takes the full path.
    async def noop():
        return "done"

    assert loop.run_until_complete(loop.create_task(coro=noop())) == "done"
    with pytest.raises(TypeError):
        loop.create_task()
    coro = noop()
    with pytest.raises(TypeError):
        loop.create_task(coro, bogus=1)
    with pytest.raises(TypeError):
        loop.create_task(coro, "positional name")
    coro.close()


def test_task_steps_keep_their_place_among_callbacks(loop):
    # ferroloop queues a C Task's steps without a Handle; the FIFO order must not change.
    order = []

    async def body():
        order.append("step 1")
        await asyncio.sleep(0)
        order.append("step 2")

    loop.call_soon(order.append, "callback 1")
    task = loop.create_task(body())
    loop.call_soon(order.append, "callback 2")
    loop.run_until_complete(task)
    assert order == ["callback 1", "step 1", "callback 2", "step 2"]


def test_task_wakeups_keep_their_place_and_the_task_context(loop):
    # ferroloop queues a C Task's wake-up (after an awaited future) without a Handle too.
    order = []

    async def main():
        fut = loop.create_future()

        async def waiter():
            request_id.set("set-in-task")
            await fut
            order.append(("woken", request_id.get()))

        task = loop.create_task(waiter())
        await asyncio.sleep(0)  # the task now waits on fut
        loop.call_soon(order.append, "before")
        fut.set_result(None)  # schedules the wake-up
        loop.call_soon(order.append, "after")
        await task

    loop.run_until_complete(main())
    assert order == ["before", ("woken", "set-in-task"), "after"]
    assert request_id.get() == "unset"


def test_keyboard_interrupt_in_a_task_step_leaves_the_loop_and_keeps_the_queue(loop):
    order = []

    async def interrupt():
        raise KeyboardInterrupt

    task = loop.create_task(interrupt())
    loop.call_soon(order.append, "queued after the step")
    with pytest.raises(KeyboardInterrupt):
        loop.run_forever()
    assert order == []
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert order == ["queued after the step"]
    with pytest.raises(KeyboardInterrupt):
        task.result()


def test_create_task_rejects_non_coroutine(loop):
    with pytest.raises(TypeError):
        loop.create_task(42)


def test_current_task_inside_a_task(loop):
    async def main():
        return asyncio.current_task()

    task = loop.create_task(main())
    assert loop.run_until_complete(task) is task


def test_all_tasks_lists_pending_tasks_of_the_loop(loop):
    async def wait_forever(future):
        await future

    async def main():
        future = loop.create_future()
        task = loop.create_task(wait_forever(future))
        await asyncio.sleep(0)
        tasks = asyncio.all_tasks()
        future.set_result(None)
        await task
        return task, tasks

    task, tasks = loop.run_until_complete(main())
    assert task in tasks


def test_task_cancel_raises_cancelled_error_inside(loop):
    seen = []

    async def victim():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main():
        task = loop.create_task(victim())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return task

    task = loop.run_until_complete(main())
    assert task.cancelled()
    assert seen == ["cancelled"]


def test_asyncio_timeout_fires_at_its_deadline(loop):
    async def main():
        start = loop.time()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await asyncio.sleep(3600)
        return loop.time() - start

    assert loop.run_until_complete(main()) >= 0.05


def test_asyncio_timeout_can_be_rescheduled(loop):
    async def main():
        async with asyncio.timeout(3600) as timeout:
            timeout.reschedule(loop.time() + 0.01)
            await asyncio.sleep(3600)

    with pytest.raises(TimeoutError):
        loop.run_until_complete(main())


def test_wait_for_times_out(loop):
    async def main():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(3600), 0.01)

    loop.run_until_complete(main())


def test_sleep_does_not_return_early(loop):
    async def main():
        start = loop.time()
        await asyncio.sleep(0.05)
        return loop.time() - start

    assert loop.run_until_complete(main()) >= 0.05


def test_sleep_zero_yields_to_other_tasks(loop):
    order = []

    async def worker(name):
        for i in range(3):
            order.append((name, i))
            await asyncio.sleep(0)

    async def main():
        await asyncio.gather(worker("a"), worker("b"))

    loop.run_until_complete(main())
    assert order == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]


def test_task_group_runs_children(loop):
    async def child(i):
        await asyncio.sleep(0.001 * i)
        return i

    async def main():
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(child(i)) for i in range(5)]
        return [task.result() for task in tasks]

    assert loop.run_until_complete(main()) == [0, 1, 2, 3, 4]


def test_many_tasks_complete(loop):
    async def child(i):
        await asyncio.sleep(0)
        return i

    async def main():
        return await asyncio.gather(*(child(i) for i in range(2000)))

    assert loop.run_until_complete(main()) == list(range(2000))
