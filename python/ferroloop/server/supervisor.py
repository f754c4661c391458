"""``--workers N``: a parent process that forks N servers and keeps them alive.

Ownership: the parent binds the listening socket(s) once and keeps them open for its whole life,
so connections queue in the kernel's backlog while a worker is being replaced; each worker gets
them through ``fork`` and serves them with its own ferroloop loop. With ``--reuse-port`` (TCP
only) each worker binds its own ``SO_REUSEPORT`` socket instead and the kernel spreads the
connections. The parent never imports the app and never creates an event loop: ``fork`` happens
in a process with one thread and no loop.

Worker exit statuses and what the parent does while running:

- 3 (``STARTUP_FAILURE``: the app could not be imported, bound or started): stop everything,
  exit 3 (uvicorn does the same);
- 0 (it reached its ``limit_max_requests``), anything else, or a signal: start a new worker.
  A worker that dies within a second of its start delays the next spawn (0.1 s, doubling to
  5 s) so that a crash at start-up does not spin.

Health checks (uvicorn's ``--timeout-worker-healthcheck``): each worker gets one end of a socket
pair and a thread that answers every byte the parent sends on it. The parent sends one every
``HEALTHCHECK_INTERVAL`` seconds to each worker that has answered the previous one; a worker that
leaves one unanswered for ``timeout_worker_healthcheck`` seconds is killed (SIGKILL) and replaced
as a crashed one is. A thread answers, as in uvicorn, so a worker whose loop is busy (a slow
request) still answers: only a process that is stopped or holds the GIL that long does not.
The checks run while the parent supervises, not during a shutdown.

Signals to the parent: SIGINT or SIGTERM → SIGTERM to every worker (each shuts down gracefully),
close the parent's copy of the listening sockets, wait for all, exit. A second SIGINT → SIGINT
to the workers (forced exit). SIGHUP → replace every worker (graceful, the socket stays open).

Why the parent closes its copy then: a listening socket is closed only when its last
descriptor is. Each worker, once it stops accepting, accepts what the kernel has already
completed and closes its copy (``Server.shutdown``); if the parent still held one, the kernel
would go on completing connections that nobody accepts, and reset them all when the parent
exits (measured: every client that connected after SIGTERM, 50 of 50, saw its accepted
connection reset). With the parent's copy gone, the last worker to stop closes the socket and
later connections are refused, which a client or load balancer can retry elsewhere. Not on
SIGHUP or a worker's ``--limit-max-requests`` exit: the new workers need the socket, and
connections wait in the backlog meanwhile.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .config import STARTUP_FAILURE, Config, jittered_request_limit
from .front import (
    FAST,
    GENERAL,
    FrontProcess,
    WorkerChannel,
    board_capacity,
    channel_pair,
    front_wanted,
    server_address,
    start_front,
)
from .metrics import MetricsExporter, new_board

logger = logging.getLogger("ferroloop.error")

POLL_INTERVAL = 0.1
QUICK_DEATH = 1.0  # seconds: a worker that dies sooner counts as a crash loop
MAX_RESPAWN_DELAY = 5.0
HEALTHCHECK_INTERVAL = 0.5  # seconds between a worker's answer and the next health check
_PR_SET_PDEATHSIG = 1


def respawn_delay(quick_deaths: int) -> float:
    """Seconds to wait before replacing a worker after ``quick_deaths`` crashes in a row."""
    if quick_deaths <= 0:
        return 0.0
    return min(MAX_RESPAWN_DELAY, 0.1 * 2 ** (quick_deaths - 1))


def describe_status(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def restart_reason(worker: _Worker, code: int) -> str:
    """Why a worker that exited is replaced, as ``ferroloop_worker_restarts_total`` labels it."""
    if worker.killed:
        return "healthcheck"
    if worker.asked_to_stop:
        return "signal"
    if code == 0 and worker.request_limit is not None:
        return "max_requests"
    return "crash"


def _hangup_is_the_supervisor_s(sig: int, frame: object) -> None:
    """A worker's SIGHUP handler: nothing to do (see ``_worker_main``)."""


