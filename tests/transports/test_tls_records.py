"""The per-record TLS path (ferroloop's native `TlsRecords`) against asyncio's `sslproto`.

Each case drives data through a TLS connection in a way that exercises one branch of the
record path: many records per read, many writes per record, the app pausing reads, a
`BufferedProtocol` app with a buffer smaller than a record, closing or aborting from inside
`data_received`, and the peer going away mid-stream.
"""

from __future__ import annotations

import asyncio

import ferroloop
import pytest


def _tls(client_ssl, server_ssl):
    return {"ssl": client_ssl, "server_hostname": "localhost", "server_ssl": server_ssl}


def test_tls_protocol_uses_the_native_record_path_on_ferroloop(
    loop, run, recorder, tcp_connect, server_ssl, client_ssl
):
    async def main():
        ends = await tcp_connect(recorder, recorder, **_tls(client_ssl, server_ssl))
        protocols = [
            ends.client.transport._ssl_protocol,
            ends.accepted.transport._ssl_protocol,
        ]
        native = [p._records is not None for p in protocols if hasattr(p, "_records")]
        await ends.close()
        return native, protocols

    native, protocols = run(main())
    if isinstance(loop, ferroloop.Loop):
        assert native == [True, True]
        # connection_lost hands the protocol back to asyncio's methods and ends the cycle.
        assert all(p._records is None and "buffer_updated" not in vars(p) for p in protocols)
    else:
        assert native == []


def test_tls_many_small_writes_arrive_in_order(
    loop, run, recorder, tcp_connect, server_ssl, client_ssl
):
    class Echo(recorder):
        def data_received(self, data):
            super().data_received(data)
            for i in range(0, len(data), 7):
                self.transport.write(data[i : i + 7])

    chunks = [b"%05d|" % i for i in range(3000)]
    payload = b"".join(chunks)

    async def main():
        ends = await tcp_connect(Echo, recorder, **_tls(client_ssl, server_ssl))
        for chunk in chunks:
            ends.client.transport.write(chunk)
        echoed = await ends.client.received_at_least(len(payload))
        await ends.close()
        return echoed

    assert run(main()) == payload


def test_tls_large_writes_and_writelines(loop, run, recorder, tcp_connect, server_ssl, client_ssl):
    big = bytes(range(256)) * 16384  # 4 MiB in one write
    parts = [b"x" * 100_000, bytearray(b"y" * 70_000), memoryview(b"z" * 50_000)]
    expected = big + b"".join(bytes(p) for p in parts)

    async def main():
        ends = await tcp_connect(recorder, recorder, **_tls(client_ssl, server_ssl))
        ends.client.transport.write(big)
        ends.client.transport.writelines(parts)
        received = await ends.accepted.received_at_least(len(expected))
        await ends.close()
        return received

    assert run(main()) == expected


def test_tls_write_type_errors_match_asyncio(
    loop, run, recorder, tcp_connect, server_ssl, client_ssl
):
    async def main():
        ends = await tcp_connect(recorder, recorder, **_tls(client_ssl, server_ssl))
        with pytest.raises(TypeError, match="data: expecting a bytes-like instance, got str"):
            ends.client.transport.write("text")
        ends.client.transport.write(b"")  # nothing, no error
        ends.client.transport.write(b"after")
        received = await ends.accepted.received_at_least(5)
        await ends.close()
        return received

    assert run(main()) == b"after"


def test_tls_app_pause_reading_holds_data_until_resume(
    loop, run, recorder, tcp_connect, server_ssl, client_ssl
):
    class Pausing(recorder):
        paused_once = False

        def data_received(self, data):
            super().data_received(data)
            if len(self.received) >= 10 and not self.paused_once:
                self.paused_once = True
                self.transport.pause_reading()

    async def main():
        ends = await tcp_connect(Pausing, recorder, **_tls(client_ssl, server_ssl))
        ends.client.transport.write(b"0123456789")
        await ends.accepted.received_at_least(10)
        assert not ends.accepted.transport.is_reading()
        ends.client.transport.write(b"more data while paused")
        await asyncio.sleep(0.2)
        held = bytes(ends.accepted.received)
        ends.accepted.transport.resume_reading()
        after = await ends.accepted.received_at_least(32)
        await ends.close()
        return held, after

    held, after = run(main())
    assert held == b"0123456789"
    assert after == b"0123456789more data while paused"


