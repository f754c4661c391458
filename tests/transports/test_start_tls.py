"""loop.start_tls and StreamWriter.start_tls: upgrading a plain TCP connection to TLS."""

from __future__ import annotations

import asyncio
import ssl

import pytest


async def upgrade(loop, ends, server_ssl, client_ssl):
    """Run both sides of start_tls at once; return (client TLS transport, server TLS transport)."""
    return await asyncio.gather(
        loop.start_tls(ends.client.transport, ends.client, client_ssl, server_hostname="localhost"),
        loop.start_tls(ends.accepted.transport, ends.accepted, server_ssl, server_side=True),
    )


def test_start_tls_upgrades_a_plain_connection(
    loop, run, recorder, tcp_connect, server_ssl, client_ssl
):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        ends.client.transport.write(b"plain;")
        await ends.accepted.received_at_least(6)
        client_tls, server_tls = await upgrade(loop, ends, server_ssl, client_ssl)
        facts = {
            "plain_ssl_object": ends.client.transport.get_extra_info("ssl_object"),
            "tls_ssl_object": client_tls.get_extra_info("ssl_object"),
            "server_peername": server_tls.get_extra_info("peername"),
            "client_sockname": client_tls.get_extra_info("sockname"),
            "protocols": (client_tls.get_protocol(), server_tls.get_protocol()),
        }
        client_tls.write(b"secret")
        await ends.accepted.received_at_least(12)
        server_tls.write(b"reply")
        await ends.client.received_at_least(5)
        client_tls.close()
        await ends.client.lost
        await ends.accepted.lost
        return facts, ends

    facts, ends = run(main())
    assert facts["plain_ssl_object"] is None
    assert isinstance(facts["tls_ssl_object"], ssl.SSLObject)
    assert facts["server_peername"] == facts["client_sockname"]
    assert facts["protocols"] == (ends.client, ends.accepted)
    assert bytes(ends.accepted.received) == b"plain;secret"
    assert bytes(ends.client.received) == b"reply"
    # start_tls does not call connection_made again; each side loses the connection once.
    for side in (ends.client, ends.accepted):
        assert side.events.count("connection_made") == 1
        assert side.events.count("connection_lost") == 1
        assert side.lost_exc is None


def test_start_tls_negotiates_alpn(loop, run, recorder, tcp_connect, server_ssl, client_ssl):
    server_ssl.set_alpn_protocols(["h2"])
    client_ssl.set_alpn_protocols(["h2", "http/1.1"])

    async def main():
        ends = await tcp_connect(recorder, recorder)
        client_tls, server_tls = await upgrade(loop, ends, server_ssl, client_ssl)
        selected = [
            transport.get_extra_info("ssl_object").selected_alpn_protocol()
            for transport in (client_tls, server_tls)
        ]
        client_tls.close()
        await ends.client.lost
        await ends.accepted.lost
        return selected

    assert run(main()) == ["h2", "h2"]


def test_stream_writer_start_tls(loop, run, server_ssl, client_ssl):
    async def handle(reader, writer):
        assert await reader.readline() == b"STARTTLS\n"
        writer.write(b"GO\n")
        await writer.drain()
        await writer.start_tls(server_ssl)
        line = await reader.readline()
        writer.write(line.upper())
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def main():
        handlers = []

        async def tracked(reader, writer):
            handlers.append(asyncio.current_task())
            await handle(reader, writer)

        server = await asyncio.start_server(tracked, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname())
        writer.write(b"STARTTLS\n")
        assert await reader.readline() == b"GO\n"
        await writer.start_tls(client_ssl, server_hostname="localhost")
        cipher = writer.get_extra_info("cipher")
        writer.write(b"over tls\n")
        answer = await reader.readline()
        writer.close()
        await writer.wait_closed()
        await asyncio.gather(*handlers)
        server.close()
        await server.wait_closed()
        return answer, cipher

    answer, cipher = run(main())
    assert answer == b"OVER TLS\n"
    assert cipher is not None


def test_start_tls_rejects_a_non_context(loop, run, recorder, tcp_connect):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        with pytest.raises(TypeError, match="sslcontext is expected to be an instance"):
            await loop.start_tls(ends.client.transport, ends.client, object())
        await ends.close()

    run(main())


def test_start_tls_rejects_a_datagram_transport(loop, run, client_ssl):
    async def main():
        transport, protocol = await loop.create_datagram_endpoint(
            asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0)
        )
        with pytest.raises(TypeError, match="is not supported by start_tls"):
            await loop.start_tls(transport, protocol, client_ssl)
        transport.close()
        await asyncio.sleep(0)

    run(main())
