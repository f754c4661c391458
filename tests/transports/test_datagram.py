"""create_datagram_endpoint over UDP on 127.0.0.1: connected and unconnected endpoints."""

from __future__ import annotations

import asyncio
import socket

import pytest


class DatagramRecorder(asyncio.DatagramProtocol):
    """Records datagrams, errors and the connection callbacks; ``next()`` awaits a datagram."""

    def __init__(self):
        loop = asyncio.get_running_loop()
        self.events = []
        self.datagrams = asyncio.Queue()
        self.errors = asyncio.Queue()
        self.lost = loop.create_future()
        self.lost_exc = None

    def connection_made(self, transport):
        self.events.append("connection_made")
        self.transport = transport

    def datagram_received(self, data, addr):
        self.events.append("datagram_received")
        self.datagrams.put_nowait((data, addr))

    def error_received(self, exc):
        self.events.append("error_received")
        self.errors.put_nowait(exc)

    def connection_lost(self, exc):
        self.events.append("connection_lost")
        self.lost_exc = exc
        self.lost.set_result(None)

    async def close(self):
        self.transport.close()
        await self.lost


def test_unconnected_endpoints_exchange_datagrams(loop, run):
    async def main():
        local = ("127.0.0.1", 0)
        _, first = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=local)
        _, second = await loop.create_datagram_endpoint(DatagramRecorder, local_addr=local)
        first_addr = first.transport.get_extra_info("sockname")
        second_addr = second.transport.get_extra_info("sockname")
        first.transport.sendto(b"ping", second_addr)
        ping = await second.datagrams.get()
        second.transport.sendto(b"pong", ping[1])
        pong = await first.datagrams.get()
        peer = first.transport.get_extra_info("peername")
        await first.close()
        await second.close()
        return ping, pong, first_addr, second_addr, peer, first, second

    ping, pong, first_addr, second_addr, peer, first, second = run(main())
    assert ping == (b"ping", first_addr)
    assert pong == (b"pong", second_addr)
    assert peer is None
    for side in (first, second):
        assert side.events[0] == "connection_made"
        assert side.events[-1] == "connection_lost"
        assert side.lost_exc is None


def test_connected_endpoint_sends_without_an_address(loop, run):
    async def main():
        _, server = await loop.create_datagram_endpoint(
            DatagramRecorder, local_addr=("127.0.0.1", 0)
        )
        server_addr = server.transport.get_extra_info("sockname")
        _, client = await loop.create_datagram_endpoint(DatagramRecorder, remote_addr=server_addr)
        client.transport.sendto(b"request")
        data, client_addr = await server.datagrams.get()
        server.transport.sendto(data.upper(), client_addr)
        reply = await client.datagrams.get()
        names = (
            client.transport.get_extra_info("peername"),
            client.transport.get_extra_info("sockname"),
        )
        with pytest.raises(ValueError, match="Invalid address"):
            client.transport.sendto(b"elsewhere", ("127.0.0.1", 9))
        await client.close()
        await server.close()
        return reply, names, server_addr, client_addr

    reply, (peer, local), server_addr, client_addr = run(main())
    assert reply == (b"REQUEST", server_addr)
    assert peer == server_addr
    assert local == client_addr


def test_connected_endpoint_reports_a_closed_port_through_error_received(
    loop, run, refused_address
):
    async def main():
        _, client = await loop.create_datagram_endpoint(
            DatagramRecorder, remote_addr=refused_address
        )
        client.transport.sendto(b"nobody listens")
        error = await client.errors.get()
        closing = client.transport.is_closing()
        await client.close()
        return error, closing

    error, closing = run(main())
    # Linux turns the ICMP port-unreachable into ECONNREFUSED on the connected socket.
    assert isinstance(error, ConnectionRefusedError)
    assert not closing  # an error_received does not close the endpoint


def test_allow_broadcast_sets_so_broadcast(loop, run):
    async def main():
        options = []
        for allow in (True, False):
            transport, protocol = await loop.create_datagram_endpoint(
                DatagramRecorder, local_addr=("127.0.0.1", 0), allow_broadcast=allow
            )
            sock = transport.get_extra_info("socket")
            options.append(bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST)))
            await protocol.close()
        return options

    assert run(main()) == [True, False]


def test_reuse_address_argument_is_gone(loop, run):
    # Python 3.11 removed the argument (it was deprecated as unsafe for UDP in 3.9).
    async def main():
        with pytest.raises(TypeError, match="reuse_address"):
            await loop.create_datagram_endpoint(
                DatagramRecorder, local_addr=("127.0.0.1", 0), reuse_address=True
            )

    run(main())


def test_datagram_endpoint_with_a_bound_sock(loop, run):
    async def main():
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        transport, protocol = await loop.create_datagram_endpoint(DatagramRecorder, sock=sock)
        same = transport.get_extra_info("socket").fileno() == sock.fileno()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.bind(("127.0.0.1", 0))
            sender.sendto(b"from a plain socket", sock.getsockname())
            data, addr = await protocol.datagrams.get()
            sender_addr = sender.getsockname()
        await protocol.close()
        return same, data, addr == sender_addr, sock.fileno()

    assert run(main()) == (True, b"from a plain socket", True, -1)


def test_datagram_transport_state(loop, run):
    async def main():
        transport, protocol = await loop.create_datagram_endpoint(
            DatagramRecorder, local_addr=("127.0.0.1", 0)
        )
        state = [transport.get_write_buffer_size(), transport.is_closing()]
        transport.sendto(b"")  # an empty datagram is sent as such
        transport.close()
        state.append(transport.is_closing())
        await protocol.lost
        return state

    assert run(main()) == [0, False, True]


def test_datagram_abort_calls_connection_lost(loop, run):
    async def main():
        transport, protocol = await loop.create_datagram_endpoint(
            DatagramRecorder, local_addr=("127.0.0.1", 0)
        )
        transport.abort()
        await protocol.lost
        return protocol.events, protocol.lost_exc

    assert run(main()) == (["connection_made", "connection_lost"], None)


def test_unix_datagram_endpoints_exchange_datagrams(loop, run, tmp_path):
    first_path, second_path = str(tmp_path / "first.sock"), str(tmp_path / "second.sock")

    async def main():
        _, first = await loop.create_datagram_endpoint(
            DatagramRecorder, local_addr=first_path, family=socket.AF_UNIX
        )
        _, second = await loop.create_datagram_endpoint(
            DatagramRecorder, local_addr=second_path, family=socket.AF_UNIX
        )
        first.transport.sendto(b"unix datagram", second_path)
        received = await second.datagrams.get()
        await first.close()
        await second.close()
        return received

    assert run(main()) == (b"unix datagram", first_path)
