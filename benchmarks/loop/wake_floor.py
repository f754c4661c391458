"""The kernel's floor under the threadsafe benchmark: its wake-up path with no Python at all.

`wake_floor.c` does what `threadsafe.py` measures, in C: a thread sleeping in `epoll_wait` on an
eventfd is woken every 0.5 ms by another thread's write, on the same pinned core. No loop can wake
faster than this on the machine; the report prints it next to the loops' wake latencies.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from threadsafe import CASES, WARMUP_SAMPLES

SOURCE = Path(__file__).with_name("wake_floor.c")


def measure(pin: list[str], repeat: int, quick: bool) -> dict:
    """{"p50_us", "p99_us"}: medians over `repeat` runs; or {"error": why it could not run}."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return {"error": "no C compiler (cc/gcc) found"}
    params = CASES[""][1 if quick else 0]
    gap_us = round(params["gap_s"] * 1e6)
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "wake_floor"
        built = subprocess.run(
            [compiler, "-O2", "-pthread", str(SOURCE), "-o", str(exe)],
            capture_output=True,
            text=True,
        )
        if built.returncode != 0:
            return {"error": f"compiling wake_floor.c failed: {built.stderr.strip()[:200]}"}
        p50s, p99s = [], []
        for _ in range(repeat):
            cmd = [*pin, str(exe), str(params["samples"]), str(gap_us), str(WARMUP_SAMPLES)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                return {"error": f"wake_floor failed: {done.stderr.strip()[:200]}"}
            p50, p99 = (float(x) for x in done.stdout.split())
            p50s.append(p50)
            p99s.append(p99)
    return {"p50_us": statistics.median(p50s), "p99_us": statistics.median(p99s)}
