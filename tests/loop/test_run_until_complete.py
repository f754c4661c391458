"""run_until_complete: results, exceptions, foreign futures, early stop."""

from __future__ import annotations

import asyncio

import pytest


def test_run_until_complete_returns_the_coroutine_result(loop):
    async def main():
        await asyncio.sleep(0)
        return 42

    assert loop.run_until_complete(main()) == 42


def test_run_until_complete_accepts_a_future(loop):
    future = loop.create_future()
    loop.call_soon(future.set_result, "value")
    assert loop.run_until_complete(future) == "value"


def test_run_until_complete_accepts_a_task(loop):
    async def main():
        return "task"

    task = loop.create_task(main())
    assert loop.run_until_complete(task) == "task"


def test_run_until_complete_accepts_an_awaitable(loop):
    class Awaitable:
        def __await__(self):
            yield from asyncio.sleep(0).__await__()
            return "awaited"

    assert loop.run_until_complete(Awaitable()) == "awaited"


def test_run_until_complete_raises_the_coroutine_exception(loop):
    async def main():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        loop.run_until_complete(main())


def test_run_until_complete_raises_cancelled_error_for_a_cancelled_future(loop):
    future = loop.create_future()
    loop.call_soon(future.cancel)
    with pytest.raises(asyncio.CancelledError):
        loop.run_until_complete(future)


def test_run_until_complete_rejects_a_future_of_another_loop(loop, loop_factory):
    other = loop_factory()
    try:
        foreign = other.create_future()
        with pytest.raises(ValueError, match="different loop"):
            loop.run_until_complete(foreign)
    finally:
        other.close()


def test_run_until_complete_rejects_a_non_awaitable(loop):
    with pytest.raises(TypeError):
        loop.run_until_complete(42)


def test_run_until_complete_stopped_early_raises(loop):
    future = loop.create_future()
    loop.call_soon(loop.stop)
    with pytest.raises(RuntimeError, match="Event loop stopped before Future completed"):
        loop.run_until_complete(future)
    future.cancel()


def test_run_until_complete_leaves_unrelated_callbacks_queued(loop):
    order = []

    async def main():
        loop.call_soon(order.append, "queued-by-main")
        return "done"

    assert loop.run_until_complete(main()) == "done"
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert order == ["queued-by-main"]


def test_run_until_complete_with_an_already_done_future(loop):
    future = loop.create_future()
    future.set_result("ready")
    assert loop.run_until_complete(future) == "ready"


def test_run_until_complete_can_be_called_many_times(loop):
    async def double(x):
        await asyncio.sleep(0)
        return 2 * x

    assert [loop.run_until_complete(double(i)) for i in range(20)] == [2 * i for i in range(20)]


def test_run_until_complete_with_sleeps_and_gather(loop):
    async def worker(i):
        await asyncio.sleep(0.001 * (5 - i))
        return i

    async def main():
        return await asyncio.gather(*(worker(i) for i in range(5)))

    assert loop.run_until_complete(main()) == [0, 1, 2, 3, 4]