def _die_with_parent() -> None:
    """Linux: the worker gets SIGTERM if the parent dies (a SIGKILLed supervisor leaves no
    orphans serving stale code)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def answer_health_checks(channel: socket.socket) -> None:
    """Worker side of the health checks: answers each byte from the parent until it closes."""
    with contextlib.suppress(OSError):
        while channel.recv(64):
            channel.sendall(b".")


def _worker_main(
    config: Config,
    sockets: list[socket.socket] | None,
    request_limit: int | None,
    channel: WorkerChannel | None = None,
    seat: tuple[Any, int] | None = None,
) -> int:
    """Runs in the forked child; returns its exit status."""
    from .server import Server

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # SIGHUP belongs to the supervisor (a graceful replacement of every worker). One sent to the
    # whole process group (a terminal's hangup, `kill -HUP -PGID`) reaches the supervisor too,
    # so here it must not kill the worker mid-request. A handler, not SIG_IGN: the app's child
    # processes get the default disposition back when they exec.
    signal.signal(signal.SIGHUP, _hangup_is_the_supervisor_s)
    try:
        server = Server(config)
        server.seat = seat
        server.limit_max_requests = request_limit
        server.run(sockets=sockets, channel=channel)
    except KeyboardInterrupt:
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        logger.exception("Worker process [%d] failed", os.getpid())
        return 1
    return 0


def spawn_worker(
    config: Config,
    sockets: list[socket.socket] | None,
    request_limit: int | None = None,
    health: socket.socket | None = None,
    parent_only: Sequence[socket.socket] = (),
    channel: WorkerChannel | None = None,
    seat: tuple[Any, int] | None = None,
) -> int:
    """Forks a server process; returns its pid (the child never returns).

    ``sockets=None``: the worker binds its own (``--reuse-port``). ``health``: the worker's end
    of its health-check channel, answered by a thread; ``parent_only``: sockets the child
    closes (the parent's ends of every channel). ``channel``: the worker serves what the front
    hands it over this channel, instead of ``sockets``. ``seat``: (board, index) where the
    worker counts its requests (``metrics.py``).
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    status = 1
    try:
        _die_with_parent()
        if os.getppid() != parent:
            os._exit(1)  # the parent died between fork and prctl
        for sock in parent_only:
            sock.close()
        if health is not None:
            threading.Thread(
                target=answer_health_checks, args=(health,), name="health-check", daemon=True
            ).start()
        status = _worker_main(config, sockets, request_limit, channel, seat)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)


@dataclass
class _Worker:
    pid: int
    started: float
    request_limit: int | None
    # The parent's end of the health-check channel (non-blocking), when the sent check (at
    # ``check_sent``) is unanswered, and when the last answer came.
    health: socket.socket | None = None
    check_sent: float | None = None
    answered: float = 0.0
    killed: bool = False  # by the health check
    asked_to_stop: bool = False  # by SIGHUP's restart
    # Behind the front: "general" takes any request, "fast" no bulk upload.
    lane: str = GENERAL
    # Behind the front: its seat on the front's board (``FrontProcess.status()``).
    seat: int | None = None


