"""Completing asyncio futures from native threads: completions/s and latency, by hand-over path.

What it measures, and why it is the user's cost: a native extension (a database driver, an
HTTP core) finishes work on its own threads and must resolve the futures Python coroutines
await. N producer threads (1, 4, 64; Rust threads of examples/wake_ext, no Python on them)
each complete their share of the futures; the loop runs nothing else. Each future's value is
the CLOCK_MONOTONIC nanoseconds when its producer handed it over, and a done callback records
the time from there to the callback running on the loop thread (the hand-over, the wake-up,
`set_result` and the callback's scheduling: what an awaiting coroutine waits before it resumes).

Paths:
- `threadsafe`: each completion takes the GIL and calls `loop.call_soon_threadsafe` (what PyO3
  async runtimes do; ferroloop-embed's fallback).
- `pipe`: a completion goes into a mutex-guarded queue; a byte is written to a pipe the loop
  watches with `add_reader` when the queue was empty; the reader drains the queue in Python.
- `capsule`: ferroloop's C API (`remote_resolve`): no GIL on the producer, one coalesced
  eventfd write per sleeping loop, the batch resolved natively (ferroloop only).

Modes: `burst` (every producer as fast as it can: completions/s, and latency under saturation)
and `paced` (2,000 completions/s in all, spread over the producers: latency on a mostly idle
loop). Each cell runs in a fresh child process. Refuses a debug build of ferroloop.

    .venv/bin/python benchmarks/wake/run.py [--repeat 3] [--out benchmarks/results/wake.md]
        [--loops ferroloop,rloop] [--producers 1,4,64] [--modes burst,paced] [--paths capsule]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRODUCERS = (1, 4, 64)
BURST_TOTAL = 20_000
PACED_TOTAL = 1_000
PACED_RATE = 2_000  # completions/s over all producers
LOOPS = ("asyncio", "uvloop", "rloop", "ferroloop")
FLOOR_SOURCE = Path(__file__).resolve().parent.parent / "loop" / "wake_floor.c"


def new_loop(name: str) -> asyncio.AbstractEventLoop:
    if name == "asyncio":
        return asyncio.new_event_loop()
    return __import__(name).new_event_loop()


async def measure(path: str, producers: int, mode: str) -> dict[str, float]:
    import wake_ext

    loop = asyncio.get_running_loop()
    total = BURST_TOTAL if mode == "burst" else PACED_TOTAL
    delay_us = 0 if mode == "burst" else int(1e6 * producers / PACED_RATE)
    futures = [loop.create_future() for _ in range(total)]
    latencies: list[int] = []
    finished = loop.create_future()

    def on_done(f: asyncio.Future) -> None:
        latencies.append(time.monotonic_ns() - f.result())
        if len(latencies) == total:
            finished.set_result(None)

    for f in futures:
        f.add_done_callback(on_done)
    start = time.perf_counter()
    if path == "pipe":
        producer = wake_ext.PipeProducer()
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)

        def on_readable() -> None:
            with contextlib.suppress(BlockingIOError):
                os.read(r, 65536)
            for i, sent in producer.drain():
                futures[i].set_result(sent)

        loop.add_reader(r, on_readable)
        producer.start(total, producers, w, delay_us)
        await finished
        elapsed = time.perf_counter() - start
        loop.remove_reader(r)
        producer.join()
        os.close(r)
        os.close(w)
    else:
        waker = wake_ext.Waker(loop, force_fallback=(path == "threadsafe"))
        assert waker.native == (path == "capsule")
        waker.complete(futures, producers, delay_us=delay_us, stamp=True)
        await finished
        elapsed = time.perf_counter() - start
        waker.join()
    latencies.sort()
    return {
        "per_s": total / elapsed,
        "p50_us": latencies[len(latencies) // 2] / 1e3,
        "p99_us": latencies[int(len(latencies) * 0.99)] / 1e3,
    }


def child(loop_name: str, path: str, producers: int, mode: str) -> None:
    if loop_name == "ferroloop":
        from ferroloop import _native

        if _native.DEBUG_BUILD:
            sys.exit("ferroloop is a debug build: run `make build` (release) first")
    loop = new_loop(loop_name)
    try:
        print(json.dumps(loop.run_until_complete(measure(path, producers, mode))))
    finally:
        loop.close()


def available(name: str) -> bool:
    if name == "asyncio":
        return True
    code = f"import {name}"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def c_floor(repeat: int) -> str:
    """The wake-up with no Python at all (`benchmarks/loop/wake_floor.c`: a thread in
    `epoll_wait` on an eventfd, another writing it every 500 µs, the paced mode's gap per
    producer at N=1), unpinned like the cells: medians of `repeat` runs."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return "C floor: not measured (no C compiler)"
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "wake_floor"
        built = subprocess.run(
            [compiler, "-O2", "-pthread", str(FLOOR_SOURCE), "-o", str(exe)],
            capture_output=True,
            text=True,
        )
        if built.returncode != 0:
            return f"C floor: not measured (compiling wake_floor.c failed: {built.stderr[:200]})"
        p50s, p99s = [], []
        for _ in range(repeat):
            out = subprocess.run([str(exe), "1000", "500", "100"], capture_output=True, text=True)
            p50, p99 = (float(x) for x in out.stdout.split())
            p50s.append(p50)
            p99s.append(p99)
    return (
        f"C floor (`benchmarks/loop/wake_floor.c`, one thread waking another through an eventfd "
        f"every 500 µs, no Python, unpinned, median of {repeat}): p50 "
        f"{statistics.median(p50s):.1f} µs [{min(p50s):.1f}-{max(p50s):.1f}], p99 "
        f"{statistics.median(p99s):.1f} µs [{min(p99s):.1f}-{max(p99s):.1f}]"
    )


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min), {os.cpu_count()} CPUs"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=4, metavar=("LOOP", "PATH", "N", "MODE"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--loops", default=",".join(LOOPS), help="comma-separated subset")
    ap.add_argument("--producers", default=",".join(map(str, PRODUCERS)))
    ap.add_argument("--modes", default="burst,paced")
    ap.add_argument("--paths", default="threadsafe,pipe,capsule")
    args = ap.parse_args()
    if args.child:
        loop_name, path, n, mode = args.child
        child(loop_name, path, int(n), mode)
        return
    loops = [name for name in args.loops.split(",") if available(name)]
    wanted_paths = args.paths.split(",")
    cells = [
        (mode, n, loop_name, path)
        for mode in args.modes.split(",")
        for n in (int(x) for x in args.producers.split(","))
        for loop_name in loops
        for path in ["threadsafe", "pipe"] + (["capsule"] if loop_name == "ferroloop" else [])
        if path in wanted_paths
    ]
    lines = [f"# benchmarks/wake ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", ""]
    lines += [f"Before: {load()}. Median of {args.repeat} rounds (min-max in brackets); each"]
    lines += ["round runs every cell once, in order, so the repeats of a cell are interleaved.", ""]
    lines += [c_floor(args.repeat) + ".", ""]
    lines += ["| mode | N | loop | path | completions/s | p50 µs | p99 µs |"]
    lines += ["|---|---|---|---|---|---|---|"]
    runs: dict[tuple, list[dict]] = {cell: [] for cell in cells}
    for round_no in range(args.repeat):
        for mode, n, loop_name, path in cells:
            out = subprocess.run(
                [sys.executable, __file__, "--child", loop_name, path, str(n), mode],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if out.returncode != 0:
                print(out.stderr, file=sys.stderr)
                continue
            result = json.loads(out.stdout)
            runs[(mode, n, loop_name, path)].append(result)
            print(f"round {round_no + 1}: {mode} {n} {loop_name} {path} {result}", flush=True)
    rows = []
    for (mode, n, loop_name, path), got in runs.items():
        if not got:
            continue

        def cell(key: str, fmt: str, got: list = got) -> str:
            xs = [r[key] for r in got]
            return f"{statistics.median(xs):{fmt}} [{min(xs):{fmt}}-{max(xs):{fmt}}]"

        row = f"| {mode} | {n} | {loop_name} | {path} | {cell('per_s', ',.0f')} | "
        row += f"{cell('p50_us', '.1f')} | {cell('p99_us', '.1f')} |"
        rows.append(row)
    lines += rows
    lines += ["", f"After: {load()}."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
