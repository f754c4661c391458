"""System calls per unit of work, counted by `strace -c -f`: robust to a noisy machine.

    python benchmarks/loop/syscalls.py [--loops asyncio,uvloop,rloop,ferroloop]
        [--shape one_future:55000] [--shape ready:20000:10] [--shape dense_timers:10000]

Each shape of `shapes.py` runs twice per loop, at N and at 2N, under `strace -c -f`; the
difference of the two counts divided by N is what one unit (a future, an iteration, a timer)
costs in system calls, with interpreter start-up and imports cancelled out. Reported per unit:
waits for I/O (`epoll_wait`, `epoll_pwait`, `epoll_pwait2`, `poll`, `select`), clock reads that
reached the kernel (`clock_gettime`: zero while the vDSO serves them), and all system calls.
Also the raw wait count at N, as the issue quotes it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from shapes import parse_spec  # noqa: E402

WAITS = ("epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "select", "pselect6")
DEFAULT_SHAPES = ("one_future:55000", "ready:20000:1", "ready:20000:10", "dense_timers:10000")
ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:(\d+)\s+)?(\w+)\s*$")


def count(loop: str, shape: str, n: int, k: int) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "strace.txt"
        cmd = ["strace", "-c", "-f", "-o", str(out), sys.executable, str(HERE / "shapes.py")]
        cmd += [loop, shape, str(n), str(k)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"{loop} {shape} failed:\n{done.stdout}\n{done.stderr[-2000:]}")
        calls: dict[str, int] = {}
        for line in out.read_text().splitlines():
            m = ROW.match(line)
            if m and m.group(3) != "total":
                calls[m.group(3)] = int(m.group(1))
    return calls


def summary(calls: dict[str, int]) -> tuple[int, int, int]:
    waits = sum(calls.get(name, 0) for name in WAITS)
    return waits, calls.get("clock_gettime", 0), sum(calls.values())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loops", default="asyncio,uvloop,rloop,ferroloop")
    parser.add_argument("--shape", action="append", help="SHAPE:N[:K]; repeatable")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    print(f"# strace -c -f, per unit = (count at 2N - count at N) / N; load {load:.2f}")
    print("| shape | loop | waits at N | waits per unit | clock_gettime per unit | all per unit |")
    print("|---|---|---:|---:|---:|---:|")
    for spec in args.shape or DEFAULT_SHAPES:
        shape, n, k, label = parse_spec(spec)
        for loop in args.loops.split(","):
            small, large = summary(count(loop, shape, n, k)), summary(count(loop, shape, 2 * n, k))
            per = [(b - a) / n for a, b in zip(small, large, strict=True)]
            print(
                f"| {label} | {loop} | {small[0]} | {per[0]:.3f} | {per[1]:.3f} | {per[2]:.3f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
