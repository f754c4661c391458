"""Memory stays flat while many pipes go through ferroloop's native pipe transports.

Each round makes an ``os.pipe()``, connects a write-pipe and a read-pipe transport to its ends,
sends small messages and one large enough to be queued and flushed by the writer, and ends by
closing the writer (the reader sees EOF and closes), by aborting it with bytes still queued, or
by closing the reader first (the writer loses the connection with ``BrokenPipeError``). RSS and
the number of gc-tracked objects are measured after each chunk; nothing may grow between the
second chunk (pools warm) and the last. A transport, core or protocol kept alive per pipe (the
transport and its core refer to each other until ``connection_lost`` has run) would add
thousands of objects; an fd left open would fail ``os.pipe()`` long before the end.
"""

from __future__ import annotations

import asyncio
import os

import ferroloop

CHUNKS = 6
PIPES_PER_CHUNK = 200
BIG = bytes(range(256)) * 1024  # 256 KiB: more than a pipe holds, so the writer queues
MAX_RSS_GROWTH = 8 * 1024 * 1024
MAX_OBJECT_GROWTH = 500


class Sink(asyncio.Protocol):
    def __init__(self) -> None:
        self.received = 0
        self.lost = asyncio.get_running_loop().create_future()
        self.waiter: tuple[int, asyncio.Future[None]] | None = None

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        if self.waiter and self.received >= self.waiter[0]:
            self.waiter[1].set_result(None)
            self.waiter = None

    async def until(self, size: int) -> None:
        if self.received < size:
            self.waiter = (size, asyncio.get_running_loop().create_future())
            await self.waiter[1]

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost.set_result(exc)


async def one_pipe(loop: asyncio.AbstractEventLoop, index: int) -> None:
    read_fd, write_fd = os.pipe()
    writer, source = await loop.connect_write_pipe(Sink, os.fdopen(write_fd, "wb", 0))
    reader, sink = await loop.connect_read_pipe(Sink, os.fdopen(read_fd, "rb", 0))
    sent = 0
    for i in range(3):
        message = BIG if (index + i) % 2 == 0 else b"ping %d\n" % i
        writer.write(message)
        sent += len(message)
    await sink.until(sent)
    ending = index % 3
    if ending == 0:
        writer.close()
    elif ending == 1:
        writer.write(BIG)
        writer.abort()  # with bytes still queued
        reader.close()
    else:
        writer.write(BIG)
        reader.close()  # the writer notices the closed end
    await source.lost
    await sink.lost


def test_native_pipe_transports_leave_memory_flat(memory_sample) -> None:
    async def main() -> list[tuple[int, int]]:
        loop = asyncio.get_running_loop()
        samples = []
        for _ in range(CHUNKS):
            for index in range(PIPES_PER_CHUNK):
                await one_pipe(loop, index)
            await asyncio.sleep(0)
            samples.append(memory_sample())
        return samples

    samples = ferroloop.run(main())
    (rss0, objs0), (rss1, objs1) = samples[1], samples[-1]
    assert rss1 - rss0 < MAX_RSS_GROWTH, samples
    assert objs1 - objs0 < MAX_OBJECT_GROWTH, samples
