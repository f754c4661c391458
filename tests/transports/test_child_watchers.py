"""Subprocesses under each of asyncio's Linux child watchers, attached to the loop under test.

ThreadedChildWatcher (the 3.11 default) reports exits with call_soon_threadsafe;
PidfdChildWatcher waits on a pidfd through the loop's ``_add_reader``; SafeChildWatcher and
FastChildWatcher reap on SIGCHLD through ``add_signal_handler``. Child watchers are
deprecated from Python 3.12 on (and gone in 3.14), so these tests run on 3.11 only.
"""

from __future__ import annotations

import asyncio
import os
import sys
from asyncio.subprocess import PIPE

import pytest

pytestmark = pytest.mark.skipif(
    sys.version_info >= (3, 12), reason="child watchers are deprecated from Python 3.12 on"
)

WATCHERS = ["ThreadedChildWatcher", "PidfdChildWatcher", "SafeChildWatcher", "FastChildWatcher"]


@pytest.fixture(params=WATCHERS)
def watcher(request, loop):
    """The watcher installed on the policy and attached to ``loop``; the default put back after."""
    if request.param == "PidfdChildWatcher" and not hasattr(os, "pidfd_open"):
        pytest.skip("os.pidfd_open is not available")
    policy = asyncio.get_event_loop_policy()
    watcher = getattr(asyncio, request.param)()
    policy.set_child_watcher(watcher)
    watcher.attach_loop(loop)
    yield watcher
    watcher.attach_loop(None)  # gives SIGCHLD back before the loop fixture checks signals
    policy.set_child_watcher(None)  # closes ours; the next use builds the default again


def test_exit_codes_are_reported(loop, run, watcher):
    async def main():
        processes = [
            await asyncio.create_subprocess_exec("/bin/sh", "-c", f"exit {code}")
            for code in (0, 1, 42)
        ]
        return [await process.wait() for process in processes]

    assert run(main()) == [0, 1, 42]


def test_communicate_and_kill(loop, run, watcher):
    async def main():
        echo = await asyncio.create_subprocess_exec("/bin/sh", "-c", "cat", stdin=PIPE, stdout=PIPE)
        output, _ = await echo.communicate(b"through cat")
        sleeper = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", "echo up; exec sleep 30", stdout=PIPE
        )
        await sleeper.stdout.readline()
        sleeper.kill()
        return output, echo.returncode, await sleeper.wait()

    assert run(main()) == (b"through cat", 0, -9)


def test_concurrent_subprocesses(loop, run, watcher):
    async def one(index):
        process = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", f"echo {index}", stdout=PIPE
        )
        stdout, _ = await process.communicate()
        return int(stdout)

    async def main():
        return await asyncio.gather(*(one(index) for index in range(20)))

    assert run(main()) == list(range(20))
