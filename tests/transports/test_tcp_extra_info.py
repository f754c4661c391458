"""get_extra_info on TCP transports: peername, sockname, socket, and the default."""

from __future__ import annotations

import asyncio
import socket


def test_peername_and_sockname_match_across_the_connection(loop, run, recorder, tcp_connect):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        client, accepted = ends.client.transport, ends.accepted.transport
        info = {
            "server_address": ends.server.sockets[0].getsockname(),
            "client_peer": client.get_extra_info("peername"),
            "client_local": client.get_extra_info("sockname"),
            "accepted_peer": accepted.get_extra_info("peername"),
            "accepted_local": accepted.get_extra_info("sockname"),
        }
        await ends.close()
        return info

    info = run(main())
    assert info["client_peer"] == info["server_address"]
    assert info["accepted_local"] == info["server_address"]
    assert info["accepted_peer"] == info["client_local"]
    assert info["client_local"][0] == "127.0.0.1"


def test_socket_extra_info_is_a_transport_socket_view(loop, run, recorder, tcp_connect):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        sock = transport.get_extra_info("socket")
        facts = (
            type(sock),
            sock.family,
            sock.type,
            sock.getsockname() == transport.get_extra_info("sockname"),
            sock.getpeername() == transport.get_extra_info("peername"),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY),
        )
        await ends.close()
        return facts

    sock_type, family, kind, same_name, same_peer, nodelay = run(main())
    assert sock_type is asyncio.trsock.TransportSocket
    assert (family, kind) == (socket.AF_INET, socket.SOCK_STREAM)
    assert same_name and same_peer
    # asyncio turns Nagle's algorithm off on every TCP transport it creates.
    assert nodelay != 0


def test_unknown_extra_info_returns_the_default(loop, run, recorder, tcp_connect):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        values = (
            transport.get_extra_info("no-such-key"),
            transport.get_extra_info("no-such-key", "fallback"),
            transport.get_extra_info("sslcontext"),
        )
        await ends.close()
        return values

    assert run(main()) == (None, "fallback", None)


def test_transport_reports_its_protocol_and_can_swap_it(loop, run, recorder, tcp_connect):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        first = transport.get_protocol()
        replacement = recorder()
        transport.set_protocol(replacement)
        ends.accepted.transport.write(b"to the new protocol")
        await replacement.received_at_least(19)
        transport.close()
        await replacement.lost
        await ends.accepted.lost
        return first, ends, replacement

    first, ends, replacement = run(main())
    assert first is ends.client
    assert bytes(replacement.received) == b"to the new protocol"
    assert ends.client.received == b""
    assert ends.client.events == ["connection_made"]
