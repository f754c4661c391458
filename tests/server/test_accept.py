"""Accepting under resource exhaustion: a server out of file descriptors keeps its connections
waiting in the backlog, rests its listener (asyncio's accept loop waits 1 s) instead of
retrying on every loop iteration, and serves again once descriptors are free.

The server's open-files limit is lowered from outside with ``prlimit(2)`` after it started,
so the test needs no special server option; the recovery test runs against the uvicorn oracle
too.
"""

from __future__ import annotations

import os
import resource
import time

import pytest

# Descriptors the server may open beyond those it has when the limit is lowered.
HEADROOM = 3
# Connections opened while the limit is low: more than HEADROOM, so accept(2) fails.
HELD = 12
# How long the server stays out of descriptors: a busy retry would log thousands of times.
EXHAUSTED_SECONDS = 2.5
# Log lines about the failure that a 1-second retry can produce in that time, with margin.
MAX_FAILURE_REPORTS = 10


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def exhaust_fds(server, connect) -> int:
    """Run the server out of descriptors for EXHAUSTED_SECONDS, then free them; return how
    many times it reported the failure meanwhile."""
    assert connect(server).request("GET", "/hello").status == 200
    pid = server.proc.pid
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_fds(pid) + HEADROOM, hard))
    held = []
    try:
        held = [server.try_connect() for _ in range(HELD)]
        assert all(sock is not None for sock in held), "the backlog should take them all"
        server.wait_for_output("Too many open files")
        time.sleep(EXHAUSTED_SECONDS)
        return server.output_text().count("Too many open files")
    finally:
        for sock in held:
            if sock is not None:
                sock.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.single_process(
    reason="the open-files limit is lowered on the process started; behind the front, "
    "another process accepts"
)
def test_out_of_fds_server_recovers(spawn_server, connect):
    server = spawn_server("raw_asgi:app", "--no-access-log")
    exhaust_fds(server, connect)
    # The retry accepts the closed backlog connections (EOF) and then this one.
    assert connect(server).request("GET", "/hello").status == 200


@pytest.mark.single_process(
    reason="the open-files limit is lowered on the process started; behind the front, "
    "another process accepts"
)
@pytest.mark.ferroloop_only(
    reason="asyncio 3.11's accept loop goes on calling accept() after EMFILE, up to the "
    "backlog, and schedules a retry for each failure: uvicorn on asyncio reports thousands"
)
def test_out_of_fds_rests_the_listener(spawn_server, connect):
    server = spawn_server("raw_asgi:app", "--no-access-log")
    reports = exhaust_fds(server, connect)
    assert reports <= MAX_FAILURE_REPORTS, (
        f"{reports} accept failures reported in {EXHAUSTED_SECONDS} s: the listener is "
        f"retried on every iteration instead of resting\n{server.describe()}"
    )
    assert "not accepting for 1 s" in server.output_text()
    assert connect(server).request("GET", "/hello").status == 200
