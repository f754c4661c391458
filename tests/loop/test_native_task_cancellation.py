"""ferroloop.Task under cancellation: cancel(msg), cancelling()/uncancel(), and the asyncio and
anyio machinery built on them (timeout, wait_for, TaskGroup, shield, gather, wait, cancel scopes).

As in test_native_task.py, every test runs with asyncio's Task (the oracle) and with
ferroloop.Task, on asyncio's loop and on ferroloop's. The ``Task`` fixture installs the matching
task factory, so the tasks that TaskGroup, gather, wait_for and anyio create are of the kind
under test too; anyio reads the task's ``_must_cancel``, ``_fut_waiter``, ``get_coro()``,
``cancelling()`` and ``uncancel()``.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import types
from typing import Any

import anyio
import pytest

# 3.13: uncancel() bringing the count to zero also clears the pending cancellation.
UNCANCEL_CLEARS_MUST_CANCEL = sys.version_info >= (3, 13)


@types.coroutine
def bare_yield():
    """What asyncio.sleep(0) does: give the loop one turn."""
    yield


async def return_value(value):
    return value


async def wait_on(future):
    return await future


# --- cancellation -----------------------------------------------------------------------------


def test_cancel_before_the_first_step_never_runs_the_body(loop, Task):
    ran = []

    async def body():
        ran.append(True)

    task = Task(body(), loop=loop)
    assert task.cancel("early") is True
    assert task._must_cancel is True
    assert task._cancel_message == "early"
    with pytest.raises(asyncio.CancelledError) as caught:
        loop.run_until_complete(task)
    assert caught.value.args == ("early",)
    assert ran == []
    assert task.cancelled() and task._state == "CANCELLED"
    assert task.cancel() is False


def test_cancel_while_awaiting_cancels_the_awaited_future_with_the_message(loop, Task):
    future = loop.create_future()
    task = Task(wait_on(future), loop=loop)
    loop.run_until_complete(bare_yield())
    assert task.cancel("stop now") is True
    assert future.cancelled()
    with pytest.raises(asyncio.CancelledError, match=r"^stop now$"):
        future.result()
    with pytest.raises(asyncio.CancelledError) as caught:
        loop.run_until_complete(task)
    assert caught.value.args == ("stop now",)
    with pytest.raises(asyncio.CancelledError):
        task.result()
    with pytest.raises(asyncio.CancelledError):
        task.exception()


def test_cancel_while_awaiting_a_task_cancels_that_task(loop, Task):
    future = loop.create_future()
    inner = Task(wait_on(future), loop=loop)
    outer = Task(wait_on(inner), loop=loop)
    loop.run_until_complete(bare_yield())
    assert outer._fut_waiter is inner
    outer.cancel()
    loop.run_until_complete(asyncio.wait([outer]))
    assert outer.cancelled() and inner.cancelled() and future.cancelled()


def test_caught_cancellation_lets_the_task_finish(loop, Task):
    future = loop.create_future()

    async def body():
        try:
            await future
        except asyncio.CancelledError as exc:
            return f"survived {exc.args}"

    task = Task(body(), loop=loop)
    loop.run_until_complete(bare_yield())
    task.cancel("once")
    assert loop.run_until_complete(task) == "survived ('once',)"
    assert not task.cancelled()
    assert task.cancelling() == 1


def test_cancelling_counts_requests_and_uncancel_counts_down(loop, Task):
    future = loop.create_future()
    task = Task(wait_on(future), loop=loop)
    loop.run_until_complete(bare_yield())
    assert task.cancelling() == 0
    assert task.cancel() is True
    assert task.cancel() is True
    assert task.cancelling() == 2
    assert task.uncancel() == 1
    assert task.uncancel() == 0
    assert task.cancelling() == 0
    with pytest.raises(asyncio.CancelledError):
        loop.run_until_complete(task)
    assert task.cancel() is False
    assert task.cancelling() == 0


def test_uncancel_to_zero_before_the_step(loop, Task):
    task = Task(return_value("ran"), loop=loop)
    task.cancel()
    assert task.uncancel() == 0
    if UNCANCEL_CLEARS_MUST_CANCEL:
        assert task._must_cancel is False
        assert loop.run_until_complete(task) == "ran"
    else:
        assert task._must_cancel is True
        with pytest.raises(asyncio.CancelledError):
            loop.run_until_complete(task)


def test_task_cancelling_itself_is_cancelled_at_its_next_await(loop, Task):
    future = loop.create_future()
    events = []

    async def body():
        asyncio.current_task().cancel("self")
        events.append("still running after cancel()")
        try:
            await future
        except asyncio.CancelledError as exc:
            events.append(("cancelled at the await", exc.args))
            raise

    task = Task(body(), loop=loop)
    with pytest.raises(asyncio.CancelledError):
        loop.run_until_complete(task)
    assert events == ["still running after cancel()", ("cancelled at the await", ("self",))]
    assert future.cancelled()
    assert task.cancelled()


def test_cancel_during_the_last_step_cancels_the_returned_task(loop, Task):
    async def body():
        asyncio.current_task().cancel("late")
        return "value dropped"

    task = Task(body(), loop=loop)
    with pytest.raises(asyncio.CancelledError):
        loop.run_until_complete(task)
    assert task.cancelled()
    assert task.cancelling() == 1


def test_coroutine_raising_cancelled_error_cancels_the_task(loop, Task):
    async def body():
        raise asyncio.CancelledError("own")

    task = Task(body(), loop=loop)
    with pytest.raises(asyncio.CancelledError) as caught:
        loop.run_until_complete(task)
    assert caught.value.args == ("own",)
    assert task.cancelled()
    assert task.cancelling() == 0


def test_cancel_after_the_awaited_future_resolved_throws_into_the_coroutine(loop, Task):
    # The future is done, its wakeup queued: cancel() cannot cancel it, so the task itself
    # throws CancelledError into the coroutine at the next step.
    future = loop.create_future()
    seen = []

    async def body():
        try:
            return await future
        except asyncio.CancelledError as exc:
            seen.append(exc.args)
            raise

    task = Task(body(), loop=loop)
    loop.run_until_complete(bare_yield())
    future.set_result("too late")
    assert task.cancel("after") is True
    assert task._must_cancel is True
    with pytest.raises(asyncio.CancelledError):
        loop.run_until_complete(task)
    assert seen == [("after",)]
    assert task._must_cancel is False


def test_cancel_message_may_be_any_object(loop, Task):
    task = Task(return_value(None), loop=loop)
    task.cancel(msg=42)
    with pytest.raises(asyncio.CancelledError) as caught:
        loop.run_until_complete(task)
    assert caught.value.args == (42,)


def test_uncancel_at_zero_stays_at_zero(loop, Task):
    task = Task(return_value(None), loop=loop)
    assert task.uncancel() == 0
    assert task.cancelling() == 0
    loop.run_until_complete(task)


def test_cancel_of_a_finished_task_is_refused(loop, Task):
    task = Task(return_value(1), loop=loop)
    loop.run_until_complete(task)
    assert task.cancel() is False
    assert not task.cancelled()
    assert task.cancelling() == 0


def test_cancel_message_is_readable_and_writable(loop, Task):
    task = Task(return_value(1), loop=loop)
    task.cancel("first")
    task._cancel_message = "second"
    with pytest.raises(asyncio.CancelledError) as caught:
        loop.run_until_complete(task)
    assert caught.value.args == ("second",)


def test_cancel_twice_keeps_the_first_message_until_the_step(loop, Task):
    future = loop.create_future()
    task = Task(wait_on(future), loop=loop)
    loop.run_until_complete(bare_yield())
    task.cancel("one")
    task.cancel("two")
    with pytest.raises(asyncio.CancelledError) as caught:
        loop.run_until_complete(task)
    assert caught.value.args == ("one",)


# --- asyncio machinery inside the task --------------------------------------------------------


def test_asyncio_timeout_inside_the_task(loop, run, Task):
    async def main():
        task = asyncio.current_task()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.005):
                await asyncio.sleep(1)
        return type(task).__name__, task.cancelling()

    assert run(main()) == ("Task", 0)


def test_asyncio_wait_for_inside_the_task(loop, run, Task):
    async def main():
        future = asyncio.get_running_loop().create_future()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(future, 0.005)
        assert future.cancelled()
        return await asyncio.wait_for(return_value("in time"), 1)

    assert run(main()) == "in time"


def test_task_group_children_are_of_the_kind_and_fail_together(loop, run, Task):
    async def main():
        events = []

        async def sleeper():
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                events.append("sibling cancelled")
                raise

        async def failer():
            await bare_yield()
            raise ValueError("child failed")

        with pytest.raises(ExceptionGroup) as caught:
            async with asyncio.TaskGroup() as group:
                child = group.create_task(sleeper())
                group.create_task(failer())
        assert type(child) is Task
        assert [type(exc) for exc in caught.value.exceptions] == [ValueError]
        return events

    assert run(main()) == ["sibling cancelled"]


def test_shield_keeps_the_inner_task_running(loop, run, Task):
    async def main():
        future = asyncio.get_running_loop().create_future()
        inner = Task(wait_on(future))
        outer = Task(wait_on(asyncio.shield(inner)))
        await bare_yield()
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        assert not inner.done()
        future.set_result("kept")
        return await inner

    assert run(main()) == "kept"


def test_gather_results_exceptions_and_cancellation(loop, run, Task):
    async def fail():
        raise KeyError("g")

    async def main():
        results = await asyncio.gather(
            Task(return_value(1)), return_value(2), fail(), return_exceptions=True
        )
        future = asyncio.get_running_loop().create_future()
        children = [Task(wait_on(future)), Task(wait_on(future))]
        gathered = asyncio.gather(*children)
        await bare_yield()
        gathered.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gathered
        return results, [child.cancelled() for child in children]

    results, cancelled = run(main())
    assert results[:2] == [1, 2] and isinstance(results[2], KeyError)
    assert cancelled == [True, True]


def test_wait_first_completed(loop, run, Task):
    async def main():
        future = asyncio.get_running_loop().create_future()
        slow = Task(wait_on(future))
        quick = Task(return_value("quick"))
        done, pending = await asyncio.wait({slow, quick}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {quick} and pending == {slow}
        slow.cancel()
        done, pending = await asyncio.wait({slow})
        return done == {slow}, slow.cancelled()

    assert run(main()) == (True, True)


def test_nested_timeouts_inner_expires_outer_survives(loop, run, Task):
    async def main():
        async with asyncio.timeout(5):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.001):
                    await asyncio.sleep(1)
            await bare_yield()
        return asyncio.current_task().cancelling()

    assert run(main()) == 0


# --- anyio on top of the task -----------------------------------------------------------------


def test_anyio_cancel_scope_cancelled_inside_the_task(loop, run, Task):
    async def main():
        with anyio.CancelScope() as scope:
            scope.cancel()
            await anyio.sleep(1)
        task = asyncio.current_task()
        return scope.cancel_called, scope.cancelled_caught, task.cancelling(), task._must_cancel

    assert run(main()) == (True, True, 0, False)


def test_anyio_move_on_after_inside_the_task(loop, run, Task):
    async def main():
        with anyio.move_on_after(0.005) as scope:
            await anyio.sleep(1)
        await anyio.sleep(0)
        return scope.cancelled_caught, asyncio.current_task().cancelling()

    assert run(main()) == (True, 0)


def test_anyio_fail_after_inside_the_task(loop, run, Task):
    async def main():
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.005):
                await anyio.sleep(1)
        await anyio.sleep(0)
        return asyncio.current_task().cancelling()

    assert run(main()) == 0


def test_anyio_shielded_scope_survives_an_outer_cancel(loop, run, Task):
    async def main():
        events = []
        with anyio.CancelScope() as outer:
            with anyio.CancelScope(shield=True):
                outer.cancel()
                await anyio.sleep(0.001)
                events.append("shielded work done")
            await anyio.sleep(1)
            events.append("not reached")
        return events, outer.cancelled_caught

    assert run(main()) == (["shielded work done"], True)


def test_anyio_task_group_cancels_siblings_of_a_failed_child(loop, run, Task):
    async def main():
        events: list[Any] = []

        async def sleeper():
            try:
                await anyio.sleep(1)
            except anyio.get_cancelled_exc_class():
                events.append("sibling cancelled")
                raise

        async def failer():
            await anyio.sleep(0)
            raise ValueError("anyio child failed")

        with pytest.raises(ExceptionGroup) as caught:
            async with anyio.create_task_group() as group:
                group.start_soon(sleeper)
                group.start_soon(failer)
        events.append([type(exc) for exc in caught.value.exceptions])
        return events

    assert run(main()) == ["sibling cancelled", [ValueError]]


def test_anyio_cancel_scope_cancels_a_task_waiting_on_a_task(loop, run, Task):
    async def main():
        future = asyncio.get_running_loop().create_future()
        inner = Task(wait_on(future))
        with anyio.move_on_after(0.002) as scope:
            await inner
        return scope.cancelled_caught, inner.cancelled()

    assert run(main()) == (True, True)


def test_anyio_run_uses_the_task_factory(loop_factory, task_factory, Task):
    # anyio.run builds its own loop through asyncio.Runner: one of the loop_factory's.
    seen = []

    async def main():
        seen.append(type(asyncio.current_task()))
        with anyio.move_on_after(0.002) as scope:
            await anyio.sleep(1)
        return scope.cancelled_caught

    def make_loop():
        new_loop = loop_factory()
        new_loop.set_task_factory(task_factory)
        return new_loop

    assert anyio.run(main, backend_options={"loop_factory": make_loop}) is True
    assert seen == [Task]


def test_runner_turns_sigint_into_keyboard_interrupt_through_the_main_task(
    loop_factory, task_factory, task_kind
):
    # asyncio.Runner cancels its main task on SIGINT, then raises KeyboardInterrupt once the
    # task's uncancel() comes back to 0.
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("asyncio.Runner handles SIGINT only while Python's default handler is set")
    events = []

    def make_loop():
        new_loop = loop_factory()
        new_loop.set_task_factory(task_factory)
        return new_loop

    async def main():
        events.append(type(asyncio.current_task()).__module__)
        asyncio.get_running_loop().call_soon(signal.raise_signal, signal.SIGINT)
        try:
            await asyncio.sleep(1)
        except asyncio.CancelledError:
            events.append("main task cancelled")
            raise

    with pytest.raises(KeyboardInterrupt), asyncio.Runner(loop_factory=make_loop) as runner:
        runner.run(main())
    expected_module = "_asyncio" if task_kind == "asyncio.Task" else "ferroloop._native"
    assert events == [expected_module, "main task cancelled"]
