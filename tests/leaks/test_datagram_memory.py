"""Memory stays flat while many endpoints go through ferroloop's native datagram transport.

Each chunk opens UDP endpoints that exchange datagrams with an echo endpoint and close or
abort, and Unix datagram endpoints whose sends block (the receiver reads only after the queue
has filled), so the core's queue and its writer are exercised too; then closes or aborts them
with datagrams still queued. RSS and gc-tracked objects are measured after each chunk; nothing
may grow between the second chunk (pools warm) and the last. A transport, core, protocol or
queued datagram kept alive per endpoint would add thousands of objects.
"""

from __future__ import annotations

import asyncio
import socket

import ferroloop

CHUNKS = 6
ENDPOINTS_PER_CHUNK = 150
DATAGRAMS_PER_ENDPOINT = 5
BLOCKED_ENDPOINTS_PER_CHUNK = 20
MAX_RSS_GROWTH = 8 * 1024 * 1024
MAX_OBJECT_GROWTH = 500


class Echo(asyncio.DatagramProtocol):
    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        self.transport.sendto(data, addr)


class Client(asyncio.DatagramProtocol):
    def __init__(self):
        loop = asyncio.get_running_loop()
        self.replies = asyncio.Queue()
        self.lost = loop.create_future()

    def connection_made(self, transport):
        self.transport = transport  # a transport <-> protocol cycle, as real protocols make

    def datagram_received(self, data, addr):
        self.replies.put_nowait(data)

    def connection_lost(self, exc):
        self.lost.set_result(exc)


async def udp_chunk(loop, server_addr):
    for index in range(ENDPOINTS_PER_CHUNK):
        connected = index % 2 == 0
        kwargs = {"remote_addr": server_addr} if connected else {"local_addr": ("127.0.0.1", 0)}
        transport, client = await loop.create_datagram_endpoint(Client, **kwargs)
        for i in range(DATAGRAMS_PER_ENDPOINT):
            message = b"datagram %d" % i
            transport.sendto(message, None if connected else server_addr)
            assert await client.replies.get() == message
        if index % 3 == 0:
            transport.abort()
        else:
            transport.close()
        await client.lost


async def blocked_chunk(loop, tmp_path):
    path = str(tmp_path / "receiver.sock")
    for index in range(BLOCKED_ENDPOINTS_PER_CHUNK):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
            receiver.bind(path)
            receiver.setblocking(False)
            sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sender.connect(path)
            transport, client = await loop.create_datagram_endpoint(Client, sock=sender)
            while not transport.get_write_buffer_size():
                transport.sendto(b"x" * 1024)
            for _ in range(10):
                transport.sendto(b"queued" * 100)
            if index % 2 == 0:
                transport.abort()
            else:
                transport.close()
            while not client.lost.done():  # read until the queue has drained
                try:
                    receiver.recv(4096)
                except BlockingIOError:
                    await asyncio.sleep(0.001)
            await client.lost
        socket_path = tmp_path / "receiver.sock"
        socket_path.unlink()


def test_native_datagram_endpoints_leave_memory_flat(tmp_path, memory_sample) -> None:
    async def main() -> list[tuple[int, int]]:
        loop = asyncio.get_running_loop()
        server, _ = await loop.create_datagram_endpoint(Echo, local_addr=("127.0.0.1", 0))
        server_addr = server.get_extra_info("sockname")
        samples = []
        try:
            for _ in range(CHUNKS):
                await udp_chunk(loop, server_addr)
                await blocked_chunk(loop, tmp_path)
                await asyncio.sleep(0)
                samples.append(memory_sample())
        finally:
            server.close()
        return samples

    samples = ferroloop.run(main())
    (rss0, objs0), (rss1, objs1) = samples[1], samples[-1]
    assert rss1 - rss0 < MAX_RSS_GROWTH, samples
    assert objs1 - objs0 < MAX_OBJECT_GROWTH, samples
