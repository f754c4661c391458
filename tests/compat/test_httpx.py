"""httpx's ``AsyncClient`` (httpcore over h11, anyio's asyncio backend) on the loop under test.

The servers are an ``aiohttp.web`` application and a raw ``asyncio.start_server`` one.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web


def test_keep_alive_connection_is_reused(run, serve_app) -> None:
    peers: list[Any] = []

    async def whoami(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername"))
        return web.Response(text=request.query["n"])

    async def main() -> list[str]:
        app = web.Application()
        app.router.add_get("/", whoami)
        url = await serve_app(app)
        async with httpx.AsyncClient(base_url=url) as client:
            return [(await client.get("/", params={"n": n})).text for n in range(20)]

    assert run(main()) == [str(n) for n in range(20)]
    assert len(peers) == 20
    assert len(set(peers)) == 1


def test_https_against_a_tls_site(
    run, serve_app, tls_server: ssl.SSLContext, tls_client: ssl.SSLContext
) -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"secure": request.secure})

    async def main() -> tuple[Any, list[type[BaseException]]]:
        app = web.Application()
        app.router.add_get("/", hello)
        url = await serve_app(app, ssl_context=tls_server)
        async with httpx.AsyncClient(verify=tls_client) as client:
            body = (await client.get(url)).json()
        async with httpx.AsyncClient() as untrusting:  # the default CAs
            with pytest.raises(httpx.ConnectError) as refused:
                await untrusting.get(url)
        chain: list[type[BaseException]] = []
        exc: BaseException | None = refused.value
        while exc is not None:
            chain.append(type(exc))
            exc = exc.__cause__ or exc.__context__
        return body, chain

    body, chain = run(main())
    assert body == {"secure": True}
    assert ssl.SSLCertVerificationError in chain, chain


def test_streamed_download_and_upload(run, serve_app) -> None:
    payload = random.Random(7).randbytes(3 * 1024 * 1024)

    async def download(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for start in range(0, len(payload), 50_000):
            await response.write(payload[start : start + 50_000])
        await response.write_eof()
        return response

    async def upload(request: web.Request) -> web.Response:
        digest = hashlib.sha256()
        async for chunk in request.content.iter_any():
            digest.update(chunk)
        return web.Response(text=digest.hexdigest())

    async def body() -> AsyncIterator[bytes]:
        for start in range(0, len(payload), 70_000):
            yield payload[start : start + 70_000]

    async def main() -> tuple[bytes, str]:
        app = web.Application(client_max_size=len(payload))
        app.router.add_get("/download", download)
        app.router.add_post("/upload", upload)
        url = await serve_app(app)
        async with httpx.AsyncClient(base_url=url) as client:
            async with client.stream("GET", "/download") as response:
                downloaded = b"".join([chunk async for chunk in response.aiter_bytes()])
            uploaded = await client.post("/upload", content=body())
            return downloaded, uploaded.text

    downloaded, upload_digest = run(main())
    assert downloaded == payload
    assert upload_digest == hashlib.sha256(payload).hexdigest()


def test_raw_asyncio_server_body_delimited_by_close(run) -> None:
    """An HTTP/1.0-style response without Content-Length ends when the server closes."""
    body = b"".join(b"line %d\n" % n for n in range(5000))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
        for start in range(0, len(body), 8192):
            writer.write(body[start : start + 8192])
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def main() -> tuple[int, bytes]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        host, port = server.sockets[0].getsockname()
        async with server, httpx.AsyncClient() as client:
            response = await client.get(f"http://{host}:{port}/")
            return response.status_code, response.content

    assert run(main()) == (200, body)


def test_read_timeout(run) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client gives up and closes
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        host, port = server.sockets[0].getsockname()
        async with server, httpx.AsyncClient(timeout=httpx.Timeout(5, read=0.2)) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.get(f"http://{host}:{port}/")

    run(main())


def test_connection_refused(run, refused_address: tuple[str, int]) -> None:
    host, port = refused_address

    async def main() -> None:
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://{host}:{port}/")

    run(main())
