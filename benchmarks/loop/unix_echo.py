"""Unix socket echo through a Protocol: `create_unix_server`, echo in `data_received`; 1 KiB.

Unix sockets carry the traffic between a reverse proxy and the app server on the same host
(nginx to gunicorn or uvicorn with `--uds`), and to local databases and caches (PostgreSQL,
Redis): no TCP stack, so the loop's own share of the cost per message is larger than over TCP.
The server listens in a fresh temporary directory; 64 connections each keep one 1 KiB request
in flight; the client is a separate process on core 1 (echo_client.c, the same for every
server loop). Server CPU per message is reported as for the TCP Protocol echo.
"""

from __future__ import annotations

import asyncio

import echo_measure
import echo_server
from metric import Metric

METRICS = (
    Metric("msgs_per_s", "Unix socket Protocol echo, 64 clients", "messages/s", True),
    Metric("server_cpu_us_per_msg", "Unix socket echo server CPU per message", "µs", False),
)
PARAMS = {"clients": 64, "size": 1024, "warmup_s": 0.5}
CASES = {"1KiB": ({**PARAMS, "duration_s": 3.0}, {**PARAMS, "duration_s": 1.0})}


async def _start(loop: asyncio.AbstractEventLoop, params: dict, tally: echo_server.Tally):
    server = await loop.create_unix_server(
        lambda: echo_server.EchoProtocol(tally), params["path"], backlog=256
    )
    return params["path"], server


def serve(loop: asyncio.AbstractEventLoop, params: dict) -> dict:
    return echo_server.run(loop, params, _start)


def measure(loop_name: str, params: dict, pins: tuple[list, list]) -> dict:
    return echo_measure.measure("unix_echo", loop_name, params, pins, "unix")
