"""Fixtures of the loop tests: sockets for the sock_* tests (non-blocking, closed at teardown),
and the Task class under test for the native Task tests."""

from __future__ import annotations

import asyncio
import inspect
import socket
from collections.abc import Callable, Iterator
from typing import Any

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


def asyncio_task_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task:
    """A task factory that makes asyncio's own (C) Task, whatever the loop's default is."""
    return asyncio.Task(coro, loop=loop, **kwargs)


@pytest.fixture(params=["asyncio.Task", "ferroloop.Task"])
def task_kind(request: pytest.FixtureRequest) -> str:
    """Which Task class is under test: asyncio's (the oracle), then ferroloop's native one."""
    return request.param


@pytest.fixture
def task_factory(task_kind: str) -> Callable[..., Any]:
    """The task factory that makes tasks of ``task_kind``."""
    if task_kind == "asyncio.Task":
        return asyncio_task_factory
    import ferroloop

    return ferroloop.task_factory


@pytest.fixture
def Task(loop: asyncio.AbstractEventLoop, task_kind: str, task_factory: Callable[..., Any]) -> type:
    """The Task class of ``task_kind``; its factory is installed on ``loop``, so the tasks that
    ``run``, ``loop.create_task``, TaskGroup, gather, wait_for and anyio make are of it too."""
    loop.set_task_factory(task_factory)
    if task_kind == "asyncio.Task":
        return asyncio.Task
    import ferroloop

    return ferroloop.Task
