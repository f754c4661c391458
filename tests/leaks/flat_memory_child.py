"""One churn scenario of ``test_flat_memory.py``, run in a child process of its own.

    python tests/leaks/flat_memory_child.py SCENARIO CHUNKS PER_CHUNK

runs the scenario's chunk ``CHUNKS`` times on one ferroloop loop and prints one JSON object:
``samples``, one ``[rss, heap_in_use, gc_objects]`` per chunk (bytes, bytes, count, taken after
a collection), ``errors`` (what reached the loop's exception handler, as reprs) and ``counter``
(the callbacks that ran). ``heap_in_use`` is the C allocator's live bytes (glibc's
``mallinfo2``: ``uordblks + hblkhd``). The parent runs it with ``PYTHONMALLOC=malloc``, so every
Python object and every native allocation of ferroloop is in that figure (see the parent's
docstring for why).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import os
import socket
import sys
from collections.abc import Callable

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


_mallinfo2 = ctypes.CDLL(None).mallinfo2
_mallinfo2.restype = _MallInfo2


def sample() -> list[int]:
    gc.collect()
    with open("/proc/self/statm") as statm:
        rss = int(statm.read().split()[1]) * PAGE_SIZE
    info = _mallinfo2()
    return [rss, info.uordblks + info.hblkhd, len(gc.get_objects())]


def scenarios(loop: asyncio.AbstractEventLoop, per_chunk: int, counter: list[int]):
    def bump(*_args: object) -> None:
        counter[0] += 1

    def call_soon() -> None:
        for i in range(per_chunk):
            loop.call_soon(bump, i)
        loop.call_soon(loop.stop)
        loop.run_forever()

    def call_later_half_cancelled() -> None:
        handles = [loop.call_later((i % 100) / 100_000, bump, i) for i in range(per_chunk)]
        for handle in handles[::2]:
            handle.cancel()
        del handles
        # Equal deadlines keep their order, so this runs after every timer of the chunk.
        loop.call_later(99 / 100_000, loop.stop)
        loop.run_forever()

    async def wait_for(future: asyncio.Future[int]) -> int:
        result = await future
        bump()
        return result

    async def futures_and_tasks_main() -> None:
        futures = [loop.create_future() for _ in range(per_chunk)]
        tasks = [loop.create_task(wait_for(future)) for future in futures]
        for i, future in enumerate(futures):
            loop.call_soon(future.set_result, i)
        results = await asyncio.gather(*tasks)
        assert results[-1] == per_chunk - 1
        await asyncio.sleep(0)

    def futures_and_tasks() -> None:
        loop.run_until_complete(futures_and_tasks_main())

    def call_soon_threadsafe() -> None:
        for _ in range(per_chunk):
            loop.call_soon_threadsafe(bump)
        loop.call_soon_threadsafe(loop.stop)
        loop.run_forever()

    kept: list[int] = []

    def call_soon_keeping_arguments() -> None:
        # The harness's own check: a deliberate leak of what each callback received.
        for i in range(per_chunk):
            loop.call_soon(kept.append, i * 1000)
        loop.call_soon(loop.stop)
        loop.run_forever()
        counter[0] = len(kept)

    left, right = socket.socketpair()

    def reader_registration() -> None:
        for i in range(per_chunk):
            loop.add_reader(left, print, i)
            loop.add_writer(left, print, i)
            loop.remove_reader(left)
            loop.remove_writer(left)
            bump()

    chunks: dict[str, Callable[[], None]] = {
        "call_soon": call_soon,
        "call_later_half_cancelled": call_later_half_cancelled,
        "futures_and_tasks": futures_and_tasks,
        "call_soon_threadsafe": call_soon_threadsafe,
        "reader_registration": reader_registration,
        "call_soon_keeping_arguments": call_soon_keeping_arguments,
    }
    return chunks, (left, right)


def main() -> None:
    import ferroloop

    name, chunks, per_chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    loop = ferroloop.new_event_loop()
    errors: list[str] = []
    loop.set_exception_handler(lambda loop, context: errors.append(repr(context)))
    counter = [0]
    table, sockets = scenarios(loop, per_chunk, counter)
    samples = []
    try:
        for _ in range(chunks):
            table[name]()
            samples.append(sample())
    finally:
        loop.close()
        for sock in sockets:
            sock.close()
    json.dump({"samples": samples, "errors": errors, "counter": counter[0]}, sys.stdout)


if __name__ == "__main__":
    main()
