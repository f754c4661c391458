"""ferroloop.Task against asyncio's Task on generated scenarios: the same event log, step by step.

Each seed generates a small program for a handful of tasks: bare yields, awaits of futures and
of earlier tasks, resolving, failing and cancelling futures, cancelling other tasks (with a
message), catching a cancellation and carrying on, uncancel(), raising, and awaits through
asyncio.timeout, shield, wait_for and a TaskGroup of children. The scenario runs once
with asyncio's Task and once with ferroloop.Task (each time on a fresh loop of the parameter's
kind, with the matching task factory), and the two logs must be equal: every operation, the
value or exception it produced, the task that was current, ``cancelling()`` after each await,
and at the end each task's state, result or exception, and the order of its done callback.

Tasks only await tasks created before them and the driver settles every future at the end,
so every scenario finishes.
"""

from __future__ import annotations

import asyncio
import random
import types
from collections.abc import Callable
from typing import Any

import pytest

SEEDS = range(100)
TASKS = (2, 5)
OPS_PER_TASK = (1, 7)
FUTURES = 3
# How often each operation appears in a program.
OP_WEIGHTS = {
    "yield": 4,
    "await_future": 4,
    "await_task": 2,
    "settle": 2,
    "cancel": 2,
    "uncancel": 2,
    "catch_cancel": 2,
    "raise": 1,
    "timeout_future": 1,  # async with asyncio.timeout(0): await the future
    "shield_future": 1,  # await asyncio.shield(future)
    "wait_for_future": 1,  # await asyncio.wait_for(future, 0)
    "group": 1,  # a TaskGroup of three children that yield and may raise
}


def asyncio_task_factory(loop, coro, **kwargs):
    return asyncio.Task(coro, loop=loop, **kwargs)


@types.coroutine
def bare_yield():
    yield


def generate(seed: int) -> tuple[int, list[list[tuple[Any, ...]]]]:
    rng = random.Random(seed)
    count = rng.randint(*TASKS)
    programs = []
    for index in range(count):
        program: list[tuple[Any, ...]] = []
        for _ in range(rng.randint(*OPS_PER_TASK)):
            kind = rng.choices(list(OP_WEIGHTS), weights=list(OP_WEIGHTS.values()))[0]
            if kind == "await_task" and index == 0:
                kind = "yield"
            if kind in ("await_future", "timeout_future", "shield_future", "wait_for_future"):
                program.append((kind, rng.randrange(FUTURES)))
            elif kind == "await_task":
                program.append((kind, rng.randrange(index)))
            elif kind == "settle":
                how = rng.choice(["set", "fail", "cancel"])
                program.append((kind, rng.randrange(FUTURES), how))
            elif kind == "cancel":
                program.append((kind, rng.randrange(count), rng.choice([None, f"m{index}"])))
            elif kind == "catch_cancel":
                program.append((kind, rng.random() < 0.5))
            elif kind == "group":
                program.append((kind, [(rng.randint(0, 2), rng.random() < 0.3) for _ in range(3)]))
            else:
                program.append((kind,))
        programs.append(program)
    return count, programs


def describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return f"{type(exc).__name__}[{', '.join(describe(e) for e in exc.exceptions)}]"
    return f"{type(exc).__name__}{exc.args!r}"


