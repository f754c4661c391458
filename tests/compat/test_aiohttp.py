"""aiohttp, unchanged: its web server (TCP, Unix and TLS sites) and its client against it.

Each case starts an ``aiohttp.web`` application with ``AppRunner`` on the loop under test and
drives it with ``aiohttp.ClientSession`` on the same loop, so both halves of the library use
the loop's transports, timers and cancellation.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import random
import signal
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

# run_app blocks until its loop stops; a stop scheduled this far ahead fails a run that hangs.
RUN_APP_BOUND = 10.0


async def double(request: web.Request) -> web.Response:
    body = await request.json()
    return web.json_response({"doubled": [2 * n for n in body["numbers"]], "path": request.path})


def json_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/double", double)
    return app


def test_json_round_trip(run, serve_app) -> None:
    async def main() -> tuple[int, Any]:
        url = await serve_app(json_app())
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/double", json={"numbers": [1, 2, 3]}) as response,
        ):
            return response.status, await response.json()

    assert run(main()) == (200, {"doubled": [2, 4, 6], "path": "/double"})


def test_unix_site(run, serve_app, tmp_path: Path) -> None:
    path = tmp_path / "aiohttp.sock"

    async def main() -> tuple[int, Any]:
        url = await serve_app(json_app(), unix_path=path)
        connector = aiohttp.UnixConnector(path=str(path))
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.post(f"{url}/double", json={"numbers": [21]}) as response,
        ):
            return response.status, await response.json()

    assert run(main()) == (200, {"doubled": [42], "path": "/double"})


def test_https_with_a_certificate_made_at_test_time(
    run, serve_app, tls_server: ssl.SSLContext, tls_client: ssl.SSLContext
) -> None:
    async def main() -> tuple[Any, type[BaseException]]:
        url = await serve_app(json_app(), ssl_context=tls_server)
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{url}/double", json={"numbers": [5]}, ssl=tls_client
            ) as response:
                body = await response.json()
            # The default context does not trust the throwaway CA.
            with pytest.raises(aiohttp.ClientConnectorCertificateError) as refused:
                await session.post(f"{url}/double", json={"numbers": [5]})
        return body, type(refused.value.certificate_error)

    body, certificate_error = run(main())
    assert body == {"doubled": [10], "path": "/double"}
    assert issubclass(certificate_error, ssl.SSLCertVerificationError)


def test_streamed_response_read_in_chunks(run, serve_app) -> None:
    parts = [bytes([n]) * (1000 + n) for n in range(200)]

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for part in parts:
            await response.write(part)
        await response.write_eof()
        return response

    async def main() -> tuple[str | None, list[bytes]]:
        app = web.Application()
        app.router.add_get("/stream", stream)
        url = await serve_app(app)
        async with aiohttp.ClientSession() as session, session.get(f"{url}/stream") as response:
            chunks = [chunk async for chunk in response.content.iter_chunked(4096)]
            return response.headers.get("Transfer-Encoding"), chunks

    transfer_encoding, chunks = run(main())
    assert transfer_encoding == "chunked"
    assert all(0 < len(chunk) <= 4096 for chunk in chunks)
    assert b"".join(chunks) == b"".join(parts)


def test_large_streamed_upload_checked_by_hash(run, serve_app) -> None:
    payload = random.Random(3).randbytes(8 * 1024 * 1024)

    async def upload(request: web.Request) -> web.Response:
        digest = hashlib.sha256()
        size = 0
        async for chunk in request.content.iter_chunked(64 * 1024):
            digest.update(chunk)
            size += len(chunk)
        return web.json_response({"size": size, "sha256": digest.hexdigest()})

    async def body() -> AsyncIterator[bytes]:
        for start in range(0, len(payload), 100_000):
            yield payload[start : start + 100_000]

    async def main() -> Any:
        app = web.Application(client_max_size=len(payload))
        app.router.add_post("/upload", upload)
        url = await serve_app(app)
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/upload", data=body()) as response,
        ):
            return await response.json()

    assert run(main()) == {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}


def test_concurrent_requests_share_keep_alive_connections(run, serve_app) -> None:
    peers: set[Any] = set()

    async def echo(request: web.Request) -> web.Response:
        peers.add(request.transport.get_extra_info("peername"))
        await asyncio.sleep(0)
        return web.Response(text=request.match_info["n"])

    async def main() -> list[str]:
        app = web.Application()
        app.router.add_get("/echo/{n}", echo)
        url = await serve_app(app)
        connector = aiohttp.TCPConnector(limit=4)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def fetch(n: int) -> str:
                async with session.get(f"{url}/echo/{n}") as response:
                    return await response.text()

            return await asyncio.gather(*(fetch(n) for n in range(200)))

    assert run(main()) == [str(n) for n in range(200)]
    assert 1 <= len(peers) <= 4


def test_server_side_timeout_on_a_stalled_upload(run, serve_app) -> None:
    seen: list[BaseException] = []

    async def impatient(request: web.Request) -> web.Response:
        try:
            async with asyncio.timeout(0.2):
                await request.read()
        except TimeoutError as exc:
            seen.append(exc)
            return web.Response(status=408, text="request body too slow")
        return web.Response(text="complete")

    async def stalled_body() -> AsyncIterator[bytes]:
        yield b"first part, and then nothing"
        await asyncio.Event().wait()

    async def main() -> tuple[int, str]:
        app = web.Application()
        app.router.add_post("/upload", impatient)
        url = await serve_app(app)
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/upload", data=stalled_body()) as response,
        ):
            return response.status, await response.text()

    assert run(main()) == (408, "request body too slow")
    assert [type(exc) for exc in seen] == [TimeoutError]


def test_client_side_timeout_and_the_server_sees_the_disconnect(run, serve_app, loop) -> None:
    handler_cancelled = loop.create_future()

    async def never(request: web.Request) -> web.Response:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            handler_cancelled.set_result(True)
            raise
        raise AssertionError("unreachable")

    async def main() -> bool:
        app = web.Application()
        app.router.add_get("/never", never)
        url = await serve_app(app, handler_cancellation=True)
        timeout = aiohttp.ClientTimeout(total=0.2)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            with pytest.raises(TimeoutError):
                await session.get(f"{url}/never")
        return await handler_cancelled

    assert run(main()) is True


def test_client_disconnects_mid_response(run, serve_app, loop) -> None:
    server_error = loop.create_future()
    part = b"x" * 65536

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        try:
            while True:
                await response.write(part)
        except Exception as exc:
            server_error.set_result(exc)
            raise

    async def main() -> tuple[bytes, BaseException]:
        app = web.Application()
        app.router.add_get("/endless", endless)
        url = await serve_app(app)
        async with aiohttp.ClientSession() as session:
            response = await session.get(f"{url}/endless")
            first = await response.content.readexactly(len(part))
            response.close()  # drops the connection with the body unread
        return first, await server_error

    first, error = run(main())
    assert first == part
    assert isinstance(error, ConnectionError)


def test_websocket_echo_text_binary_ping_and_close(run, serve_app, loop) -> None:
    server_close_code = loop.create_future()

    async def echo(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            if message.type == aiohttp.WSMsgType.TEXT:
                await ws.send_str(message.data.upper())
            elif message.type == aiohttp.WSMsgType.BINARY:
                await ws.send_bytes(message.data[::-1])
        server_close_code.set_result(ws.close_code)
        return ws

    async def main() -> list[Any]:
        app = web.Application()
        app.router.add_get("/ws", echo)
        url = await serve_app(app)
        results: list[Any] = []
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(f"{url}/ws", autoping=False) as ws,
        ):
            await ws.send_str("hello")
            results.append(await ws.receive_str())
            await ws.send_bytes(b"\x00\x01\x02" * 1000)
            results.append(await ws.receive_bytes())
            await ws.ping(b"are you there")
            pong = await ws.receive()
            results.append((pong.type, pong.data))
            await ws.close(code=4000, message=b"done")
            results.append(ws.close_code)  # the code of the server's closing reply
        results.append(await server_close_code)
        return results

    assert run(main()) == [
        "HELLO",
        b"\x02\x01\x00" * 1000,
        (aiohttp.WSMsgType.PONG, b"are you there"),
        aiohttp.WSCloseCode.OK,
        4000,
    ]


@pytest.mark.parametrize("tls", [False, True], ids=["sendfile", "tls-fallback"])
def test_file_response(
    run,
    serve_app,
    tmp_path: Path,
    tls: bool,
    tls_server: ssl.SSLContext,
    tls_client: ssl.SSLContext,
) -> None:
    """FileResponse hands the file to ``loop.sendfile`` (plain TCP) or reads it (TLS)."""
    payload = random.Random(9).randbytes(5 * 1024 * 1024 + 17)
    path = tmp_path / "payload.bin"
    path.write_bytes(payload)

    async def file(request: web.Request) -> web.FileResponse:
        return web.FileResponse(path)

    async def main() -> tuple[str | None, str]:
        app = web.Application()
        app.router.add_get("/file", file)
        url = await serve_app(app, ssl_context=tls_server if tls else None)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{url}/file", ssl=tls_client if tls else True) as response,
        ):
            digest = hashlib.sha256()
            async for chunk in response.content.iter_chunked(256 * 1024):
                digest.update(chunk)
            return response.headers.get("Content-Length"), digest.hexdigest()

    assert run(main()) == (str(len(payload)), hashlib.sha256(payload).hexdigest())


def test_slow_reader_of_a_large_response(run, serve_app) -> None:
    """The client stops reading; the server's writes wait on flow control, then all arrive."""
    payload = random.Random(13).randbytes(6 * 1024 * 1024)

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=payload)

    async def main() -> bytes:
        app = web.Application()
        app.router.add_get("/big", big)
        url = await serve_app(app)
        async with aiohttp.ClientSession() as session, session.get(f"{url}/big") as response:
            received = bytearray()
            while chunk := await response.content.read(32 * 1024):
                received += chunk
                if len(received) % (1024 * 1024) < 32 * 1024:
                    await asyncio.sleep(0.01)  # let the buffers fill and flow control act
            return bytes(received)

    assert run(main()) == payload


