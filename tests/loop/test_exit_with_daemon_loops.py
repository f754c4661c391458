"""Interpreter exit while a loop still runs in a daemon thread: the process exits cleanly.

CPython (before 3.14) ends a daemon thread with `pthread_exit` when it takes the GIL after
finalization began. A thread inside ferroloop's Rust frames cannot survive that unwind: before
the exit hook (crates/py/src/gil.rs) these scripts crashed in about half of their runs (exit
status 134 or 139, in `PyEval_RestoreThread` after the poll or in a handle's destructor). Each
script runs several times, in a fresh interpreter each, on asyncio's loop and on ferroloop's.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

RUNS = 6

PRELUDE = """
import asyncio, sys, threading, time, atexit
if sys.argv[1] == "ferroloop":
    import ferroloop
    loop = ferroloop.new_event_loop()
else:
    loop = asyncio.new_event_loop()
threading.Thread(target=loop.run_forever, daemon=True).start()
"""

SCENARIOS = {
    # Four daemon threads keep waking the loop with call_soon_threadsafe.
    "producers": """
def produce():
    while True:
        loop.call_soon_threadsafe(lambda: None)
for _ in range(4):
    threading.Thread(target=produce, daemon=True).start()
""",
    # The loop is never idle: a chain of callbacks and short timers, all Python.
    "busy loop": """
def again(n):
    sum(range(200))
    loop.call_soon(again, n + 1)
    if n % 50 == 0:
        loop.call_later(0.0001, lambda: None)
loop.call_soon_threadsafe(again, 0)
""",
    # Tasks that await each other through futures and sleep(0), resolved from a thread too.
    "tasks": """
async def worker():
    while True:
        fut = loop.create_future()
        loop.call_soon(fut.set_result, None)
        await fut
        await asyncio.sleep(0)
def start():
    for _ in range(20):
        loop.create_task(worker())
loop.call_soon_threadsafe(start)
def produce():
    while True:
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop)
threading.Thread(target=produce, daemon=True).start()
""",
}

EPILOGUE = """
atexit.register(print, "exit functions ran", flush=True)
time.sleep(float(sys.argv[2]))
print("main done", flush=True)
"""


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_exit_with_a_running_daemon_loop_is_clean(loop_name, scenario):
    code = textwrap.dedent(PRELUDE) + textwrap.dedent(SCENARIOS[scenario]) + EPILOGUE
    for run in range(RUNS):
        delay = f"{0.02 + 0.015 * run:.3f}"
        done = subprocess.run(
            [sys.executable, "-c", code, loop_name, delay],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (
            f"run {run} (main thread slept {delay} s) exited with {done.returncode}\n"
            f"stdout: {done.stdout[-500:]}\nstderr: {done.stderr[-2000:]}"
        )
        assert done.stdout.splitlines() == ["main done", "exit functions ran"]


FORK_SCRIPT = """
import os, sys, threading, time
import ferroloop
from ferroloop import _native
loop = ferroloop.new_event_loop()
def again():
    loop.call_soon(again)
loop.call_soon(again)
threading.Thread(target=loop.run_forever, daemon=True).start()
time.sleep(0.05)
pid = os.fork()
if pid == 0:
    # The busy loop's thread does not exist here: nothing to wait for at exit.
    os.write(1, f"child {_native._prepare_exit(0.0)}\\n".encode())
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_a_forked_child_does_not_wait_for_the_parents_loop_threads():
    # The parent's busy daemon loop counts as running Python; a child forked meanwhile has only
    # the forking thread, so its exit hook must find no other loop to wait for.
    done = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "child 0" in done.stdout.splitlines(), done.stdout


LATE_LOOP_SCRIPT = """
import atexit, sys, threading
def cleanup():
    # Registered before ferroloop is imported, so it runs after ferroloop's exit hook: a loop
    # started now, in a thread this function joins, must run to the end, not park.
    import asyncio
    import ferroloop
    async def work():
        await asyncio.sleep(0.01)
        return "cleanup loop finished"
    out = []
    t = threading.Thread(target=lambda: out.append(ferroloop.run(work())))
    t.start()
    t.join()
    print(out[0], flush=True)
atexit.register(cleanup)
import ferroloop
loop = ferroloop.new_event_loop()
def again():
    loop.call_soon(again)
loop.call_soon(again)
threading.Thread(target=loop.run_forever, daemon=True).start()
"""


def test_a_loop_started_by_an_exit_function_after_the_hook_runs_to_the_end():
    done = subprocess.run(
        [sys.executable, "-c", LATE_LOOP_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["cleanup loop finished"]
