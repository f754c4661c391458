"""sock_* error paths: blocking sockets, closed peers, refused connections, cancellation."""

from __future__ import annotations

import asyncio
import gc
import socket
import struct

import pytest


@pytest.mark.parametrize(
    ("method", "extra_args"),
    [
        ("sock_recv", (1,)),
        ("sock_recv_into", (bytearray(1),)),
        ("sock_sendall", (b"x",)),
        ("sock_recvfrom", (1,)),
        ("sock_recvfrom_into", (bytearray(1),)),
        ("sock_sendto", (b"x", ("127.0.0.1", 9))),
        ("sock_accept", ()),
        ("sock_connect", (("127.0.0.1", 9),)),
    ],
)
def test_blocking_socket_is_rejected_in_debug_mode(loop, method, extra_args):
    loop.set_debug(True)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as blocking:
        assert blocking.getblocking()
        coroutine = getattr(loop, method)(blocking, *extra_args)
        with pytest.raises(ValueError, match="the socket must be non-blocking"):
            loop.run_until_complete(coroutine)


@pytest.mark.parametrize("data", ["text", None, 5, [b"x"]], ids=lambda d: type(d).__name__)
def test_sock_sendall_of_a_non_buffer_raises_sockets_type_error(loop, unix_pair, data):
    # asyncio's sock_sendall fails in socket.send: socket's own message, whatever the loop.
    left, _ = unix_pair
    name = type(data).__name__
    with pytest.raises(TypeError, match=f"^a bytes-like object is required, not '{name}'$"):
        loop.run_until_complete(loop.sock_sendall(left, data))


def test_blocking_socket_with_data_ready_is_read_outside_debug_mode(loop):
    # asyncio checks the blocking mode only in debug mode; a ready blocking socket works.
    left, right = socket.socketpair()
    with left, right:
        right.send(b"ready")
        assert loop.run_until_complete(loop.sock_recv(left, 100)) == b"ready"


def test_blocking_socket_with_buffer_space_is_written_outside_debug_mode(loop):
    left, right = socket.socketpair()
    with left, right:
        loop.run_until_complete(loop.sock_sendall(left, b"fits"))
        assert right.recv(100) == b"fits"


def test_sock_recv_returns_empty_bytes_after_peer_closed(loop, stream_pair):
    left, right = stream_pair
    right.close()
    assert loop.run_until_complete(loop.sock_recv(left, 100)) == b""


def test_pending_sock_recv_returns_empty_bytes_when_peer_closes(loop, stream_pair):
    left, right = stream_pair

    async def main():
        receive = loop.create_task(loop.sock_recv(left, 100))
        await asyncio.sleep(0.01)
        right.close()
        return await receive

    assert loop.run_until_complete(main()) == b""


def test_sock_recv_into_returns_zero_after_peer_closed(loop, stream_pair):
    left, right = stream_pair
    right.close()
    assert loop.run_until_complete(loop.sock_recv_into(left, bytearray(10))) == 0


def test_sock_sendall_to_a_closed_peer_raises(loop, unix_pair):
    left, right = unix_pair
    right.close()
    with pytest.raises((BrokenPipeError, ConnectionResetError)):
        loop.run_until_complete(loop.sock_sendall(left, b"x" * 1024))


def test_sock_sendall_fails_when_peer_closes_mid_transfer(loop, unix_pair):
    left, right = unix_pair

    async def main():
        send = loop.create_task(loop.sock_sendall(left, b"x" * (16 * 1024 * 1024)))
        await asyncio.sleep(0.01)
        assert not send.done()
        right.close()
        await send

    with pytest.raises((BrokenPipeError, ConnectionResetError)):
        loop.run_until_complete(main())


def test_sock_connect_to_a_closed_port_is_refused(loop):
    # A bound socket that does not listen answers connection attempts with a reset.
    with (
        socket.socket(socket.AF_INET, socket.SOCK_STREAM) as bound,
        socket.socket(socket.AF_INET, socket.SOCK_STREAM) as client,
    ):
        bound.bind(("127.0.0.1", 0))
        client.setblocking(False)
        with pytest.raises(ConnectionRefusedError):
            loop.run_until_complete(loop.sock_connect(client, bound.getsockname()))


