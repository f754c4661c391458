"""BufferedProtocol on TCP transports: get_buffer / buffer_updated instead of data_received."""

from __future__ import annotations

import asyncio

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB


class Collector(asyncio.BufferedProtocol):
    """Receives into a fixed-size buffer and copies out what each buffer_updated reports."""

    buffer_size = 4096

    def __init__(self):
        loop = asyncio.get_running_loop()
        self.events = []
        self.size_hints = []
        self.updates = []
        self.received = bytearray()
        self.buffer = bytearray(self.buffer_size)
        self.made = loop.create_future()
        self.lost = loop.create_future()
        self.lost_exc = None

    def connection_made(self, transport):
        self.events.append("connection_made")
        self.transport = transport
        self.made.set_result(None)

    def get_buffer(self, sizehint):
        self.size_hints.append(sizehint)
        return self.buffer

    def buffer_updated(self, nbytes):
        self.updates.append(nbytes)
        self.received += self.buffer[:nbytes]

    def eof_received(self):
        self.events.append("eof_received")

    def connection_lost(self, exc):
        self.events.append("connection_lost")
        self.lost_exc = exc
        self.lost.set_result(None)


def test_buffered_protocol_receives_everything_in_order(loop, run, recorder, tcp_connect):
    async def main():
        ends = await tcp_connect(Collector, recorder)
        ends.client.transport.write(PAYLOAD)
        ends.client.transport.write_eof()
        await ends.accepted.lost
        ends.client.transport.close()
        await ends.client.lost
        return ends.accepted

    collector = run(main())
    assert bytes(collector.received) == PAYLOAD
    assert collector.events == ["connection_made", "eof_received", "connection_lost"]
    assert collector.lost_exc is None
    assert all(0 < n <= Collector.buffer_size for n in collector.updates)
    assert sum(collector.updates) == len(PAYLOAD)
    assert all(isinstance(hint, int) for hint in collector.size_hints)


def test_small_buffer_splits_data_into_many_updates(loop, run, recorder, tcp_connect):
    class Tiny(Collector):
        buffer_size = 7

    async def main():
        ends = await tcp_connect(Tiny, recorder)
        ends.client.transport.write(b"abcdefghijklmnopqrstuvwxyz")
        await ends.close()
        return ends.accepted

    collector = run(main())
    assert bytes(collector.received) == b"abcdefghijklmnopqrstuvwxyz"
    assert len(collector.updates) >= 4
    assert max(collector.updates) <= 7


def test_memoryview_buffer_is_accepted(loop, run, recorder, tcp_connect):
    class Viewed(Collector):
        def get_buffer(self, sizehint):
            self.size_hints.append(sizehint)
            return memoryview(self.buffer)[:100]

    async def main():
        ends = await tcp_connect(Viewed, recorder)
        ends.client.transport.write(b"x" * 250)
        await ends.close()
        return ends.accepted

    collector = run(main())
    assert bytes(collector.received) == b"x" * 250
    assert max(collector.updates) <= 100


def run_collector(run, recorder, tcp_connect, collector):
    async def main():
        ends = await tcp_connect(collector, recorder)
        ends.client.transport.write(b"data")
        await ends.accepted.lost
        ends.client.transport.close()
        await ends.client.lost
        return ends.accepted

    return run(main())


def test_empty_buffer_is_a_fatal_error(loop, run, recorder, tcp_connect, exception_handler_calls):
    class Empty(Collector):
        def get_buffer(self, sizehint):
            return bytearray()

    collector = run_collector(run, recorder, tcp_connect, Empty)
    assert isinstance(collector.lost_exc, RuntimeError)
    assert "get_buffer() returned an empty buffer" in str(collector.lost_exc)
    (context,) = exception_handler_calls.consume()
    assert context["message"] == "Fatal error: protocol.get_buffer() call failed."
    assert context["exception"] is collector.lost_exc
    assert context["protocol"] is collector


def test_exception_in_buffer_updated_is_a_fatal_error(
    loop, run, recorder, tcp_connect, exception_handler_calls
):
    class Broken(Collector):
        def buffer_updated(self, nbytes):
            raise ZeroDivisionError("broken protocol")

    collector = run_collector(run, recorder, tcp_connect, Broken)
    assert isinstance(collector.lost_exc, ZeroDivisionError)
    (context,) = exception_handler_calls.consume()
    assert context["message"] == "Fatal error: protocol.buffer_updated() call failed."
    assert context["exception"] is collector.lost_exc


def test_get_buffer_raising_is_a_fatal_error(
    loop, run, recorder, tcp_connect, exception_handler_calls
):
    class Raising(Collector):
        def get_buffer(self, sizehint):
            raise ValueError("no buffer today")

    protocol = run_collector(run, recorder, tcp_connect, Raising)
    assert isinstance(protocol.lost_exc, ValueError)
    (context,) = exception_handler_calls.consume()
    assert context["message"] == "Fatal error: protocol.get_buffer() call failed."
    assert context["exception"] is protocol.lost_exc
    assert context["transport"] is protocol.transport


def test_read_only_buffer_is_a_fatal_read_error(
    loop, run, recorder, tcp_connect, exception_handler_calls
):
    class ReadOnly(Collector):
        def get_buffer(self, sizehint):
            return b"not writable"

    protocol = run_collector(run, recorder, tcp_connect, ReadOnly)
    assert isinstance(protocol.lost_exc, TypeError)
    (context,) = exception_handler_calls.consume()
    assert context["message"] == "Fatal read error on socket transport"
    assert context["exception"] is protocol.lost_exc


def test_set_protocol_switches_between_data_received_and_get_buffer(
    loop, run, recorder, tcp_connect
):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        ends.client.transport.write(b"first")
        await ends.accepted.received_at_least(5)
        collector = Collector()
        ends.accepted.transport.set_protocol(collector)
        ends.client.transport.write(b"second")
        while len(collector.received) < 6:
            await asyncio.sleep(0.001)
        ends.accepted.transport.set_protocol(ends.accepted)
        ends.client.transport.write(b"third")
        await ends.accepted.received_at_least(10)
        await ends.close()
        return bytes(ends.accepted.received), bytes(collector.received)

    assert run(main()) == (b"firstthird", b"second")
