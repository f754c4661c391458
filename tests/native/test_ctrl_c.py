"""Ctrl-C from outside: SIGINT sent to a process whose loop sleeps in epoll.

The child starts an idle extra thread first, so the kernel may deliver the signal to a thread
that is not the loop's; the loop must still wake (through the signal wakeup fd), cancel the main
coroutine, and exit with KeyboardInterrupt, exactly as ``asyncio.run`` does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

CHILD = r"""
import asyncio, sys, threading, time
import ferroloop

threading.Thread(target=time.sleep, args=(30,), daemon=True).start()

async def main():
    print("ready", flush=True)
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        print("cancelled", flush=True)
        raise

try:
    {runner}(main())
except KeyboardInterrupt:
    print("keyboard-interrupt", flush=True)
    sys.exit(3)
"""


@pytest.mark.parametrize("runner", ["asyncio.run", "ferroloop.run"])
def test_sigint_while_sleeping_in_poll_cancels_main_and_raises_keyboard_interrupt(runner):
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(runner=runner)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.2)  # let the loop reach epoll_wait
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, err
    assert out.split() == ["cancelled", "keyboard-interrupt"]
