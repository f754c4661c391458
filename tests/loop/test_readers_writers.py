"""add_reader / remove_reader / add_writer / remove_writer on socketpairs."""

from __future__ import annotations

import asyncio
import errno
import os
import socket

import pytest


@pytest.fixture
def pair():
    left, right = socket.socketpair()
    left.setblocking(False)
    right.setblocking(False)
    yield left, right
    left.close()
    right.close()


def run_once(loop):
    loop.call_soon(loop.stop)
    loop.run_forever()


def test_reader_fires_when_data_arrives(loop, pair):
    left, right = pair
    received = []

    def on_readable():
        received.append(left.recv(100))
        loop.stop()

    loop.add_reader(left, on_readable)
    loop.call_soon(right.send, b"ping")
    loop.run_forever()
    assert received == [b"ping"]
    assert loop.remove_reader(left)


def test_reader_accepts_a_raw_file_descriptor(loop, pair):
    left, right = pair
    received = []

    def on_readable():
        received.append(left.recv(100))
        loop.stop()

    loop.add_reader(left.fileno(), on_readable)
    right.send(b"fd")
    loop.run_forever()
    assert received == [b"fd"]
    assert loop.remove_reader(left.fileno())


def test_reader_receives_its_arguments(loop, pair):
    left, right = pair
    received = []

    def on_readable(*args):
        received.append(args)
        left.recv(100)
        loop.stop()

    loop.add_reader(left, on_readable, "a", 2)
    right.send(b"x")
    loop.run_forever()
    assert received == [("a", 2)]
    loop.remove_reader(left)


def test_reader_does_not_fire_without_data(loop, pair):
    left, _ = pair
    fired = []
    loop.add_reader(left, fired.append, "readable")
    loop.call_later(0.02, loop.stop)
    loop.run_forever()
    assert fired == []
    assert loop.remove_reader(left)


def test_reader_is_level_triggered(loop, pair):
    # Data left unread keeps the descriptor readable: the reader fires again in each
    # iteration until the data is consumed.
    left, right = pair
    calls = []

    def on_readable():
        calls.append(len(calls))
        if len(calls) == 3:
            left.recv(100)
            loop.call_later(0.02, loop.stop)

    loop.add_reader(left, on_readable)
    right.send(b"unread")
    loop.run_forever()
    assert calls == [0, 1, 2]
    assert loop.remove_reader(left)


def test_remove_reader_returns_whether_a_reader_was_registered(loop, pair):
    left, _ = pair
    assert loop.remove_reader(left) is False
    loop.add_reader(left, print)
    assert loop.remove_reader(left) is True
    assert loop.remove_reader(left) is False


def test_removed_reader_does_not_fire(loop, pair):
    left, right = pair
    fired = []
    loop.add_reader(left, fired.append, "removed")
    loop.remove_reader(left)
    right.send(b"data")
    loop.call_later(0.02, loop.stop)
    loop.run_forever()
    assert fired == []


def test_add_reader_replaces_the_previous_reader(loop, pair):
    left, right = pair
    fired = []

    def second():
        fired.append("second")
        left.recv(100)
        loop.stop()

    loop.add_reader(left, fired.append, "first")
    loop.add_reader(left, second)
    right.send(b"data")
    loop.run_forever()
    assert fired == ["second"]
    assert loop.remove_reader(left) is True
    assert loop.remove_reader(left) is False


def test_reader_can_remove_itself(loop, pair):
    left, right = pair
    fired = []

    def once():
        fired.append("once")
        loop.remove_reader(left)

    loop.add_reader(left, once)
    right.send(b"data")
    loop.call_later(0.02, loop.stop)
    loop.run_forever()
    assert fired == ["once"]


