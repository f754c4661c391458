"""sock_sendto / sock_recvfrom / sock_recvfrom_into on UDP sockets over 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket

import pytest


def test_sock_sendto_and_sock_recvfrom(loop, udp_pair):
    first, second = udp_pair

    async def main():
        receive = loop.create_task(loop.sock_recvfrom(second, 100))
        await asyncio.sleep(0)
        sent = await loop.sock_sendto(first, b"datagram", second.getsockname())
        return sent, await receive

    sent, (data, address) = loop.run_until_complete(main())
    assert sent == len(b"datagram")
    assert data == b"datagram"
    assert address == first.getsockname()


def test_sock_recvfrom_returns_one_datagram_at_a_time(loop, udp_pair):
    first, second = udp_pair
    for message in (b"one", b"two", b"three"):
        first.sendto(message, second.getsockname())

    async def main():
        return [(await loop.sock_recvfrom(second, 100))[0] for _ in range(3)]

    assert loop.run_until_complete(main()) == [b"one", b"two", b"three"]


def test_sock_recvfrom_truncates_to_bufsize(loop, udp_pair):
    first, second = udp_pair
    first.sendto(b"0123456789", second.getsockname())
    data, _ = loop.run_until_complete(loop.sock_recvfrom(second, 4))
    assert data == b"0123"


def test_sock_recvfrom_into_fills_the_buffer(loop, udp_pair):
    first, second = udp_pair
    buffer = bytearray(16)

    async def main():
        receive = loop.create_task(loop.sock_recvfrom_into(second, buffer))
        await asyncio.sleep(0)
        first.sendto(b"into", second.getsockname())
        return await receive

    count, address = loop.run_until_complete(main())
    assert count == 4
    assert bytes(buffer[:4]) == b"into"
    assert address == first.getsockname()


def test_sock_recvfrom_into_with_nbytes(loop, udp_pair):
    first, second = udp_pair
    buffer = bytearray(16)
    first.sendto(b"abcdefgh", second.getsockname())
    count, _ = loop.run_until_complete(loop.sock_recvfrom_into(second, buffer, 3))
    assert count == 3
    assert bytes(buffer[:4]) == b"abc\x00"


def test_sock_sendto_and_recv_on_connected_udp(loop, udp_pair):
    first, second = udp_pair
    first.connect(second.getsockname())
    loop.run_until_complete(loop.sock_sendall(first, b"connected"))
    assert loop.run_until_complete(loop.sock_recv(second, 100)) == b"connected"


def test_many_datagrams_round_trip(loop, udp_pair):
    first, second = udp_pair

    async def main():
        received = []
        for i in range(200):
            receive = loop.create_task(loop.sock_recvfrom(second, 100))
            await loop.sock_sendto(first, str(i).encode(), second.getsockname())
            received.append((await receive)[0])
        return received

    assert loop.run_until_complete(main()) == [str(i).encode() for i in range(200)]


def test_pending_sock_recv_on_connected_udp_gets_the_icmp_error(loop):
    # The error arrives as EPOLLERR without data; it must wake the pending receive.
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as closed,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client,
    ):
        closed.bind(("127.0.0.1", 0))
        address = closed.getsockname()
        closed.close()
        client.setblocking(False)
        client.connect(address)

        async def main():
            receive = loop.create_task(loop.sock_recv(client, 100))
            await asyncio.sleep(0.01)
            client.send(b"to nobody")
            return await asyncio.wait_for(receive, 10)

        with pytest.raises(ConnectionRefusedError):
            loop.run_until_complete(main())


def test_sock_connect_on_a_udp_socket(loop, udp_pair):
    first, second = udp_pair
    loop.run_until_complete(loop.sock_connect(first, second.getsockname()))
    assert first.getpeername() == second.getsockname()
