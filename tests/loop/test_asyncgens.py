"""Async generator hooks: shutdown_asyncgens and the finalizer of collected generators."""

from __future__ import annotations

import asyncio
import gc

import pytest


def test_shutdown_asyncgens_acloses_an_open_generator(loop):
    events = []

    async def ticker():
        try:
            yield 1
            yield 2
        finally:
            events.append("finally")

    async def main():
        generator = ticker()
        assert await generator.__anext__() == 1
        return generator

    generator = loop.run_until_complete(main())
    assert events == []
    loop.run_until_complete(loop.shutdown_asyncgens())
    assert events == ["finally"]
    del generator


def test_shutdown_asyncgens_lets_finally_await(loop):
    events = []

    async def ticker():
        try:
            yield 1
        finally:
            await asyncio.sleep(0)
            events.append("awaited in finally")

    async def main():
        generator = ticker()
        await generator.__anext__()
        return generator

    generator = loop.run_until_complete(main())
    loop.run_until_complete(loop.shutdown_asyncgens())
    assert events == ["awaited in finally"]
    del generator


def test_shutdown_asyncgens_reports_errors_from_aclose(loop, exception_handler_calls):
    async def broken():
        try:
            yield 1
        finally:
            raise ValueError("error while closing")

    async def main():
        generator = broken()
        await generator.__anext__()
        return generator

    generator = loop.run_until_complete(main())
    loop.run_until_complete(loop.shutdown_asyncgens())
    (context,) = exception_handler_calls.consume()
    assert isinstance(context["exception"], ValueError)
    assert context["asyncgen"] is generator
    assert "error occurred during closing of asynchronous generator" in context["message"]


def test_shutdown_asyncgens_with_no_generators(loop):
    loop.run_until_complete(loop.shutdown_asyncgens())


def test_generator_first_iterated_after_shutdown_warns(loop):
    async def ticker():
        yield 1

    async def main():
        generator = ticker()
        try:
            with pytest.warns(ResourceWarning, match="after loop.shutdown_asyncgens"):
                await generator.__anext__()
        finally:
            await generator.aclose()

    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(main())


def test_collected_open_generator_is_aclosed_by_the_loop(loop):
    events = []

    async def ticker():
        try:
            yield 1
            yield 2
        finally:
            events.append("finally")

    async def main():
        generator = ticker()
        await generator.__anext__()
        del generator
        gc.collect()
        # The finalizer hook schedules aclose() as a task; let it run.
        for _ in range(5):
            await asyncio.sleep(0)

    loop.run_until_complete(main())
    assert events == ["finally"]


def test_generator_exhausted_normally_is_not_closed_again(loop):
    events = []

    async def ticker():
        try:
            yield 1
        finally:
            events.append("finally")

    async def main():
        return [value async for value in ticker()]

    assert loop.run_until_complete(main()) == [1]
    loop.run_until_complete(loop.shutdown_asyncgens())
    assert events == ["finally"]
