"""ferroloop.run() next to asyncio.run(), and asyncio.Runner with a loop factory."""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
import threading
import warnings

import pytest


def run_function(loop_name):
    if loop_name == "asyncio":
        return asyncio.run
    import ferroloop

    return ferroloop.run


@pytest.fixture
def run(loop_name):
    """asyncio.run, then ferroloop.run: same signature, same behaviour."""
    return run_function(loop_name)


def test_run_returns_the_coroutine_result(run):
    async def main():
        await asyncio.sleep(0)
        return "result"

    assert run(main()) == "result"


def test_run_uses_the_right_loop_class(run, loop_factory):
    async def main():
        return type(asyncio.get_running_loop())

    reference = loop_factory()
    try:
        assert run(main()) is type(reference)
    finally:
        reference.close()


def test_run_closes_the_loop(run):
    async def main():
        return asyncio.get_running_loop()

    loop = run(main())
    assert loop.is_closed()


def test_run_propagates_the_exception(run):
    async def main():
        raise LookupError("from main")

    with pytest.raises(LookupError, match="from main"):
        run(main())


def test_run_debug_flag(run):
    async def main():
        return asyncio.get_running_loop().get_debug()

    assert run(main(), debug=True) is True
    assert run(main(), debug=False) is False


def test_run_cancels_leftover_tasks(run):
    events = []

    async def leftover():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise

    async def main():
        asyncio.get_running_loop().create_task(leftover())
        await asyncio.sleep(0)

    run(main())
    assert events == ["cancelled"]


def test_run_closes_open_async_generators(run):
    events = []

    async def ticker():
        try:
            yield 1
            yield 2
        finally:
            events.append("closed")

    async def main():
        generator = ticker()
        await generator.__anext__()
        return generator

    generator = run(main())
    assert events == ["closed"]
    del generator


def test_run_shuts_down_the_default_executor(run):
    async def main():
        return await asyncio.get_running_loop().run_in_executor(None, threading.get_ident)

    worker_id = run(main())
    assert worker_id not in {thread.ident for thread in threading.enumerate()}


def test_run_inside_a_running_loop_raises(run):
    async def inner():
        pass

    async def main():
        coroutine = inner()
        try:
            run(coroutine)
        finally:
            coroutine.close()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with pytest.raises(RuntimeError, match="cannot be called from a running event loop"):
                run(main())
        finally:
            # A run() that created a loop before refusing leaves garbage: collect it here.
            gc.collect()
    assert [str(warning.message) for warning in caught] == []


def test_run_rejects_a_non_coroutine(run):
    # 3.14's Runner also takes any awaitable, and says so.
    if sys.version_info >= (3, 14):
        expected = pytest.raises(TypeError, match="a coroutine or an awaitable is required")
    else:
        expected = pytest.raises(ValueError, match="a coroutine was expected")
    with expected:
        run(42)


def test_run_leaves_no_event_loop_set(run):
    async def main():
        pass

    run(main())
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()


def test_runner_with_loop_factory(loop_factory):
    reference = loop_factory()
    reference.close()

    async def main(value):
        await asyncio.sleep(0)
        return value, type(asyncio.get_running_loop())

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        assert runner.run(main(1)) == (1, type(reference))
        assert runner.run(main(2)) == (2, type(reference))
        loop = runner.get_loop()
        assert not loop.is_closed()
    assert loop.is_closed()


def test_runner_keeps_one_loop_across_runs(loop_factory):
    async def current():
        return asyncio.get_running_loop()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        assert runner.run(current()) is runner.run(current())


def test_runner_translates_sigint_to_main_task_cancellation(loop_factory):
    events = []

    async def main():
        asyncio.get_running_loop().call_later(0.01, signal.raise_signal, signal.SIGINT)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with asyncio.Runner(loop_factory=loop_factory) as runner, pytest.raises(KeyboardInterrupt):
        runner.run(main())
    assert events == ["cancelled"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