async def scenario(seed: int, task_class: type, log: list[Any]) -> None:
    loop = asyncio.get_running_loop()
    count, programs = generate(seed)
    futures = [loop.create_future() for _ in range(FUTURES)]
    tasks: list[Any] = []

    def settle(index: int, how: str) -> str:
        future = futures[index]
        if future.done():
            return "already done"
        if how == "set":
            future.set_result(f"f{index}")
        elif how == "fail":
            future.set_exception(KeyError(f"f{index}"))
        else:
            future.cancel(f"f{index} cancelled")
        return how

    async def child(index: int, number: int, yields: int, fails: bool) -> str:
        try:
            for _ in range(yields):
                await bare_yield()
        except asyncio.CancelledError:
            log.append((index, "child", number, "cancelled"))
            raise
        if fails:
            raise ValueError(f"t{index} child {number}")
        return f"t{index} child {number}"

    async def run_program(index: int) -> str:
        catching = None
        for step, op in enumerate(programs[index]):
            me = asyncio.current_task()
            assert me is tasks[index]
            kind = op[0]
            try:
                if kind == "yield":
                    await bare_yield()
                    outcome: Any = "resumed"
                elif kind == "await_future":
                    outcome = await futures[op[1]]
                elif kind == "await_task":
                    outcome = await tasks[op[1]]
                elif kind == "settle":
                    outcome = settle(op[1], op[2])
                elif kind == "cancel":
                    outcome = tasks[op[1]].cancel(op[2])
                elif kind == "uncancel":
                    outcome = me.uncancel() if me.cancelling() else "not cancelling"
                elif kind == "catch_cancel":
                    catching = op[1]
                    outcome = f"catching={catching}"
                elif kind == "timeout_future":
                    async with asyncio.timeout(0):
                        outcome = await futures[op[1]]
                elif kind == "shield_future":
                    outcome = await asyncio.shield(futures[op[1]])
                elif kind == "wait_for_future":
                    outcome = await asyncio.wait_for(futures[op[1]], 0)
                elif kind == "group":
                    async with asyncio.TaskGroup() as group:
                        children = [
                            group.create_task(child(index, number, yields, fails))
                            for number, (yields, fails) in enumerate(op[1])
                        ]
                    outcome = [child_task.result() for child_task in children]
                else:
                    raise ValueError(f"t{index} step {step}")
            except asyncio.CancelledError as exc:
                log.append((index, step, kind, "cancelled", exc.args, me.cancelling()))
                if catching is None:
                    raise
                if catching:
                    me.uncancel()
                catching = None
                continue
            except Exception as exc:
                log.append((index, step, kind, "raised", describe(exc), me.cancelling()))
                if kind == "raise":
                    raise
                continue
            log.append((index, step, kind, "ok", outcome, me.cancelling()))
        return f"t{index} finished"

    for index in range(count):
        task = task_class(run_program(index), name=f"t{index}")
        task.add_done_callback(lambda t: log.append(("done callback", t.get_name())))
        tasks.append(task)
    for _ in range(3):
        await bare_yield()
    for index in range(FUTURES):
        settle(index, "set")
    await asyncio.wait(tasks)
    await bare_yield()
    for future in futures:
        if not future.cancelled():
            future.exception()  # retrieved: no "never retrieved" report from the collector
    for task in tasks:
        if task.cancelled():
            end: Any = "cancelled"
        elif task.exception() is not None:
            end = describe(task.exception())
        else:
            end = task.result()
        log.append(("end", task.get_name(), task._state, end, task.cancelling()))


def run_scenario(
    seed: int, make_loop: Callable[[], asyncio.AbstractEventLoop], task_kind: str
) -> list[Any]:
    import ferroloop

    if task_kind == "asyncio.Task":
        task_class, factory = asyncio.Task, asyncio_task_factory
    else:
        task_class, factory = ferroloop.Task, ferroloop.task_factory
    loop = make_loop()
    handler_calls: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda loop, context: handler_calls.append(context))
    loop.set_task_factory(factory)
    log: list[Any] = []
    try:
        loop.run_until_complete(scenario(seed, task_class, log))
    finally:
        loop.close()
    log.append(("exception handler calls", [context["message"] for context in handler_calls]))
    return log


@pytest.mark.parametrize("seed", SEEDS)
def test_native_task_scenario_matches_asyncio(loop_factory, seed):
    oracle = run_scenario(seed, loop_factory, "asyncio.Task")
    ours = run_scenario(seed, loop_factory, "ferroloop.Task")
    assert ours == oracle
