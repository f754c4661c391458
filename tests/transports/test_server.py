"""The Server object of create_server: sockets, serving state, serve_forever, closing, options."""

from __future__ import annotations

import asyncio
import errno
import socket
import sys

import pytest


def test_server_sockets_are_listening_transport_sockets(loop, run, recorder):
    async def main():
        server = await loop.create_server(recorder, "127.0.0.1", 0)
        sockets = server.sockets
        facts = [(type(sock), sock.family, sock.type, sock.getsockname()[0]) for sock in sockets]
        serving = server.is_serving()
        same_loop = server.get_loop() is loop
        server.close()
        await server.wait_closed()
        return facts, serving, same_loop, server.sockets, server.is_serving()

    facts, serving, same_loop, sockets_after, serving_after = run(main())
    assert facts == [
        (asyncio.trsock.TransportSocket, socket.AF_INET, socket.SOCK_STREAM, "127.0.0.1")
    ]
    assert serving and same_loop
    assert sockets_after == ()
    assert not serving_after


def test_closed_server_refuses_new_connections(loop, run, recorder):
    async def main():
        server = await loop.create_server(recorder, "127.0.0.1", 0)
        address = server.sockets[0].getsockname()
        server.close()
        await server.wait_closed()
        with pytest.raises(ConnectionRefusedError):
            await loop.create_connection(recorder, *address)

    run(main())


def test_close_leaves_accepted_connections_open(loop, run, recorder, tcp_connect):
    """``close()`` stops listening only. asyncio 3.11's ``wait_closed()`` then returns at once;
    from 3.12 it waits until the accepted connections are closed too."""

    async def main():
        ends = await tcp_connect(recorder, recorder)
        ends.server.close()
        waiting = asyncio.ensure_future(ends.server.wait_closed())
        await asyncio.sleep(0.01)
        assert waiting.done() is (sys.version_info < (3, 12))
        ends.client.transport.write(b"still here")
        received = await ends.accepted.received_at_least(10)
        await ends.close()
        await waiting
        return received

    assert run(main()) == b"still here"


def test_start_serving_false_listens_only_after_start_serving(loop, run, recorder):
    async def main():
        accepted = loop.create_future()

        def factory():
            accepted.set_result(recorder())
            return accepted.result()

        server = await loop.create_server(factory, "127.0.0.1", 0, start_serving=False)
        address = server.sockets[0].getsockname()
        serving_before = server.is_serving()
        with pytest.raises(ConnectionRefusedError):
            await loop.create_connection(recorder, *address)
        await server.start_serving()
        await server.start_serving()  # a second call is a no-op
        transport, protocol = await loop.create_connection(recorder, *address)
        transport.close()
        await protocol.lost
        await (await accepted).lost
        serving_after = server.is_serving()
        server.close()
        await server.wait_closed()
        return serving_before, serving_after

    assert run(main()) == (False, True)


def test_cancelling_serve_forever_closes_the_server(loop, run, recorder):
    async def main():
        server = await loop.create_server(recorder, "127.0.0.1", 0, start_serving=False)
        serving = loop.create_task(server.serve_forever())
        await asyncio.sleep(0)
        serving_while_awaited = server.is_serving()
        with pytest.raises(RuntimeError, match="already being awaited"):
            await server.serve_forever()
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving
        return serving_while_awaited, server.is_serving(), server.sockets

    assert run(main()) == (True, False, ())


def test_serve_forever_on_a_closed_server_raises(loop, run, recorder):
    async def main():
        server = await loop.create_server(recorder, "127.0.0.1", 0)
        server.close()
        await server.wait_closed()
        with pytest.raises(RuntimeError, match="is closed"):
            await server.serve_forever()

    run(main())


def test_async_with_closes_the_server(loop, run, recorder):
    async def main():
        async with await loop.create_server(recorder, "127.0.0.1", 0) as server:
            inside = server.is_serving()
        return inside, server.is_serving()

    assert run(main()) == (True, False)


def test_duplicate_hosts_are_bound_once(loop, run, recorder):
    async def main():
        server = await loop.create_server(recorder, ["127.0.0.1", "127.0.0.1"], 0)
        names = [sock.getsockname()[0] for sock in server.sockets]
        server.close()
        await server.wait_closed()
        return names

    assert run(main()) == ["127.0.0.1"]


def test_reuse_address_sets_so_reuseaddr(loop, run, recorder):
    async def main():
        options = []
        for reuse in (True, False):
            server = await loop.create_server(recorder, "127.0.0.1", 0, reuse_address=reuse)
            sock = server.sockets[0]
            options.append(bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)))
            server.close()
            await server.wait_closed()
        return options

    assert run(main()) == [True, False]


def test_reuse_port_lets_two_servers_share_a_port(loop, run, recorder):
    async def main():
        first = await loop.create_server(recorder, "127.0.0.1", 0, reuse_port=True)
        port = first.sockets[0].getsockname()[1]
        second = await loop.create_server(recorder, "127.0.0.1", port, reuse_port=True)
        ports = [server.sockets[0].getsockname()[1] for server in (first, second)]
        for server in (first, second):
            server.close()
            await server.wait_closed()
        return ports, port

    ports, port = run(main())
    assert ports == [port, port]


def test_binding_a_port_in_use_raises_oserror(loop, run, recorder):
    async def main():
        first = await loop.create_server(recorder, "127.0.0.1", 0)
        port = first.sockets[0].getsockname()[1]
        try:
            with pytest.raises(OSError, match="address already in use") as raised:
                await loop.create_server(recorder, "127.0.0.1", port)
        finally:
            first.close()
            await first.wait_closed()
        return raised.value.errno

    assert run(main()) == errno.EADDRINUSE


@pytest.mark.parametrize("backlog", [1, 100])
def test_backlog_is_accepted_and_connections_are_served(loop, run, recorder, backlog):
    async def main():
        accepted = []

        def factory():
            protocol = recorder()
            accepted.append(protocol)
            return protocol

        server = await loop.create_server(factory, "127.0.0.1", 0, backlog=backlog)
        address = server.sockets[0].getsockname()
        for _ in range(5):
            transport, protocol = await loop.create_connection(recorder, *address)
            transport.close()
            await protocol.lost
        while len(accepted) < 5:
            await asyncio.sleep(0)
        await asyncio.gather(*(protocol.lost for protocol in accepted))
        server.close()
        await server.wait_closed()
        return len(accepted)

    assert run(main()) == 5


def test_create_server_with_a_listening_sock(loop, run, recorder):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))

    async def main():
        accepted = loop.create_future()

        def factory():
            accepted.set_result(recorder())
            return accepted.result()

        server = await loop.create_server(factory, sock=listener)
        same = server.sockets[0].fileno() == listener.fileno()
        transport, protocol = await loop.create_connection(recorder, *listener.getsockname())
        transport.close()
        await protocol.lost
        await (await accepted).lost
        server.close()
        await server.wait_closed()
        return same, listener.fileno()

    same, fileno_after_close = run(main())
    assert same
    assert fileno_after_close == -1  # the server owns the socket and closes it
