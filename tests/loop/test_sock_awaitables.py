"""What ``sock_recv``/``sock_recv_into``/``sock_sendall`` return behaves as asyncio's coroutines.

ferroloop returns native awaitables for plain sockets (crates/py/src/sock_ops.rs); asyncio
returns coroutines. Everything a caller can do with a coroutine must work the same.
"""

from __future__ import annotations

import asyncio
import socket

import pytest


@pytest.fixture(params=["unix", "tcp"])
def pair(request):
    return request.getfixturevalue("unix_pair" if request.param == "unix" else "tcp_pair")


def test_sock_recv_result_is_a_coroutine_to_asyncio(loop, pair):
    left, _ = pair
    op = loop.sock_recv(left, 10)
    try:
        assert asyncio.iscoroutine(op)
    finally:
        op.close()


def test_sock_recv_runs_as_a_task(loop, pair):
    left, right = pair

    async def main():
        task = asyncio.create_task(loop.sock_recv(left, 100))
        await asyncio.sleep(0)
        right.send(b"hello")
        return await task

    assert loop.run_until_complete(main()) == b"hello"


def test_awaiting_a_finished_sock_recv_again_raises(loop, pair):
    left, right = pair
    right.send(b"x")

    async def main():
        op = loop.sock_recv(left, 10)
        assert await op == b"x"
        with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
            await op

    loop.run_until_complete(main())


def test_wait_for_timeout_on_sock_recv_removes_its_reader(loop, pair):
    left, _ = pair

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(loop.sock_recv(left, 10), 0.05)
        await asyncio.sleep(0)  # the done callback of the cancelled wait runs
        return loop.remove_reader(left.fileno())

    assert loop.run_until_complete(main()) is False


def test_sock_recv_of_zero_bytes_returns_empty(loop, pair):
    left, _ = pair
    assert loop.run_until_complete(loop.sock_recv(left, 0)) == b""


def test_sock_recv_with_a_negative_size_fails_when_awaited(loop, pair):
    left, _ = pair
    op = loop.sock_recv(left, -1)  # no error yet: it belongs to the awaited operation
    with pytest.raises(ValueError):
        loop.run_until_complete(op)


def test_sock_recv_on_a_closed_socket_raises_os_error_when_awaited(loop):
    sock = socket.socket()
    sock.setblocking(False)
    sock.close()
    with pytest.raises(OSError):
        loop.run_until_complete(loop.sock_recv(sock, 10))


def test_sock_recv_after_the_peer_reset_raises_connection_reset(loop, tcp_pair):
    client, server = tcp_pair
    # SO_LINGER 0: close sends RST.
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    client.close()

    async def main():
        await asyncio.sleep(0.05)
        return await loop.sock_recv(server, 10)

    with pytest.raises(ConnectionResetError) as info:
        loop.run_until_complete(main())
    assert info.value.errno is not None


def test_sock_recv_into_a_read_only_buffer_raises_type_error(loop, pair):
    left, right = pair
    right.send(b"abc")
    with pytest.raises(TypeError):
        loop.run_until_complete(loop.sock_recv_into(left, b"xyz"))


def test_throw_into_a_pending_sock_recv_raises_it_and_releases_the_fd(loop, pair):
    left, _ = pair

    async def main():
        task = asyncio.create_task(loop.sock_recv(left, 10))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)
        return loop.remove_reader(left.fileno())

    assert loop.run_until_complete(main()) is False


def test_many_sequential_sock_recv_on_one_socket(loop, pair):
    left, right = pair

    async def main():
        got = []
        for i in range(200):
            right.send(bytes([i % 256]))
            got.append(await loop.sock_recv(left, 10))
        return got

    assert loop.run_until_complete(main()) == [bytes([i % 256]) for i in range(200)]


def test_sock_recv_created_before_close_never_reads_a_reused_fd(loop):
    first, peer = socket.socketpair()
    op = loop.sock_recv(first, 10)
    number = first.fileno()
    first.close()
    peer.close()
    # Linux hands out the lowest free fd, so `a` takes the closed socket's number; data waits
    # on it.
    a, b = socket.socketpair()
    try:
        for s in (a, b):
            s.setblocking(False)
        if a.fileno() != number:
            pytest.skip("another thread took the fd number first")
        b.send(b"not yours")
        with pytest.raises(OSError):
            loop.run_until_complete(op)
    finally:
        a.close()
        b.close()


def test_the_coroutine_protocol_driven_by_hand(loop, pair):
    # `await` takes the native awaitable's `am_send` slot; `send`/`__next__` by hand must still
    # end in StopIteration carrying the result, whether or not the operation had to wait.
    left, right = pair
    right.send(b"ready")
    op = loop.sock_recv(left, 100)
    with pytest.raises(StopIteration) as finished:
        op.send(None)
    assert finished.value.value == b"ready"

    op = loop.sock_recv(left, 100)
    waiting = op.__await__()
    fut = waiting.send(None)
    assert isinstance(fut, asyncio.Future)
    right.send(b"later")
    loop.run_until_complete(fut)
    with pytest.raises(StopIteration) as finished:
        next(waiting)
    assert finished.value.value == b"later"

    op = loop.sock_sendall(left, b"sent")
    with pytest.raises(StopIteration) as finished:
        op.send(None)
    assert finished.value.value is None
    assert right.recv(100) == b"sent"
