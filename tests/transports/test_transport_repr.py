"""Transport and server reprs: asyncio's format, with the polling state read from the loop."""

from __future__ import annotations

import asyncio
import re


def test_socket_transport_repr_follows_the_reading_and_writing_state(
    loop, run, recorder, tcp_connect
):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        fd = transport.get_extra_info("socket").fileno()
        reprs = [repr(transport)]
        transport.pause_reading()
        reprs.append(repr(transport))
        transport.resume_reading()
        ends.accepted.transport.pause_reading()
        while not transport.get_write_buffer_size():
            transport.write(b"w" * 65536)
        reprs.append(re.sub(r"bufsize=\d+", "bufsize=N", repr(transport)))
        ends.accepted.transport.resume_reading()
        transport.close()
        reprs.append(re.sub(r"bufsize=\d+", "bufsize=N", repr(transport)))
        await ends.client.lost
        await ends.accepted.lost
        reprs.append(repr(transport))
        return fd, reprs

    fd, reprs = run(main())
    assert reprs == [
        f"<_SelectorSocketTransport fd={fd} read=polling write=<idle, bufsize=0>>",
        f"<_SelectorSocketTransport fd={fd} read=idle write=<idle, bufsize=0>>",
        f"<_SelectorSocketTransport fd={fd} read=polling write=<polling, bufsize=N>>",
        f"<_SelectorSocketTransport closing fd={fd} read=idle write=<polling, bufsize=N>>",
        f"<_SelectorSocketTransport closed fd={fd}>",
    ]


def test_datagram_transport_repr(loop, run):
    async def main():
        transport, _ = await loop.create_datagram_endpoint(
            asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0)
        )
        fd = transport.get_extra_info("socket").fileno()
        text = repr(transport)
        transport.close()
        await asyncio.sleep(0)
        return fd, text

    fd, text = run(main())
    assert text == f"<_SelectorDatagramTransport fd={fd} read=polling write=<idle, bufsize=0>>"


def test_server_repr_lists_its_sockets(loop, run, recorder):
    async def main():
        server = await loop.create_server(recorder, "127.0.0.1", 0)
        text, sockets = repr(server), repr(server.sockets)
        server.close()
        await server.wait_closed()
        return text, sockets, repr(server)

    text, sockets, closed_text = run(main())
    assert text == f"<Server sockets={sockets}>"
    assert closed_text == "<Server sockets=()>"
