"""--workers: requests are served by worker processes, children of the process started; a
worker killed with SIGKILL is replaced and requests keep succeeding; a worker that stops
answering health checks is killed and replaced."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest


def pid_of_a_worker(http_request, server) -> dict[str, int]:
    response = http_request(server, "GET", "/pid", headers=[("Connection", "close")])
    assert response.status == 200
    return json.loads(response.body)


@pytest.fixture
def workers(spawn_server):
    return spawn_server("raw_asgi:app", "--workers", "2")


def test_requests_are_served_by_child_processes(workers, http_request):
    seen = [pid_of_a_worker(http_request, workers) for _ in range(20)]
    assert all(entry["pid"] != workers.proc.pid for entry in seen)
    assert all(entry["ppid"] == workers.proc.pid for entry in seen)


def test_killed_worker_is_replaced(workers, http_request, wait_until, is_gone):
    first = pid_of_a_worker(http_request, workers)["pid"]
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: is_gone(first), f"worker {first} to die")

    served_by: set[int] = set()

    def a_new_worker_serves() -> bool:
        entry = pid_of_a_worker(http_request, workers)  # every request must succeed
        assert entry["pid"] != first, "the killed worker answered"
        assert entry["ppid"] == workers.proc.pid
        served_by.add(entry["pid"])
        return len(served_by) == 2

    wait_until(a_new_worker_serves, "requests to reach two live workers", timeout=20)
    for _ in range(10):
        assert pid_of_a_worker(http_request, workers)["pid"] in served_by
    assert workers.proc.poll() is None


def test_worker_that_stops_answering_health_checks_is_replaced(
    spawn_server, http_request, wait_until, is_gone
):
    server = spawn_server("raw_asgi:app", "--workers", "2", "--timeout-worker-healthcheck", "1")
    first = pid_of_a_worker(http_request, server)["pid"]
    os.kill(first, signal.SIGSTOP)  # neither its loop nor its answering thread runs any more
    wait_until(lambda: is_gone(first), f"the stopped worker {first} to be killed", timeout=20)
    entry = pid_of_a_worker(http_request, server)
    assert entry["pid"] != first and entry["ppid"] == server.proc.pid
    if os.environ.get("FERROLOOP_TEST_SERVER", "ferroloop") == "ferroloop":
        # ferroloop's words; uvicorn's supervisor logs the kill in its own.
        assert "did not answer a health check within 1 s; killing it" in server.output_text()


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (Linux: /proc/PID/task/PID/children)."""
    found = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return found
    for child in map(int, children):
        found += [child, *descendants(child)]
    return found


@pytest.mark.ferroloop_only("ferroloop's workers leave SIGHUP to the supervisor")
def test_a_sighup_sent_to_every_process_loses_no_request_in_flight(spawn_server, connect):
    """A terminal's hangup (or `kill -HUP -PGID`) reaches the workers as well as the
    supervisor: the supervisor replaces the workers gracefully, and the workers do not die of
    the signal with requests in flight."""
    server = spawn_server("raw_asgi:app", "--workers", "2")
    connections = [connect(server) for _ in range(3)]
    for connection in connections:
        connection.send(b"GET /sleep?s=1 HTTP/1.1\r\nHost: t\r\n\r\n")
    time.sleep(0.3)  # the requests reach their workers' apps
    tree = [server.proc.pid, *descendants(server.proc.pid)]
    assert len(tree) >= 4, tree  # the supervisor, the front and three workers
    for pid in tree:
        os.kill(pid, signal.SIGHUP)
    for connection in connections:
        assert connection.read_response().status == 200
    server.wait_for_output("restarting workers")
    assert "signal SIGHUP" not in server.output_text()
