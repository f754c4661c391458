"""TCP echo through streams: `asyncio.start_server`, then `readexactly`, `write`, `drain`.

Streams are the API most asyncio code is written in (aiohttp's client, database drivers,
`open_connection` in scripts and tests), and they cost more than a Protocol: each message wakes
a task (the StreamReader's waiter future), copies through the reader's buffer, and `drain()`
is a coroutine call per write. How much of that a loop makes cheaper (faster futures, task
steps, call_soon) is what a user of streams gains. 64 connections each keep one 1 KiB request
in flight; one task per connection reads exactly one message, writes it back and drains. The
client is a separate process on core 1 (echo_client.c, the same for every server loop).
Server CPU per message is reported as for the Protocol echo, and so is the C floor (echo_floor.c,
whose echo is the same on the wire).
"""

from __future__ import annotations

import asyncio

import echo_floor
import echo_measure
import echo_server
from metric import Metric

METRICS = (
    Metric("msgs_per_s", "TCP streams echo, 64 clients", "messages/s", True),
    Metric("server_cpu_us_per_msg", "TCP streams echo server CPU per message", "µs", False),
)
PARAMS = {"clients": 64, "size": 1024, "warmup_s": 0.5}
CASES = {"1KiB": ({**PARAMS, "duration_s": 3.0}, {**PARAMS, "duration_s": 1.0})}


async def _echo(
    tally: echo_server.Tally, size: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    tally.connection_made()
    error = None
    try:
        while True:
            data = await reader.readexactly(size)
            writer.write(data)
            await writer.drain()
            tally.echoed += size
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            tally.problem(f"server side: EOF after {len(exc.partial)} bytes of a message")
    except Exception as exc:
        error = exc
    finally:
        writer.close()
        tally.connection_lost(error)


async def _start(loop: asyncio.AbstractEventLoop, params: dict, tally: echo_server.Tally):
    size = params["size"]
    server = await asyncio.start_server(
        lambda reader, writer: _echo(tally, size, reader, writer), "127.0.0.1", 0, backlog=256
    )
    return server.sockets[0].getsockname()[1], server


def serve(loop: asyncio.AbstractEventLoop, params: dict) -> dict:
    return echo_server.run(loop, params, _start)


def measure(loop_name: str, params: dict, pins: tuple[list, list]) -> dict:
    return echo_measure.measure("tcp_streams_echo", loop_name, params, pins, "tcp")


def floor(params: dict, pins: tuple[list, list]) -> dict:
    """The same bytes echoed by echo_floor.c, with no Python (see echo_floor.py)."""
    return echo_floor.measure(params, pins)
