"""set_task_factory / get_task_factory."""

from __future__ import annotations

import asyncio
import contextvars
import sys

import ferroloop
import pytest

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


class MyTask(asyncio.Task):
    pass


def test_task_factory_defaults_to_none(loop):
    assert loop.get_task_factory() is None


def test_task_factory_round_trips(loop):
    def factory(loop, coro, **kwargs):
        return MyTask(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    assert loop.get_task_factory() is factory
    loop.set_task_factory(None)
    assert loop.get_task_factory() is None


def test_task_factory_rejects_non_callable(loop):
    with pytest.raises(TypeError, match="task factory must be a callable or None"):
        loop.set_task_factory(1)


def test_create_task_uses_the_task_factory(loop):
    calls = []

    def factory(factory_loop, coro, **kwargs):
        calls.append((factory_loop, kwargs))
        return MyTask(coro, loop=factory_loop, **kwargs)

    async def main():
        return "made by factory"

    loop.set_task_factory(factory)
    task = loop.create_task(main())
    assert isinstance(task, MyTask)
    assert loop.run_until_complete(task) == "made by factory"
    assert calls == [(loop, {})]


def test_task_factory_gets_the_context_and_name_is_applied(loop):
    received = []

    def factory(factory_loop, coro, **kwargs):
        received.append(kwargs)
        return MyTask(coro, loop=factory_loop, **kwargs)

    context = contextvars.copy_context()
    context.run(request_id.set, "factory-context")

    async def main():
        return request_id.get()

    loop.set_task_factory(factory)
    task = loop.create_task(main(), name="named", context=context)
    assert task.get_name() == "named"
    assert loop.run_until_complete(task) == "factory-context"
    # 3.14's create_task passes every keyword to the factory; earlier ones set the name after.
    expected = {"name": "named", "context": context} if sys.version_info >= (3, 14) else {}
    assert received == [{"context": context, **expected}]


def recording_factory(made):
    """A task factory that makes a `MyTask` and appends it to `made`."""

    def factory(factory_loop, coro, **kwargs):
        task = MyTask(coro, loop=factory_loop, **kwargs)
        made.append(task)
        return task

    return factory


def test_run_until_complete_uses_the_task_factory(loop):
    made = []

    async def main():
        return 1

    loop.set_task_factory(recording_factory(made))
    assert loop.run_until_complete(main()) == 1
    assert len(made) == 1


def test_task_factory_attribute_set_directly_is_used_and_reset(loop):
    # asyncio keeps the factory in loop._task_factory, and some code assigns it directly;
    # create_task and get_task_factory must both see such an assignment.
    made = []
    factory = recording_factory(made)

    async def main():
        return "done"

    loop._task_factory = factory
    assert loop.get_task_factory() is factory
    task = loop.create_task(main())
    assert made == [task]
    assert loop.run_until_complete(task) == "done"
    loop._task_factory = None
    assert loop.get_task_factory() is None
    plain = loop.create_task(main())
    assert type(plain) in (asyncio.Task, ferroloop.Task)  # the loop's own, once reset
    assert loop.run_until_complete(plain) == "done"


@pytest.mark.skipif(sys.version_info < (3, 12), reason="eager task factories are new in 3.12")
def test_eager_task_factory_runs_the_first_step_inside_create_task(loop):
    steps = []

    async def finishes_at_once():
        steps.append(asyncio.current_task())
        return "at once"

    async def suspends():
        steps.append("first step")
        await asyncio.sleep(0)
        steps.append("second step")
        return "later"

    async def main():
        first = loop.create_task(finishes_at_once())
        facts = [first.done(), first.result(), steps == [first]]
        second = loop.create_task(suspends())
        facts += [second.done(), steps[-1]]
        return facts, await second

    loop.set_task_factory(asyncio.eager_task_factory)
    assert loop.run_until_complete(main()) == (
        [True, "at once", True, False, "first step"],
        "later",
    )
    assert steps[-1] == "second step"


def test_create_task_makes_an_asyncio_task_of_the_loops_default_kind(loop):
    # ferroloop's default is ferroloop.Task, a subclass of asyncio.Task; asyncio's loop makes
    # asyncio's own. Either way the task is an asyncio.Task, gathered and awaited as one.
    async def child():
        await asyncio.sleep(0)
        return asyncio.current_task()

    async def main():
        task = loop.create_task(child())
        assert isinstance(task, asyncio.Task)
        assert await asyncio.gather(task) == [task]
        return type(task)

    kind = loop.run_until_complete(main())
    assert kind is (ferroloop.Task if isinstance(loop, ferroloop.Loop) else asyncio.Task)


@pytest.mark.parametrize(("value", "native"), [("0", False), ("1", True), ("", True)])
def test_ferroloop_native_tasks_env_chooses_the_kind(monkeypatch, value, native):
    monkeypatch.setenv("FERROLOOP_NATIVE_TASKS", value)
    loop = ferroloop.new_event_loop()
    try:

        async def child():
            return None

        task = loop.create_task(child())
        assert type(task) is (ferroloop.Task if native else asyncio.Task)
        loop.run_until_complete(task)
    finally:
        loop.close()
