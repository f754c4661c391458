"""Fixtures for the transport tests: recording protocols, ports and TLS contexts.

Everything listens on 127.0.0.1 (or a Unix path under ``tmp_path``) and every await is
bounded by the timeout of ``run`` (tests/conftest.py), so a loop that never delivers an event
fails the test with ``TimeoutError`` instead of hanging until the per-test timeout.

Helpers are handed out as fixtures (``run``, ``recorder``, ``tcp_echo``...) rather than
imported, so the test files stay independent of how pytest puts directories on sys.path.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import weakref
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest


class RecordingProtocol(asyncio.Protocol):
    """Records every callback in order; futures mark connection_made, eof and connection_lost.

    ``events`` holds the callback names in call order (consecutive data_received calls are
    recorded once each, so use ``milestones()`` to compare orders regardless of chunking).
    ``keep_open_on_eof`` is what eof_received returns.
    """

    keep_open_on_eof: bool | None = None

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.events: list[str] = []
        self.transport: Any = None
        self.received = bytearray()
        self.lost_exc: BaseException | None = None
        self.made = loop.create_future()
        self.eof = loop.create_future()
        self.lost = loop.create_future()
        self._data_waiters: list[tuple[int, asyncio.Future[None]]] = []

    def milestones(self) -> list[str]:
        """``events`` with runs of data_received collapsed into one entry."""
        collapsed: list[str] = []
        for event in self.events:
            if not (event == "data_received" and collapsed and collapsed[-1] == event):
                collapsed.append(event)
        return collapsed

    async def received_at_least(self, size: int) -> bytes:
        """Wait until ``size`` bytes have arrived; return everything received so far."""
        if len(self.received) < size:
            waiter = asyncio.get_running_loop().create_future()
            self._data_waiters.append((size, waiter))
            await waiter
        return bytes(self.received)

    def connection_made(self, transport: Any) -> None:
        self.events.append("connection_made")
        self.transport = transport
        self.made.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.events.append("data_received")
        self.received += data
        for size, waiter in list(self._data_waiters):
            if len(self.received) >= size and not waiter.done():
                waiter.set_result(None)
                self._data_waiters.remove((size, waiter))

    def eof_received(self) -> bool | None:
        self.events.append("eof_received")
        self.eof.set_result(None)
        return self.keep_open_on_eof

    def pause_writing(self) -> None:
        self.events.append("pause_writing")

    def resume_writing(self) -> None:
        self.events.append("resume_writing")

    def connection_lost(self, exc: BaseException | None) -> None:
        self.events.append("connection_lost")
        self.lost_exc = exc
        for _, waiter in self._data_waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionError("connection lost before the data arrived"))
        self.lost.set_result(None)


@pytest.fixture
def recorder() -> type[RecordingProtocol]:
    """The RecordingProtocol class (subclass it in a test to add behaviour)."""
    return RecordingProtocol


class BufferedRecordingProtocol(asyncio.BufferedProtocol):
    """A ``BufferedProtocol`` that lends one buffer of ``buffer_size`` bytes and keeps what
    arrives in ``received``; ``calls`` counts ``buffer_updated``. Futures as RecordingProtocol's
    ``made`` and ``lost``."""

    buffer_size = 1000

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.buffer = bytearray(self.buffer_size)
        self.received = bytearray()
        self.calls = 0
        self.transport: Any = None
        self.made = loop.create_future()
        self.lost = loop.create_future()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.made.set_result(None)

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.calls += 1
        self.received += self.buffer[:nbytes]

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost.set_result(exc)


@pytest.fixture
def buffered_recorder() -> type[BufferedRecordingProtocol]:
    """The BufferedRecordingProtocol class (subclass it in a test to add behaviour)."""
    return BufferedRecordingProtocol


@pytest.fixture
def pipe():
    """(read file, write file) of an os.pipe(), unbuffered; closed at teardown if still open."""
    read_fd, write_fd = os.pipe()
    reader = os.fdopen(read_fd, "rb", buffering=0)
    writer = os.fdopen(write_fd, "wb", buffering=0)
    with reader, writer:
        yield reader, writer


class TcpEndpoints:
    """A server made by ``create_server`` and the client and server protocols of one connection."""

    def __init__(self, server: asyncio.Server, client: Any, accepted: Any) -> None:
        self.server = server
        self.client = client
        self.accepted = accepted

    async def close(self) -> None:
        """Close the client transport and wait until both sides have lost the connection."""
        self.client.transport.close()
        await self.client.lost
        await self.accepted.lost


# Upper bound for closing the servers of ``tcp_connect`` at teardown (milliseconds on loopback).
TEARDOWN_TIMEOUT = 10.0


@pytest.fixture
def tcp_connect(loop) -> Callable[..., Coroutine[Any, Any, TcpEndpoints]]:
    """``await tcp_connect(server_cls, client_cls, server_ssl=None, **client_kwargs)``.

    Starts a server on 127.0.0.1, connects one client and waits until both sides have seen
    connection_made. The server is closed at teardown. The transports are the test's to close;
    a test that failed before closing them leaves them open, and from 3.12
    ``Server.wait_closed()`` waits for every connection, so the teardown aborts what is still
    open and bounds the wait: a failed test must not hang the run.
    """
    servers: list[asyncio.Server] = []
    # The protocols of each connection, weakly: tests check that closed ones are collected.
    made: list[weakref.ref[Any]] = []

    async def connect(
        server_cls: type, client_cls: type, *, server_ssl: Any = None, **client_kwargs: Any
    ) -> TcpEndpoints:
        accepted: asyncio.Future[Any] = loop.create_future()

        def server_factory() -> Any:
            protocol = server_cls()
            if not accepted.done():  # the first connection is the one handed back
                accepted.set_result(protocol)
            return protocol

        server = await loop.create_server(server_factory, "127.0.0.1", 0, ssl=server_ssl)
        servers.append(server)
        _, client = await loop.create_connection(
            client_cls, *server.sockets[0].getsockname(), **client_kwargs
        )
        server_protocol = await accepted
        await server_protocol.made
        made.extend(weakref.ref(protocol) for protocol in (client, server_protocol))
        return TcpEndpoints(server, client, server_protocol)

    yield connect

    async def close_servers() -> None:
        for ref in made:
            transport = getattr(ref(), "transport", None)
            if transport is not None and not transport.is_closing():
                transport.abort()
        async with asyncio.timeout(TEARDOWN_TIMEOUT):
            for server in servers:
                server.close()
                await server.wait_closed()

    if not loop.is_closed():
        loop.run_until_complete(close_servers())


# -- TLS ------------------------------------------------------------------------------------

# CPython's test suite ships its certificates: keycert3.pem is a certificate for "localhost"
# (valid until 2037) signed by the test CA in pycacert.pem.


@pytest.fixture(scope="session")
def certdata() -> Path:
    try:
        import test
    except ImportError:  # pragma: no cover - a Python built without its test suite
        pytest.skip("CPython's test package (and its certificates) is not installed")
    path = Path(test.__file__).parent / "certdata"
    if not (path / "keycert3.pem").exists():  # pragma: no cover
        pytest.skip(f"CPython's test certificates are missing from {path}")
    return path


@pytest.fixture
def server_ssl(certdata: Path) -> ssl.SSLContext:
    """A server context presenting the 'localhost' certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certdata / "keycert3.pem")
    return context


@pytest.fixture
def client_ssl(certdata: Path) -> ssl.SSLContext:
    """A client context that trusts the test CA and checks the host name."""
    return ssl.create_default_context(cafile=str(certdata / "pycacert.pem"))
