"""loop.start_tls and StreamWriter.start_tls: upgrading a plain TCP connection to TLS.

On ferroloop the upgraded connection runs ferroloop's ``SSLProtocol`` (the native per-record
path), as connections made with ``ssl=`` do; everything else must match asyncio's loop: the
argument checks, a failed or timed-out handshake, cancellation, and a transport already closing.
"""

from __future__ import annotations

import asyncio
import ssl

import ferroloop
import pytest
from ferroloop import _ssl_protocol


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


def test_start_tls_upgraded_connection_takes_the_native_record_path(
    loop, run, recorder, tcp_connect, server_ssl, client_ssl
):
    payload = bytes(range(256)) * 1024  # 256 KiB: many records each way

    class Echo(recorder):
        tls = None  # the TLS transport (start_tls does not call connection_made again)

        def data_received(self, data):
            super().data_received(data)
            self.tls.write(data)

    async def main():
        ends = await tcp_connect(Echo, recorder)
        client_tls, server_tls = await upgrade(loop, ends, server_ssl, client_ssl)
        ends.accepted.tls = server_tls
        tls_protocols = [client_tls._ssl_protocol, server_tls._ssl_protocol]
        attached = [getattr(p, "_records", None) is not None for p in tls_protocols]
        client_tls.write(payload)
        echoed = await ends.client.received_at_least(len(payload))
        client_tls.close()
        await ends.client.lost
        await ends.accepted.lost
        return tls_protocols, attached, echoed

    tls_protocols, attached, echoed = run(main())
    assert echoed == payload
    if isinstance(loop, ferroloop.Loop):
        assert all(type(p) is _ssl_protocol.SSLProtocol for p in tls_protocols)
        assert attached == [True, True]
        # connection_lost hands the protocol back to asyncio's methods.
        assert all(p._records is None and "buffer_updated" not in vars(p) for p in tls_protocols)
    else:
        assert all(type(p) is asyncio.sslproto.SSLProtocol for p in tls_protocols)


def test_start_tls_with_a_buffered_app_protocol(
    loop, run, recorder, buffered_recorder, tcp_connect, server_ssl, client_ssl
):
    payload = b"0123456789" * 5000

    async def main():
        ends = await tcp_connect(recorder, recorder)
        app = buffered_recorder()
        client_tls, server_tls = await asyncio.gather(
            loop.start_tls(ends.client.transport, app, client_ssl, server_hostname="localhost"),
            loop.start_tls(ends.accepted.transport, ends.accepted, server_ssl, server_side=True),
        )
        server_tls.write(payload)
        while len(app.received) < len(payload):
            await asyncio.sleep(0.01)
        client_tls.close()
        await ends.accepted.lost
        return bytes(app.received), await app.lost, app.made.done()

    received, lost_exc, made = run(main())
    assert received == payload
    assert lost_exc is None
    assert not made  # start_tls never calls connection_made on the app protocol


def test_start_tls_handshake_failure_closes_the_transport(
    loop, run, recorder, tcp_connect, server_ssl, client_ssl
):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        client, server = await asyncio.gather(
            loop.start_tls(
                ends.client.transport, ends.client, client_ssl, server_hostname="not-localhost"
            ),
            loop.start_tls(ends.accepted.transport, ends.accepted, server_ssl, server_side=True),
            return_exceptions=True,
        )
        closing = (ends.client.transport.is_closing(), ends.accepted.transport.is_closing())
        await asyncio.sleep(0.1)
        return client, server, closing, ends

    client, server, closing, ends = run(main())
    assert isinstance(client, ssl.SSLCertVerificationError)
    assert "Hostname mismatch" in str(client)
    assert isinstance(server, (ssl.SSLError, ConnectionError))
    assert closing == (True, True)
    # The handshake never completed, so the app protocols hear nothing more.
    # The TLS protocol was torn down after the handshake: each app protocol loses the
    # connection once.
    for side in (ends.client, ends.accepted):
        assert side.events == ["connection_made", "connection_lost"]


