"""Edge cases of the stream socket transport that the native core must reproduce exactly.

Each case runs on asyncio's loop (the oracle) and on ferroloop, whose TCP and Unix transports
are native (``crates/py/src/transport``): BufferedProtocol failures, writes in odd states,
write-buffer thresholds, the write side of ``write_eof`` and the transport's lifetime.
"""

from __future__ import annotations

import array
import asyncio
import errno
import gc
import logging
import socket
import struct
import sys
import warnings
import weakref

import ferroloop
import pytest
from ferroloop._socket_transport import CLOSE_CLEARS_READ_READY_CB

FILL = bytes(range(256)) * 1024  # 256 KiB


async def fill_write_buffer(transport) -> None:
    """Writes until the kernel's socket buffers are full and the transport queues bytes."""
    while not transport.get_write_buffer_size():
        transport.write(FILL)
        await asyncio.sleep(0)


def test_stream_transport_is_an_asyncio_transport(loop, run, recorder, tcp_connect):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        facts = (
            isinstance(transport, asyncio.Transport),
            isinstance(transport, asyncio.ReadTransport),
            isinstance(transport, asyncio.WriteTransport),
            transport.get_protocol() is ends.client,
            transport.is_reading(),
            transport.can_write_eof(),
        )
        await ends.close()
        return facts

    assert run(main()) == (True, True, True, True, True, True)


def test_write_and_is_closing_work_through_the_class_and_detached_bound_methods(
    loop, run, recorder, tcp_connect
):
    # ferroloop's are native method descriptors of the class that find the core in a slot
    # (crates/py/src/transport/methods.rs); asyncio's are plain methods.
    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        cls = type(transport)
        write, is_closing = transport.write, transport.is_closing
        cls.write(transport, b"by class, ")
        write(bytearray(b"detached, "))
        transport.write(memoryview(b"bound"))
        before = (cls.is_closing(transport), is_closing(), transport.is_closing())
        await ends.accepted.received_at_least(25)
        transport.close()
        after = (cls.is_closing(transport), is_closing(), transport.is_closing())
        await ends.client.lost
        await ends.accepted.lost
        return before, after, bytes(ends.accepted.received)

    assert run(main()) == ((False,) * 3, (True,) * 3, b"by class, detached, bound")


def test_write_and_is_closing_of_an_uninitialised_transport_raise_attribute_error(
    loop, run, recorder, tcp_connect
):
    async def transport_class():
        ends = await tcp_connect(recorder, recorder)
        cls = type(ends.client.transport)
        await ends.close()
        return cls

    cls = run(transport_class())
    bare = cls.__new__(cls)
    with pytest.raises(AttributeError):
        bare.is_closing()
    with pytest.raises(AttributeError):
        bare.write(b"data")
    bare._sock = None  # what asyncio's __del__ reads


def test_write_to_a_reset_connection_loses_it_with_the_reset_error(
    loop, run, recorder, tcp_connect
):
    # The write finds nothing queued and sends at once (ferroloop: one send(MSG_NOSIGNAL)).
    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        transport.pause_reading()  # the reset is seen by the write, not by a read
        peer = ends.accepted.transport.get_extra_info("socket")
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        ends.accepted.transport.abort()
        await ends.accepted.lost
        await asyncio.sleep(0.05)  # the RST reaches the client's socket
        transport.write(b"into a reset connection")
        await ends.client.lost
        return ends.client.lost_exc, transport.get_write_buffer_size(), ends.client.milestones()

    exc, buffered, milestones = run(main())
    assert type(exc) is ConnectionResetError
    assert exc.errno == errno.ECONNRESET
    assert buffered == 0
    assert milestones == ["connection_made", "connection_lost"]


def test_close_clears_the_read_ready_cb_that_asyncio_code_inspects(
    loop, run, recorder, tcp_connect
):
    # asyncio's private reader callback: set while open; once close() ran, None where asyncio
    # has the gh-115514 fix (3.13 here), kept on 3.11. CPython 3.13's test_ssl reads it.
    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        before = transport._read_ready_cb
        await ends.close()
        return before, transport._read_ready_cb

    before, after = run(main())
    assert callable(before)
    assert (after is None) == CLOSE_CLEARS_READ_READY_CB


