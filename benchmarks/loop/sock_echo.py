"""Socket echo: sock_accept / sock_recv / sock_sendall serving 64 clients; messages per second.

This is the loop's I/O path end to end: readiness polling, non-blocking reads and writes, and
waking the task that waits on each socket, with 64 connections in flight so one poll returns
many ready sockets. The server (the loop under test, pinned to core 0) accepts 64 connections
on 127.0.0.1 and runs one task per connection that echoes what it receives. A separate client
process (echo_client.c, pinned to core 1; the same client for every server loop) keeps one
1 KiB request in flight per connection for a fixed time and counts completed round trips.

Messages per second can be capped by the client, so the server's CPU time per message (all its
threads, user + system) is reported too: that is the cost a real server pays per request.
"""

from __future__ import annotations

import asyncio
import socket
import time

import echo_measure
import echo_server
from metric import Metric

METRICS = (
    Metric("msgs_per_s", "sock echo, 64 clients", "messages/s", True),
    Metric("server_cpu_us_per_msg", "sock echo server CPU per message", "µs", False),
)
PARAMS = {"clients": 64, "size": 1024, "warmup_s": 0.5}
CASES = {"": ({**PARAMS, "duration_s": 5.0}, {**PARAMS, "duration_s": 2.0})}


async def _echo(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> int:
    echoed = 0
    with conn:
        while data := await loop.sock_recv(conn, 65536):
            await loop.sock_sendall(conn, data)
            echoed += len(data)
    return echoed


async def _serve(loop: asyncio.AbstractEventLoop, listener: socket.socket, clients: int) -> dict:
    handlers = []
    for _ in range(clients):
        conn, _addr = await loop.sock_accept(listener)
        conn.setblocking(False)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handlers.append(loop.create_task(_echo(loop, conn)))
    listener.close()
    cpu0 = time.process_time()
    echoed = await asyncio.gather(*handlers)
    return {"echoed_bytes": sum(echoed), "cpu_s": time.process_time() - cpu0}


def serve(loop: asyncio.AbstractEventLoop, params: dict) -> dict:
    """Child side: listen, announce the port on stdout, serve until all clients have left."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    listener.setblocking(False)
    echo_server.announce({"address": listener.getsockname()[1]})
    limit = params["warmup_s"] + params["duration_s"] + echo_server.GRACE_S
    served = loop.run_until_complete(
        asyncio.wait_for(_serve(loop, listener, params["clients"]), limit)
    )
    messages = served["echoed_bytes"] / params["size"]
    cpu_per_msg = served["cpu_s"] / messages * 1e6 if messages else float("nan")
    return {"metrics": {"server_cpu_us_per_msg": cpu_per_msg}, "info": served, "problems": []}


def measure(loop_name: str, params: dict, pins: tuple[list, list]) -> dict:
    """Parent side: the server on core 0, the echo client on core 1 (see echo_measure.py)."""
    return echo_measure.measure("sock_echo", loop_name, params, pins, "tcp")
