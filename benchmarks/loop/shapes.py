"""Small loop workloads run on their own, for counts that noise cannot blur: system calls
(`syscalls.py`, under `strace -c -f`) and instructions (`shape_instructions.py`, under
callgrind). Each is one process, one loop, one shape:

    python benchmarks/loop/shapes.py LOOP SHAPE N [K]

- `one_future`: one task awaits one future at a time, resolved by `call_soon(fut.set_result)`;
  N futures. No concurrency, so each future costs two loop iterations of one callback each
  (issue 29's shape: asyncio and ferroloop polled twice per future, rloop not at all).
- `ready`: K chains each re-scheduling itself with `call_soon`, for N iterations, so every
  iteration runs exactly K callbacks (the iteration's cost curve in K).
- `dense_timers`: N `call_later` timers due within one 10 ms window 50 ms out, in scrambled
  order; prints the lateness p99 on the loop clock in ms.

Prints one line `shape=... loop=... n=... seconds=...` (and what the shape measured), so a
caller can check the work was done.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from time import perf_counter

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loops
from metric import percentile

SHAPES = ("one_future", "ready", "dense_timers")


def parse_spec(spec: str) -> tuple[str, int, int, str]:
    """`SHAPE:N[:K]` (as `syscalls.py` and `shape_instructions.py` take it) -> shape, N, K and
    a label for a table row."""
    parts = spec.split(":")
    shape, n = parts[0], int(parts[1])
    if shape not in SHAPES:
        raise SystemExit(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}")
    k = int(parts[2]) if len(parts) > 2 else 1
    return shape, n, k, f"{shape} N={n}" + (f" K={k}" if shape == "ready" else "")


def one_future(loop: asyncio.AbstractEventLoop, n: int, _k: int) -> str:
    async def main() -> int:
        total = 0
        for i in range(n):
            fut = loop.create_future()
            loop.call_soon(fut.set_result, i)
            total += await fut
        return total

    total = loop.run_until_complete(main())
    assert total == n * (n - 1) // 2, total
    return ""


def ready(loop: asyncio.AbstractEventLoop, n: int, k: int) -> str:
    """K chains for N iterations: chain 0 counts iterations and stops the loop after N."""
    iterations = 0
    call_soon = loop.call_soon

    def counter() -> None:
        nonlocal iterations
        iterations += 1
        if iterations < n:
            call_soon(counter)
        else:
            loop.stop()

    def other() -> None:
        if iterations < n:
            call_soon(other)

    call_soon(counter)
    for _ in range(k - 1):
        call_soon(other)
    loop.run_forever()
    # Chains scheduled after the counter in its last iteration: let them see the end and stop.
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert iterations == n, iterations
    return f"k={k}"


def dense_timers(loop: asyncio.AbstractEventLoop, n: int, _k: int) -> str:
    lead, window = 0.05, 0.01
    late: list[float] = []
    done = loop.create_future()
    now = loop.time

    def fire(handle_when: list[float], i: int) -> None:
        late.append(now() - handle_when[i])
        if len(late) == n and not done.done():
            done.set_result(None)

    whens = [0.0] * n

    async def schedule() -> None:
        for i in range(n):
            h = loop.call_later(lead + (i * 7919 % n) / n * window, fire, whens, i)
            whens[i] = h.when()
        await done

    loop.run_until_complete(schedule())
    return f"late_p99_ms={percentile(late, 99) * 1e3:.3f}"


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4) or argv[1] not in SHAPES:
        print(__doc__, file=sys.stderr)
        return 2
    name, shape, n = argv[0], argv[1], int(argv[2])
    k = int(argv[3]) if len(argv) == 4 else 1
    loop = loops.factory(name)()
    try:
        t0 = perf_counter()
        extra = globals()[shape](loop, n, k)
        elapsed = perf_counter() - t0
    finally:
        loop.close()
    print(f"shape={shape} loop={name} n={n} seconds={elapsed:.4f} {extra}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
