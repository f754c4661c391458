"""Instructions per unit of work, counted by callgrind: the iteration's cost curve, noise-free.

    python benchmarks/loop/shape_instructions.py [--loops asyncio,uvloop,rloop,ferroloop]
        [--shape ready:4000:1] [--shape ready:400:1000] [--shape one_future:4000]
        [--calling N [--calling-shape call_soon.local ...]]

Each shape of `shapes.py` runs under `valgrind --tool=callgrind` at N and at 2N; the difference
of the two totals divided by N is one unit's cost (an iteration for `ready`, a future for
`one_future`, a timer for `dense_timers`), with start-up cancelled out. `PYTHONHASHSEED=0` makes
the counts repeat. For `ready` the table also gives the cost per callback (per iteration / K).
Callgrind counts what the process executes in user space; a system call counts only its
user-space side (its kernel time is what `syscalls.py` shows), so read the two together.
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
import callgrind_marks  # noqa: E402
from calling import SHAPES as CALLING_SHAPES  # noqa: E402
from shapes import parse_spec  # noqa: E402

DEFAULT_SHAPES = (
    "ready:4000:1",
    "ready:4000:2",
    "ready:2000:10",
    "ready:100:1000",
    "one_future:4000",
)
TOTALS = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


def instructions(loop: str, shape: str, n: int, k: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        cmd += [sys.executable, str(HERE / "shapes.py"), loop, shape, str(n), str(k)]
        env = dict(os.environ, PYTHONHASHSEED="0")
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if done.returncode != 0:
            sys.exit(f"{loop} {shape} failed under callgrind:\n{done.stderr[-2000:]}")
        m = TOTALS.search(out.read_text())
        if not m:
            sys.exit(f"no totals in the callgrind output of {loop} {shape}")
        return int(m.group(1))


def calling_table(loops: list[str], n: int, shapes: list[str]) -> int:
    """`calling.py`'s shapes: one process per loop under callgrind, start-up not counted
    (`callgrind_marks.py`), each shape at N and 2N calls; per call = the difference / N."""
    per_call: dict[str, dict[str, float]] = {}
    for loop in loops:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "callgrind.out"
            cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
            cmd += [f"--callgrind-out-file={out}", sys.executable, str(HERE / "calling.py")]
            cmd += [loop, "--callgrind", str(n), *shapes]
            env = dict(os.environ, PYTHONHASHSEED="0")
            done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
            if done.returncode != 0:
                sys.exit(f"{loop} failed under callgrind:\n{done.stderr[-2000:]}")
            counts = callgrind_marks.read_dumps(out)
        for shape in shapes or CALLING_SHAPES:
            small, large = counts[f"{shape} {n}"], counts[f"{shape} {2 * n}"]
            per_call.setdefault(shape, {})[loop] = (large - small) / n
        print(f"# {loop} done", file=sys.stderr, flush=True)
    print(f"# callgrind, instructions per call = (count at {2 * n} calls - at {n}) / {n}")
    print("| shape | " + " | ".join(loops) + " | best peer ÷ ferroloop |")
    print("|---|" + "---:|" * (len(loops) + 1))
    for shape, row in per_call.items():
        peers = [v for name, v in row.items() if name != "ferroloop"]
        ratio = f"{min(peers) / row['ferroloop']:.2f}" if peers and "ferroloop" in row else ""
        cells = " | ".join(f"{row[name]:,.0f}" for name in loops)
        print(f"| {shape} | {cells} | {ratio} |")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loops", default="asyncio,uvloop,rloop,ferroloop")
    parser.add_argument("--shape", action="append", help="SHAPE:N[:K]; repeatable")
    parser.add_argument("--calling", type=int, metavar="N", help="calling.py's shapes at N")
    parser.add_argument(
        "--calling-shape", action="append", choices=CALLING_SHAPES, help="(default: all)"
    )
    args = parser.parse_args(argv)
    if args.calling:
        return calling_table(args.loops.split(","), args.calling, args.calling_shape or [])
    specs = args.shape or DEFAULT_SHAPES
    print("# callgrind, per unit = (instructions at 2N - at N) / N")
    print("| shape | loop | instructions per unit | per callback |")
    print("|---|---|---:|---:|")
    for spec in specs:
        shape, n, k, label = parse_spec(spec)
        for loop in args.loops.split(","):
            small = instructions(loop, shape, n, k)
            large = instructions(loop, shape, 2 * n, k)
            per = (large - small) / n
            per_cb = f"{per / k:,.0f}" if shape == "ready" else ""
            print(f"| {label} | {loop} | {per:,.0f} | {per_cb} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
