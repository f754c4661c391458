"""The one measurement every leak test takes: RSS and the number of gc-tracked objects."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _memory_sample() -> tuple[int, int]:
    gc.collect()
    with open("/proc/self/statm") as statm:
        rss = int(statm.read().split()[1]) * PAGE_SIZE
    return rss, len(gc.get_objects())


@pytest.fixture
def memory_sample() -> Callable[[], tuple[int, int]]:
    """``memory_sample()``: collect garbage, then return (RSS in bytes, gc-tracked objects)."""
    return _memory_sample


@contextlib.asynccontextmanager
async def _native_server(app: Any, **options: Any) -> AsyncIterator[tuple[Any, int]]:
    """``async with native_server(app, **options) as (server, port)``: the native
    ``HttpServer`` serving ``app`` on a loopback port of the running ferroloop loop, with
    ``options`` as its keyword arguments; aborted and closed on exit."""
    from ferroloop._native import HttpServer

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    server = HttpServer(asyncio.get_running_loop(), sock, app, **options)
    server.start()
    try:
        yield server, sock.getsockname()[1]
    finally:
        server.abort()
        sock.close()


@pytest.fixture
def native_server() -> Callable[..., contextlib.AbstractAsyncContextManager[tuple[Any, int]]]:
    """``async with native_server(app, **options) as (server, port)``: see ``_native_server``."""
    return _native_server


@pytest.fixture
def server_churn_samples(
    native_server: Callable[..., contextlib.AbstractAsyncContextManager[tuple[Any, int]]],
) -> Callable[[Any, Callable[[int], Any], int], Any]:
    """``await server_churn_samples(app, churn, chunks)``: serves ``app`` (``native_server``),
    runs ``await churn(port)`` ``chunks`` times, and after each, once every app task has ended
    and every connection is gone, takes a ``memory_sample``; returns the samples."""

    async def run(app: Any, churn: Callable[[int], Any], chunks: int) -> list[tuple[int, int]]:
        samples = []
        async with native_server(app) as (server, port):
            for _ in range(chunks):
                await churn(port)
                for _ in range(500):
                    if server.tasks == 0 and server.connections == 0:
                        break
                    await asyncio.sleep(0.01)
                assert (server.tasks, server.connections) == (0, 0)
                samples.append(_memory_sample())
        return samples

    return run
