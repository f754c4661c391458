"""sock_recv / sock_recv_into / sock_sendall / sock_connect / sock_accept on stream sockets."""

from __future__ import annotations

import asyncio
import socket


def test_sock_recv_returns_available_data(loop, stream_pair):
    left, right = stream_pair
    right.send(b"hello")
    assert loop.run_until_complete(loop.sock_recv(left, 100)) == b"hello"


def test_sock_recv_waits_for_data(loop, stream_pair):
    left, right = stream_pair

    async def main():
        receive = loop.create_task(loop.sock_recv(left, 100))
        await asyncio.sleep(0.01)
        assert not receive.done()
        right.send(b"later")
        return await receive

    assert loop.run_until_complete(main()) == b"later"


def test_sock_recv_respects_the_size_limit(loop, stream_pair):
    left, right = stream_pair
    right.send(b"abcdef")

    async def main():
        return [await loop.sock_recv(left, 4), await loop.sock_recv(left, 4)]

    assert loop.run_until_complete(main()) == [b"abcd", b"ef"]


def test_sock_recv_into_fills_the_buffer(loop, stream_pair):
    left, right = stream_pair
    buffer = bytearray(10)

    async def main():
        receive = loop.create_task(loop.sock_recv_into(left, buffer))
        await asyncio.sleep(0)
        right.send(b"abc")
        return await receive

    assert loop.run_until_complete(main()) == 3
    assert bytes(buffer[:3]) == b"abc"


def test_sock_recv_into_a_memoryview_slice(loop, stream_pair):
    left, right = stream_pair
    buffer = bytearray(b"..........")
    right.send(b"xyz")
    count = loop.run_until_complete(loop.sock_recv_into(left, memoryview(buffer)[5:]))
    assert count == 3
    assert buffer == bytearray(b".....xyz..")


def test_sock_sendall_returns_none_and_delivers(loop, stream_pair):
    left, right = stream_pair
    assert loop.run_until_complete(loop.sock_sendall(left, b"payload")) is None
    assert loop.run_until_complete(loop.sock_recv(right, 100)) == b"payload"


def test_sock_sendall_accepts_bytearray_and_memoryview(loop, stream_pair):
    left, right = stream_pair

    async def main():
        await loop.sock_sendall(left, bytearray(b"ab"))
        await loop.sock_sendall(left, memoryview(b"cd"))
        received = b""
        while len(received) < 4:
            received += await loop.sock_recv(right, 100)
        return received

    assert loop.run_until_complete(main()) == b"abcd"


def test_sock_sendall_of_more_than_the_socket_buffer(loop, stream_pair):
    left, right = stream_pair
    payload = bytes(range(256)) * 16384  # 4 MiB, far above the kernel buffers

    async def reader():
        received = bytearray()
        while len(received) < len(payload):
            chunk = await loop.sock_recv(right, 65536)
            assert chunk
            received += chunk
        return bytes(received)

    async def main():
        receive = loop.create_task(reader())
        await loop.sock_sendall(left, payload)
        return await receive

    assert loop.run_until_complete(main()) == payload


def test_sock_sendall_of_empty_data(loop, stream_pair):
    left, _ = stream_pair
    assert loop.run_until_complete(loop.sock_sendall(left, b"")) is None


def test_sock_connect_and_sock_accept(loop, tcp_listener):
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setblocking(False)

    async def main():
        accept = loop.create_task(loop.sock_accept(tcp_listener))
        await loop.sock_connect(client, tcp_listener.getsockname())
        return await accept

    with client:
        conn, address = loop.run_until_complete(main())
        with conn:
            assert address == client.getsockname()
            assert conn.getpeername() == client.getsockname()
            # asyncio hands back the accepted socket in non-blocking mode.
            assert conn.getblocking() is False
            loop.run_until_complete(loop.sock_sendall(client, b"over tcp"))
            assert loop.run_until_complete(loop.sock_recv(conn, 100)) == b"over tcp"


def test_sock_accept_waits_for_a_client(loop, tcp_listener):
    async def main():
        accept = loop.create_task(loop.sock_accept(tcp_listener))
        await asyncio.sleep(0.01)
        assert not accept.done()
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.setblocking(False)
        await loop.sock_connect(client, tcp_listener.getsockname())
        conn, _ = await accept
        return client, conn

    client, conn = loop.run_until_complete(main())
    client.close()
    conn.close()


def test_sock_connect_resolves_a_host_name(loop, tcp_listener):
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setblocking(False)
    port = tcp_listener.getsockname()[1]
    with client:
        loop.run_until_complete(loop.sock_connect(client, ("localhost", port)))
        assert client.getpeername() == ("127.0.0.1", port)
        tcp_listener.setblocking(True)
        conn, _ = tcp_listener.accept()
        conn.close()


def test_sock_connect_on_a_unix_socket(loop, tmp_path):
    path = str(tmp_path / "listener.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with listener, client:
        listener.bind(path)
        listener.listen(1)
        listener.setblocking(False)
        client.setblocking(False)

        async def main():
            accept = loop.create_task(loop.sock_accept(listener))
            await loop.sock_connect(client, path)
            conn, _ = await accept
            with conn:
                await loop.sock_sendall(conn, b"unix")
                return await loop.sock_recv(client, 100)

        assert loop.run_until_complete(main()) == b"unix"


def test_many_concurrent_receives_on_different_sockets(loop):
    pairs = [socket.socketpair() for _ in range(50)]
    try:
        for pair in pairs:
            for sock in pair:
                sock.setblocking(False)

        async def main():
            receives = [loop.create_task(loop.sock_recv(left, 100)) for left, _ in pairs]
            await asyncio.sleep(0)
            for index, (_, right) in enumerate(pairs):
                right.send(str(index).encode())
            return await asyncio.gather(*receives)

        assert loop.run_until_complete(main()) == [str(i).encode() for i in range(50)]
    finally:
        for left, right in pairs:
            left.close()
            right.close()


def test_echo_round_trips(loop, stream_pair):
    left, right = stream_pair

    async def echo():
        while data := await loop.sock_recv(right, 1024):
            await loop.sock_sendall(right, data)

    async def main():
        server = loop.create_task(echo())
        replies = []
        for i in range(100):
            message = f"message {i}".encode()
            await loop.sock_sendall(left, message)
            reply = b""
            while len(reply) < len(message):
                reply += await loop.sock_recv(left, 1024)
            replies.append(reply)
        left.shutdown(socket.SHUT_WR)
        await server
        return replies

    assert loop.run_until_complete(main()) == [f"message {i}".encode() for i in range(100)]
