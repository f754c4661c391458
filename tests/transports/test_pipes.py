"""connect_read_pipe / connect_write_pipe over os.pipe()."""

from __future__ import annotations

import asyncio
import os


def test_read_pipe_delivers_data_then_eof_then_connection_lost(loop, run, recorder, pipe):
    reader, writer = pipe

    async def main():
        transport, protocol = await loop.connect_read_pipe(recorder, reader)
        writer.write(b"through the pipe")
        first = await protocol.received_at_least(16)
        writer.write(b", twice")
        writer.close()
        await protocol.lost
        return transport, protocol, first

    transport, protocol, first = run(main())
    assert first == b"through the pipe"
    assert bytes(protocol.received) == b"through the pipe, twice"
    assert protocol.milestones() == [
        "connection_made",
        "data_received",
        "eof_received",
        "connection_lost",
    ]
    assert protocol.lost_exc is None
    assert transport.is_closing()
    assert reader.closed  # the transport owns the pipe and closes it


def test_read_pipe_pause_and_resume_reading(loop, run, recorder, pipe):
    reader, writer = pipe

    async def main():
        transport, protocol = await loop.connect_read_pipe(recorder, reader)
        transport.pause_reading()
        states = [transport.is_reading()]
        writer.write(b"waiting")
        await asyncio.sleep(0.05)
        held = bytes(protocol.received)
        transport.resume_reading()
        states.append(transport.is_reading())
        received = await protocol.received_at_least(7)
        transport.close()
        await protocol.lost
        states.append(transport.is_reading())
        return states, held, received

    assert run(main()) == ([False, True, False], b"", b"waiting")


def test_read_pipe_extra_info_and_close(loop, run, recorder, pipe):
    reader, _ = pipe

    async def main():
        transport, protocol = await loop.connect_read_pipe(recorder, reader)
        pipe_info = transport.get_extra_info("pipe")
        transport.close()
        await protocol.lost
        return pipe_info, protocol.events

    pipe_info, events = run(main())
    assert pipe_info is reader
    assert events == ["connection_made", "connection_lost"]


def test_write_pipe_writes_and_close_gives_the_reader_eof(loop, run, recorder, pipe):
    reader, writer = pipe

    async def main():
        transport, protocol = await loop.connect_write_pipe(recorder, writer)
        transport.write(b"into ")
        transport.writelines([b"the ", b"pipe"])
        facts = (transport.can_write_eof(), transport.get_extra_info("pipe") is writer)
        transport.close()
        await protocol.lost
        return facts, protocol

    facts, protocol = run(main())
    assert facts == (True, True)
    assert reader.read() == b"into the pipe"  # read() to EOF: the write end is closed
    assert protocol.events == ["connection_made", "connection_lost"]
    assert protocol.lost_exc is None


def test_write_pipe_buffers_and_pauses_writing_when_the_reader_is_slow(loop, run, recorder, pipe):
    reader, writer = pipe
    chunk = b"p" * 65536

    async def main():
        transport, protocol = await loop.connect_write_pipe(recorder, writer)
        written = 0
        while "pause_writing" not in protocol.events:
            transport.write(chunk)
            written += len(chunk)
        buffered = transport.get_write_buffer_size()
        received = bytearray()
        while len(received) < written:
            received += await loop.run_in_executor(None, reader.read, 1 << 20)
        await asyncio.sleep(0)
        while transport.get_write_buffer_size():
            await asyncio.sleep(0.01)
        transport.close()
        await protocol.lost
        return written, buffered, len(received), protocol.events

    written, buffered, received, events = run(main())
    assert buffered > 0
    assert received == written
    assert events == ["connection_made", "pause_writing", "resume_writing", "connection_lost"]


def test_write_pipe_loses_the_connection_when_the_reader_closes(loop, run, recorder, pipe):
    reader, writer = pipe

    async def main():
        transport, protocol = await loop.connect_write_pipe(recorder, writer)
        reader.close()
        await protocol.lost
        return protocol.lost_exc, transport.is_closing()

    # With nothing buffered, a closed read end is a clean close for asyncio.
    assert run(main()) == (None, True)


def test_write_pipe_write_eof_closes_it(loop, run, recorder, pipe):
    reader, writer = pipe

    async def main():
        transport, protocol = await loop.connect_write_pipe(recorder, writer)
        transport.write(b"last words")
        transport.write_eof()
        await protocol.lost
        return transport.is_closing()

    assert run(main())
    assert reader.read() == b"last words"


def test_write_pipe_abort_drops_buffered_data(loop, run, recorder, pipe):
    _, writer = pipe

    async def main():
        transport, protocol = await loop.connect_write_pipe(recorder, writer)
        while not transport.get_write_buffer_size():
            transport.write(b"a" * 65536)
        transport.abort()
        await protocol.lost
        return transport.get_write_buffer_size(), protocol.lost_exc

    assert run(main()) == (0, None)
    assert writer.closed


def test_read_pipe_over_a_pty(loop, run, recorder):
    # A pty is a character device, which connect_read_pipe accepts besides pipes and sockets.
    master_fd, slave_fd = os.openpty()
    master = os.fdopen(master_fd, "rb", buffering=0)

    async def main():
        transport, protocol = await loop.connect_read_pipe(recorder, master)
        os.write(slave_fd, b"from the terminal\n")
        received = await protocol.received_at_least(18)
        transport.close()
        await protocol.lost
        return received

    try:
        received = run(main())
    finally:
        os.close(slave_fd)
        master.close()
    assert received.replace(b"\r\n", b"\n") == b"from the terminal\n"
