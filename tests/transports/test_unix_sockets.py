"""create_unix_server / create_unix_connection on a socket file under tmp_path.

The socket file's life follows asyncio's: Python 3.11 and 3.12 leave it behind when the
server closes, and create_unix_server removes a stale socket file left at its path (but
never a file of another kind). Python 3.13 added ``cleanup_socket``, which unlinks it.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import stat
import sys
import uuid

import pytest

LEAVES_SOCKET_FILE_BEHIND = sys.version_info < (3, 13)


@pytest.fixture
def socket_path(tmp_path):
    # AF_UNIX paths are limited to 107 bytes; pytest's tmp_path usually fits, check anyway.
    path = tmp_path / "server.sock"
    assert len(os.fsencode(path)) < 100, f"tmp_path too long for an AF_UNIX path: {path}"
    return path


async def connect_once(loop, server_cls, client_cls, path):
    """Serve at ``path``, connect one client; return (server, client, accepted protocols)."""
    accepted = loop.create_future()

    def factory():
        accepted.set_result(server_cls())
        return accepted.result()

    server = await loop.create_unix_server(factory, str(path))
    _, client = await loop.create_unix_connection(client_cls, str(path))
    await (await accepted).made
    return server, client, accepted.result()


def test_unix_connection_carries_data_both_ways(loop, run, recorder, socket_path):
    class Echo(recorder):
        def data_received(self, data):
            super().data_received(data)
            self.transport.write(data[::-1])

    async def main():
        server, client, accepted = await connect_once(loop, Echo, recorder, socket_path)
        client.transport.write(b"abcdef")
        reply = await client.received_at_least(6)
        client.transport.write_eof()
        await client.lost
        await accepted.lost
        server.close()
        await server.wait_closed()
        return reply, client, accepted

    reply, client, accepted = run(main())
    assert reply == b"fedcba"
    assert bytes(accepted.received) == b"abcdef"
    expected = ["connection_made", "data_received", "eof_received", "connection_lost"]
    assert client.milestones() == expected
    assert accepted.milestones() == expected


def test_unix_transports_report_the_path_and_family(loop, run, recorder, socket_path):
    async def main():
        server, client, accepted = await connect_once(loop, recorder, recorder, socket_path)
        info = {
            "server_sockname": server.sockets[0].getsockname(),
            "server_family": server.sockets[0].family,
            "client_peername": client.transport.get_extra_info("peername"),
            "client_family": client.transport.get_extra_info("socket").family,
            "accepted_sockname": accepted.transport.get_extra_info("sockname"),
            "can_write_eof": client.transport.can_write_eof(),
        }
        client.transport.close()
        await client.lost
        await accepted.lost
        server.close()
        await server.wait_closed()
        return info

    info = run(main())
    assert info["server_sockname"] == str(socket_path)
    assert info["client_peername"] == str(socket_path)
    assert info["accepted_sockname"] == str(socket_path)
    assert info["server_family"] == info["client_family"] == socket.AF_UNIX
    assert info["can_write_eof"]


def test_closed_server_leaves_the_socket_file_as_asyncio_does(loop, run, recorder, socket_path):
    async def main():
        server = await loop.create_unix_server(recorder, str(socket_path))
        exists_while_serving = stat.S_ISSOCK(os.stat(socket_path).st_mode)
        server.close()
        await server.wait_closed()
        return exists_while_serving, socket_path.exists()

    assert run(main()) == (True, LEAVES_SOCKET_FILE_BEHIND)


def test_stale_socket_file_is_replaced(loop, run, recorder, socket_path):
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(socket_path))  # a socket file nobody listens on any more

    async def main():
        server, client, accepted = await connect_once(loop, recorder, recorder, socket_path)
        client.transport.close()
        await client.lost
        await accepted.lost
        server.close()
        await server.wait_closed()

    run(main())


def test_a_regular_file_at_the_path_is_not_removed(loop, run, recorder, socket_path):
    socket_path.write_text("not a socket")

    async def main():
        with pytest.raises(OSError) as raised:
            await loop.create_unix_server(recorder, str(socket_path))
        return raised.value.errno

    assert run(main()) == errno.EADDRINUSE
    assert socket_path.read_text() == "not a socket"


def test_connecting_to_a_missing_path_raises_file_not_found(loop, run, recorder, socket_path):
    async def main():
        with pytest.raises(FileNotFoundError):
            await loop.create_unix_connection(recorder, str(socket_path))

    run(main())


def test_abstract_namespace_socket(loop, run, recorder):
    address = f"\0ferroloop-test-{uuid.uuid4().hex}"

    async def main():
        server, client, accepted = await connect_once(loop, recorder, recorder, address)
        accepted.transport.write(b"abstract")
        received = await client.received_at_least(8)
        name = server.sockets[0].getsockname()
        client.transport.close()
        await client.lost
        await accepted.lost
        server.close()
        await server.wait_closed()
        return received, name

    received, name = run(main())
    assert received == b"abstract"
    assert name == address.encode()  # Linux reports abstract names as bytes


def test_unix_server_with_a_bound_sock(loop, run, recorder, socket_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(socket_path))

    async def main():
        accepted = loop.create_future()

        def factory():
            accepted.set_result(recorder())
            return accepted.result()

        server = await loop.create_unix_server(factory, sock=sock)
        transport, protocol = await loop.create_unix_connection(recorder, str(socket_path))
        transport.close()
        await protocol.lost
        await (await accepted).lost
        server.close()
        await server.wait_closed()
        return sock.fileno()

    assert run(main()) == -1


def test_unix_streams_echo(loop, run, socket_path):
    async def echo(reader, writer):
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def main():
        handlers = []

        async def tracked(reader, writer):
            handlers.append(asyncio.current_task())
            await echo(reader, writer)

        server = await asyncio.start_unix_server(tracked, str(socket_path))
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        writer.write(b"unix stream\n")
        answer = await reader.read()
        writer.close()
        await writer.wait_closed()
        await asyncio.gather(*handlers)
        server.close()
        await server.wait_closed()
        return answer

    assert run(main()) == b"unix stream\n"
