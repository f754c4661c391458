"""Streams over TCP: start_server / open_connection, the reader methods, drain, wait_closed."""

from __future__ import annotations

import asyncio

import pytest


@pytest.fixture
def stream_server(loop):
    """``await stream_server(handler)`` -> (host, port) of an asyncio.start_server on 127.0.0.1.

    The servers are closed at teardown, after the handlers they started have finished.
    """
    servers = []
    handlers = []

    async def start(handler):
        async def tracked(reader, writer):
            handlers.append(asyncio.current_task())
            await handler(reader, writer)

        server = await asyncio.start_server(tracked, "127.0.0.1", 0)
        servers.append(server)
        return server.sockets[0].getsockname()

    yield start

    async def stop():
        for server in servers:
            server.close()
            await server.wait_closed()
        await asyncio.gather(*handlers, return_exceptions=True)

    loop.run_until_complete(stop())


async def echo_parts(reader, writer):
    """Echo a line, then exactly 5 bytes, then everything up to EOF, each in brackets."""
    line = await reader.readline()
    exact = await reader.readexactly(5)
    rest = await reader.read()
    writer.write(b"[" + line + b"][" + exact + b"][" + rest + b"]")
    await writer.drain()
    writer.close()
    await writer.wait_closed()


def test_echo_with_readline_readexactly_and_read(loop, run, stream_server):
    async def main():
        host, port = await stream_server(echo_parts)
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"first line\n12")
        await writer.drain()
        writer.write(b"345the rest")
        writer.write_eof()
        answer = await reader.read()
        at_eof = reader.at_eof()
        writer.close()
        await writer.wait_closed()
        return answer, at_eof

    answer, at_eof = run(main())
    assert answer == b"[first line\n][12345][the rest]"
    assert at_eof


def test_readexactly_at_eof_raises_incomplete_read_error(loop, run, stream_server):
    async def reply_short(reader, writer):
        writer.write(b"abc")
        writer.close()
        await writer.wait_closed()

    async def main():
        reader, writer = await asyncio.open_connection(*await stream_server(reply_short))
        with pytest.raises(asyncio.IncompleteReadError) as raised:
            await reader.readexactly(10)
        writer.close()
        await writer.wait_closed()
        return raised.value.partial, raised.value.expected

    assert run(main()) == (b"abc", 10)


def test_readline_and_readuntil_split_at_separators(loop, run, stream_server):
    async def reply(reader, writer):
        writer.write(b"one\ntwo;three")
        writer.close()
        await writer.wait_closed()

    async def main():
        reader, writer = await asyncio.open_connection(*await stream_server(reply))
        parts = [await reader.readline(), await reader.readuntil(b";"), await reader.readline()]
        parts.append(await reader.readline())
        writer.close()
        await writer.wait_closed()
        return parts

    assert run(main()) == [b"one\n", b"two;", b"three", b""]


def test_drain_waits_while_the_peer_does_not_read(loop, run, stream_server):
    release = None

    async def slow_reader(reader, writer):
        await release.wait()
        while await reader.read(65536):
            pass
        writer.close()
        await writer.wait_closed()

    async def main():
        nonlocal release
        release = asyncio.Event()
        reader, writer = await asyncio.open_connection(*await stream_server(slow_reader))
        transport = writer.transport
        chunk = b"x" * 65536
        while transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[1]:
            writer.write(chunk)
            await asyncio.sleep(0)
        drain = loop.create_task(writer.drain())
        await asyncio.sleep(0.05)
        blocked = not drain.done()
        release.set()
        await drain
        writer.write_eof()
        await reader.read()
        writer.close()
        await writer.wait_closed()
        return blocked, transport.get_write_buffer_size()

    assert run(main()) == (True, 0)


def test_wait_closed_returns_after_close(loop, run, stream_server):
    async def hold(reader, writer):
        await reader.read()
        writer.close()
        await writer.wait_closed()

    async def main():
        _, writer = await asyncio.open_connection(*await stream_server(hold))
        open_before = writer.is_closing()
        writer.close()
        closing = writer.is_closing()
        await writer.wait_closed()
        await writer.wait_closed()  # waiting again returns at once
        return open_before, closing, writer.transport.is_closing()

    assert run(main()) == (False, True, True)


def test_writer_exposes_the_transport_extra_info(loop, run, stream_server):
    async def hold(reader, writer):
        await reader.read()
        writer.close()
        await writer.wait_closed()

    async def main():
        address = await stream_server(hold)
        _, writer = await asyncio.open_connection(*address)
        peer = writer.get_extra_info("peername")
        can_write_eof = writer.can_write_eof()
        writer.close()
        await writer.wait_closed()
        return peer == address, can_write_eof

    assert run(main()) == (True, True)


def test_unhandled_exception_in_the_client_handler_reaches_the_exception_handler(
    loop, run, stream_server, exception_handler_calls
):
    async def broken(reader, writer):
        await reader.readline()
        raise ZeroDivisionError("handler failed")

    async def main():
        reader, writer = await asyncio.open_connection(*await stream_server(broken))
        writer.write(b"go\n")
        answer = await reader.read()
        writer.close()
        await writer.wait_closed()
        return answer

    assert run(main()) == b""
    (context,) = exception_handler_calls.consume()
    assert context["message"] == "Unhandled exception in client_connected_cb"
    assert isinstance(context["exception"], ZeroDivisionError)
