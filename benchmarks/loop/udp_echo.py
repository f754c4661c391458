"""UDP echo: `create_datagram_endpoint`, echo in `datagram_received`; 1 KiB datagrams.

Datagrams are DNS, QUIC, game and metrics traffic (statsd, syslog): one `recvfrom` and one
`sendto` per message with no stream buffering, so the loop's per-event cost is nearly all of
the cost. One server endpoint on 127.0.0.1 serves 64 client sockets (a separate process on
core 1, echo_client.c, the same for every server loop), each keeping one numbered datagram in
flight. UDP may drop: a datagram unanswered for 0.5 s is counted lost and the client moves on,
so loss never hangs the run; any loss is reported under the tables (with the count of replies
that came late) and in `loop.json` (`info.lost`). The client ends the server with a STOP
datagram, which it resends until the server echoes it. Server CPU per datagram is reported as
for the TCP Protocol echo, counted from the first datagram.
"""

from __future__ import annotations

import asyncio

import echo_measure
import echo_server
from metric import Metric

METRICS = (
    Metric("msgs_per_s", "UDP echo, 64 client sockets", "datagrams/s", True),
    Metric("server_cpu_us_per_msg", "UDP echo server CPU per datagram", "µs", False),
)
PARAMS = {"clients": 64, "size": 1024, "warmup_s": 0.5}
CASES = {"1KiB": ({**PARAMS, "duration_s": 3.0}, {**PARAMS, "duration_s": 1.0})}
STOP = b"STOP"  # the client's last datagram (echo_client.STOP): echo it, then end


class DatagramEcho(asyncio.DatagramProtocol):
    def __init__(self, tally: echo_server.Tally) -> None:
        self.tally = tally
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        self.transport.sendto(data, addr)
        if data == STOP:
            self.tally.finish()
            return
        if self.tally.cpu0 is None:  # the clock starts with the first datagram
            self.tally.start_clock()
        self.tally.echoed += len(data)

    def error_received(self, exc: Exception) -> None:
        self.tally.problem(f"server side: error_received({exc!r})")


async def _start(loop: asyncio.AbstractEventLoop, params: dict, tally: echo_server.Tally):
    tally.awaited = "the client's STOP datagram (no connections in UDP)"
    transport, _protocol = await loop.create_datagram_endpoint(
        lambda: DatagramEcho(tally), local_addr=("127.0.0.1", 0)
    )
    return transport.get_extra_info("sockname")[1], transport


def serve(loop: asyncio.AbstractEventLoop, params: dict) -> dict:
    return echo_server.run(loop, params, _start)


def measure(loop_name: str, params: dict, pins: tuple[list, list]) -> dict:
    return echo_measure.measure("udp_echo", loop_name, params, pins, "udp")
