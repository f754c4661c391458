"""Load generator for sock_echo: the same client for every server loop (uvloop if installed).

    echo_client.py PORT CLIENTS SIZE WARMUP_S DURATION_S

Opens CLIENTS connections to 127.0.0.1:PORT; each keeps one SIZE-byte request in flight and
checks that every reply is exactly its own request echoed back. Round trips completed during
DURATION_S (after WARMUP_S) are counted. Then every connection finishes its reply in flight and
closes, so the server sees a clean EOF on each, and the client prints `RESULT <json>`.
It uses Protocols, the cheapest API asyncio offers, so the client costs less per message than
the server under test.
"""

from __future__ import annotations

import asyncio
import json
import sys
from time import perf_counter, process_time

CLOSE_TIMEOUT_S = 10.0


class Stats:
    def __init__(self) -> None:
        self.count = 0
        self.stopping = False
        self.problems: list[str] = []


class EchoClient(asyncio.Protocol):
    def __init__(self, payload: bytes, stats: Stats, closed: asyncio.Future) -> None:
        self.payload, self.stats, self.closed = payload, stats, closed
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(self.payload)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) < len(self.payload):
            return
        if self.buf != self.payload and len(self.stats.problems) < 5:
            self.stats.problems.append(
                f"echo mismatch: got {len(self.buf)} bytes starting {bytes(self.buf[:8])!r}, "
                f"sent {len(self.payload)} starting {self.payload[:8]!r}"
            )
        self.buf.clear()
        self.stats.count += 1
        if self.stats.stopping:
            self.transport.close()
        else:
            self.transport.write(self.payload)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and len(self.stats.problems) < 5:
            self.stats.problems.append(f"connection lost: {exc!r}")
        if not self.closed.done():
            self.closed.set_result(None)


async def main(port: int, clients: int, size: int, warmup_s: float, duration_s: float) -> dict:
    loop = asyncio.get_running_loop()
    stats = Stats()
    closed = [loop.create_future() for _ in range(clients)]
    payloads = [bytes((c + i) % 256 for i in range(size)) for c in range(clients)]
    await asyncio.gather(
        *(
            loop.create_connection(
                lambda c=c: EchoClient(payloads[c], stats, closed[c]), "127.0.0.1", port
            )
            for c in range(clients)
        )
    )
    await asyncio.sleep(warmup_s)
    count0, t0, cpu0 = stats.count, perf_counter(), process_time()
    await asyncio.sleep(duration_s)
    count1, t1, cpu1 = stats.count, perf_counter(), process_time()
    stats.stopping = True
    _, pending = await asyncio.wait(closed, timeout=CLOSE_TIMEOUT_S)
    if pending:
        stats.problems.append(
            f"{len(pending)} of {clients} connections got no complete reply to their last "
            f"request within {CLOSE_TIMEOUT_S:.0f} s (round trips counted: {stats.count})"
        )
    return {
        "msgs_per_s": (count1 - count0) / (t1 - t0),
        "client_busy": (cpu1 - cpu0) / (t1 - t0),  # near 1.0: the client, not the server, limits
        "problems": stats.problems,
    }


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:4]] + [float(a) for a in sys.argv[4:6]]
    try:
        import uvloop

        client_loop, run_loop = "uvloop", uvloop.new_event_loop
    except ImportError:
        client_loop, run_loop = "asyncio", asyncio.new_event_loop
    loop = run_loop()
    try:
        result = loop.run_until_complete(main(*args))
    finally:
        loop.close()
    result["client_loop"] = client_loop
    print("RESULT " + json.dumps(result), flush=True)
