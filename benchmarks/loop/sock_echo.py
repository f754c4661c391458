"""Socket echo: sock_accept / sock_recv / sock_sendall serving 64 clients; messages per second.

This is the loop's I/O path end to end: readiness polling, non-blocking reads and writes, and
waking the task that waits on each socket, with 64 connections in flight so one poll returns
many ready sockets. The server (the loop under test, pinned to core 0) accepts 64 connections
on 127.0.0.1 and runs one task per connection that echoes what it receives. A separate client
process (echo_client.py, pinned to core 1; the same client for every server loop) keeps one
1 KiB request in flight per connection for a fixed time and counts completed round trips.

Messages per second can be capped by the client, so the server's CPU time per message (all its
threads, user + system) is reported too: that is the cost a real server pays per request.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

from launch import ChildFailed, child_command, parse_result, tail
from metric import Metric

METRICS = (
    Metric("msgs_per_s", "sock echo, 64 clients", "messages/s", True),
    Metric("server_cpu_us_per_msg", "sock echo server CPU per message", "µs", False),
)
PARAMS = {"clients": 64, "size": 1024, "warmup_s": 0.5}
CASES = {"": ({**PARAMS, "duration_s": 5.0}, {**PARAMS, "duration_s": 2.0})}
CLIENT = str(Path(__file__).with_name("echo_client.py"))
GRACE_S = 20.0  # beyond the planned run time, before a stuck process is declared hung


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
    print(json.dumps({"port": listener.getsockname()[1]}), flush=True)
    limit = params["warmup_s"] + params["duration_s"] + GRACE_S
    served = loop.run_until_complete(
        asyncio.wait_for(_serve(loop, listener, params["clients"]), limit)
    )
    messages = served["echoed_bytes"] / params["size"]
    cpu_per_msg = served["cpu_s"] / messages * 1e6 if messages else float("nan")
    return {"metrics": {"server_cpu_us_per_msg": cpu_per_msg}, "info": served, "problems": []}


def _read_port(server: subprocess.Popen, timeout: float) -> int:
    ready, _, _ = select.select([server.stdout], [], [], timeout)
    if not ready:
        raise ChildFailed(f"echo server hung: no port within {timeout:.0f} s", hung=True)
    line = server.stdout.readline()
    if not line:
        raise ChildFailed("echo server exited before announcing its port")
    return json.loads(line)["port"]


def _run_client(port: int, params: dict, pin: list[str], timeout: float) -> dict:
    args = [str(port), str(params["clients"]), str(params["size"])]
    args += [str(params["warmup_s"]), str(params["duration_s"])]
    try:
        client = subprocess.run(
            [*pin, sys.executable, CLIENT, *args], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise ChildFailed(
            f"echo client hung: no result within {timeout:.0f} s", hung=True
        ) from None
    if client.returncode != 0:
        raise ChildFailed(f"echo client exited with {client.returncode}\n{tail(client.stderr)}")
    return parse_result(client.stdout, client.stderr, "echo client")


def measure(loop_name: str, params: dict, pins: tuple[list, list]) -> dict:
    """Parent side: start the server on core 0 and the client on core 1; merge their results."""
    server = subprocess.Popen(
        child_command(pins[0], "sock_echo", "serve", loop_name, json.dumps(params)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = _read_port(server, 30.0)
        planned = params["warmup_s"] + params["duration_s"]
        client_result = _run_client(port, params, pins[1], planned + GRACE_S)
        try:
            out, err = server.communicate(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            message = f"echo server hung: alive {GRACE_S:.0f} s after the client left"
            raise ChildFailed(message, hung=True) from None
        if server.returncode != 0:
            raise ChildFailed(f"echo server exited with {server.returncode}\n{tail(err)}")
        result = parse_result(out, err, "echo server")
    except ChildFailed as exc:
        if server.poll() is None:
            server.kill()
        _, err = server.communicate()
        raise ChildFailed(f"{exc}\nserver stderr:\n{tail(err)}", exc.hung) from None
    result["metrics"]["msgs_per_s"] = client_result["msgs_per_s"]
    result["problems"] += client_result["problems"]
    result["info"]["client_loop"] = client_result["client_loop"]
    result["info"]["client_busy"] = round(client_result["client_busy"], 3)
    return result