@dataclass
class Supervisor:
    """Runs ``config.workers`` server processes on ``sockets`` until told to stop."""

    config: Config
    sockets: list[socket.socket] | None
    rng: random.Random = field(default_factory=random.Random)
    should_exit: bool = False
    exit_code: int = 0
    workers: dict[int, _Worker] = field(default_factory=dict)
    _force: bool = False
    _forced: bool = False
    _restart: bool = False
    _stop_signal: str | None = None
    _quick_deaths: int = 0
    # (when, lane) of each worker to start.
    _spawn_due: list[tuple[float, str]] = field(default_factory=list)
    front: FrontProcess | None = None
    _server_address: object = None
    # Where workers count their requests and the front publishes (front.py, metrics.py).
    board: Any = None
    exporter_pid: int | None = None

    def worker_request_limit(self) -> int | None:
        return jittered_request_limit(
            self.config.limit_max_requests, self.config.max_requests_jitter, self.rng
        )

    def spawn(self, lane: str = GENERAL) -> None:
        limit = self.worker_request_limit()
        ours, theirs = socket.socketpair()
        parent_only = [ours, *(w.health for w in self.workers.values() if w.health is not None)]
        sockets = self.sockets
        channel = front_end = None
        board = self.board
        taken = {w.seat for w in self.workers.values()}
        seat = next((i for i in range(board.capacity if board else 0) if i not in taken), None)
        if self.front is not None:
            front_end, worker_end = channel_pair()
            channel = WorkerChannel(worker_end, self._server_address, lane)
            parent_only += [front_end, self.front.control]
            sockets = []
        try:
            pid = spawn_worker(
                self.config,
                sockets,
                limit,
                theirs,
                parent_only,
                channel,
                seat=(board, seat) if board is not None and seat is not None else None,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            if channel is not None:
                channel.sock.close()
        ours.setblocking(False)
        now = time.monotonic()
        self.workers[pid] = _Worker(
            pid, now, limit, health=ours, answered=now, lane=lane, seat=seat
        )
        if self.front is not None and front_end is not None:
            try:
                self.front.add_worker(pid, lane, front_end)
            except OSError as exc:
                logger.error("Could not give worker [%d] to the front process: %s", pid, exc)
            finally:
                front_end.close()
        logger.info("Started worker process [%d]", pid)

    def handle_signal(self, sig: int, frame: object = None) -> None:
        # Only flags here; the messages are logged by the main loop. A handler runs between two
        # bytecodes of the main thread, possibly inside a logging call, and Python 3.13's logging
        # drops a record emitted while the same handler is emitting another in that thread.
        if sig == signal.SIGHUP:
            self._restart = True
            return
        if self.should_exit and sig == signal.SIGINT:
            self._force = True
        elif not self.should_exit:
            self._stop_signal = signal.Signals(sig).name
        self.should_exit = True

    def run(self) -> int:
        logger.info("Started parent process [%d]", os.getpid())
        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {sig: signal.signal(sig, self.handle_signal) for sig in handled}
        try:
            wants_front = front_wanted(self.config, self.sockets)
            if self.config.metrics or wants_front:
                self.board = new_board(board_capacity(self.config))
            if self.config.metrics and not self._start_exporter():
                return 1
            if wants_front:
                self._start_front()
            for _ in range(self.config.workers):
                self.spawn(GENERAL)
            if self.front is not None:
                for _ in range(self.config.lane_fast_workers):
                    self.spawn(FAST)
            while not self.should_exit:
                self._step()
                time.sleep(POLL_INTERVAL)
            if self._stop_signal is not None:
                logger.info("Received %s, stopping workers.", self._stop_signal)
            self._stop_all()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._stop_exporter()
        logger.info("Stopping parent process [%d]", os.getpid())
        return self.exit_code

    def _start_exporter(self) -> bool:
        """Forks the metrics exporter (a process of its own, so this one stays single-threaded
        for its forks); False, logged, if its port cannot be bound."""
        try:
            exporter = MetricsExporter(self.config, self.board)
        except OSError as exc:
            logger.error("%s", exc.strerror)
            return False
        parent_only = [
            *(self.sockets or ()),
            *(w.health for w in self.workers.values() if w.health),
        ]
        if self.front is not None:
            parent_only.append(self.front.control)
        self.exporter_pid = exporter.start_process(_die_with_parent, parent_only)
        return True

    def _stop_exporter(self) -> None:
        if self.exporter_pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.exporter_pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.exporter_pid, 0)
        self.exporter_pid = None

    def _start_front(self) -> None:
        """Forks the front; from then on only it holds the listening sockets (closed here),
        so that once it drains, new connections are refused."""
        assert self.sockets
        self._server_address = server_address(self.sockets)
        self.front = start_front(self.config, self.sockets, _die_with_parent, self.board)
        for sock in self.sockets:
            sock.close()

    def _step(self) -> None:
        if self._restart:
            self._restart = False
            logger.info("Received SIGHUP, restarting workers.")
            for pid, worker in list(self.workers.items()):
                worker.asked_to_stop = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        # Every exit reaped here is accounted for, even after one of them decided to stop:
        # a reaped worker left in the table would be waited for forever by _stop_all.
        for pid, status in self._reap():
            self._on_worker_exit(pid, status)
        if self.should_exit:
            return
        now = time.monotonic()
        while self._spawn_due and self._spawn_due[0][0] <= now:
            _, lane = self._spawn_due.pop(0)
            self.spawn(lane)
        self._check_health(time.monotonic())

    def _check_health(self, now: float) -> None:
        """Reads answers, sends due checks, and kills a worker that left one unanswered for
        ``timeout_worker_healthcheck`` seconds (it is replaced when it is reaped)."""
        timeout = self.config.timeout_worker_healthcheck
        for worker in self.workers.values():
            channel = worker.health
            if channel is None or worker.killed:
                continue
            if worker.check_sent is not None:
                try:
                    answered = bool(channel.recv(64))
                except (BlockingIOError, InterruptedError):
                    answered = False
                except OSError:
                    continue  # the worker is exiting: waitpid reports it
                if answered:
                    worker.check_sent, worker.answered = None, now
                elif now - worker.check_sent >= timeout:
                    logger.warning(
                        "Worker process [%d] did not answer a health check within %g s; "
                        "killing it.",
                        worker.pid,
                        timeout,
                    )
                    worker.killed = True
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(worker.pid, signal.SIGKILL)
                    continue
            if worker.check_sent is None and now - worker.answered >= HEALTHCHECK_INTERVAL:
                with contextlib.suppress(OSError):
                    channel.send(b"?")
                    worker.check_sent = now

    def _reap(self) -> list[tuple[int, int]]:
        exited = []
        while self.workers:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in self.workers:
                exited.append((pid, status))
            elif self.front is not None and pid == self.front.pid:
                # Without the front nothing reaches the workers: stop, and say why.
                logger.error(
                    "The front process [%d] died (%s); stopping.", pid, describe_status(status)
                )
                self.front.close()
                self.front = None
                self.exit_code = 1
                self.should_exit = True
            elif pid == self.exporter_pid:
                self.exporter_pid = None
                logger.warning(
                    "The metrics process [%d] died (%s); starting a new one.",
                    pid,
                    describe_status(status),
                )
                self._start_exporter()
        return exited

    def _on_worker_exit(self, pid: int, status: int) -> None:
        worker = self.workers.pop(pid)
        if worker.health is not None:
            worker.health.close()
        if worker.seat is not None and self.board is not None:
            # Its requests stay in the metrics' totals (metrics.py).
            self.board.seat_retire(worker.seat)
        code = os.waitstatus_to_exitcode(status)
        if code == STARTUP_FAILURE:
            logger.error("Worker process [%d] failed to start; stopping the parent process.", pid)
            self.exit_code = STARTUP_FAILURE
            self.should_exit = True
            return
        if code == 0 and worker.request_limit is not None:
            logger.info(
                "Worker process [%d] exited after its request limit (%d); starting a new one.",
                pid,
                worker.request_limit,
            )
        elif code == 0:
            logger.info("Worker process [%d] stopped; starting a new one.", pid)
        else:
            logger.warning(
                "Worker process [%d] died (%s); starting a new one.", pid, describe_status(status)
            )
        if self.board is not None and not self.should_exit:
            self.board.count_restart(restart_reason(worker, code))
        lived = time.monotonic() - worker.started
        self._quick_deaths = self._quick_deaths + 1 if code != 0 and lived < QUICK_DEATH else 0
        due = time.monotonic() + respawn_delay(self._quick_deaths)
        self._spawn_due.append((due, worker.lane))

    def _drain_front(self) -> None:
        """Tells the front to drain and waits for it (the workers serve meanwhile): requests
        it has read are handed on and answered with ``Connection: close``, those with workers
        finish, and then new connections are refused."""
        front = self.front
        if front is None:
            return
        timeout = self.config.timeout_graceful_shutdown
        front.drain(timeout)
        logger.info("Waiting for the front process [%d] to drain.", front.pid)
        # The front keeps its own deadline; this one only guards against a stuck front.
        deadline = None if timeout is None else time.monotonic() + timeout + 5.0
        forced = False
        while True:
            try:
                pid, _status = os.waitpid(front.pid, os.WNOHANG)
            except ChildProcessError:
                break
            if pid:
                break
            if self._force and not forced:
                forced = True
                front.drain(0.0)
            if deadline is not None and time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(front.pid, signal.SIGKILL)
                deadline = None
            time.sleep(0.02)
        front.close()
        self.front = None

    def _stop_all(self) -> None:
        self._drain_front()
        for pid in list(self.workers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        # No worker will be started again: the workers' copies keep the socket listening until
        # each has stopped accepting (see the module docstring).
        for sock in self.sockets or ():
            sock.close()
        if self.workers:
            logger.info("Waiting for %d worker process(es) to finish.", len(self.workers))
        while self.workers:
            if self._force and not self._forced:
                self._forced = True
                for pid in list(self.workers):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGINT)
            for pid, _status in self._reap():
                worker = self.workers.pop(pid, None)
                if worker is not None and worker.health is not None:
                    worker.health.close()
                logger.info("Terminated worker process [%d]", pid)
            if self.workers:
                time.sleep(POLL_INTERVAL)
