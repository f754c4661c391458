"""Memory stays flat while many ferroloop.Task objects live and die.

Each chunk runs tasks through every way a task ends: a result, an exception (retrieved), a
cancellation while awaiting a future, a caught cancellation, a reference cycle through the
task's result and through its exception's traceback, done callbacks with their contexts, and
an await of another task. RSS and gc-tracked objects are measured after each chunk; nothing may
grow between the second chunk (pools warm) and the last. A task, coroutine, context or
callback kept alive per task would add thousands of objects; a pyclass that does not traverse
what it holds would keep every cycle.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable

import pytest

CHUNKS = 6
TASKS_PER_CHUNK = 2_000
MAX_RSS_GROWTH = 8 * 1024 * 1024
MAX_OBJECT_GROWTH = 500

tag: contextvars.ContextVar[int] = contextvars.ContextVar("tag", default=0)


class Holder:
    task: object = None


async def result(index: int) -> int:
    tag.set(index)
    await asyncio.sleep(0)
    return index


async def failure(index: int) -> None:
    await asyncio.sleep(0)
    raise ValueError(index)


async def waiter(future: asyncio.Future) -> None:
    await future


async def survivor(future: asyncio.Future) -> str:
    try:
        await future
    except asyncio.CancelledError:
        return "survived"
    return "not cancelled"


async def result_cycle() -> Holder:
    holder = Holder()
    holder.task = asyncio.current_task()
    return holder


async def traceback_cycle() -> None:
    task = asyncio.current_task()
    raise KeyError(task.get_name())


async def awaiter(task_class: type, index: int) -> int:
    return await task_class(result(index))


async def chunk(task_class: type) -> None:
    loop = asyncio.get_running_loop()
    done_callbacks = 0

    def on_done(task: object) -> None:
        nonlocal done_callbacks
        done_callbacks += 1

    for index in range(TASKS_PER_CHUNK // 8):
        futures = [loop.create_future() for _ in range(2)]
        tasks = [
            task_class(result(index)),
            task_class(failure(index)),
            task_class(waiter(futures[0])),
            task_class(survivor(futures[1])),
            task_class(result_cycle()),
            task_class(traceback_cycle()),
            task_class(awaiter(task_class, index)),
            task_class(result(index), context=contextvars.copy_context()),
        ]
        for task in tasks:
            task.add_done_callback(on_done)
        await asyncio.sleep(0)
        tasks[2].cancel("leak test")
        tasks[3].cancel()
        await asyncio.wait(tasks)
        for task in tasks:
            if not task.cancelled():
                task.exception()
    await asyncio.sleep(0)
    assert done_callbacks == TASKS_PER_CHUNK // 8 * 8


@pytest.mark.parametrize("loop_name", ["asyncio", "ferroloop"])
def test_native_tasks_leave_memory_flat(
    loop_name: str, memory_sample: Callable[[], tuple[int, int]]
) -> None:
    import ferroloop

    loop = ferroloop.new_event_loop() if loop_name == "ferroloop" else asyncio.new_event_loop()
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda loop, context: errors.append(context))
    loop.set_task_factory(ferroloop.task_factory)
    samples = []
    try:
        for _ in range(CHUNKS):
            loop.run_until_complete(chunk(ferroloop.Task))
            samples.append(memory_sample())
    finally:
        loop.close()
    assert errors == []
    (rss0, objs0), (rss1, objs1) = samples[1], samples[-1]
    assert rss1 - rss0 < MAX_RSS_GROWTH, samples
    assert objs1 - objs0 < MAX_OBJECT_GROWTH, samples
