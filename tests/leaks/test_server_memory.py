"""Memory stays flat while the native HTTP server answers many requests.

One ferroloop loop runs both the server (``HttpServer`` on a listening socket) and the clients
(asyncio streams): keep-alive requests with and without a body, and connections that are
opened, used once and closed. RSS and the number of gc-tracked objects are measured after each
chunk; nothing may grow between the second chunk (pools warm) and the last. A leak of one
object per request would add thousands of objects; of one connection buffer, megabytes.

The same churn runs over TLS (``tls_cert``/``tls_key``), each short connection making a full
handshake: every TLS connection also owns a rustls session and a ciphertext queue.
"""

from __future__ import annotations

import asyncio
import ssl

import ferroloop
import pytest

CHUNKS = 6
REQUESTS_PER_CHUNK = 3_000
CONNECTIONS_PER_CHUNK = 300
MAX_RSS_GROWTH = 8 * 1024 * 1024
MAX_OBJECT_GROWTH = 500


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body or b"hello"})


async def read_response(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return await reader.readexactly(length)


async def churn(port: int, tls: ssl.SSLContext | None = None) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    for i in range(REQUESTS_PER_CHUNK):
        if i % 2:
            writer.write(b"POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nabcde")
            assert await read_response(reader) == b"abcde"
        else:
            writer.write(b"GET /g?x=1 HTTP/1.1\r\nHost: t\r\n\r\n")
            assert await read_response(reader) == b"hello"
    writer.close()
    await writer.wait_closed()
    for _ in range(CONNECTIONS_PER_CHUNK):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
        writer.write(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        assert await read_response(reader) == b"hello"
        assert await reader.read() == b"", "the server closes after Connection: close"
        writer.close()
        await writer.wait_closed()


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_server_requests_and_connections_leave_memory_flat(
    memory_sample, native_server, scheme
) -> None:
    options: dict[str, object] = {}
    client = None
    if scheme == "https":
        trustme = pytest.importorskip("trustme")
        ca = trustme.CA()
        leaf = ca.issue_cert("127.0.0.1")
        client = ssl.create_default_context()
        ca.configure_trust(client)
        options = {
            "tls_cert": b"".join(pem.bytes() for pem in leaf.cert_chain_pems),
            "tls_key": leaf.private_key_pem.bytes(),
            "scheme": "https",
        }

    async def main() -> list[tuple[int, int]]:
        samples = []
        async with native_server(app, **options) as (server, port):
            for _ in range(CHUNKS):
                await churn(port, client)
                samples.append(memory_sample())
        assert server.requests == CHUNKS * (REQUESTS_PER_CHUNK + CONNECTIONS_PER_CHUNK)
        return samples

    samples = ferroloop.run(main())
    (rss0, objs0), (rss1, objs1) = samples[1], samples[-1]
    assert rss1 - rss0 < MAX_RSS_GROWTH, samples
    assert objs1 - objs0 < MAX_OBJECT_GROWTH, samples
