"""The pipe transports' edges, asyncio against ferroloop's native pipe transports.

The cases follow asyncio's ``_UnixReadPipeTransport`` and ``_UnixWritePipeTransport`` through
their less travelled paths: the reader closing with bytes still queued, a write that fails at
once, writes after close, ``write_eof``/``close``/``abort`` while bytes are queued, flow control
with small limits (a pipe resumes writing only once its queue is empty), a protocol that raises,
the argument checks, sockets and regular files given as pipes, and subprocess pipes carrying
several MiB each way. ``RecordingProtocol`` resolves a future in ``connection_lost``, so a
second call would reach the loop's exception handler and fail the test.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import socket
import sys
import warnings
import weakref
from asyncio.subprocess import PIPE

import pytest


def fill(transport, chunk=b"q" * 65536):
    """Write until the transport queues something; return the bytes written."""
    written = 0
    while not transport.get_write_buffer_size():
        transport.write(chunk)
        written += len(chunk)
    return written


def drain_in_thread(loop, reader, size):
    """Read ``size`` bytes from a blocking pipe file in the executor."""

    def read_all():
        got = bytearray()
        while len(got) < size:
            part = reader.read(size - len(got))
            if not part:
                break
            got += part
        return bytes(got)

    return loop.run_in_executor(None, read_all)


def test_reader_closing_with_bytes_queued_loses_the_connection_with_broken_pipe(
    loop, run, recorder, pipe
):
    reader, writer = pipe

    async def main():
        transport, protocol = await loop.connect_write_pipe(recorder, writer)
        fill(transport)
        reader.close()
        await protocol.lost
        return protocol.lost_exc, transport.get_write_buffer_size(), protocol.events

    exc, buffered, events = run(main())
    assert type(exc) is BrokenPipeError
    assert buffered == 0
    assert events == ["connection_made", "connection_lost"]


def test_write_to_a_closed_reader_fails_at_once_without_reporting_to_the_loop(
    loop, run, recorder, pipe
):
    reader, writer = pipe

    async def main():
        transport, protocol = await loop.connect_write_pipe(recorder, writer)
        reader.close()
        transport.write(b"nobody reads this")  # before the loop notices: os.write fails
        lost_count_after_write = transport._conn_lost
        await protocol.lost
        return protocol.lost_exc, lost_count_after_write, transport.is_closing()

    exc, conn_lost, closing = run(main())
    assert isinstance(exc, BrokenPipeError)  # EPIPE, passed to connection_lost
    assert conn_lost == 1
    assert closing


def test_writes_after_close_are_dropped_and_logged_past_the_threshold(
    loop, run, recorder, pipe, caplog
):
    reader, writer = pipe

    async def main():
        transport, protocol = await loop.connect_write_pipe(recorder, writer)
        transport.write(b"kept")
        transport.close()
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            for _ in range(7):
                transport.write(b"dropped")
        await protocol.lost
        return transport._conn_lost

    assert run(main()) == 7
    assert reader.read() == b"kept"
    warnings = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert warnings == ["pipe closed by peer or os.write(pipe, data) raised exception."] * 2


@pytest.mark.parametrize("how", ["close", "write_eof"])
def test_close_and_write_eof_with_bytes_queued_deliver_everything_first(
    loop, run, recorder, pipe, how
):
    reader, writer = pipe
    size = 1 << 20

    async def main():
        transport, protocol = await loop.connect_write_pipe(recorder, writer)
        transport.write(bytes(range(256)) * (size // 256))
        queued = transport.get_write_buffer_size()
        getattr(transport, how)()
        closing = transport.is_closing()
        received = await drain_in_thread(loop, reader, size + 1)
        await protocol.lost
        return queued, closing, received, protocol

    queued, closing, received, protocol = run(main())
    assert queued > 0
    assert closing
    assert received == bytes(range(256)) * (size // 256)
    # 1 MiB queued is past the high-water mark; the drain resumes before the close completes.
    assert protocol.events == [
        "connection_made",
        "pause_writing",
        "resume_writing",
        "connection_lost",
    ]
    assert protocol.lost_exc is None


def test_abort_after_write_eof_with_bytes_queued(loop, run, recorder, pipe):
    _, writer = pipe

    async def main():
        transport, protocol = await loop.connect_write_pipe(recorder, writer)
        fill(transport)
        transport.write_eof()
        transport.abort()  # the queue is dropped; connection_lost once
        await protocol.lost
        await asyncio.sleep(0.01)
        return protocol.events, transport.get_write_buffer_size()

    assert run(main()) == (["connection_made", "connection_lost"], 0)
    assert writer.closed


def test_flow_control_resumes_only_when_the_queue_is_empty(loop, run, recorder, pipe):
    reader, writer = pipe

    class Recorder(recorder):
        def resume_writing(self):
            super().resume_writing()
            self.sizes.append(self.transport.get_write_buffer_size())

    async def main():
        transport, protocol = await loop.connect_write_pipe(Recorder, writer)
        protocol.sizes = []
        transport.set_write_buffer_limits(high=4096, low=2048)
        limits = transport.get_write_buffer_limits()
        written = fill(transport, b"f" * 70000)
        paused = protocol.events[-1]
        received = await drain_in_thread(loop, reader, written)
        while "resume_writing" not in protocol.events:
            await asyncio.sleep(0.01)
        transport.close()
        await protocol.lost
        return limits, paused, len(received) == written, protocol.sizes, protocol.events

    limits, paused, complete, sizes, events = run(main())
    assert limits == (2048, 4096)
    assert paused == "pause_writing"
    assert complete
    assert sizes == [0]
    assert events == ["connection_made", "pause_writing", "resume_writing", "connection_lost"]


def test_writes_of_bytearray_memoryview_and_writelines(loop, run, recorder, pipe):
    reader, writer = pipe

    async def main():
        transport, protocol = await loop.connect_write_pipe(recorder, writer)
        transport.write(bytearray(b"array "))
        transport.write(memoryview(b"xxview yy")[2:7])
        transport.write(b"")
        transport.writelines([b"li", bytearray(b"nes"), memoryview(b"!")])
        transport.close()
        await protocol.lost

    run(main())
    assert reader.read() == b"array view lines!"


def test_write_of_a_str_is_refused_as_asyncio_asserts(loop, run, recorder, pipe):
    _, writer = pipe

    async def main():
        transport, protocol = await loop.connect_write_pipe(recorder, writer)
        with pytest.raises(AssertionError, match="'text'"):
            transport.write("text")
        transport.close()
        await protocol.lost

    run(main())


def test_data_received_raising_reaches_the_exception_handler_and_reading_goes_on(
    loop, run, recorder, pipe, exception_handler_calls
):
    reader, writer = pipe

    class Raising(recorder):
        def data_received(self, data):
            super().data_received(data)
            if data.startswith(b"boom"):
                raise ZeroDivisionError("from data_received")

    async def main():
        transport, protocol = await loop.connect_read_pipe(Raising, reader)
        writer.write(b"boom")
        await protocol.received_at_least(4)
        await asyncio.sleep(0.01)
        writer.write(b" and more")
        await protocol.received_at_least(13)
        transport.close()
        await protocol.lost
        return bytes(protocol.received)

    assert run(main()) == b"boom and more"
    calls = exception_handler_calls.consume()
    assert [type(c["exception"]) for c in calls] == [ZeroDivisionError]
    assert calls[0]["message"] == "Exception in callback _UnixReadPipeTransport._read_ready()"


def test_read_pipe_set_protocol_switches_the_receiver(loop, run, recorder, pipe):
    reader, writer = pipe

    async def main():
        transport, first = await loop.connect_read_pipe(recorder, reader)
        second = recorder()
        transport.set_protocol(second)
        same = transport.get_protocol() is second
        writer.write(b"to the second")
        await second.received_at_least(13)
        writer.close()
        await second.lost
        return same, bytes(first.received), second.milestones()

    same, first_got, events = run(main())
    assert same
    assert first_got == b""
    assert events == ["data_received", "eof_received", "connection_lost"]


def test_read_pipe_close_twice_and_pause_after_close(loop, run, recorder, pipe):
    reader, _ = pipe

    async def main():
        transport, protocol = await loop.connect_read_pipe(recorder, reader)
        transport.close()
        transport.close()
        transport.pause_reading()
        transport.resume_reading()
        await protocol.lost
        await asyncio.sleep(0.01)
        return protocol.events, repr(transport)

    events, shown = run(main())
    assert events == ["connection_made", "connection_lost"]
    assert shown.startswith("<_UnixReadPipeTransport closed")


def test_unclosed_read_pipe_warns_and_closes_the_pipe_when_collected(loop, run, pipe):
    reader, _ = pipe

    class Holder(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport  # a transport <-> protocol cycle

    async def main():
        transport, _ = await loop.connect_read_pipe(Holder, reader)
        transport.pause_reading()  # the loop no longer references it
        await asyncio.sleep(0)
        return weakref.ref(transport)

    ref = run(main())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert reader.closed
    messages = [str(w.message) for w in caught if w.category is ResourceWarning]
    # A recorded warning keeps its source, the transport, alive: 3.15's collector then leaves
    # the weak reference to it alive too (3.14's cleared it before the finalizer resurrected
    # it). Dropping the records lets the next collection free it.
    del caught
    gc.collect()
    assert ref() is None
    assert any(m.startswith("unclosed transport <_UnixReadPipeTransport") for m in messages)


def test_a_regular_file_is_not_a_pipe(loop, run, recorder, tmp_path):
    path = tmp_path / "plain"
    path.write_bytes(b"data")

    async def main():
        read_only = "Pipe transport is for pipes/sockets only"
        with open(path, "rb") as f, pytest.raises(ValueError, match=read_only):
            await loop.connect_read_pipe(recorder, f)
        write_only = "Pipe transport is only for pipes, sockets"
        with open(path, "wb") as f, pytest.raises(ValueError, match=write_only):
            await loop.connect_write_pipe(recorder, f)

    run(main())


def test_a_socketpair_as_read_and_write_pipes(loop, run, recorder):
    left, right = socket.socketpair()

    async def main():
        wt, wp = await loop.connect_write_pipe(recorder, left)
        _, rp = await loop.connect_read_pipe(recorder, right)
        wt.write(b"over a socket" * 10000)
        received = await rp.received_at_least(130000)
        wt.close()
        await wp.lost
        await rp.lost
        return len(received), rp.milestones(), rp.lost_exc

    try:
        assert run(main()) == (
            130000,
            ["connection_made", "data_received", "eof_received", "connection_lost"],
            None,
        )
    finally:
        left.close()
        right.close()


def test_subprocess_cat_carries_several_mib_each_way(loop, run):
    size = 6 << 20
    payload = bytes(range(256)) * (size // 256)

    async def main():
        process = await asyncio.create_subprocess_exec("cat", stdin=PIPE, stdout=PIPE)
        stdout, _ = await process.communicate(payload)
        return stdout == payload, len(stdout), process.returncode

    assert run(main()) == (True, size, 0)


def test_subprocess_stdin_drain_and_stdout_stream(loop, run):
    chunk = b"0123456789abcdef" * 4096  # 64 KiB

    async def main():
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read()[::-1])",
            stdin=PIPE,
            stdout=PIPE,
        )
        for _ in range(32):
            process.stdin.write(chunk)
            await process.stdin.drain()
        process.stdin.close()
        await process.stdin.wait_closed()
        out = await process.stdout.read()
        return out == (chunk * 32)[::-1], await process.wait()

    assert run(main()) == (True, 0)


def test_pty_whose_other_side_closes_ends_with_eio_and_no_report(loop, run, recorder):
    # Reading a pty master after the slave closed fails with EIO, which asyncio's pipe transport
    # treats as the end of the stream: connection_lost(OSError(EIO)), no exception handler call.
    master_fd, slave_fd = os.openpty()
    master = os.fdopen(master_fd, "rb", buffering=0)

    async def main():
        transport, protocol = await loop.connect_read_pipe(recorder, master)
        os.write(slave_fd, b"last line\n")
        received = await protocol.received_at_least(10)
        os.close(slave_fd)
        await protocol.lost
        return received, protocol.lost_exc, protocol.milestones(), transport.is_closing()

    try:
        received, exc, events, closing = run(main())
    finally:
        master.close()
    assert received.replace(b"\r\n", b"\n") == b"last line\n"
    assert isinstance(exc, OSError)
    assert exc.errno == errno.EIO
    assert events == ["connection_made", "data_received", "connection_lost"]
    assert closing
