"""TLS failures and limits: verification, handshake timeout, argument checks, no half-close."""

from __future__ import annotations

import asyncio
import socket
import ssl

import pytest


def test_wrong_server_hostname_fails_verification(loop, run, recorder, server_ssl, client_ssl):
    async def main():
        server = await loop.create_server(recorder, "127.0.0.1", 0, ssl=server_ssl)
        address = server.sockets[0].getsockname()
        try:
            with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
                await loop.create_connection(
                    recorder, *address, ssl=client_ssl, server_hostname="not-localhost"
                )
        finally:
            server.close()
            await server.wait_closed()
        await asyncio.sleep(0.1)  # let the server side see the aborted handshake

    run(main())


def test_untrusted_certificate_fails_verification(loop, run, recorder, server_ssl):
    async def main():
        server = await loop.create_server(recorder, "127.0.0.1", 0, ssl=server_ssl)
        address = server.sockets[0].getsockname()
        try:
            with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
                await loop.create_connection(
                    recorder,
                    *address,
                    ssl=ssl.create_default_context(),
                    server_hostname="localhost",
                )
        finally:
            server.close()
            await server.wait_closed()
        await asyncio.sleep(0.1)

    run(main())


def test_handshake_timeout_aborts_the_connection(loop, run, recorder, client_ssl):
    with socket.socket() as silent:  # listens, never accepts, never answers the ClientHello
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)

        async def main():
            with pytest.raises(ConnectionAbortedError, match="SSL handshake is taking longer"):
                await loop.create_connection(
                    recorder,
                    *silent.getsockname(),
                    ssl=client_ssl,
                    server_hostname="localhost",
                    ssl_handshake_timeout=0.1,
                )

        run(main())


def test_ssl_true_uses_a_default_context(loop, run, recorder, server_ssl):
    # ssl=True means ssl.create_default_context(): the test CA is not trusted.
    async def main():
        server = await loop.create_server(recorder, "127.0.0.1", 0, ssl=server_ssl)
        address = server.sockets[0].getsockname()
        try:
            with pytest.raises(ssl.SSLCertVerificationError):
                await loop.create_connection(
                    recorder, *address, ssl=True, server_hostname="localhost"
                )
        finally:
            server.close()
            await server.wait_closed()
        await asyncio.sleep(0.1)

    run(main())


def test_tls_server_argument_checks(loop, run, recorder, server_ssl):
    async def main():
        with pytest.raises(ValueError, match="ssl_handshake_timeout is only meaningful"):
            await loop.create_server(recorder, "127.0.0.1", 0, ssl_handshake_timeout=1)
        with pytest.raises(TypeError, match="ssl argument must be an SSLContext"):
            await loop.create_server(recorder, "127.0.0.1", 0, ssl=True)

    run(main())


def test_tls_transport_cannot_half_close(loop, run, recorder, tcp_connect, server_ssl, client_ssl):
    async def main():
        ends = await tcp_connect(
            recorder, recorder, ssl=client_ssl, server_hostname="localhost", server_ssl=server_ssl
        )
        can_write_eof = ends.client.transport.can_write_eof()
        with pytest.raises(NotImplementedError):
            ends.client.transport.write_eof()
        await ends.close()
        return can_write_eof

    assert run(main()) is False