def test_keep_alive_connection_closed_by_the_server_is_replaced(run, serve_app) -> None:
    peers: list[Any] = []

    async def hello(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername"))
        return web.Response(text="hello")

    async def main() -> list[str]:
        app = web.Application()
        app.router.add_get("/", hello)
        url = await serve_app(app, keepalive_timeout=0.05)
        texts = []
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                async with session.get(url) as response:
                    texts.append(await response.text())
                await asyncio.sleep(0.3)  # past the server's keep-alive timeout
        return texts

    assert run(main()) == ["hello", "hello"]
    assert len(set(peers)) == 2


def test_client_resolves_localhost_and_falls_back_across_addresses(run, serve_app) -> None:
    """aiohappyeyeballs tries each address of 'localhost' with ``loop.sock_connect``."""

    async def main() -> str:
        url = await serve_app(json_app())  # on 127.0.0.1 only; ::1 is refused if tried
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                url.replace("127.0.0.1", "localhost") + "/double", json={"numbers": [4]}
            ) as response,
        ):
            return await response.text()

    assert run(main()) == '{"doubled": [8], "path": "/double"}'


def test_https_through_a_connect_proxy_upgrades_with_start_tls(
    run, serve_app, tls_server: ssl.SSLContext, tls_client: ssl.SSLContext
) -> None:
    """Through a CONNECT tunnel, aiohttp upgrades the proxy connection with ``loop.start_tls``."""
    tunnels: list[bytes] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            writer.write_eof()
        except ConnectionError:
            writer.close()

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        tunnels.append(head.split(b"\r\n", 1)[0])
        host, port = head.split(b" ")[1].decode().rsplit(":", 1)
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        async with asyncio.TaskGroup() as tg:
            tg.create_task(pipe(reader, upstream_writer))
            tg.create_task(pipe(upstream_reader, writer))
        upstream_writer.close()
        writer.close()

    async def main() -> Any:
        url = await serve_app(json_app(), ssl_context=tls_server)
        server = await asyncio.start_server(proxy, "127.0.0.1", 0)
        host, port = server.sockets[0].getsockname()
        async with (
            server,
            aiohttp.ClientSession() as session,
            session.post(
                f"{url}/double",
                json={"numbers": [7]},
                ssl=tls_client,
                proxy=f"http://{host}:{port}",
            ) as response,
        ):
            return await response.json()

    assert run(main()) == {"doubled": [14], "path": "/double"}
    assert len(tunnels) == 1
    assert tunnels[0].startswith(b"CONNECT 127.0.0.1:")