def test_start_tls_handshake_timeout(loop, run, recorder, tcp_connect, client_ssl):
    async def main():
        ends = await tcp_connect(recorder, recorder)  # the server side never answers
        with pytest.raises(
            ConnectionAbortedError, match=r"SSL handshake is taking longer than 0\.2"
        ):
            await loop.start_tls(
                ends.client.transport,
                ends.client,
                client_ssl,
                server_hostname="localhost",
                ssl_handshake_timeout=0.2,
            )
        assert ends.client.transport.is_closing()
        await ends.accepted.lost
        return ends

    ends = run(main())
    assert ends.client.events == ["connection_made"]
    assert ends.accepted.events[0] == "connection_made"
    assert ends.accepted.events[-1] == "connection_lost"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ssl_handshake_timeout": 0}, "ssl_handshake_timeout should be a positive number, got 0"),
        ({"ssl_shutdown_timeout": -1}, "ssl_shutdown_timeout should be a positive number, got -1"),
    ],
)
def test_start_tls_rejects_bad_timeouts_and_leaves_the_transport_alone(
    loop, run, recorder, tcp_connect, client_ssl, kwargs, message
):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        with pytest.raises(ValueError, match=message):
            await loop.start_tls(ends.client.transport, ends.client, client_ssl, **kwargs)
        state = (
            ends.client.transport.get_protocol() is ends.client,
            ends.client.transport.is_reading(),
            ends.client.transport.is_closing(),
        )
        ends.accepted.transport.write(b"still plain")
        await ends.client.received_at_least(11)
        await ends.close()
        return state

    assert run(main()) == (True, True, False)


def test_start_tls_rejects_a_non_transport(loop, run, client_ssl):
    async def main():
        with pytest.raises(TypeError, match="sslcontext is expected to be an instance"):
            await loop.start_tls(None, None, None)
        with pytest.raises(TypeError, match="transport None is not supported by start_tls"):
            await loop.start_tls(None, None, client_ssl)

    run(main())


def test_start_tls_on_a_closing_transport_returns_none(
    loop, run, recorder, tcp_connect, client_ssl
):
    """As asyncio (CPython gh-105993): the transport's pending connection_lost reaches the TLS
    protocol, which ends the wait with no TLS transport and tells the app protocol."""

    async def main():
        ends = await tcp_connect(recorder, recorder)
        ends.client.transport.close()
        upgraded = await loop.start_tls(
            ends.client.transport, ends.client, client_ssl, server_hostname="localhost"
        )
        await ends.client.lost
        await ends.accepted.lost
        return upgraded, ends

    upgraded, ends = run(main())
    assert upgraded is None
    assert ends.client.events == ["connection_made", "connection_lost"]
    assert ends.client.lost_exc is None


def test_start_tls_cancelled_during_the_handshake_closes_the_transport(
    loop, run, recorder, tcp_connect, client_ssl
):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        upgrading = asyncio.ensure_future(
            loop.start_tls(transport, ends.client, client_ssl, server_hostname="localhost")
        )
        await ends.accepted.received_at_least(1)  # the ClientHello; no one answers it
        upgrading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await upgrading
        closing = transport.is_closing()
        await ends.accepted.lost
        return closing, ends

    closing, ends = run(main())
    assert closing
    assert ends.client.events == ["connection_made"]
    assert ends.accepted.events[-1] == "connection_lost"


def test_stream_writer_start_tls_takes_the_native_record_path(loop, run, server_ssl, client_ssl):
    async def main():
        upgraded = asyncio.Event()

        async def handle(reader, writer):
            await writer.start_tls(server_ssl)
            upgraded.set()
            writer.write(await reader.readexactly(5))
            await writer.drain()
            writer.close()
            await writer.wait_closed()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname())
        await writer.start_tls(client_ssl, server_hostname="localhost")
        tls_protocol = writer.transport._ssl_protocol
        attached = getattr(tls_protocol, "_records", None) is not None
        writer.write(b"hello")
        echoed = await reader.readexactly(5)
        await upgraded.wait()
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
        return echoed, type(tls_protocol), attached

    echoed, protocol_type, attached = run(main())
    assert echoed == b"hello"
    if isinstance(loop, ferroloop.Loop):
        assert (protocol_type, attached) == (_ssl_protocol.SSLProtocol, True)
    else:
        assert (protocol_type, attached) == (asyncio.sslproto.SSLProtocol, False)
