"""Memory stays flat while many connections go through ferroloop's native stream transports.

One loop runs an echo server (a Protocol on TCP, a BufferedProtocol on a Unix socket) and
clients that connect, exchange messages (small ones, and ones large enough to be queued and
flushed by the writer), and close, or abort with bytes still queued. RSS and the number of
gc-tracked objects are measured after each chunk; nothing may grow between the second chunk
(pools warm) and the last. A transport, core or protocol kept alive per connection would add
thousands of objects; a read buffer per connection, megabytes.
"""

from __future__ import annotations

import asyncio

import ferroloop

CHUNKS = 6
CONNECTIONS_PER_CHUNK = 200
MESSAGES_PER_CONNECTION = 5
BIG = bytes(range(256)) * 1024  # 256 KiB: more than one write and one read
MAX_RSS_GROWTH = 8 * 1024 * 1024
MAX_OBJECT_GROWTH = 500


class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)


class BufferedEcho(asyncio.BufferedProtocol):
    def __init__(self):
        self.buffer = bytearray(16 * 1024)

    def connection_made(self, transport):
        self.transport = transport

    def get_buffer(self, sizehint):
        return self.buffer

    def buffer_updated(self, nbytes):
        self.transport.write(memoryview(self.buffer)[:nbytes])


async def exchange(reader, writer, index):
    for i in range(MESSAGES_PER_CONNECTION):
        message = BIG if (index + i) % 4 == 0 else b"ping %d\n" % i
        writer.write(message)
        assert await reader.readexactly(len(message)) == message
    if index % 3 == 0:
        writer.write(BIG)
        writer.transport.abort()  # with bytes still queued
    else:
        writer.close()
    await writer.wait_closed()


async def churn(connect):
    for index in range(CONNECTIONS_PER_CHUNK):
        reader, writer = await connect()
        await exchange(reader, writer, index)


def test_native_transport_connections_leave_memory_flat(tmp_path, memory_sample) -> None:
    async def main() -> list[tuple[int, int]]:
        loop = asyncio.get_running_loop()
        tcp = await loop.create_server(Echo, "127.0.0.1", 0)
        path = str(tmp_path / "echo.sock")
        unix = await loop.create_unix_server(BufferedEcho, path)
        port = tcp.sockets[0].getsockname()[1]
        samples = []
        try:
            for _ in range(CHUNKS):
                await churn(lambda: asyncio.open_connection("127.0.0.1", port))
                await churn(lambda: asyncio.open_unix_connection(path))
                await asyncio.sleep(0)
                samples.append(memory_sample())
        finally:
            tcp.close()
            unix.close()
            await tcp.wait_closed()
            await unix.wait_closed()
        return samples

    samples = ferroloop.run(main())
    (rss0, objs0), (rss1, objs1) = samples[1], samples[-1]
    assert rss1 - rss0 < MAX_RSS_GROWTH, samples
    assert objs1 - objs0 < MAX_OBJECT_GROWTH, samples
