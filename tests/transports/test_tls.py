"""TLS via ssl=SSLContext on create_server / create_connection, with CPython's test certificates."""

from __future__ import annotations

import socket
import ssl


def test_tls_connection_carries_data_both_ways(
    loop, run, recorder, tcp_connect, server_ssl, client_ssl
):
    class Echo(recorder):
        def data_received(self, data):
            super().data_received(data)
            self.transport.write(data[::-1])

    async def main():
        ends = await tcp_connect(
            Echo, recorder, ssl=client_ssl, server_hostname="localhost", server_ssl=server_ssl
        )
        ends.client.transport.write(b"encrypted")
        reply = await ends.client.received_at_least(9)
        await ends.close()
        return reply, ends.client, ends.accepted

    reply, client, accepted = run(main())
    assert reply == b"detpyrcne"
    assert bytes(accepted.received) == b"encrypted"
    # Both ends see the other's close_notify as EOF.
    expected = ["connection_made", "data_received", "eof_received", "connection_lost"]
    assert client.milestones() == expected
    assert accepted.milestones() == expected
    assert client.lost_exc is None


def test_tls_extra_info(loop, run, recorder, tcp_connect, server_ssl, client_ssl):
    async def main():
        ends = await tcp_connect(
            recorder, recorder, ssl=client_ssl, server_hostname="localhost", server_ssl=server_ssl
        )
        transport = ends.client.transport
        info = {
            key: transport.get_extra_info(key)
            for key in ("ssl_object", "peercert", "cipher", "compression", "sslcontext")
        }
        info["server_peercert"] = ends.accepted.transport.get_extra_info("peercert")
        info["socket"] = transport.get_extra_info("socket")
        await ends.close()
        return info

    info = run(main())
    assert isinstance(info["ssl_object"], ssl.SSLObject)
    assert info["ssl_object"].server_hostname == "localhost"
    assert dict(item for rdn in info["peercert"]["subject"] for item in rdn)["commonName"] == (
        "localhost"
    )
    name, version, bits = info["cipher"]
    assert isinstance(name, str) and version.startswith("TLS") and bits > 0
    assert info["compression"] is None
    assert info["sslcontext"] is client_ssl
    assert info["server_peercert"] is None  # the client sent no certificate
    assert info["socket"].family == socket.AF_INET


def test_alpn_negotiation(loop, run, recorder, tcp_connect, server_ssl, client_ssl):
    server_ssl.set_alpn_protocols(["h2", "http/1.1"])
    client_ssl.set_alpn_protocols(["http/1.1"])

    async def main():
        ends = await tcp_connect(
            recorder, recorder, ssl=client_ssl, server_hostname="localhost", server_ssl=server_ssl
        )
        selected = [
            side.transport.get_extra_info("ssl_object").selected_alpn_protocol()
            for side in (ends.client, ends.accepted)
        ]
        await ends.close()
        return selected

    assert run(main()) == ["http/1.1", "http/1.1"]


def test_tls_large_payload_both_ways(loop, run, recorder, tcp_connect, server_ssl, client_ssl):
    payload = bytes(range(256)) * 8192  # 2 MiB, many TLS records

    class Echo(recorder):
        def data_received(self, data):
            super().data_received(data)
            self.transport.write(data)

    async def main():
        ends = await tcp_connect(
            Echo, recorder, ssl=client_ssl, server_hostname="localhost", server_ssl=server_ssl
        )
        ends.client.transport.write(payload)
        echoed = await ends.client.received_at_least(len(payload))
        await ends.close()
        return echoed

    assert run(main()) == payload


def test_tls_with_a_buffered_protocol(
    loop, run, recorder, buffered_recorder, tcp_connect, server_ssl, client_ssl
):
    Buffered = buffered_recorder

    async def main():
        ends = await tcp_connect(
            Buffered, recorder, ssl=client_ssl, server_hostname="localhost", server_ssl=server_ssl
        )
        ends.client.transport.write(b"b" * 5000)
        await ends.close()
        return bytes(ends.accepted.received)

    assert run(main()) == b"b" * 5000


def test_tls_timeouts_are_accepted(loop, run, recorder, tcp_connect, server_ssl, client_ssl):
    async def main():
        ends = await tcp_connect(
            recorder,
            recorder,
            ssl=client_ssl,
            server_hostname="localhost",
            server_ssl=server_ssl,
            ssl_handshake_timeout=5.0,
            ssl_shutdown_timeout=5.0,
        )
        await ends.close()
        return ends.client.lost_exc

    assert run(main()) is None


def test_tls_over_a_unix_socket(loop, run, recorder, tmp_path, server_ssl, client_ssl):
    path = str(tmp_path / "tls.sock")

    async def main():
        accepted = loop.create_future()

        def factory():
            accepted.set_result(recorder())
            return accepted.result()

        server = await loop.create_unix_server(factory, path, ssl=server_ssl)
        transport, client = await loop.create_unix_connection(
            recorder, path, ssl=client_ssl, server_hostname="localhost"
        )
        transport.write(b"tls over unix")
        received = await (await accepted).received_at_least(13)
        version = transport.get_extra_info("ssl_object").version()
        transport.close()
        await client.lost
        await accepted.result().lost
        server.close()
        await server.wait_closed()
        return received, version

    received, version = run(main())
    assert received == b"tls over unix"
    assert version.startswith("TLS")