def test_writes_after_close_are_dropped_and_warned_about_past_the_threshold(
    loop, run, recorder, tcp_connect, caplog
):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        transport.close()
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            for _ in range(6):
                transport.write(b"late")
        await ends.client.lost
        await ends.accepted.lost
        return bytes(ends.accepted.received), transport.get_write_buffer_size()

    received, buffered = run(main())
    assert received == b""
    assert buffered == 0
    warnings = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    # close() counts as the first lost write; the 5th and 6th counted writes are logged.
    assert warnings == ["socket.send() raised exception."] * 2


def test_empty_writes_queue_nothing(loop, run, recorder, tcp_connect):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        for empty in (b"", bytearray(), memoryview(b"")):
            transport.write(empty)
        transport.writelines([])
        transport.writelines([b"", memoryview(b"")])
        size = transport.get_write_buffer_size()
        transport.write(b"end")
        await ends.accepted.received_at_least(3)
        await ends.close()
        return size, bytes(ends.accepted.received)

    assert run(main()) == (0, b"end")


def test_write_and_writelines_take_memoryviews_of_any_item_format(loop, run, recorder, tcp_connect):
    if sys.version_info >= (3, 12) and not isinstance(loop, ferroloop.Loop):
        # Its sendmsg-based writelines counts such a view by items, not bytes, and fails the
        # transport with "IndexError: pop from an empty deque".
        pytest.skip("asyncio 3.12+ loses track of memoryviews with multi-byte items")
    shorts = array.array("H", [1, 2, 3, 0xFFFF])
    expected = b"ab" + bytes(shorts) + b"cd" + b"ef" + bytes(shorts)

    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        transport.write(memoryview(b"xaby")[1:3])
        transport.write(memoryview(shorts))
        transport.writelines([bytearray(b"cd"), memoryview(b"ef"), memoryview(shorts)])
        await ends.accepted.received_at_least(len(expected))
        await ends.close()
        return bytes(ends.accepted.received)

    assert run(main()) == expected


def test_non_contiguous_memoryview_is_a_fatal_write_error(
    loop, run, recorder, tcp_connect, exception_handler_calls
):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        ends.client.transport.write(memoryview(b"abcdef")[::2])
        await ends.client.lost
        await ends.accepted.lost
        return ends.client

    client = run(main())
    assert isinstance(client.lost_exc, BufferError)
    (context,) = exception_handler_calls.consume()
    assert context["message"] == "Fatal write error on socket transport"
    assert context["exception"] is client.lost_exc


