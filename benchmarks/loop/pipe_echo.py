"""Pipe echo: `connect_write_pipe` into an `os.pipe()`, `connect_read_pipe` out; round trips/s.

Pipes carry a subprocess's stdin, stdout and stderr (`asyncio.create_subprocess_exec` builds its
streams on exactly these two transports), and local tools talk over them (a language server on
stdio, `ssh`, `ffmpeg`). Everything here is the loop's work, in one process: 16 chains each own
two pipes; a chain writes a message into its first pipe with a write-pipe transport, the
read-pipe transport on the other end echoes it into the second pipe, and the read-pipe
transport there counts the round trip and sends the next message. Every round trip is two
writes, two readiness events and two reads through the pipe transports, with 16 in flight so
one poll returns several ready pipes. A message may arrive in more than one read; a round trip
counts when all its bytes are back.
"""

from __future__ import annotations

import asyncio
import os
from time import perf_counter

from metric import Metric

METRICS = (Metric("round_trips_per_s", "pipe echo, 16 chains", "round trips/s", True),)
PARAMS = {"chains": 16}
CASES = {
    "1KiB": ({**PARAMS, "size": 1024, "n": 200_000}, {**PARAMS, "size": 1024, "n": 40_000}),
    "64KiB": ({**PARAMS, "size": 65536, "n": 20_000}, {**PARAMS, "size": 65536, "n": 4_000}),
}


class _Echo(asyncio.Protocol):
    """The far end of a chain's first pipe: writes what it reads into the second pipe."""

    def __init__(self) -> None:
        self.out: asyncio.WriteTransport | None = None

    def data_received(self, data: bytes) -> None:
        self.out.write(data)


class _Back(asyncio.Protocol):
    """The end of a chain's second pipe: counts round trips and starts the next one."""

    def __init__(self, bench: _Bench) -> None:
        self.bench = bench
        self.pending = 0
        self.out: asyncio.WriteTransport | None = None

    def data_received(self, data: bytes) -> None:
        bench = self.bench
        self.pending -= len(data)
        if self.pending:
            return
        bench.count += 1
        if bench.count >= bench.n:
            if not bench.done.done():
                bench.done.set_result(None)
            return
        self.pending = len(bench.message)
        self.out.write(bench.message)


class _Bench:
    def __init__(self, loop: asyncio.AbstractEventLoop, n: int, size: int) -> None:
        self.n = n
        self.count = 0
        self.message = b"m" * size
        self.done = loop.create_future()


async def _chain(loop: asyncio.AbstractEventLoop, bench: _Bench) -> tuple[list, _Back]:
    """Two pipes and four transports; returns the transports and the protocol that drives it."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    echo = _Echo()
    back = _Back(bench)
    to_echo, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(w1, "wb", 0))
    from_echo, _ = await loop.connect_read_pipe(lambda: echo, os.fdopen(r1, "rb", 0))
    echo.out, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(w2, "wb", 0))
    back_in, _ = await loop.connect_read_pipe(lambda: back, os.fdopen(r2, "rb", 0))
    back.out = to_echo
    return [to_echo, from_echo, echo.out, back_in], back


async def _measure(loop: asyncio.AbstractEventLoop, n: int, size: int, chains: int) -> float:
    bench = _Bench(loop, n, size)
    built = [await _chain(loop, bench) for _ in range(chains)]
    t0 = perf_counter()
    for _, back in built:
        back.pending = size
        back.out.write(bench.message)
    await bench.done
    elapsed = perf_counter() - t0
    for transports, _ in built:
        for transport in transports:
            transport.close()
    await asyncio.sleep(0)
    return bench.count / elapsed


def run(loop: asyncio.AbstractEventLoop, params: dict) -> dict:
    n, size, chains = params["n"], params["size"], params["chains"]
    loop.run_until_complete(_measure(loop, max(n // 10, chains), size, chains))  # warm-up
    rate = loop.run_until_complete(_measure(loop, n, size, chains))
    return {"metrics": {"round_trips_per_s": rate}, "problems": []}
