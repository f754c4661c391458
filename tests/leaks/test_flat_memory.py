"""Memory stays flat while one ferroloop loop churns through millions of handles.

Each test pushes work through one loop in equal chunks, measures RSS (``/proc/self/statm``)
and the number of gc-tracked objects after every chunk, and asserts that nothing grows
between the second chunk (allocator pools and free lists are warm by then) and the last
(pydantic-core ``tests/test_garbage_collection.py`` uses the same idea). A leak of one
object per callback would add a million objects; one leaked byte per handle, a megabyte.

These tests exercise ferroloop's native memory only, so they run on ferroloop alone.
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Callable, Iterator

import pytest

CHUNKS = 10
PER_CHUNK = 100_000  # CHUNKS * PER_CHUNK = one million callbacks / timers
TASK_CHUNK = 20_000
MAX_RSS_GROWTH = 10 * 1024 * 1024
MAX_OBJECT_GROWTH = 1000
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_SIZE


def measure() -> tuple[int, int]:
    gc.collect()
    return rss_bytes(), len(gc.get_objects())


@pytest.fixture
def ferroloop_loop() -> Iterator[asyncio.AbstractEventLoop]:
    import ferroloop

    loop = ferroloop.new_event_loop()
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda loop, context: errors.append(context))
    try:
        yield loop
    finally:
        loop.close()
    assert errors == []


def assert_flat(run_chunk: Callable[[], None]) -> None:
    samples = []
    for _ in range(CHUNKS):
        run_chunk()
        samples.append(measure())
    (rss_start, objects_start), (rss_end, objects_end) = samples[1], samples[-1]
    described = [(rss // 1024, objects) for rss, objects in samples]
    assert rss_end - rss_start < MAX_RSS_GROWTH, f"RSS grew (KiB, objects): {described}"
    assert objects_end - objects_start < MAX_OBJECT_GROWTH, f"objects grew: {described}"


def test_call_soon_churn_keeps_memory_flat(ferroloop_loop):
    loop = ferroloop_loop
    counter = [0]

    def bump(i):
        counter[0] += 1

    def chunk():
        for i in range(PER_CHUNK):
            loop.call_soon(bump, i)
        loop.call_soon(loop.stop)
        loop.run_forever()

    assert_flat(chunk)
    assert counter[0] == CHUNKS * PER_CHUNK


def test_call_later_churn_with_half_cancelled_keeps_memory_flat(ferroloop_loop):
    loop = ferroloop_loop
    fired = [0]

    def fire(i):
        fired[0] += 1

    def chunk():
        handles = [loop.call_later((i % 100) / 100_000, fire, i) for i in range(PER_CHUNK)]
        for handle in handles[::2]:
            handle.cancel()
        del handles
        # Equal deadlines keep their order, so this runs after every timer of the chunk.
        loop.call_later(99 / 100_000, loop.stop)
        loop.run_forever()

    assert_flat(chunk)
    assert fired[0] == CHUNKS * PER_CHUNK // 2


def test_future_and_task_churn_keeps_memory_flat(ferroloop_loop):
    loop = ferroloop_loop

    async def wait_for(future):
        return await future

    async def chunk_main():
        futures = [loop.create_future() for _ in range(TASK_CHUNK)]
        tasks = [loop.create_task(wait_for(future)) for future in futures]
        for i, future in enumerate(futures):
            loop.call_soon(future.set_result, i)
        results = await asyncio.gather(*tasks)
        assert results[-1] == TASK_CHUNK - 1
        await asyncio.sleep(0)

    def chunk():
        loop.run_until_complete(chunk_main())

    assert_flat(chunk)


def test_call_soon_threadsafe_churn_keeps_memory_flat(ferroloop_loop):
    loop = ferroloop_loop
    counter = [0]

    def bump():
        counter[0] += 1

    def chunk():
        for _ in range(PER_CHUNK):
            loop.call_soon_threadsafe(bump)
        loop.call_soon_threadsafe(loop.stop)
        loop.run_forever()

    assert_flat(chunk)
    assert counter[0] == CHUNKS * PER_CHUNK


def test_reader_registration_churn_keeps_memory_flat(ferroloop_loop):
    import socket

    loop = ferroloop_loop
    left, right = socket.socketpair()
    with left, right:

        def chunk():
            for i in range(PER_CHUNK // 10):
                loop.add_reader(left, print, i)
                loop.add_writer(left, print, i)
                loop.remove_reader(left)
                loop.remove_writer(left)

        assert_flat(chunk)