def test_tls_buffered_protocol_with_a_buffer_smaller_than_a_record(
    loop, run, recorder, buffered_recorder, tcp_connect, server_ssl, client_ssl
):
    payload = bytes(range(256)) * 1024  # 256 KiB through a 100-byte buffer

    class Buffered(buffered_recorder):
        buffer_size = 100

        def __init__(self):
            super().__init__()
            # A memoryview: asyncio's sslproto reads the rest of a record into `buf[offset:]`,
            # which for a bytearray would be a copy.
            self.buffer = memoryview(self.buffer)
            self.done = loop.create_future()

        def buffer_updated(self, nbytes):
            super().buffer_updated(nbytes)
            if len(self.received) >= len(payload) and not self.done.done():
                self.done.set_result(None)

    async def main():
        ends = await tcp_connect(Buffered, recorder, **_tls(client_ssl, server_ssl))
        ends.client.transport.write(payload)
        await ends.accepted.done
        await ends.close()
        return bytes(ends.accepted.received), ends.accepted.calls

    received, calls = run(main())
    assert received == payload
    assert calls >= len(payload) // 100


def test_tls_close_from_data_received_flushes_the_reply(
    loop, run, recorder, tcp_connect, server_ssl, client_ssl
):
    class ReplyAndClose(recorder):
        def data_received(self, data):
            super().data_received(data)
            self.transport.write(b"bye:" + data)
            self.transport.close()
            self.transport.write(b"ignored after close")

    async def main():
        ends = await tcp_connect(ReplyAndClose, recorder, **_tls(client_ssl, server_ssl))
        ends.client.transport.write(b"hello")
        await ends.client.eof
        reply = bytes(ends.client.received)
        await ends.close()
        return reply, ends.accepted.milestones()

    reply, milestones = run(main())
    assert reply == b"bye:hello"
    # asyncio's shutdown reads the peer's close_notify: eof_received before connection_lost.
    assert milestones == ["connection_made", "data_received", "eof_received", "connection_lost"]


def test_tls_abort_from_data_received(loop, run, recorder, tcp_connect, server_ssl, client_ssl):
    class Abort(recorder):
        def data_received(self, data):
            super().data_received(data)
            self.transport.abort()

    async def main():
        ends = await tcp_connect(Abort, recorder, **_tls(client_ssl, server_ssl))
        ends.client.transport.write(b"x" * 50_000)
        lost = await ends.accepted.lost
        await ends.client.lost
        ends.client.transport.close()
        return lost, ends.accepted.milestones()

    lost, milestones = run(main())
    assert lost is None
    assert milestones == ["connection_made", "data_received", "connection_lost"]


def test_tls_write_eof_during_data_is_refused(
    loop, run, recorder, tcp_connect, server_ssl, client_ssl
):
    class HalfClose(recorder):
        error = None

        def data_received(self, data):
            super().data_received(data)
            try:
                self.transport.write_eof()
            except NotImplementedError as exc:
                self.error = exc
            self.transport.write(data)

    async def main():
        ends = await tcp_connect(HalfClose, recorder, **_tls(client_ssl, server_ssl))
        ends.client.transport.write(b"ping")
        echoed = await ends.client.received_at_least(4)
        await ends.close()
        return echoed, ends.accepted.error

    echoed, error = run(main())
    assert echoed == b"ping"
    assert isinstance(error, NotImplementedError)


def test_tls_peer_vanishing_mid_stream_loses_the_connection(
    loop, run, recorder, tcp_connect, server_ssl, client_ssl
):
    payload = b"p" * 1_000_000

    async def main():
        ends = await tcp_connect(recorder, recorder, **_tls(client_ssl, server_ssl))
        ends.client.transport.write(payload)
        await ends.accepted.received_at_least(1)
        # Abort the socket transport under TLS: the peer gets no close_notify.
        ends.client.transport._ssl_protocol._transport.abort()
        await ends.accepted.lost
        await ends.client.lost
        return bytes(ends.accepted.received)

    received = run(main())
    assert payload.startswith(received)


def test_tls_error_in_data_received_is_a_fatal_ssl_protocol_error(
    loop, run, recorder, tcp_connect, server_ssl, client_ssl, exception_handler_calls
):
    class Broken(recorder):
        def data_received(self, data):
            super().data_received(data)
            raise RuntimeError("app bug")

    async def main():
        ends = await tcp_connect(Broken, recorder, **_tls(client_ssl, server_ssl))
        ends.client.transport.write(b"boom")
        lost = await ends.accepted.lost
        await ends.client.lost
        return lost

    run(main())
    (context,) = exception_handler_calls.consume()
    assert context["message"] == "Fatal error on SSL protocol"
    assert isinstance(context["exception"], RuntimeError)


