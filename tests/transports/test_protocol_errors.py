"""Exceptions raised by protocol callbacks: fatal transport errors, SystemExit."""

from __future__ import annotations

import asyncio

import pytest


def test_exception_in_data_received_is_a_fatal_error(
    loop, run, recorder, tcp_connect, exception_handler_calls
):
    class Broken(recorder):
        def data_received(self, data):
            super().data_received(data)
            raise ZeroDivisionError("bad data")

    async def main():
        ends = await tcp_connect(Broken, recorder)
        ends.client.transport.write(b"boom")
        await ends.accepted.lost
        await ends.client.lost
        return ends

    ends = run(main())
    assert isinstance(ends.accepted.lost_exc, ZeroDivisionError)
    assert ends.client.lost_exc is None  # the peer just sees the connection closed
    (context,) = exception_handler_calls.consume()
    assert context["message"] == "Fatal error: protocol.data_received() call failed."
    assert context["exception"] is ends.accepted.lost_exc
    assert context["protocol"] is ends.accepted
    assert context["transport"] is ends.accepted.transport


def test_exception_in_eof_received_is_a_fatal_error(
    loop, run, recorder, tcp_connect, exception_handler_calls
):
    class Broken(recorder):
        def eof_received(self):
            super().eof_received()
            raise ZeroDivisionError("bad eof")

    async def main():
        ends = await tcp_connect(Broken, recorder)
        ends.client.transport.write_eof()
        await ends.accepted.lost
        ends.client.transport.close()
        await ends.client.lost
        return ends

    ends = run(main())
    assert isinstance(ends.accepted.lost_exc, ZeroDivisionError)
    (context,) = exception_handler_calls.consume()
    assert context["message"] == "Fatal error: protocol.eof_received() call failed."


def test_exception_in_connection_made_reaches_the_handler(
    loop, run, recorder, tcp_connect, exception_handler_calls
):
    class Broken(recorder):
        def connection_made(self, transport):
            super().connection_made(transport)
            raise ZeroDivisionError("bad start")

    async def main():
        ends = await tcp_connect(recorder, Broken)
        await ends.close()
        return ends

    ends = run(main())
    (context,) = exception_handler_calls.consume()
    assert isinstance(context["exception"], ZeroDivisionError)
    assert context["message"].startswith("Exception in callback")
    assert ends.client.events[-1] == "connection_lost"


@pytest.mark.parametrize("exception", [SystemExit, KeyboardInterrupt])
def test_base_exception_in_data_received_propagates_and_the_transport_survives(
    loop, run, recorder, tcp_connect, exception
):
    class Exiting(recorder):
        def data_received(self, data):
            super().data_received(data)
            if data == b"exit":
                raise exception

    ends = run(tcp_connect(Exiting, recorder))

    async def send(data):
        ends.client.transport.write(data)
        await asyncio.sleep(3600)

    with pytest.raises(exception):
        loop.run_until_complete(send(b"exit"))

    async def after():
        ends.client.transport.write(b"still open")
        received = await ends.accepted.received_at_least(len(b"exitstill open"))
        await ends.close()
        return received

    assert run(after()) == b"exitstill open"