@pytest.mark.parametrize("debug", [False, True], ids=["normal", "debug"])
def test_refused_sock_connect_error_is_not_kept_alive_by_a_cycle(loop, refused_address, debug):
    # The error's traceback holds the frames it passed through; a frame that still refers to
    # the failed future makes a cycle that keeps the error alive (CPython 3.13's test_streams
    # test_open_connection_happy_eyeball_refcycles). With the collector off, only a plain
    # decref frees it.
    loop.set_debug(debug)

    async def connect() -> OSError | None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as client:
            client.setblocking(False)
            try:
                await loop.sock_connect(client, refused_address)
            except OSError as exc:
                return exc
        return None

    async def main() -> list[object]:
        error = await loop.create_task(connect())
        assert isinstance(error, ConnectionRefusedError)
        # Off the wake-up handle that delivered the task (its arguments hold the task).
        await asyncio.sleep(0)
        # Not this coroutine itself, whose local `error` 3.14 reports as a reference.
        return [
            r for r in gc.get_referrers(error) if getattr(r, "cr_code", None) is not main.__code__
        ]

    gc.disable()
    try:
        assert loop.run_until_complete(main()) == []
    finally:
        gc.enable()


def test_cancelled_sock_recv_removes_its_reader(loop, stream_pair):
    left, right = stream_pair

    async def main():
        receive = loop.create_task(loop.sock_recv(left, 100))
        await asyncio.sleep(0)
        receive.cancel()
        with pytest.raises(asyncio.CancelledError):
            await receive
        await asyncio.sleep(0)

    loop.run_until_complete(main())
    assert loop.remove_reader(left) is False
    # Data sent afterwards was not consumed by the cancelled receive.
    right.send(b"still here")
    assert loop.run_until_complete(loop.sock_recv(left, 100)) == b"still here"


def test_cancelled_sock_recv_into_removes_its_reader(loop, stream_pair):
    left, right = stream_pair
    buffer = bytearray(10)

    async def main():
        receive = loop.create_task(loop.sock_recv_into(left, buffer))
        await asyncio.sleep(0)
        receive.cancel()
        with pytest.raises(asyncio.CancelledError):
            await receive
        await asyncio.sleep(0)

    loop.run_until_complete(main())
    assert loop.remove_reader(left) is False
    right.send(b"late")
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    assert buffer == bytearray(10)


def test_cancelled_sock_accept_removes_its_reader(loop, tcp_listener):
    async def main():
        accept = loop.create_task(loop.sock_accept(tcp_listener))
        await asyncio.sleep(0)
        accept.cancel()
        with pytest.raises(asyncio.CancelledError):
            await accept
        await asyncio.sleep(0)

    loop.run_until_complete(main())
    assert loop.remove_reader(tcp_listener) is False


def test_cancelled_sock_recvfrom_removes_its_reader(loop, udp_pair):
    _, second = udp_pair

    async def main():
        receive = loop.create_task(loop.sock_recvfrom(second, 100))
        await asyncio.sleep(0)
        receive.cancel()
        with pytest.raises(asyncio.CancelledError):
            await receive
        await asyncio.sleep(0)

    loop.run_until_complete(main())
    assert loop.remove_reader(second) is False


def test_sock_recv_timeout_via_wait_for_removes_its_reader(loop, stream_pair):
    left, _ = stream_pair

    async def main():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(loop.sock_recv(left, 100), 0.01)
        await asyncio.sleep(0)

    loop.run_until_complete(main())
    assert loop.remove_reader(left) is False


def test_pending_sock_recv_fails_when_the_peer_resets(loop, tcp_pair):
    client, server = tcp_pair
    # SO_LINGER with a zero timeout makes close() send a reset instead of a FIN.
    server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    async def main():
        receive = loop.create_task(loop.sock_recv(client, 100))
        await asyncio.sleep(0.01)
        server.close()
        return await receive

    with pytest.raises(ConnectionResetError):
        loop.run_until_complete(main())


def test_cancelled_sock_sendall_removes_its_writer(loop, unix_pair):
    left, _ = unix_pair

    async def main():
        send = loop.create_task(loop.sock_sendall(left, b"x" * (16 * 1024 * 1024)))
        await asyncio.sleep(0.01)
        assert not send.done()
        send.cancel()
        with pytest.raises(asyncio.CancelledError):
            await send
        await asyncio.sleep(0)

    loop.run_until_complete(main())
    assert loop.remove_writer(left) is False


def test_sock_recv_on_a_closed_socket_raises(loop, stream_pair):
    left, _ = stream_pair
    left.close()
    with pytest.raises(OSError):
        loop.run_until_complete(loop.sock_recv(left, 100))
