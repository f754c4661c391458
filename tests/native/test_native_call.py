"""Handles whose callback is a native object (a transport core) call it directly, not through
Python's call machinery (``crates/py/src/native_call.rs``): the result and every error must be
those of calling the object from Python with the same arguments, and the call runs in the
handle's context."""

from __future__ import annotations

import asyncio
import contextvars
import socket

import ferroloop
import pytest

VAR = contextvars.ContextVar("VAR", default="unset")


class Echo(asyncio.Protocol):
    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.contexts: list[str] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received.append(data)
        self.contexts.append(VAR.get())


@pytest.fixture
def stream():
    """A connected socket pair, one end under a native stream transport on a ferroloop loop:
    (loop, transport, protocol, the transport's core, the peer socket)."""
    loop = ferroloop.new_event_loop()
    a, peer = socket.socketpair()
    a.setblocking(False)
    proto = Echo()
    transport, _ = loop.run_until_complete(loop.create_connection(lambda: proto, sock=a))
    core = transport._core
    assert type(core).__name__ == "StreamCore"
    yield loop, transport, proto, core, peer
    transport.close()
    peer.close()
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()


def _errors_of(loop, schedule):
    """The exceptions that reach the loop's exception handler from what `schedule` queues."""
    seen: list[BaseException] = []
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx["exception"]))
    schedule()
    loop.run_until_complete(asyncio.sleep(0.01))
    loop.set_exception_handler(None)
    return seen


def _python_call_error(call) -> tuple[type, str]:
    with pytest.raises(BaseException) as info:
        call()
    return type(info.value), str(info.value)


def test_wrong_arguments_fail_as_the_python_call_does(stream):
    loop, _transport, _proto, core, _peer = stream
    for args in [("not a bool",), (1,), (True, True)]:
        expected = _python_call_error(lambda args=args: core(*args))
        seen = _errors_of(loop, lambda args=args: loop.call_soon(core, *args))
        assert [(type(e), str(e)) for e in seen] == [expected], args


def test_reader_runs_in_the_handles_context(stream):
    loop, _transport, proto, core, peer = stream
    ctx = contextvars.copy_context()
    ctx.run(VAR.set, "handle's")
    peer.send(b"ping")
    deadline = loop.time() + 5
    # A direct call of the core with no argument reads, in the context the handle names.
    while not proto.received and loop.time() < deadline:
        loop.call_soon(core, context=ctx)
        loop.run_until_complete(asyncio.sleep(0.01))
    assert b"".join(proto.received) == b"ping"
    assert "handle's" in proto.contexts


def test_cancelled_native_handle_does_not_run(stream):
    loop, transport, proto, core, peer = stream
    transport.pause_reading()
    peer.send(b"ping")
    handle = loop.call_soon(core)
    handle.cancel()
    loop.run_until_complete(asyncio.sleep(0.05))
    assert proto.received == []