def test_connection_refused(run, refused_address: tuple[str, int]) -> None:
    host, port = refused_address

    async def main() -> tuple[type[BaseException], int | None]:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientConnectorError) as refused:
                await session.get(f"http://{host}:{port}/")
        return type(refused.value.os_error), refused.value.os_error.errno

    assert run(main()) == (ConnectionRefusedError, errno.ECONNREFUSED)


def test_run_app_stops_gracefully_on_sigterm(loop) -> None:
    """``web.run_app`` on the loop under test: SIGTERM raises GracefulExit from the loop's
    signal handler, and run_app cleans up, cancels what is left and closes the loop (the
    ``loop`` fixture then checks that closing gave the signal handlers back)."""
    served: list[str] = []
    listening = socket.create_server(("127.0.0.1", 0))
    host, port = listening.getsockname()

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    async def client() -> None:
        async with aiohttp.ClientSession() as session, session.get(f"http://{host}:{port}/") as r:
            served.append(await r.text())
        os.kill(os.getpid(), signal.SIGTERM)

    app = web.Application()
    app.router.add_get("/", hello)
    loop.create_task(client())
    loop.call_later(RUN_APP_BOUND, loop.stop)  # run_app then raises RuntimeError
    with listening:
        web.run_app(app, sock=listening, loop=loop, print=None, shutdown_timeout=1.0)
    assert served == ["hello"]
    assert loop.is_closed()
