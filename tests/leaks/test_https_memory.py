"""Memory stays flat while the native HTTP server answers many requests over TLS.

The same churn as ``test_server_memory.py`` with TLS on (``tls_cert``/``tls_key``): keep-alive
requests with and without a body on one TLS connection, and connections that each make a full
handshake, send one ``Connection: close`` request, and close. Every connection owns a rustls
session, a ciphertext queue and a read buffer; a leak of any of them would add tens of KiB per
connection, megabytes per chunk. RSS and gc-tracked objects must not grow between the second
chunk and the last.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import ferroloop
import pytest

CHUNKS = 5
REQUESTS_PER_CHUNK = 2_000
CONNECTIONS_PER_CHUNK = 200
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


async def churn(port: int, client: ssl.SSLContext) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
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
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        writer.write(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        assert await read_response(reader) == b"hello"
        assert await reader.read() == b"", "the server closes after Connection: close"
        writer.close()
        await writer.wait_closed()


def test_tls_requests_and_connections_leave_memory_flat(server_churn_samples: Any) -> None:
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

    samples = ferroloop.run(
        server_churn_samples(app, lambda port: churn(port, client), CHUNKS, **options)
    )
    (rss0, objs0), (rss1, objs1) = samples[1], samples[-1]
    assert rss1 - rss0 < MAX_RSS_GROWTH, samples
    assert objs1 - objs0 < MAX_OBJECT_GROWTH, samples
