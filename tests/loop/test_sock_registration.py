"""When a socket operation's fd enters and leaves the poller.

A native `sock_recv`/`sock_sendall` that has to wait registers its socket; when it ends, the
registration is parked, not deleted, until the loop next polls, so the same socket's next
operation (queued by the same task in the same iteration, as in any receive loop) takes it back
without an `epoll_ctl` pair (docs/architecture.md, "Parked socket registrations"). These tests
pin what that must not change: a socket closed in that window, its fd number reused, a reader
added or removed by hand, and a file that outlives its closed fd.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import sys

import pytest


def _pair() -> tuple[socket.socket, socket.socket]:
    left, right = socket.socketpair()
    left.setblocking(False)
    right.setblocking(False)
    return left, right


def test_a_socket_closed_after_a_receive_and_its_fd_number_reused(loop):
    # Closed in the same step as its receive ended; the number then names another socket's file,
    # whose receive must be registered for that file, not mistaken for the parked one.
    a, b = _pair()
    c, d = _pair()

    async def main():
        loop.call_later(0.01, b.send, b"one")
        first = await loop.sock_recv(a, 100)
        number = a.fileno()
        a.close()
        os.dup2(c.fileno(), number)
        e = socket.socket(fileno=number)
        e.setblocking(False)
        with e:
            loop.call_later(0.01, d.send, b"two")
            # Awaited directly: it starts in this step, not in a new task after a poll.
            second = await loop.sock_recv(e, 100)
        return first, second

    with b, c, d:
        assert loop.run_until_complete(asyncio.wait_for(main(), 5)) == (b"one", b"two")


def test_a_reader_added_by_hand_after_a_receive(loop):
    a, b = _pair()

    async def main():
        loop.call_later(0.01, b.send, b"one")
        first = await loop.sock_recv(a, 100)
        seen = loop.create_future()
        loop.add_reader(a, lambda: seen.done() or seen.set_result(a.recv(100)))
        b.send(b"two")
        try:
            return first, await seen
        finally:
            assert loop.remove_reader(a)

    with a, b:
        assert loop.run_until_complete(asyncio.wait_for(main(), 5)) == (b"one", b"two")


def test_remove_reader_after_a_receive_has_nothing_to_remove(loop):
    a, b = _pair()

    async def main():
        loop.call_later(0.01, b.send, b"one")
        data = await loop.sock_recv(a, 100)
        return data, loop.remove_reader(a), loop.remove_writer(a)

    with a, b:
        assert loop.run_until_complete(main()) == (b"one", False, False)


def test_alternating_receives_and_sends_on_one_socket(loop):
    # Parked after a read, taken back for a write that has to wait, then for a read again.
    a, b = _pair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    big = b"x" * 2_000_000

    async def drain():
        got = 0
        while got < len(big):
            got += len(await loop.sock_recv(b, 65536))
        return got

    async def main():
        for round_ in range(3):
            loop.call_later(0.005, b.send, b"ping")
            assert await loop.sock_recv(a, 100) == b"ping"
            reader = loop.create_task(drain())
            await loop.sock_sendall(a, big)
            assert await reader == len(big), round_
        return True

    with a, b:
        assert loop.run_until_complete(main())


# ferroloop only: what the kernel's epoll set holds, read from /proc.


def _epoll_fds() -> set[int]:
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[eventpoll]":
                found.add(int(name))
        except OSError:
            pass
    return found


def _watched(epfd: int) -> set[int]:
    with open(f"/proc/self/fdinfo/{epfd}") as info:
        return {int(m) for m in re.findall(r"^tfd:\s*(\d+)", info.read(), re.M)}


def _watched_files(epfd: int) -> set[int]:
    """The inode numbers of the files the epoll set watches (the fd number may be reused)."""
    with open(f"/proc/self/fdinfo/{epfd}") as info:
        return {int(m, 16) for m in re.findall(r"^tfd:.*\bino:([0-9a-f]+)", info.read(), re.M)}


@pytest.fixture
def own_ferroloop():
    """A ferroloop loop and its epoll fd."""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    import ferroloop

    before = _epoll_fds()
    lp = ferroloop.new_event_loop()
    (epfd,) = _epoll_fds() - before
    try:
        yield lp, epfd
    finally:
        lp.close()


def test_a_finished_operation_leaves_epoll_by_the_next_poll(own_ferroloop):
    lp, epfd = own_ferroloop
    a, b = _pair()

    async def main():
        lp.call_later(0.01, b.send, b"one")
        assert await lp.sock_recv(a, 100) == b"one"
        during = a.fileno() in _watched(epfd)
        # Nothing else is ready while this sleeps, so the loop polls (a busy loop may run
        # several iterations between polls: ferroloop_core::poll_budget).
        await asyncio.sleep(0.001)
        return during, a.fileno() in _watched(epfd)

    with a, b:
        # Parked until the poll, gone after it: closing the socket then is always safe.
        assert lp.run_until_complete(main()) == (True, False)


def test_remove_reader_takes_a_parked_socket_out_at_once(own_ferroloop):
    lp, epfd = own_ferroloop
    a, b = _pair()

    async def main():
        lp.call_later(0.01, b.send, b"one")
        await lp.sock_recv(a, 100)
        assert not lp.remove_reader(a)
        return a.fileno() in _watched(epfd)

    with a, b:
        assert lp.run_until_complete(main()) is False


def test_a_registration_that_outlives_its_closed_fd_is_dropped(own_ferroloop):
    # The socket is closed while parked, and a duplicate keeps its file open (a forked child's
    # copy, say): epoll keeps that registration, which its closed fd can no longer remove, and
    # would report it on every poll once the file is readable. The loop starts epoll over.
    lp, epfd = own_ferroloop
    a, b = _pair()
    c, d = _pair()
    keep = os.dup(a.fileno())

    async def main():
        lp.call_later(0.01, b.send, b"one")
        assert await lp.sock_recv(a, 100) == b"one"
        a.close()
        b.send(b"unread")  # the orphaned registration's file is now readable
        lp.call_later(0.05, d.send, b"after")
        got = await lp.sock_recv(c, 100)
        await asyncio.sleep(0)
        return got

    try:
        with b, c, d:
            assert lp.run_until_complete(asyncio.wait_for(main(), 5)) == b"after"
            assert os.fstat(keep).st_ino not in _watched_files(epfd)
    finally:
        os.close(keep)


def test_a_reader_removed_after_its_fd_was_closed_leaves_no_registration(own_ferroloop):
    # The same leftover without parking: a reader's socket closed before remove_reader, while a
    # duplicate keeps the file open. The DEL finds no fd; the loop drops the registration at its
    # first event (asyncio's selector would report it on every poll from then on).
    lp, epfd = own_ferroloop
    a, b = _pair()
    keep = os.dup(a.fileno())
    number = a.fileno()
    lp.add_reader(number, lambda: None)
    a.close()
    assert lp.remove_reader(number)

    async def main():
        b.send(b"unread")
        await asyncio.sleep(0.001)  # idle: the loop polls and sees the event

    try:
        with b:
            lp.run_until_complete(main())
            # (The number itself may be reused meanwhile, by the loop's own signal wake-up
            # socket for one: the file is what must be gone.)
            assert os.fstat(keep).st_ino not in _watched_files(epfd)
    finally:
        os.close(keep)
