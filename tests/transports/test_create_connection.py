"""create_connection: sock=, local_addr=, refused ports, happy eyeballs, argument checks."""

from __future__ import annotations

import socket

import pytest


def test_create_connection_with_a_connected_sock(loop, run, recorder):
    async def main():
        accepted = loop.create_future()

        def factory():
            accepted.set_result(recorder())
            return accepted.result()

        server = await loop.create_server(factory, "127.0.0.1", 0)
        address = server.sockets[0].getsockname()
        sock = socket.create_connection(address)
        transport, protocol = await loop.create_connection(recorder, sock=sock)
        facts = (
            transport.get_extra_info("socket").fileno() == sock.fileno(),
            sock.getblocking(),
            transport.get_extra_info("peername") == address,
        )
        transport.close()
        await protocol.lost
        await (await accepted).lost
        server.close()
        await server.wait_closed()
        return facts, sock.fileno()

    facts, fileno_after_close = run(main())
    # asyncio switches the socket to non-blocking mode and closes it with the transport.
    assert facts == (True, False, True)
    assert fileno_after_close == -1


def test_create_connection_binds_local_addr(loop, run, recorder, tcp_connect):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        local = probe.getsockname()

    async def main():
        ends = await tcp_connect(recorder, recorder, local_addr=local)
        names = (
            ends.client.transport.get_extra_info("sockname"),
            ends.accepted.transport.get_extra_info("peername"),
        )
        await ends.close()
        return names

    assert run(main()) == (local, local)


def test_connection_to_a_closed_port_is_refused(loop, run, recorder, refused_address):
    async def main():
        with pytest.raises(ConnectionRefusedError) as raised:
            await loop.create_connection(recorder, *refused_address)
        return raised.value

    error = run(main())
    assert isinstance(error, OSError)


def test_connection_to_a_closed_port_with_local_addr_is_refused(
    loop, run, recorder, refused_address
):
    async def main():
        with pytest.raises(ConnectionRefusedError):
            await loop.create_connection(recorder, *refused_address, local_addr=("127.0.0.1", 0))

    run(main())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"happy_eyeballs_delay": 0.25},
        {"interleave": 1},
        {"happy_eyeballs_delay": 0.1, "interleave": 2},
    ],
)
def test_happy_eyeballs_arguments_are_accepted(loop, run, recorder, tcp_connect, kwargs):
    async def main():
        ends = await tcp_connect(recorder, recorder, **kwargs)
        peer = ends.client.transport.get_extra_info("peername")
        await ends.close()
        return peer

    assert run(main())[0] == "127.0.0.1"


def test_happy_eyeballs_to_a_closed_port_is_refused(loop, run, recorder, refused_address):
    async def main():
        with pytest.raises(ConnectionRefusedError):
            await loop.create_connection(recorder, *refused_address, happy_eyeballs_delay=0.25)

    run(main())


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("127.0.0.1", 1), {"sock": "placeholder"}, "host/port and sock can not be specified"),
        ((), {}, "host and port was not specified and no sock specified"),
        (("127.0.0.1", 1), {"server_hostname": "localhost"}, "server_hostname is only meaningful"),
        (("127.0.0.1", 1), {"ssl_handshake_timeout": 1}, "ssl_handshake_timeout is only"),
        (("127.0.0.1", 1), {"ssl_shutdown_timeout": 1}, "ssl_shutdown_timeout is only"),
    ],
)
def test_create_connection_argument_errors(loop, run, recorder, args, kwargs, message):
    async def main():
        with socket.socket() as sock:
            if kwargs.get("sock") == "placeholder":
                kwargs["sock"] = sock
            with pytest.raises(ValueError, match=message):
                await loop.create_connection(recorder, *args, **kwargs)

    run(main())


def test_create_connection_rejects_a_datagram_sock(loop, run, recorder):
    async def main():
        with (
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock,
            pytest.raises(ValueError, match="A Stream Socket was expected"),
        ):
            await loop.create_connection(recorder, sock=sock)

    run(main())


def test_connect_accepted_socket_wraps_a_server_side_socket(loop, run, recorder):
    async def main():
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            client = socket.create_connection(listener.getsockname())
            accepted, _ = listener.accept()
        with client:
            _, protocol = await loop.connect_accepted_socket(recorder, accepted)
            client.sendall(b"over an accepted socket")
            client.shutdown(socket.SHUT_WR)
            await protocol.eof
            await protocol.lost
            return bytes(protocol.received), protocol.milestones()

    received, milestones = run(main())
    assert received == b"over an accepted socket"
    assert milestones == ["connection_made", "data_received", "eof_received", "connection_lost"]
