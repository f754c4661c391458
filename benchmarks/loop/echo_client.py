"""Load generator for the echo benchmarks in Python: one client for every server loop, on uvloop.

    echo_client.py CONFIG_JSON

CONFIG: `transport` (tcp, unix, tls or udp), `address` (a port on 127.0.0.1, or a Unix socket
path), `clients`, `size`, `warmup_s`, `duration_s`; for tls also `cafile`, the CA that signed
the server's certificate (the client verifies the chain and the name `localhost`).

Streams (tcp, unix, tls): CLIENTS connections, each keeping one SIZE-byte request in flight and
checking that every reply is exactly its own request echoed back. Round trips completed during
DURATION_S (after WARMUP_S) are counted. Then every connection finishes its reply in flight and
closes, so the server sees a clean EOF on each; a connection still waiting after
CLOSE_TIMEOUT_S is aborted and reported.

UDP: CLIENTS connected sockets, each keeping one numbered SIZE-byte datagram in flight. A
datagram with no reply within LOSS_TIMEOUT_S is counted lost and the next one is sent, so loss
costs time but never stops the run; a reply that arrives after that is counted late. At the end
the client sends STOP until the server echoes it (the server then ends).

The client prints `RESULT <json>` (for tls with `tls`, the negotiated protocol and cipher). It
uses Protocols, the cheapest API asyncio offers, but it still costs about as much CPU per
message as the server under test, so its core, not the server, tends to limit messages/s
(`client_busy` near 1.0 says so). The echoes therefore use echo_client.c by default, which does
the same in C with epoll (and OpenSSL for tls); this client drives them with run.py's
`--echo-client python`.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
from time import perf_counter, process_time

CONNECT_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 10.0
LOSS_TIMEOUT_S = 0.5
STOP = b"STOP"  # shorter than any payload (at least 8 bytes), so it cannot be mistaken for one
STOP_TRIES = 10
MAX_PROBLEMS = 5


class Stats:
    def __init__(self) -> None:
        self.count = 0
        self.lost = 0
        self.late = 0
        self.stopping = False
        self.problems: list[str] = []

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)


def _mismatch(got: bytes | bytearray, sent: bytes) -> str:
    return (
        f"echo mismatch: got {len(got)} bytes starting {bytes(got[:8])!r}, "
        f"sent {len(sent)} starting {sent[:8]!r}"
    )


class StreamClient(asyncio.Protocol):
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
        if self.buf != self.payload:
            self.stats.problem(_mismatch(self.buf, self.payload))
        self.buf.clear()
        self.stats.count += 1
        if self.stats.stopping:
            self.transport.close()
        else:
            self.transport.write(self.payload)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self.stats.problem(f"client side: connection lost with {exc!r}")
        if not self.closed.done():
            self.closed.set_result(None)


async def _connect(config: dict, factory) -> tuple:
    loop = asyncio.get_running_loop()
    if config["transport"] == "unix":
        return await loop.create_unix_connection(factory, config["address"])
    if config["transport"] == "tls":
        context = ssl.create_default_context(cafile=config["cafile"])
        return await loop.create_connection(
            factory, "127.0.0.1", config["address"], ssl=context, server_hostname="localhost"
        )
    return await loop.create_connection(factory, "127.0.0.1", config["address"])


async def _bounded(what: str, aws: list, timeout: float) -> list:
    tasks = [asyncio.ensure_future(a) for a in aws]
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    failed = [t.exception() for t in done if t.exception() is not None]
    if pending or failed:
        first = f"; first error: {failed[0]!r}" if failed else ""
        raise RuntimeError(
            f"{what}: {len(aws) - len(pending) - len(failed)} of {len(aws)} succeeded within "
            f"{timeout:.0f} s ({len(pending)} timed out, {len(failed)} failed{first})"
        )
    return [t.result() for t in tasks]


async def _measure(stats: Stats, warmup_s: float, duration_s: float) -> tuple[int, float, float]:
    await asyncio.sleep(warmup_s)
    count0, t0, cpu0 = stats.count, perf_counter(), process_time()
    await asyncio.sleep(duration_s)
    count1, t1, cpu1 = stats.count, perf_counter(), process_time()
    return count1 - count0, t1 - t0, cpu1 - cpu0


async def run_streams(config: dict) -> dict:
    loop = asyncio.get_running_loop()
    clients, size = config["clients"], config["size"]
    stats = Stats()
    closed = [loop.create_future() for _ in range(clients)]
    payloads = [bytes((c + i) % 256 for i in range(size)) for c in range(clients)]
    connections = await _bounded(
        "connecting",
        [
            _connect(config, lambda c=c: StreamClient(payloads[c], stats, closed[c]))
            for c in range(clients)
        ],
        CONNECT_TIMEOUT_S,
    )
    tls = connections[0][0].get_extra_info("ssl_object")  # None unless transport is tls
    count, elapsed, cpu = await _measure(stats, config["warmup_s"], config["duration_s"])
    stats.stopping = True
    _, pending = await asyncio.wait(closed, timeout=CLOSE_TIMEOUT_S)
    if pending:
        stats.problem(
            f"{len(pending)} of {clients} connections got no complete reply to their last "
            f"request within {CLOSE_TIMEOUT_S:.0f} s (round trips counted: {stats.count}); "
            "aborted them"
        )
        for transport, _protocol in connections:
            if not transport.is_closing():
                transport.abort()
    result = {
        "msgs_per_s": count / elapsed,
        "client_busy": cpu / elapsed,  # near 1.0: the client, not the server, limits
        "round_trips": stats.count,
        "problems": stats.problems,
    }
    if tls is not None:
        result["tls"] = f"{tls.version()} {tls.cipher()[0]}"
    return result


class DatagramClient(asyncio.DatagramProtocol):
    """One socket with one numbered datagram in flight: 8-byte sequence number, then filler."""

    def __init__(self, filler: bytes, stats: Stats) -> None:
        self.filler, self.stats = filler, stats
        self.seq = 0
        self.in_flight: bytes | None = None
        self.sent_at = 0.0
        self.transport: asyncio.DatagramTransport | None = None
        self.stop_echoed: asyncio.Future | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.send_next()

    def send_next(self) -> None:
        if self.stats.stopping:
            self.in_flight = None
            return
        self.seq += 1
        self.in_flight = self.seq.to_bytes(8, "big") + self.filler
        self.sent_at = perf_counter()
        self.transport.sendto(self.in_flight)

    def datagram_received(self, data: bytes, addr: object) -> None:
        if data == self.in_flight:
            self.stats.count += 1
            self.send_next()
        elif data == STOP:
            if self.stop_echoed is not None and not self.stop_echoed.done():
                self.stop_echoed.set_result(None)
        elif data[8:] == self.filler and int.from_bytes(data[:8], "big") <= self.seq:
            self.stats.late += 1  # the reply to a datagram already counted lost
        else:
            self.stats.problem(_mismatch(data, self.in_flight or b""))

    def error_received(self, exc: Exception) -> None:
        self.stats.problem(f"client side: error_received({exc!r})")

    def expire(self, now: float) -> None:
        if self.in_flight is not None and now - self.sent_at > LOSS_TIMEOUT_S:
            self.stats.lost += 1
            self.send_next()


async def _expire_lost(endpoints: list[DatagramClient]) -> None:
    while True:
        await asyncio.sleep(LOSS_TIMEOUT_S / 5)
        now = perf_counter()
        for endpoint in endpoints:
            endpoint.expire(now)


async def _stop_server(endpoint: DatagramClient, stats: Stats) -> None:
    endpoint.stop_echoed = asyncio.get_running_loop().create_future()
    for _ in range(STOP_TRIES):
        endpoint.transport.sendto(STOP)
        try:
            await asyncio.wait_for(asyncio.shield(endpoint.stop_echoed), LOSS_TIMEOUT_S)
            return
        except TimeoutError:
            continue
    stats.problem(f"the server did not echo STOP in {STOP_TRIES} tries")


async def run_udp(config: dict) -> dict:
    loop = asyncio.get_running_loop()
    clients, size = config["clients"], config["size"]
    stats = Stats()
    fillers = [bytes((c + i) % 256 for i in range(size - 8)) for c in range(clients)]
    connections = await _bounded(
        "opening UDP endpoints",
        [
            loop.create_datagram_endpoint(
                lambda c=c: DatagramClient(fillers[c], stats),
                remote_addr=("127.0.0.1", config["address"]),
            )
            for c in range(clients)
        ],
        CONNECT_TIMEOUT_S,
    )
    endpoints = [protocol for _transport, protocol in connections]
    expiry = loop.create_task(_expire_lost(endpoints))
    count, elapsed, cpu = await _measure(stats, config["warmup_s"], config["duration_s"])
    stats.stopping = True  # no new datagrams; wait for those in flight to come back or expire
    deadline = perf_counter() + 2 * LOSS_TIMEOUT_S
    while any(e.in_flight is not None for e in endpoints) and perf_counter() < deadline:
        await asyncio.sleep(0.01)
    expiry.cancel()
    await _stop_server(endpoints[0], stats)
    for transport, _protocol in connections:
        transport.close()
    if stats.lost:
        stats.problem(
            f"{stats.lost} of {stats.count + stats.lost} datagrams got no reply within "
            f"{LOSS_TIMEOUT_S} s ({stats.late} of those replies came later)"
        )
    return {
        "msgs_per_s": count / elapsed,
        "client_busy": cpu / elapsed,
        "round_trips": stats.count,
        "lost": stats.lost,
        "late": stats.late,
        "problems": stats.problems,
    }


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    try:
        import uvloop

        client_loop, new_loop = "Python on uvloop", uvloop.new_event_loop
    except ImportError:
        client_loop, new_loop = "Python on asyncio", asyncio.new_event_loop
    loop = new_loop()
    try:
        main = run_udp if config["transport"] == "udp" else run_streams
        result = loop.run_until_complete(main(config))
    finally:
        loop.close()
    result["client_loop"] = client_loop
    print("RESULT " + json.dumps(result), flush=True)
