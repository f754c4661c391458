"""The dispatching front of ``--workers N`` (``--dispatch front``, the default).

The supervisor forks the front first, in a process of its own that holds the listening sockets
and runs ``_native.run_front`` (Rust, one thread, the GIL released: ``crates/core/src/front``).
It accepts, reads each request head, and hands the connection to a free worker over that
worker's channel (a ``SOCK_SEQPACKET`` pair: one end in the worker, one given to the front over
the control socket). Requests whose body is over ``--lane-bulk-body`` (or chunked) go only to
the general workers; ``--lane-fast-workers`` more workers take only the others, so a small
request always finds a worker that is not parsing an upload.

The supervisor talks to the front over the control socket: ``worker PID LANE`` with the
channel's fd when a worker starts, and ``drain SECONDS`` at shutdown. The front never forks or
signals; it returns when drained, or when the control socket closes (the supervisor is gone).
The front publishes each worker's state on a board in shared memory that the supervisor made
before forking it (``FrontProcess.status()``), for metrics to read without asking.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import message_logger
from .config import Config

if TYPE_CHECKING:
    from .._native import FrontBoard

logger = logging.getLogger("ferroloop.error")

GENERAL = "general"
FAST = "fast"


def front_wanted(config: Config, sockets: Sequence[socket.socket] | None) -> bool:
    """Whether ``--workers`` runs behind the front: asked for, more than one worker, and
    sockets bound by the parent. With TLS the front places each connection on a worker when it
    is accepted, and the worker keeps it: TLS terminates in the workers, so the front cannot
    read the requests."""
    return (
        config.dispatch == "front"
        and config.workers > 1
        and sockets is not None
        and len(sockets) > 0
    )


def channel_pair() -> tuple[socket.socket, socket.socket]:
    """``(front's end, worker's end)`` of a new worker's channel."""
    front_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker_end.setblocking(False)
    return front_end, worker_end


@dataclass
class WorkerChannel:
    """What a worker behind the front gets instead of listening sockets."""

    sock: socket.socket
    # The scope's "server": the first listener's address.
    server: object
    # GENERAL, or FAST: bulk work that reaches this worker on a kept connection goes back.
    lane: str = GENERAL


def server_address(sockets: Sequence[socket.socket]) -> object:
    """The scope's ``server`` for requests from the front: the first listener's address."""
    name = sockets[0].getsockname()
    if isinstance(name, tuple):
        return name[:2]
    return name or None


@dataclass
class FrontProcess:
    pid: int
    control: socket.socket
    board: FrontBoard | None = None

    def status(self) -> dict[str, Any] | None:
        """What the front last published: its counts, its queue (``pending_small``,
        ``pending_bulk``) and ``workers``, one dict per worker: ``pid``, ``lane``,
        ``in_flight`` (connections handed to it and not back: a request being served or a
        keep-alive connection it kept), ``bulk_in_flight``, ``oldest_since`` (when the oldest
        of those was handed, ``time.monotonic()`` seconds, or ``None``), ``handed_total``,
        ``bulk_running``, ``leaving``. ``updated`` says when it was written (the front writes
        after every batch of events and at least every 50 ms). ``None`` without a board."""
        return None if self.board is None else self.board.snapshot()

    def add_worker(self, pid: int, lane: str, front_end: socket.socket) -> None:
        """Gives the front a new worker's channel (``OSError`` if the front is gone)."""
        socket.send_fds(self.control, [f"worker {pid} {lane}".encode()], [front_end.fileno()])

    def drain(self, seconds: float | None) -> None:
        """Stop accepting; serve what was read; return within ``seconds`` (``None``: no limit)."""
        limit = "inf" if seconds is None else f"{seconds:.3f}"
        with contextlib.suppress(OSError):
            self.control.send(f"drain {limit}".encode())

    def close(self) -> None:
        self.control.close()


def _front_log(message: str) -> None:
    logger.warning("Front [%d]: %s", os.getpid(), message)


def board_capacity(config: Config) -> int:
    """Slots for every worker at once, twice over: during a restart the old workers drain
    while their replacements start."""
    return 2 * (config.workers + config.lane_fast_workers) + 2


def start_front(
    config: Config,
    sockets: Sequence[socket.socket],
    die_with_parent: object,
    board: FrontBoard | None = None,
) -> FrontProcess:
    """Forks the front process; it takes the listening sockets (the caller closes its own).
    It publishes on ``board`` (made here if not given)."""
    from .. import _native

    if board is None:
        board = _native.FrontBoard(board_capacity(config))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    pid = os.fork()
    if pid:
        theirs.close()
        logger.info("Started front process [%d]", pid)
        return FrontProcess(pid, ours, board)
    status = 1
    try:
        ours.close()
        # It follows the control socket only: Ctrl-C to the process group and the
        # supervisor's SIGTERM to its children must not stop it before it has drained.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        if callable(die_with_parent):
            die_with_parent()
        listeners = [sock.detach() for sock in sockets]
        accepted, dispatched, returned, lost = _native.run_front(
            listeners,
            theirs.detach(),
            log=_front_log,
            board=board,
            trace_connections=message_logger.trace_connection if message_logger.wanted() else None,
            bulk_body=config.lane_bulk_body,
            timeout_keep_alive=float(config.timeout_keep_alive),
            timeout_header=float(config.timeout_header),
            limit_header_size=config.limit_header_size,
            limit_headers=config.limit_headers,
            limit_uri=config.limit_uri,
            server_header=config.server_header,
            date_header=config.date_header,
            headers=config.encoded_headers,
            place_at_accept=config.is_ssl,
        )
        logger.info(
            "Front process [%d] finished: %d connection(s) accepted, %d handed to workers, "
            "%d given back, %d lost with a worker.",
            os.getpid(),
            accepted,
            dispatched,
            returned,
            lost,
        )
        status = 0
    except BaseException:
        logger.exception("Front process [%d] failed", os.getpid())
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)
