"""A transport owns its file descriptor: the loop refuses readers, writers and sock_* waits on it.

asyncio checks ownership (``_ensure_fd_no_transport``) in add_reader/add_writer/remove_*,
in the sock_* methods at the moment they would have to wait for readiness, and, from 3.12 on,
when a second transport would be built on the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys

import pytest

OWNED = "is used by transport"

checked_from_312 = pytest.mark.skipif(
    sys.version_info < (3, 12), reason="asyncio checks new transports' fds from 3.12 on"
)


@pytest.fixture
def owned_socket(loop, run, recorder):
    """A TCP client socket handed to create_connection(sock=...): (sock, client protocol)."""
    server_protocols = []

    def server_factory():
        server_protocols.append(recorder())
        return server_protocols[-1]

    async def connect():
        server = await loop.create_server(server_factory, "127.0.0.1", 0)
        sock = socket.create_connection(server.sockets[0].getsockname())
        _, client = await loop.create_connection(recorder, sock=sock)
        while not server_protocols:
            await asyncio.sleep(0)
        await server_protocols[0].made
        return server, sock, client

    server, sock, client = run(connect())
    yield sock, client, server_protocols[0]

    async def close():
        server_protocols[0].transport.resume_reading()  # a no-op unless a test paused it
        client.transport.close()
        await client.lost
        await server_protocols[0].lost
        server.close()
        await server.wait_closed()

    run(close())


@pytest.mark.parametrize("method", ["add_reader", "add_writer"])
def test_adding_a_callback_on_a_transport_fd_raises(loop, owned_socket, method):
    sock, _, _ = owned_socket
    with pytest.raises(RuntimeError, match=OWNED):
        getattr(loop, method)(sock.fileno(), lambda: None)
    with pytest.raises(RuntimeError, match=OWNED):
        getattr(loop, method)(sock, lambda: None)


@pytest.mark.parametrize("method", ["remove_reader", "remove_writer"])
def test_removing_a_callback_on_a_transport_fd_raises(loop, owned_socket, method):
    sock, _, _ = owned_socket
    with pytest.raises(RuntimeError, match=OWNED):
        getattr(loop, method)(sock.fileno())


def test_fd_is_free_again_once_the_transport_closed(loop, run, owned_socket):
    sock, client, _ = owned_socket
    fd = sock.fileno()

    async def main():
        client.transport.close()
        await client.lost

    run(main())
    # The fd number is closed (and may be reused): nothing is registered for it any more.
    assert not loop.remove_reader(fd)


def test_sock_recv_that_must_wait_on_a_transport_socket_raises(loop, run, owned_socket):
    sock, _, _ = owned_socket

    async def main():
        with pytest.raises(RuntimeError, match=OWNED):
            await loop.sock_recv(sock, 100)

    run(main(), timeout=0.5)


def test_sock_recv_into_that_must_wait_on_a_transport_socket_raises(loop, run, owned_socket):
    sock, _, _ = owned_socket

    async def main():
        with pytest.raises(RuntimeError, match=OWNED):
            await loop.sock_recv_into(sock, bytearray(100))

    run(main(), timeout=0.5)


def test_sock_sendall_that_must_wait_on_a_transport_socket_raises(loop, run, owned_socket):
    sock, _, accepted = owned_socket
    accepted.transport.pause_reading()

    async def main():
        with pytest.raises(RuntimeError, match=OWNED):
            await loop.sock_sendall(sock, b"z" * (16 << 20))

    run(main(), timeout=0.5)


def test_sock_sendall_that_need_not_wait_on_a_transport_socket_succeeds(loop, run, owned_socket):
    sock, _, accepted = owned_socket

    async def main():
        await loop.sock_sendall(sock, b"fits at once")
        return await accepted.received_at_least(12)

    assert run(main()) == b"fits at once"


def test_transport_still_receives_after_a_sock_recv_on_its_socket(loop, run, owned_socket):
    sock, client, accepted = owned_socket

    async def main():
        # asyncio refuses at once; a loop that waits times out.
        with contextlib.suppress(RuntimeError, TimeoutError):
            await asyncio.wait_for(loop.sock_recv(sock, 100), 0.1)
        accepted.transport.write(b"for the transport")
        return await client.received_at_least(17)

    assert run(main(), timeout=0.5) == b"for the transport"


@pytest.fixture
def owned_datagram_socket(loop, run):
    """A bound UDP socket handed to create_datagram_endpoint(sock=...)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    transport, _ = run(loop.create_datagram_endpoint(asyncio.DatagramProtocol, sock=sock))
    yield sock

    async def close():
        transport.close()
        await asyncio.sleep(0)

    run(close())


def test_sock_recvfrom_that_must_wait_on_a_datagram_transport_socket_raises(
    loop, run, owned_datagram_socket
):
    async def main():
        with pytest.raises(RuntimeError, match=OWNED):
            await asyncio.wait_for(loop.sock_recvfrom(owned_datagram_socket, 100), 0.5)

    run(main())


@checked_from_312
def test_a_second_stream_transport_on_a_transport_socket_raises(loop, run, recorder, owned_socket):
    sock, _, _ = owned_socket

    async def main():
        with pytest.raises(RuntimeError, match=OWNED):
            await loop.connect_accepted_socket(recorder, sock)

    run(main())


@checked_from_312
def test_a_second_datagram_transport_on_a_transport_socket_raises(loop, run, owned_datagram_socket):
    async def main():
        with pytest.raises(RuntimeError, match=OWNED):
            await loop.create_datagram_endpoint(
                asyncio.DatagramProtocol, sock=owned_datagram_socket
            )

    run(main())
