"""run_in_executor, set_default_executor, shutdown_default_executor."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import sys
import threading

import pytest

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


def add(a, b):
    return a + b


def test_run_in_executor_returns_the_result(loop):
    async def main():
        return await loop.run_in_executor(None, add, 2, 3)

    assert loop.run_until_complete(main()) == 5


def test_run_in_executor_runs_in_another_thread(loop):
    async def main():
        return await loop.run_in_executor(None, threading.get_ident)

    assert loop.run_until_complete(main()) != threading.get_ident()


def test_run_in_executor_returns_an_asyncio_future(loop):
    async def main():
        future = loop.run_in_executor(None, add, 1, 1)
        assert asyncio.isfuture(future)
        assert future.get_loop() is loop
        return await future

    assert loop.run_until_complete(main()) == 2


def test_run_in_executor_propagates_the_exception(loop):
    def fail():
        raise ArithmeticError("in a worker")

    async def main():
        await loop.run_in_executor(None, fail)

    with pytest.raises(ArithmeticError, match="in a worker"):
        loop.run_until_complete(main())


def test_run_in_executor_with_an_explicit_executor(loop):
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="explicit") as executor:

        async def main():
            return await loop.run_in_executor(executor, lambda: threading.current_thread().name)

        assert loop.run_until_complete(main()).startswith("explicit")


def test_run_in_executor_rejects_coroutine_function_in_debug_mode(loop):
    async def coroutine_function():
        pass

    loop.set_debug(True)
    with pytest.raises(TypeError, match="coroutines cannot be used with run_in_executor"):
        loop.run_in_executor(None, coroutine_function)


def test_set_default_executor_is_used(loop):
    executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="default-set")
    loop.set_default_executor(executor)

    async def main():
        return await loop.run_in_executor(None, lambda: threading.current_thread().name)

    try:
        assert loop.run_until_complete(main()).startswith("default-set")
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        executor.shutdown()


def test_set_default_executor_rejects_other_executors(loop):
    with pytest.raises(TypeError, match="executor must be ThreadPoolExecutor instance"):
        loop.set_default_executor(object())


def test_shutdown_default_executor_joins_the_workers(loop):
    async def main():
        return await loop.run_in_executor(None, threading.get_ident)

    worker_id = loop.run_until_complete(main())
    (worker,) = [thread for thread in threading.enumerate() if thread.ident == worker_id]
    loop.run_until_complete(loop.shutdown_default_executor())
    assert not worker.is_alive()


def test_run_in_executor_after_shutdown_default_executor_raises(loop):
    loop.run_until_complete(loop.shutdown_default_executor())
    with pytest.raises(RuntimeError, match="Executor shutdown has been called"):
        loop.run_in_executor(None, add, 1, 2)


def test_shutdown_default_executor_without_executor(loop):
    loop.run_until_complete(loop.shutdown_default_executor())


def test_run_in_executor_does_not_propagate_the_context(loop):
    # asyncio's run_in_executor runs the function without copying contextvars. A thread that
    # inherits its starter's context (sys.flags.thread_inherit_context, on by default on
    # free-threaded 3.14t) sees it anyway: the executor's thread is started here.
    inherited = getattr(sys.flags, "thread_inherit_context", False)
    token = request_id.set("caller")
    try:

        async def main():
            return await loop.run_in_executor(None, request_id.get)

        assert loop.run_until_complete(main()) == ("caller" if inherited else "unset")
    finally:
        request_id.reset(token)


def test_many_concurrent_executor_calls(loop):
    async def main():
        return await asyncio.gather(*(loop.run_in_executor(None, add, i, i) for i in range(200)))

    assert loop.run_until_complete(main()) == [2 * i for i in range(200)]