def test_reader_removed_by_another_ready_callback_does_not_fire(loop):
    first_pair = socket.socketpair()
    second_pair = socket.socketpair()
    try:
        fired = []

        def remove_the_other(mine, other):
            fired.append(mine)
            loop.remove_reader(other)
            loop.remove_reader(mine)

        first, second = first_pair[0], second_pair[0]
        first_pair[1].send(b"x")
        second_pair[1].send(b"x")
        loop.add_reader(first, remove_the_other, first, second)
        loop.add_reader(second, remove_the_other, second, first)
        loop.call_later(0.02, loop.stop)
        loop.run_forever()
        # Both became readable in the same poll; whichever ran first removed the other.
        assert len(fired) == 1
    finally:
        for sock in (*first_pair, *second_pair):
            sock.close()


def test_writer_fires_when_writable(loop, pair):
    left, _ = pair
    fired = []

    def on_writable(tag):
        fired.append(tag)
        loop.remove_writer(left)
        loop.stop()

    loop.add_writer(left, on_writable, "writable")
    loop.run_forever()
    assert fired == ["writable"]


def test_remove_writer_returns_whether_a_writer_was_registered(loop, pair):
    left, _ = pair
    assert loop.remove_writer(left) is False
    loop.add_writer(left, print)
    assert loop.remove_writer(left) is True
    assert loop.remove_writer(left) is False


def test_add_writer_replaces_the_previous_writer(loop, pair):
    left, _ = pair
    fired = []

    def second():
        fired.append("second")
        loop.remove_writer(left)
        loop.stop()

    loop.add_writer(left, fired.append, "first")
    loop.add_writer(left, second)
    loop.run_forever()
    assert fired == ["second"]


def test_writer_fires_again_once_a_full_buffer_drains(loop, pair):
    left, right = pair
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    chunk = b"x" * 65536
    with pytest.raises(BlockingIOError):
        while True:
            left.send(chunk)
    fired = []

    def on_writable():
        fired.append("drained")
        loop.remove_writer(left)
        loop.stop()

    def drain():
        try:
            while right.recv(65536):
                pass
        except BlockingIOError:
            pass

    loop.add_writer(left, on_writable)
    loop.call_later(0.02, drain)
    loop.run_forever()
    assert fired == ["drained"]


def test_reader_and_writer_on_one_socket_are_independent(loop, pair):
    left, right = pair
    events = []

    def on_writable():
        events.append("writable")
        loop.remove_writer(left)
        right.send(b"data")

    def on_readable():
        events.append("readable")
        left.recv(100)
        loop.stop()

    loop.add_reader(left, on_readable)
    loop.add_writer(left, on_writable)
    loop.run_forever()
    assert events == ["writable", "readable"]
    assert loop.remove_writer(left) is False
    assert loop.remove_reader(left) is True


def test_remove_reader_leaves_the_writer(loop, pair):
    left, _ = pair
    fired = []

    def on_writable():
        fired.append("writable")
        loop.remove_writer(left)
        loop.stop()

    loop.add_reader(left, fired.append, "readable")
    loop.add_writer(left, on_writable)
    assert loop.remove_reader(left) is True
    loop.run_forever()
    assert fired == ["writable"]


def test_reader_exception_goes_to_the_handler_and_the_loop_goes_on(
    loop, pair, exception_handler_calls
):
    left, right = pair

    def failing_reader():
        left.recv(100)
        raise OSError("reader failed")

    loop.add_reader(left, failing_reader)
    right.send(b"x")
    loop.call_later(0.02, loop.stop)
    loop.run_forever()
    assert loop.remove_reader(left) is True
    (context,) = exception_handler_calls.consume()
    assert isinstance(context["exception"], OSError)
    assert {"message", "exception", "handle"} <= context.keys()


def test_reader_sees_eof_when_the_peer_closes(loop, pair):
    left, right = pair
    received = []

    def on_readable():
        received.append(left.recv(100))
        loop.remove_reader(left)
        loop.stop()

    loop.add_reader(left, on_readable)
    loop.call_soon(right.close)
    loop.run_forever()
    assert received == [b""]


