"""Server side of the echo benchmarks: runs in the server child, on the loop under test.

The parent (echo_measure.py) starts `child.py BENCH serve LOOP PARAMS`; the benchmark's `serve`
calls `run()` with a `start` coroutine that opens its server. `run()` then

1. prints one JSON line on stdout: `{"address": ...}` (a port, or a Unix socket path) for the
   client, or `{"unsupported": why}` if opening the server raised NotImplementedError (a peer
   loop without Unix sockets or TLS, say): that cell of the table is not a failure of the run;
2. serves until every client has left (streams: all connections closed; UDP: the client's STOP
   datagram), bounded in time, so clients that never come or never leave fail the run with a
   message saying how many were seen, instead of hanging it;
3. returns the server's CPU time (all threads, user + system) per echoed message, counted from
   the moment every client is connected: the cost a real server pays per request.

Before opening the server it puts the allocator in a fixed state (`warm_allocator`), without
which the numbers of loops that read through asyncio's transports depend on heap layout luck.
"""

from __future__ import annotations

import asyncio
import json
import traceback
from collections.abc import Awaitable, Callable
from time import process_time

GRACE_S = 20.0  # beyond the client's planned time, before the server gives up on its clients
WARM_ALLOCATOR_BYTES = 1 << 20  # see warm_allocator()
CLOSE_TIMEOUT_S = 5.0
MAX_PROBLEMS = 5


class Tally:
    """What the server did. Owned by the loop thread; the protocols and handlers update it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, clients: int) -> None:
        self.clients = clients
        self.connected = 0
        self.closed = 0
        self.echoed = 0  # bytes
        self.cpu0: float | None = None
        self.cpu_s = float("nan")
        self.problems: list[str] = []
        self.done = loop.create_future()
        self.awaited = "every connection to close"  # what ends the run, for the timeout message

    def connection_made(self) -> None:
        self.connected += 1
        if self.connected == self.clients:
            self.start_clock()

    def start_clock(self) -> None:
        self.cpu0 = process_time()

    def connection_lost(self, exc: BaseException | None) -> None:
        if exc is not None:
            self.problem(f"server side: connection lost with {exc!r}")
        self.closed += 1
        if self.closed == self.clients:
            self.finish()

    def finish(self) -> None:
        if not self.done.done():
            if self.cpu0 is not None:
                self.cpu_s = process_time() - self.cpu0
            self.done.set_result(None)

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)


class EchoProtocol(asyncio.Protocol):
    """Writes back every chunk as it arrives: the least work a server can do per read."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.tally.connection_made()

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)
        self.tally.echoed += len(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.tally.connection_lost(exc)


def warm_allocator() -> None:
    """Put glibc's malloc in the state of a server that has already closed a connection.

    asyncio's selector transports (which ferroloop still borrows) read with `sock.recv(256 KiB)`
    and shrink the result. Whether glibc serves that 256 KiB from the heap or maps it (mmap,
    then mremap and munmap: three more syscalls per read, up to 5x the server CPU per message
    here) depends on the process's allocation history, not on the loop (python/cpython#85451).
    The first time such a buffer is freed whole (asyncio does so when `recv` returns EOF), glibc
    raises its mmap threshold for the rest of the process, so a server that has closed a
    connection reads from the heap. Freeing one 1 MiB buffer here does the same before the
    clients come, so every loop is measured in that steady state, not in whichever one its heap
    layout happened to give. Loops with their own read buffers (uvloop, rloop) are unaffected.
    """
    buffer = bytes(WARM_ALLOCATOR_BYTES)
    del buffer


def announce(message: dict) -> None:
    print(json.dumps(message), flush=True)


# start(loop, params, tally) opens the server; returns (address, what to close at the end).
Start = Callable[[asyncio.AbstractEventLoop, dict, Tally], Awaitable[tuple[object, object]]]


def _unsupported(exc: NotImplementedError) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1].name
    return f"{where}() raised NotImplementedError" + (f": {exc}" if str(exc) else "")


async def _close(server: object) -> None:
    server.close()
    wait_closed = getattr(server, "wait_closed", None)  # a Server has it, a transport not
    if wait_closed is not None:
        await asyncio.wait_for(wait_closed(), CLOSE_TIMEOUT_S)


def run(loop: asyncio.AbstractEventLoop, params: dict, start: Start) -> dict:
    """Open the server, announce it, serve until the clients have left; the child's result."""
    warm_allocator()
    tally = Tally(loop, params["clients"])
    try:
        address, server = loop.run_until_complete(start(loop, params, tally))
    except NotImplementedError as exc:
        reason = _unsupported(exc)
        announce({"unsupported": reason})
        return {"metrics": {}, "unsupported": reason, "problems": []}
    announce({"address": address})
    limit = params["warmup_s"] + params["duration_s"] + GRACE_S
    try:
        loop.run_until_complete(asyncio.wait_for(asyncio.shield(tally.done), limit))
    except TimeoutError:
        raise RuntimeError(
            f"no end within {limit:.0f} s: waited for {tally.awaited}; {tally.connected} of "
            f"{tally.clients} connections made, {tally.closed} closed, {tally.echoed} bytes echoed"
        ) from None
    finally:
        loop.run_until_complete(_close(server))
    messages = tally.echoed / params["size"]
    cpu_per_msg = tally.cpu_s / messages * 1e6 if messages else float("nan")
    return {
        "metrics": {"server_cpu_us_per_msg": cpu_per_msg},
        "info": {"echoed_bytes": tally.echoed, "cpu_s": tally.cpu_s},
        "problems": tally.problems,
    }
