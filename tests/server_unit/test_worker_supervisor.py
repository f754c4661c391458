"""Workers: the jitter and respawn arithmetic, the supervisor's decisions on worker exits (with
forked stand-in children), and one end-to-end run in a subprocess with a fake HttpServer."""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time

import pytest
from ferroloop.server import supervisor as supervisor_module
from ferroloop.server.config import Config
from ferroloop.server.supervisor import (
    Supervisor,
    answer_health_checks,
    describe_status,
    respawn_delay,
)
from server_unit_harness import finish, read_until, running_harness


def test_worker_request_limits_are_jittered_independently():
    config = Config("m:app", limit_max_requests=1000, max_requests_jitter=100, log_config=None)
    sup = Supervisor(config, [], rng=random.Random(42))
    limits = [sup.worker_request_limit() for _ in range(200)]
    assert all(1000 <= limit <= 1100 for limit in limits)
    assert len(set(limits)) > 50  # spread, not one value for everyone
    no_jitter = Supervisor(Config("m:app", limit_max_requests=7, log_config=None), [])
    assert no_jitter.worker_request_limit() == 7
    no_limit = Supervisor(Config("m:app", log_config=None), [])
    assert no_limit.worker_request_limit() is None


def test_respawn_delay_doubles_to_a_cap():
    assert [respawn_delay(n) for n in range(8)] == [0.0, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0]


def test_describe_status():
    assert describe_status(0) == "exit code 0"
    assert describe_status(3 << 8) == "exit code 3"
    assert describe_status(signal.SIGKILL) == "signal SIGKILL"


@pytest.fixture
def fake_children(monkeypatch):
    """spawn_worker replaced by a fork whose child sleeps, then exits with a scripted code."""
    script: list[tuple[float, int]] = []
    spawned: list[int] = []

    def spawn(
        config, sockets, request_limit=None, health=None, parent_only=(), channel=None, seat=None
    ):
        seconds, code = script.pop(0) if script else (60.0, 0)
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            if health is not None and code != HANGS:
                threading.Thread(target=answer_health_checks, args=(health,), daemon=True).start()
            time.sleep(seconds)
            os._exit(code)
        spawned.append(pid)
        return pid

    monkeypatch.setattr(supervisor_module, "spawn_worker", spawn)
    yield script, spawned
    for pid in spawned:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


# A scripted exit code for a fake child that never answers health checks.
HANGS = 99


def step_until(sup: Supervisor, condition, timeout=5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        sup._step()
        time.sleep(0.02)


def test_crashed_worker_is_replaced(fake_children, caplog):
    caplog.set_level(logging.INFO, logger="ferroloop.error")
    script, spawned = fake_children
    script += [(0.0, 1), (60.0, 0)]
    sup = Supervisor(Config("m:app", workers=2, log_config=None), [])
    sup.spawn()
    sup.spawn()
    step_until(sup, lambda: len(spawned) == 3)
    assert "died (exit code 1); starting a new one" in caplog.text
    assert len(sup.workers) == 2 and not sup.should_exit
    sup.should_exit = True
    sup._stop_all()
    assert sup.workers == {}
    assert caplog.text.count("Terminated worker process") == 2


def test_worker_at_its_request_limit_is_replaced(fake_children, caplog):
    caplog.set_level(logging.INFO, logger="ferroloop.error")
    script, spawned = fake_children
    script += [(0.0, 0)]
    config = Config("m:app", workers=1, limit_max_requests=5, log_config=None)
    sup = Supervisor(config, [])
    sup.spawn()
    step_until(sup, lambda: len(spawned) == 2)
    assert "exited after its request limit (5); starting a new one" in caplog.text
    sup._stop_all()


def test_startup_failure_stops_everything(fake_children, caplog):
    script, _ = fake_children
    script += [(0.0, 3)]
    sup = Supervisor(Config("m:app", workers=2, log_config=None), [])
    assert sup.run() == 3
    assert "failed to start; stopping the parent process" in caplog.text
    assert sup.workers == {}


def test_every_worker_failing_to_start_at_once_stops_the_parent(fake_children, caplog):
    """Both workers exit 3 before the parent looks: one reap returns both, and both must leave
    the worker table (the parent used to wait for the second one forever)."""
    script, spawned = fake_children
    script += [(0.0, 3), (0.0, 3)]
    sup = Supervisor(Config("m:app", workers=2, log_config=None), [])
    sup.spawn()
    sup.spawn()
    for pid in spawned:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # both have exited, not yet reaped
    sup._step()
    assert sup.should_exit and sup.exit_code == 3
    assert sup.workers == {}
    sup._stop_all()  # returns: nothing is left to wait for
    assert caplog.text.count("failed to start") == 2


def test_quick_crashes_back_off(fake_children):
    script, _ = fake_children
    script += [(0.0, 1)] * 3
    sup = Supervisor(Config("m:app", workers=1, log_config=None), [])
    sup.spawn()
    step_until(sup, lambda: sup._quick_deaths == 3)
    assert sup._spawn_due and sup._spawn_due[0][0] - time.monotonic() > 0.2  # 0.4 s pending
    sup._stop_all()


def test_worker_that_does_not_answer_health_checks_is_killed_and_replaced(fake_children, caplog):
    caplog.set_level(logging.INFO, logger="ferroloop.error")
    script, spawned = fake_children
    script += [(60.0, HANGS), (60.0, 0)]
    config = Config("m:app", workers=1, timeout_worker_healthcheck=0.3, log_config=None)
    sup = Supervisor(config, [])
    sup.spawn()
    step_until(sup, lambda: len(spawned) == 2)
    assert f"Worker process [{spawned[0]}] did not answer a health check within 0.3 s" in (
        caplog.text
    )
    assert "died (signal SIGKILL); starting a new one" in caplog.text
    sup._stop_all()


def test_workers_that_answer_health_checks_are_left_alone(fake_children, caplog):
    _, spawned = fake_children
    config = Config("m:app", workers=2, timeout_worker_healthcheck=0.3, log_config=None)
    sup = Supervisor(config, [])
    sup.spawn()
    sup.spawn()
    answers: dict[int, set[float]] = {pid: set() for pid in sup.workers}

    def count_answers() -> bool:
        for pid, worker in sup.workers.items():
            if worker.answered > worker.started:
                answers[pid].add(worker.answered)  # the time of each answer received
        return min(len(times) for times in answers.values()) >= 3

    # Several checks answered by each worker (each takes HEALTHCHECK_INTERVAL), none killed.
    step_until(sup, count_answers, timeout=10.0)
    assert len(spawned) == 2 and "did not answer" not in caplog.text
    sup._stop_all()


def test_supervisor_end_to_end(tmp_path):
    with running_harness(tmp_path, workers=2, limit_max_requests=50) as proc:
        # Two workers and one fast-lane worker behind the front, then a replacement.
        output = read_until(proc, "Started worker process", count=4)
        assert "ferroloop running on http://127.0.0.1:" in output
        assert "Started parent process" in output
        assert "Started front process" in output
        proc.send_signal(signal.SIGTERM)
    output += finish(proc)
    assert proc.returncode == 0, output
    assert "Maximum request limit of 50 exceeded. Terminating process." in output
    assert "exited after its request limit (50); starting a new one" in output
    assert "Received SIGTERM, stopping workers." in output
    assert "Finished server process" in output
    assert "Stopping parent process" in output
