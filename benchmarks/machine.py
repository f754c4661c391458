"""What every benchmark runner shares: number formatting, the machine's description, core
pinning and the revision measured. Imported by benchmarks/loop and benchmarks/http."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path


def fmt(x: float | None) -> str:
    """Three significant figures, with k/M suffixes for big numbers."""
    if x is None or x != x:  # None or NaN
        return "—"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale * 0.9995:  # so 999.7 prints as 1k, not 1e+03
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def cpu_pins() -> tuple[list[str], list[str], str | None]:
    """taskset prefixes for core 0 (measured) and core 1 (load), or two empty ones and why not."""
    if shutil.which("taskset") is None:
        return [], [], "taskset not found (install util-linux); processes are not pinned"
    cpus = os.sched_getaffinity(0)
    if not {0, 1} <= cpus:
        return [], [], f"cores 0 and 1 are not both available (have {sorted(cpus)}); not pinned"
    return ["taskset", "-c", "0"], ["taskset", "-c", "1"], None


def core_busy_seconds(core: int) -> float:
    """CPU time core `core` spent not idle, from /proc/stat (user, nice, system, irq, softirq,
    steal), by whatever ran there."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{core} "):
            ticks = [int(x) for x in line.split()[1:9]]
            return (sum(ticks[0:3]) + sum(ticks[5:8])) / os.sysconf("SC_CLK_TCK")
    return float("nan")


def git_revision() -> str:
    """HEAD of the repository, with `+dirty` if the tree has changes: what was measured."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def run_meta(
    script: str, argv: list[str], started: float, load_before: float, pinned: bool
) -> dict:
    """What every results file records first: when, the command, the revision, the machine,
    whether the processes were pinned, and the 1-minute load average at start and end (other
    processes share the pinned cores: a load near the number of CPUs means noisy numbers)."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "command": " ".join(["python", script, *argv]),
        "revision": git_revision(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "pinned": pinned,
        "load_avg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