def test_reader_on_a_pipe_fires_on_hangup(loop):
    # A pipe whose writer closed reports only EPOLLHUP (no EPOLLIN); asyncio treats
    # that as readable, so the reader sees the end of file.
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    received = []

    def on_readable():
        received.append(os.read(read_fd, 100))
        loop.remove_reader(read_fd)
        loop.stop()

    try:
        loop.add_reader(read_fd, on_readable)
        loop.call_soon(os.close, write_fd)
        loop.run_forever()
    finally:
        os.close(read_fd)
    assert received == [b""]


def test_reader_on_a_pipe_gets_the_data(loop):
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    received = []

    def on_readable():
        received.append(os.read(read_fd, 100))
        loop.remove_reader(read_fd)
        loop.stop()

    try:
        loop.add_reader(read_fd, on_readable)
        loop.call_soon(os.write, write_fd, b"through a pipe")
        loop.run_forever()
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert received == [b"through a pipe"]


def test_add_reader_and_add_writer_return_none(loop, pair):
    left, _ = pair
    assert loop.add_reader(left, print) is None
    assert loop.add_writer(left, print) is None
    loop.remove_reader(left)
    loop.remove_writer(left)


def test_reader_with_a_file_object(loop, pair):
    left, right = pair

    class FileLike:
        def fileno(self):
            return left.fileno()

    fired = []

    def on_readable():
        fired.append(left.recv(100))
        loop.stop()

    loop.add_reader(FileLike(), on_readable)
    right.send(b"file-like")
    loop.run_forever()
    assert fired == [b"file-like"]
    assert loop.remove_reader(left.fileno()) is True


@pytest.mark.parametrize("direction", ["reader", "writer"])
def test_removing_the_only_callback_of_an_fd_closed_while_registered(loop, direction):
    left, right = socket.socketpair()
    fd = left.fileno()
    getattr(loop, f"add_{direction}")(fd, print)
    left.close()
    right.close()
    # The kernel already dropped the closed fd from the poll set; removal still succeeds.
    assert getattr(loop, f"remove_{direction}")(fd) is True
    assert getattr(loop, f"remove_{direction}")(fd) is False


def test_loop_keeps_running_after_a_registered_fd_is_closed(loop):
    left, right = socket.socketpair()
    fd = left.fileno()
    fired = []
    loop.add_reader(fd, fired.append, "closed fd")
    left.close()
    right.close()
    loop.call_later(0.02, loop.stop)
    loop.run_forever()
    assert fired == []
    loop.remove_reader(fd)


@pytest.mark.parametrize("direction", ["reader", "writer"])
def test_callback_of_a_closed_fd_does_not_follow_its_number_to_the_next_file(loop, direction):
    # The socket is closed without removing its callback; the next fd the loop itself opens
    # (ferroloop's signal wake-up socket, made when run_forever starts) may get its number. The
    # closed socket's callback must not fire for that file's readiness (it would, a writer at
    # every iteration, if the stale registration were carried over to the new file).
    left, right = socket.socketpair()
    fd = left.fileno()
    fired = []
    getattr(loop, f"add_{direction}")(fd, fired.append, "closed fd")
    left.close()
    right.close()
    loop.call_later(0.02, loop.stop)
    loop.run_forever()
    assert fired == []
    getattr(loop, f"remove_{direction}")(fd)


def test_add_reader_of_a_regular_file_is_refused(loop, tmp_path):
    path = tmp_path / "regular"
    path.write_bytes(b"data")
    with path.open("rb") as file:
        with pytest.raises(PermissionError) as info:
            loop.add_reader(file.fileno(), print)
        assert info.value.errno == errno.EPERM
        assert loop.remove_reader(file.fileno()) is False


