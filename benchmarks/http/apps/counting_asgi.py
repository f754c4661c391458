"""`hello_asgi.py`'s hello world, plus a per-process response count for `workers.py`.

Each worker process counts the responses it sends. If the environment names
`FERROLOOP_BENCH_COUNT_DIR`, importing the app (which every worker does itself) writes
`{pid}.ready` there, so the benchmark knows every worker and its PID, and installs a SIGUSR1
handler that writes the count so far to `{pid}.count` (to a temporary name, then renamed, so a
reader never sees half a number). The benchmark reads the counts before and after the measured
window: the difference is what each worker served, counted by the workers themselves.
"""

import os
import signal
from pathlib import Path

import hello_asgi

COUNT_DIR = os.environ.get("FERROLOOP_BENCH_COUNT_DIR")
served = 0


def write_count(signum: int, frame: object) -> None:
    assert COUNT_DIR is not None
    tmp = Path(COUNT_DIR, f"{os.getpid()}.count.tmp")
    tmp.write_text(str(served))
    tmp.rename(Path(COUNT_DIR, f"{os.getpid()}.count"))


if COUNT_DIR:
    signal.signal(signal.SIGUSR1, write_count)
    Path(COUNT_DIR, f"{os.getpid()}.ready").write_text("")


async def app(scope, receive, send):
    global served
    await hello_asgi.app(scope, receive, send)
    if scope["type"] == "http":
        served += 1
