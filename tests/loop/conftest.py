"""Socket fixtures for the sock_* tests; every socket is non-blocking and closed at teardown."""

from __future__ import annotations

import inspect
import socket
from collections.abc import Callable, Iterator

import pytest


@pytest.fixture
def unix_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected, non-blocking AF_UNIX stream socketpair."""
    left, right = socket.socketpair()
    left.setblocking(False)
    right.setblocking(False)
    with left, right:
        yield left, right


@pytest.fixture
def tcp_listener() -> Iterator[socket.socket]:
    """A non-blocking TCP socket listening on 127.0.0.1 (ephemeral port)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.setblocking(False)
        yield listener


@pytest.fixture
def tcp_pair(tcp_listener: socket.socket) -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected, non-blocking TCP pair over 127.0.0.1: (client, server side)."""
    client = socket.create_connection(tcp_listener.getsockname())
    tcp_listener.setblocking(True)
    server, _ = tcp_listener.accept()
    tcp_listener.setblocking(False)
    client.setblocking(False)
    server.setblocking(False)
    with client, server:
        yield client, server


@pytest.fixture
def udp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """Two non-blocking UDP sockets bound to 127.0.0.1 (not connected)."""
    first = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    second = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with first, second:
        for sock in (first, second):
            sock.bind(("127.0.0.1", 0))
            sock.setblocking(False)
        yield first, second


@pytest.fixture(params=["unix", "tcp"])
def stream_pair(request: pytest.FixtureRequest) -> tuple[socket.socket, socket.socket]:
    """A connected non-blocking stream pair: AF_UNIX socketpair, then TCP over 127.0.0.1."""
    return request.getfixturevalue("unix_pair" if request.param == "unix" else "tcp_pair")


@pytest.fixture
def call_args() -> Callable[[str], str]:
    """``call_args("('x')")``: a callback's arguments as asyncio writes them in a repr or an error
    message outside debug mode: as given on 3.11; ``()`` where asyncio hides them because they
    may hold sensitive data (3.13 and later 3.12 releases: ``_format_callback_source`` then
    takes ``debug=``)."""
    from asyncio import format_helpers

    hidden = "debug" in inspect.signature(format_helpers._format_callback_source).parameters
    return lambda text: "()" if hidden else text
