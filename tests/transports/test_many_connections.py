"""Many connections on one server: concurrent clients, reuse of fd numbers, debug mode."""

from __future__ import annotations

import asyncio


async def echo_handler(reader, writer):
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()
    await writer.wait_closed()


async def echo_once(host, port, payload):
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(payload)
    writer.write_eof()
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    return answer


async def with_echo_server(loop, body):
    """Run ``body(host, port)`` against a stream echo server; wait for all its handlers."""
    handlers = []

    async def tracked(reader, writer):
        handlers.append(asyncio.current_task())
        await echo_handler(reader, writer)

    server = await asyncio.start_server(tracked, "127.0.0.1", 0)
    try:
        return await body(*server.sockets[0].getsockname()), len(handlers)
    finally:
        server.close()
        await server.wait_closed()
        await asyncio.gather(*handlers)


def test_fifty_concurrent_clients_each_get_their_own_echo(loop, run):
    async def body(host, port):
        payloads = [bytes([index]) * (1000 + 97 * index) for index in range(50)]
        answers = await asyncio.gather(*(echo_once(host, port, p) for p in payloads))
        return answers == payloads

    assert run(with_echo_server(loop, body)) == (True, 50)


def test_two_hundred_sequential_connections_reuse_fd_numbers(loop, run):
    async def body(host, port):
        return [await echo_once(host, port, b"%d" % index) for index in range(200)]

    answers, handled = run(with_echo_server(loop, body))
    assert answers == [b"%d" % index for index in range(200)]
    assert handled == 200


def test_large_payloads_in_both_directions_at_once(loop, run):
    payload = bytes(range(256)) * 16384  # 4 MiB: both sides must write while reading

    async def body(host, port):
        return await echo_once(host, port, payload)

    answer, _ = run(with_echo_server(loop, body))
    assert answer == payload


def test_echo_in_debug_mode(loop, run):
    loop.set_debug(True)
    loop.slow_callback_duration = 10.0  # keep slow-callback log lines out of the picture

    async def body(host, port):
        return await asyncio.gather(*(echo_once(host, port, b"debug") for _ in range(5)))

    assert run(with_echo_server(loop, body)) == ([b"debug"] * 5, 5)
