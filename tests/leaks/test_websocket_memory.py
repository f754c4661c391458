"""Memory stays flat while the native server handles many WebSocket connections.

One ferroloop loop runs both the server (``HttpServer`` with an echo app) and the clients (asyncio
streams speaking RFC 6455 by hand): each connection does the handshake, echoes text and binary
messages (every other connection compressed with permessage-deflate, so each has a compressor
and an inflater), and ends with a close exchange, a dropped socket, or a protocol error. RSS and the
number of gc-tracked objects are measured after each chunk; nothing may grow between the
second chunk (pools warm) and the last. A leaked session, inbox or decoder buffer per connection
would add thousands of objects or megabytes.
"""

from __future__ import annotations

import asyncio
import os
import struct
import zlib

import ferroloop

CHUNKS = 6
CONNECTIONS_PER_CHUNK = 150
MESSAGES_PER_CONNECTION = 8
MAX_RSS_GROWTH = 8 * 1024 * 1024
MAX_OBJECT_GROWTH = 500
UPGRADE = (
    b"GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)
DEFLATE_OFFER = b"Sec-WebSocket-Extensions: permessage-deflate\r\n"
TAIL = b"\x00\x00\xff\xff"


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    assert scope["type"] == "websocket"
    assert (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        await send({"type": "websocket.send", **{k: v for k, v in message.items() if k != "type"}})


def frame(opcode: int, payload: bytes, rsv1: bool = False) -> bytes:
    key = os.urandom(4)
    length = len(payload)
    first = 0x80 | (0x40 if rsv1 else 0) | opcode
    if length < 126:
        head = bytes([first, 0x80 | length])
    else:
        head = bytes([first, 0x80 | 126]) + struct.pack("!H", length)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


async def read_frame(
    reader: asyncio.StreamReader, inflater: zlib._Decompress | None = None
) -> tuple[int, bytes]:
    first, second = await reader.readexactly(2)
    length = second & 0x7F
    if length == 126:
        (length,) = struct.unpack("!H", await reader.readexactly(2))
    payload = await reader.readexactly(length)
    if first & 0x40:
        assert inflater is not None, "a compressed frame that was not negotiated"
        payload = inflater.decompress(payload + TAIL)
    return first & 0x0F, payload


async def one_connection(port: int, ending: int, compress: bool) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(UPGRADE + (DEFLATE_OFFER if compress else b"") + b"\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 "), head
    assert (b"permessage-deflate" in head) == compress, head
    deflater = zlib.compressobj(wbits=-15) if compress else None
    inflater = zlib.decompressobj(wbits=-15) if compress else None

    def data_frame(opcode: int, payload: bytes) -> bytes:
        if deflater is None:
            return frame(opcode, payload)
        packed = deflater.compress(payload) + deflater.flush(zlib.Z_SYNC_FLUSH)
        return frame(opcode, packed[: -len(TAIL)], rsv1=True)

    for i in range(MESSAGES_PER_CONNECTION):
        if i % 2:
            payload = b"\x00binary" * (i * 40)
            writer.write(data_frame(0x2, payload))
            assert await read_frame(reader, inflater) == (0x2, payload)
        else:
            text = f"text message {i} é".encode()
            writer.write(data_frame(0x1, text))
            assert await read_frame(reader, inflater) == (0x1, text)
    if ending == 0:  # a close exchange
        writer.write(frame(0x8, struct.pack("!H", 1000)))
        opcode, _ = await read_frame(reader)
        assert opcode == 0x8
        assert await reader.read() == b""
    elif ending == 1:  # a protocol error: an unmasked frame
        writer.write(b"\x81\x02hi")
        opcode, payload = await read_frame(reader)
        assert (opcode, payload[:2]) == (0x8, struct.pack("!H", 1002))
    writer.close()  # ending 2: dropped without a close frame
    await writer.wait_closed()


async def churn(port: int) -> None:
    for start in range(0, CONNECTIONS_PER_CHUNK, 10):
        await asyncio.gather(
            *(one_connection(port, i % 3, i % 2 == 1) for i in range(start, start + 10))
        )


def test_websocket_connections_leave_memory_flat(server_churn_samples) -> None:

    samples = ferroloop.run(server_churn_samples(app, churn, CHUNKS))
    (rss0, objs0), (rss1, objs1) = samples[1], samples[-1]
    assert rss1 - rss0 < MAX_RSS_GROWTH, samples
    assert objs1 - objs0 < MAX_OBJECT_GROWTH, samples