@pytest.mark.parametrize("direction", ["reader", "writer"])
def test_add_of_a_closed_fd_number_raises_oserror_with_errno(loop, direction):
    fd = os.open(os.devnull, os.O_RDONLY)
    os.close(fd)
    with pytest.raises(OSError) as info:
        getattr(loop, f"add_{direction}")(fd, print)
    assert (info.value.errno, info.value.strerror) == (errno.EBADF, os.strerror(errno.EBADF))


@pytest.mark.parametrize("direction", ["reader", "writer"])
def test_remove_by_socket_object_after_the_socket_was_closed(loop, direction):
    left, right = socket.socketpair()
    getattr(loop, f"add_{direction}")(left, print)
    left.close()
    right.close()
    assert getattr(loop, f"remove_{direction}")(left) is True


def test_remove_on_a_closed_loop_with_a_closed_socket_returns_false(loop):
    left, right = socket.socketpair()
    left.close()
    right.close()
    loop.close()
    assert loop.remove_reader(left) is False
    assert loop.remove_writer(left) is False


def test_close_with_a_registered_fd_that_was_closed(loop):
    left, right = socket.socketpair()
    loop.add_reader(left.fileno(), print)
    loop.add_writer(left.fileno(), print)
    left.close()
    right.close()
    loop.close()
    assert loop.is_closed()


def test_add_reader_rejects_invalid_file_object(loop):
    with pytest.raises(ValueError, match="Invalid file object"):
        loop.add_reader(object(), print)


def test_add_reader_rejects_negative_fd(loop):
    with pytest.raises(ValueError):
        loop.add_reader(-1, print)


@pytest.mark.parametrize("direction", ["reader", "writer"])
def test_fd_numbers_beyond_a_c_int(loop, direction):
    # asyncio: epoll.register raises OverflowError; remove_* finds nothing registered; a
    # negative number is invalid however large.
    with pytest.raises(OverflowError):
        getattr(loop, f"add_{direction}")(2**40, print)
    assert getattr(loop, f"remove_{direction}")(2**40) is False
    with pytest.raises(ValueError, match="Invalid file descriptor"):
        getattr(loop, f"add_{direction}")(-(2**70), print)


def test_add_writer_rejects_invalid_file_object(loop):
    with pytest.raises(ValueError, match="Invalid file object"):
        loop.add_writer("not a file", print)


def test_add_reader_after_close_raises(loop, pair):
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.add_reader(pair[0], print)


def test_add_writer_after_close_raises(loop, pair):
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.add_writer(pair[0], print)


def test_remove_reader_after_close_returns_false(loop, pair):
    loop.close()
    assert loop.remove_reader(pair[0]) is False
    assert loop.remove_writer(pair[0]) is False


def test_many_readers_each_fire(loop):
    pairs = [socket.socketpair() for _ in range(50)]
    try:
        fired = set()

        def on_readable(index, sock):
            sock.recv(100)
            fired.add(index)
            loop.remove_reader(sock)
            if len(fired) == len(pairs):
                loop.stop()

        for index, (reader, _) in enumerate(pairs):
            loop.add_reader(reader, on_readable, index, reader)
        for _, writer in pairs:
            writer.send(b"x")
        loop.run_forever()
        assert fired == set(range(50))
    finally:
        for reader, writer in pairs:
            reader.close()
            writer.close()


@pytest.mark.parametrize("method", ["add_reader", "add_writer", "remove_reader", "remove_writer"])
def test_public_fd_methods_refuse_an_fd_owned_by_a_transport(loop, method):
    async def close_at_once(_reader, writer):
        writer.close()
        await writer.wait_closed()

    async def main():
        server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
        _reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        fd = writer.transport.get_extra_info("socket").fileno()
        try:
            args = (fd, print) if method.startswith("add") else (fd,)
            with pytest.raises(RuntimeError, match="is used by transport"):
                getattr(loop, method)(*args)
        finally:
            writer.close()
            await writer.wait_closed()
            server.close()
            await server.wait_closed()

    loop.run_until_complete(main())