def test_pause_and_resume_writing_at_the_water_marks(loop, run, recorder, tcp_connect):
    class Watcher(recorder):
        def pause_writing(self):
            super().pause_writing()
            self.sizes.append(("pause", self.transport.get_write_buffer_size()))

        def resume_writing(self):
            super().resume_writing()
            self.sizes.append(("resume", self.transport.get_write_buffer_size()))

    async def main():
        ends = await tcp_connect(recorder, Watcher)
        client = ends.client
        client.sizes = []
        transport = client.transport
        transport.set_write_buffer_limits(high=10**9)
        ends.accepted.transport.pause_reading()
        await fill_write_buffer(transport)
        size = transport.get_write_buffer_size()
        transport.set_write_buffer_limits(high=size + 10, low=size // 2)
        transport.write(b"x" * 10)  # exactly at the high-water mark: not above it
        at_mark = list(client.sizes)
        transport.write(b"y")
        above_mark = list(client.sizes)
        transport.write(b"z")  # already paused: not paused again
        ends.accepted.transport.resume_reading()
        total = transport.get_write_buffer_size()
        while "resume_writing" not in client.events:
            await asyncio.sleep(0.001)
        ends.accepted.transport.close()
        await ends.accepted.lost
        await client.lost
        return size, total, at_mark, above_mark, client.sizes

    size, total, at_mark, above_mark, sizes = run(main())
    assert at_mark == []
    assert above_mark == [("pause", size + 11)]
    assert total == size + 12
    assert len(sizes) == 2
    assert sizes[1][0] == "resume"
    assert sizes[1][1] <= size // 2


@pytest.mark.parametrize("method", ["pause_writing", "resume_writing"])
def test_flow_control_callback_errors_go_to_the_exception_handler(
    loop, run, recorder, tcp_connect, exception_handler_calls, method
):
    class Broken(recorder):
        pass

    def broken(self):
        raise ZeroDivisionError(method)

    setattr(Broken, method, broken)

    async def main():
        ends = await tcp_connect(recorder, Broken)
        transport = ends.client.transport
        transport.set_write_buffer_limits(high=0)
        ends.accepted.transport.pause_reading()
        await fill_write_buffer(transport)
        ends.accepted.transport.resume_reading()
        while transport.get_write_buffer_size():
            await asyncio.sleep(0.001)
        alive = not transport.is_closing()
        ends.accepted.transport.close()
        await ends.accepted.lost
        await ends.client.lost
        return alive, ends.client

    alive, client = run(main())
    assert alive
    (context,) = exception_handler_calls.consume()
    assert context["message"] == f"protocol.{method}() failed"
    assert isinstance(context["exception"], ZeroDivisionError)
    assert context["protocol"] is client
    assert context["transport"] is client.transport


def test_write_eof_with_queued_bytes_shuts_down_after_they_drain(loop, run, recorder, tcp_connect):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        ends.accepted.transport.pause_reading()
        await fill_write_buffer(transport)
        sent = transport.get_write_buffer_size()
        transport.write_eof()
        transport.write_eof()  # a second call is a no-op
        queued_at_eof = transport.get_write_buffer_size()
        ends.accepted.transport.resume_reading()
        await ends.accepted.eof
        received = len(ends.accepted.received)
        transport.close()
        await ends.client.lost
        await ends.accepted.lost
        return sent, queued_at_eof, received, ends.accepted.milestones()

    sent, queued_at_eof, received, milestones = run(main())
    assert queued_at_eof == sent > 0
    assert received % len(FILL) == 0
    assert received >= len(FILL)
    assert milestones == ["connection_made", "data_received", "eof_received", "connection_lost"]


def test_close_with_queued_bytes_keeps_is_closing_and_loses_the_connection_once(
    loop, run, recorder, tcp_connect
):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        ends.accepted.transport.pause_reading()
        await fill_write_buffer(transport)
        transport.close()
        transport.close()
        states = [transport.is_closing(), transport.is_reading()]
        ends.accepted.transport.resume_reading()
        await ends.client.lost
        states.append(transport.get_write_buffer_size())
        await ends.accepted.lost
        return states, ends.client.events.count("connection_lost")

    assert run(main()) == ([True, False, 0], 1)


def test_closed_transport_and_protocol_cycle_is_collected(loop, run, recorder, tcp_connect):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        refs = [weakref.ref(ends.client), weakref.ref(ends.client.transport)]
        ends.client.transport.write(b"bye")
        await ends.close()
        return refs

    refs = run(main())
    loop.run_until_complete(asyncio.sleep(0))
    gc.collect()
    assert [ref() for ref in refs] == [None, None]


def test_unclosed_transport_warns_when_collected(loop, run):
    class Holder(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport  # a transport <-> protocol cycle

    async def main():
        a, b = socket.socketpair()
        transport, _ = await loop.create_connection(Holder, sock=a)
        transport.pause_reading()  # the loop no longer references it
        await asyncio.sleep(0)
        return weakref.ref(transport), b

    ref, peer = run(main())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    peer.close()
    messages = [str(w.message) for w in caught if w.category is ResourceWarning]
    # A recorded warning keeps its source, the transport, alive: 3.15's collector then leaves
    # the weak reference to it alive too (3.14's cleared it before the finalizer resurrected
    # it). Dropping the records lets the next collection free it.
    del caught
    gc.collect()
    assert ref() is None
    # The socket, collected in the same pass, may warn too (on both loops).
    assert any(m.startswith("unclosed transport <_SelectorSocketTransport") for m in messages)


def test_float_write_buffer_limits_are_kept_and_compared_as_numbers(
    loop, run, recorder, tcp_connect
):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        transport.set_write_buffer_limits(high=1000.5)
        limits = transport.get_write_buffer_limits()
        transport.set_write_buffer_limits(high=0.5, low=0.25)
        ends.accepted.transport.pause_reading()
        await fill_write_buffer(transport)
        paused = ends.client.events.count("pause_writing")
        ends.accepted.transport.resume_reading()
        while "resume_writing" not in ends.client.events:
            await asyncio.sleep(0.001)
        await ends.close()
        return limits, paused

    assert run(main()) == ((250.0, 1000.5), 1)


@pytest.mark.parametrize("name", ["StreamCore", "DatagramCore"])
def test_native_transport_cores_cannot_be_built_from_python(name):
    # Both cores get their constructor from one definition (core_pymethods! in
    # crates/py/src/transport/shared.rs); each must still name itself.
    core_class = getattr(ferroloop._native, name)
    message = rf"^{name} objects are created by the transport \({name}\._attach\)$"
    with pytest.raises(TypeError, match=message):
        core_class()
