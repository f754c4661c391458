"""The websockets library, unchanged: its asyncio server and client (``websockets.asyncio``)."""

from __future__ import annotations

import hashlib
import random
import ssl
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect, unix_connect
from websockets.asyncio.server import ServerConnection, serve, unix_serve
from websockets.exceptions import ConnectionClosedError, ConnectionClosedOK


async def echo(websocket: ServerConnection) -> None:
    async for message in websocket:
        await websocket.send(message)


def url_of(server: Any) -> str:
    host, port = server.sockets[0].getsockname()[:2]
    return f"ws://{host}:{port}"


def test_echo_text_binary_and_ping(run) -> None:
    async def main() -> list[Any]:
        async with serve(echo, "127.0.0.1", 0) as server, connect(url_of(server)) as client:
            await client.send("héllo")
            text = await client.recv()
            await client.send(b"\x00\xff" * 500)
            binary = await client.recv()
            latency = await (await client.ping(b"ping data"))
            return [text, binary, latency >= 0]

    assert run(main()) == ["héllo", b"\x00\xff" * 500, True]


def test_echo_over_a_unix_socket(run, tmp_path: Path) -> None:
    path = str(tmp_path / "ws.sock")

    async def main() -> Any:
        async with (
            unix_serve(echo, path),
            unix_connect(path, uri="ws://localhost/") as client,
        ):
            await client.send("over unix")
            return await client.recv()

    assert run(main()) == "over unix"


def test_secure_websocket(run, tls_server: ssl.SSLContext, tls_client: ssl.SSLContext) -> None:
    async def main() -> tuple[Any, Any]:
        async with (
            serve(echo, "127.0.0.1", 0, ssl=tls_server) as server,
            connect(
                url_of(server).replace("ws://", "wss://"),
                ssl=tls_client,
                server_hostname="localhost",
            ) as client,
        ):
            await client.send("over TLS")
            cipher = client.transport.get_extra_info("cipher")
            return await client.recv(), cipher is not None

    assert run(main()) == ("over TLS", True)


def test_server_close_closes_open_connections_with_going_away(run, loop) -> None:
    connected = loop.create_future()

    async def idle(websocket: ServerConnection) -> None:
        connected.set_result(None)
        await websocket.wait_closed()

    async def main() -> tuple[Any, Any]:
        server = await serve(idle, "127.0.0.1", 0)
        async with connect(url_of(server)) as client:
            await connected
            server.close()
            await server.wait_closed()
            try:
                await client.recv()
            except ConnectionClosedOK as exc:
                return exc.rcvd.code, client.state.name
        raise AssertionError("recv() returned after the server closed")

    assert run(main()) == (1001, "CLOSED")


def test_large_message(run) -> None:
    payload = random.Random(5).randbytes(4 * 1024 * 1024)

    async def digest(websocket: ServerConnection) -> None:
        message = await websocket.recv()
        await websocket.send(hashlib.sha256(message).hexdigest())
        await websocket.send(message)

    async def main() -> tuple[Any, Any]:
        async with (
            serve(digest, "127.0.0.1", 0, max_size=None) as server,
            connect(url_of(server), max_size=None) as client,
        ):
            await client.send(payload)
            return await client.recv(), await client.recv()

    hexdigest, echoed = run(main())
    assert hexdigest == hashlib.sha256(payload).hexdigest()
    assert echoed == payload


def test_client_close_code_reaches_the_server(run, loop) -> None:
    received = loop.create_future()

    async def wait_for_close(websocket: ServerConnection) -> None:
        try:
            await websocket.recv()
        except ConnectionClosedError as exc:  # 4001 is not a normal closure (1000 or 1001)
            received.set_result((exc.rcvd.code, exc.rcvd.reason))

    async def main() -> tuple[Any, Any, Any]:
        async with serve(wait_for_close, "127.0.0.1", 0) as server:
            client = await connect(url_of(server))
            await client.close(code=4001, reason="client is done")
            return await received, client.close_code, client.close_reason

    assert run(main()) == ((4001, "client is done"), 4001, "client is done")


def test_server_closes_first(run) -> None:
    async def goodbye(websocket: ServerConnection) -> None:
        await websocket.send("last words")
        await websocket.close(code=1001, reason="going away")

    async def main() -> tuple[Any, Any, Any]:
        async with serve(goodbye, "127.0.0.1", 0) as server, connect(url_of(server)) as client:
            last = await client.recv()
            try:
                await client.recv()
            except ConnectionClosedOK as exc:
                return last, exc.rcvd.code, exc.rcvd.reason
            raise AssertionError("the second recv() returned")

    assert run(main()) == ("last words", 1001, "going away")


def test_keepalive_ping_timeout_when_the_client_stops_reading(run, loop) -> None:
    """The server's keepalive pings go unanswered while the client's transport is paused."""
    server_closed = loop.create_future()

    async def idle(websocket: ServerConnection) -> None:
        await websocket.wait_closed()
        sent = websocket.protocol.close_sent
        server_closed.set_result((sent.code, sent.reason, websocket.close_code))

    async def main() -> tuple[Any, Any]:
        async with (
            serve(
                idle, "127.0.0.1", 0, ping_interval=0.05, ping_timeout=0.05, close_timeout=0.1
            ) as server,
            connect(url_of(server), ping_interval=None) as client,
        ):
            client.transport.pause_reading()
            closed = await server_closed
            client.transport.resume_reading()
            try:
                await client.recv()
            except ConnectionClosedError as exc:
                return closed, exc.rcvd.code if exc.rcvd else None
            raise AssertionError("recv() returned on a connection the server failed")

    # The server sent 1011 and, the client never answering, saw no closing frame (1006).
    assert run(main()) == ((1011, "keepalive ping timeout", 1006), 1011)


def test_connection_refused(run, refused_address: tuple[str, int]) -> None:
    host, port = refused_address

    async def main() -> None:
        with pytest.raises(ConnectionRefusedError):
            await connect(f"ws://{host}:{port}/")

    run(main())
