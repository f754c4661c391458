"""TCP echo through a Protocol: `create_server`, echo in `data_received`; 1 KiB and 64 KiB.

Protocols are asyncio's lowest-level stream API and what fast servers and clients are built on
(uvicorn's HTTP protocols, asyncpg, aiohttp's web protocol): between readiness and user code
there is only the loop's transport, so the cost per message here is the transport's own: poll,
recv into a new bytes object, `data_received`, `write` (sent at once if the socket takes it,
else buffered and sent on write readiness). 64 connections each keep one request in flight, so
one poll returns many ready sockets, as on a busy server. The client is a separate process on
core 1 (echo_client.c, the same C client for every server loop; see echo_measure.py).

- 1 KiB: per-event overhead dominates (one read and one write per message).
- 64 KiB: a message arrives in several reads and leaves in several writes, so the read size,
  copies and partial writes count; reported also as MB/s each way (10^6 bytes/s).
- Server CPU per message (all threads, user + system, over the whole connected period) is what
  a real server pays per request, even when messages/s is capped by the client's core.
- The C floor: echo_floor.c serves the same echo in C, in every repeat (echo_floor.py). At
  1 KiB no loop's server can beat its messages/s with this client on this machine; at 64 KiB
  the kernel's copies are nearly all of the cost, and ferroloop's server matches it.
"""

from __future__ import annotations

import asyncio

import echo_floor
import echo_measure
import echo_server
from metric import Metric

METRICS = (
    Metric("msgs_per_s", "TCP Protocol echo, 64 clients", "messages/s", True),
    Metric("mb_per_s", "TCP Protocol echo, 64 clients", "MB/s each way", True, ("64KiB",)),
    Metric("server_cpu_us_per_msg", "TCP Protocol echo server CPU per message", "µs", False),
)
PARAMS = {"clients": 64, "warmup_s": 0.5}
CASES = {
    "1KiB": (
        {**PARAMS, "size": 1024, "duration_s": 3.0},
        {**PARAMS, "size": 1024, "duration_s": 1.0},
    ),
    "64KiB": (
        {**PARAMS, "size": 65536, "duration_s": 3.0},
        {**PARAMS, "size": 65536, "duration_s": 1.0},
    ),
}


async def _start(loop: asyncio.AbstractEventLoop, params: dict, tally: echo_server.Tally):
    server = await loop.create_server(
        lambda: echo_server.EchoProtocol(tally), "127.0.0.1", 0, backlog=256
    )
    return server.sockets[0].getsockname()[1], server


def serve(loop: asyncio.AbstractEventLoop, params: dict) -> dict:
    return echo_server.run(loop, params, _start)


def measure(loop_name: str, params: dict, pins: tuple[list, list]) -> dict:
    result = echo_measure.measure("tcp_proto_echo", loop_name, params, pins, "tcp")
    result["metrics"]["mb_per_s"] = result["metrics"]["msgs_per_s"] * params["size"] / 1e6
    return result


def floor(params: dict, pins: tuple[list, list]) -> dict:
    """The same echo from echo_floor.c, with no Python (see echo_floor.py)."""
    return echo_floor.measure(params, pins)