def test_tls_buffered_app_switching_to_a_plain_protocol_mid_stream(
    loop, run, recorder, buffered_recorder, tcp_connect, server_ssl, client_ssl
):
    class Switch(buffered_recorder):
        buffer_size = 4096
        plain = None

        def buffer_updated(self, nbytes):
            super().buffer_updated(nbytes)
            if self.plain is None and len(self.received) >= 5:
                self.plain = recorder()
                self.plain.transport = self.transport
                self.transport.set_protocol(self.plain)

    async def main():
        ends = await tcp_connect(Switch, recorder, **_tls(client_ssl, server_ssl))
        ends.client.transport.write(b"first")
        await asyncio.sleep(0.1)
        ends.client.transport.write(b"second")
        while ends.accepted.plain is None or len(ends.accepted.plain.received) < 6:
            await asyncio.sleep(0.01)
        result = bytes(ends.accepted.received), bytes(ends.accepted.plain.received)
        ends.client.transport.close()
        await ends.client.lost
        await ends.accepted.plain.lost
        return result

    assert run(main()) == (b"first", b"second")


def test_tls_write_limits_set_from_data_received_pause_and_resume_the_app(
    loop, run, recorder, tcp_connect, server_ssl, client_ssl
):
    # The water marks and the paused flags are slots read natively for every record: a limit
    # the app sets inside data_received must govern the writes that follow, as in asyncio.
    chunk = b"w" * 65536

    class Flooding(recorder):
        sent = 0

        def data_received(self, data):
            super().data_received(data)
            self.transport.set_write_buffer_limits(high=4096)
            while "pause_writing" not in self.events and self.sent < 64 * 1024 * 1024:
                self.transport.write(chunk)
                self.sent += len(chunk)

    async def main():
        ends = await tcp_connect(Flooding, recorder, **_tls(client_ssl, server_ssl))
        ends.client.transport.pause_reading()
        ends.client.transport.write(b"go")
        await ends.accepted.received_at_least(2)
        paused = "pause_writing" in ends.accepted.events
        ends.client.transport.resume_reading()
        received = await ends.client.received_at_least(ends.accepted.sent)
        for _ in range(100):
            if "resume_writing" in ends.accepted.events:
                break
            await asyncio.sleep(0.01)
        await ends.close()
        return paused, len(received) == ends.accepted.sent, ends.accepted.milestones()

    paused, complete, milestones = run(main())
    assert paused and complete
    assert [m for m in milestones if m.endswith("_writing")] == ["pause_writing", "resume_writing"]


def test_tls_protocol_attributes_can_be_patched_and_restored(
    loop, run, recorder, tcp_connect, server_ssl, client_ssl
):
    # On ferroloop these are __slots__ read natively: mock.patch.object (getattr, setattr,
    # then delattr and setattr on exit) must leave them working as plain attributes do.
    from unittest import mock

    names = ["_state", "_write_backlog", "_outgoing_high_water", "_app_protocol", "_transport"]

    async def main():
        ends = await tcp_connect(recorder, recorder, **_tls(client_ssl, server_ssl))
        proto = ends.accepted.transport._ssl_protocol
        before = [getattr(proto, n) for n in names]
        for name, value in zip(names, before, strict=True):
            with mock.patch.object(proto, name, value):
                assert getattr(proto, name) is value
        after = [getattr(proto, n) for n in names]
        ends.client.transport.write(b"still records")
        received = await ends.accepted.received_at_least(13)
        await ends.close()
        return all(a is b for a, b in zip(before, after, strict=True)), received

    assert run(main()) == (True, b"still records")


def test_tls_records_go_through_a_replaced_socket_transport_write(
    loop, run, recorder, tcp_connect, server_ssl, client_ssl
):
    # ferroloop calls its own socket transport's write directly; a write replaced on the
    # instance must still be the one called, as asyncio looks it up for every record.
    from unittest import mock

    async def main():
        ends = await tcp_connect(recorder, recorder, **_tls(client_ssl, server_ssl))
        socket_transport = ends.accepted.transport._ssl_protocol._transport
        real_write = socket_transport.write
        with mock.patch.object(socket_transport, "write", side_effect=real_write) as spy:
            ends.accepted.transport.write(b"through the spy")
            received = await ends.client.received_at_least(15)
        await ends.close()
        return spy.call_count, received

    calls, received = run(main())
    assert calls >= 1 and received == b"through the spy"
