"""Memory stays flat while the native server runs a WSGI app for many requests.

One ferroloop loop runs the server (``HttpServer`` with a ``WsgiPool`` and two pool threads)
and the clients (asyncio streams, keep-alive). The requests cover each path of a WSGI call:
a list response, a generator (one hand-over per block), a body read through ``wsgi.input``,
the ``write()`` callable, an app error (500), and a client that leaves mid-response. RSS and
the number of gc-tracked objects are measured after each chunk; nothing may grow between the
second chunk (pools warm) and the last. A leaked call, environ, input buffer or callback per
request would add thousands of objects.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import ferroloop
from ferroloop._native import WsgiPool

CHUNKS = 6
CONNECTIONS_PER_CHUNK = 40
REQUESTS_PER_CONNECTION = 10
MAX_RSS_GROWTH = 8 * 1024 * 1024
MAX_OBJECT_GROWTH = 500


def app(environ, start_response):  # type: ignore[no-untyped-def]
    path = environ["PATH_INFO"]
    if path == "/echo":
        body = environ["wsgi.input"].read()
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return [body]
    if path == "/stream":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return (b"block %d\n" % i for i in range(20))
    if path == "/write":
        write = start_response("200 OK", [("Content-Type", "text/plain")])
        write(b"written;")
        return [b"returned"]
    if path == "/error":
        raise RuntimeError("expected by the leak test")
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"Hello, world!"]


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    if b"content-length:" in head.lower():
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        return head, await reader.readexactly(length)
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return head, body
        body += chunk[:-2]


async def one_connection(port: int, n: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for i in range(REQUESTS_PER_CONNECTION):
        kind = (n + i) % 5
        if kind == 0:
            payload = b"x" * (100 + 37 * i)
            writer.write(
                b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(payload)
                + payload
            )
            assert (await read_response(reader))[1] == payload
        elif kind == 1:
            writer.write(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
            assert (await read_response(reader))[1].count(b"\n") == 20
        elif kind == 2:
            writer.write(b"GET /write HTTP/1.1\r\nHost: t\r\n\r\n")
            assert (await read_response(reader))[1] == b"written;returned"
        elif kind == 3:
            writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            assert (await read_response(reader))[1] == b"Hello, world!"
        else:
            writer.write(b"GET /error HTTP/1.1\r\nHost: t\r\n\r\n")
            head, _ = await read_response(reader)
            assert head.startswith(b"HTTP/1.1 500 "), head
            break  # a 500 closes the connection
    if n % 4 == 0:
        # Leaves with a request in flight.
        writer.write(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
    writer.close()
    await writer.wait_closed()


async def churn(port: int) -> None:
    for start in range(0, CONNECTIONS_PER_CHUNK, 10):
        await asyncio.gather(*(one_connection(port, i) for i in range(start, start + 10)))


class CountingHandler(logging.Handler):
    """Counts the app errors the server logs, keeping no record (pytest's capture keeps every
    record with its traceback, which would look like a leak)."""

    def __init__(self) -> None:
        super().__init__()
        self.errors = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Exception in WSGI application"):
            self.errors += 1


def test_wsgi_requests_leave_memory_flat(server_churn_samples) -> None:
    logger = logging.getLogger("ferroloop.error")
    counter = CountingHandler()
    logger.addHandler(counter)
    propagate, logger.propagate = logger.propagate, False
    pool = WsgiPool(app)
    threads = [threading.Thread(target=pool.work, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()

    try:
        samples = ferroloop.run(server_churn_samples(pool, churn, CHUNKS))
    finally:
        logger.removeHandler(counter)
        logger.propagate = propagate
        pool.close()
        for thread in threads:
            thread.join(5)
    # Every connection ends with the app error (its fifth request at the latest).
    assert counter.errors == CHUNKS * CONNECTIONS_PER_CHUNK
    assert not any(thread.is_alive() for thread in threads)
    (rss0, objs0), (rss1, objs1) = samples[1], samples[-1]
    assert rss1 - rss0 < MAX_RSS_GROWTH, samples
    assert objs1 - objs0 < MAX_OBJECT_GROWTH, samples
