"""``--metrics``: Prometheus text on a listener of its own, read from the board.

The board (``_native.FrontBoard``) is shared memory made before any worker is forked: each
worker counts its requests (by method and status class), their durations and its app tasks on
a seat of its own, and the dispatching front, when there is one, publishes each worker's load
there. The exporter only reads it, so a scrape sends no message to any worker and adds nothing
to a request's path. With ``--workers N`` it runs in a process the supervisor forks for it
(the supervisor stays single-threaded: it forks workers); with one worker, on a thread of the
server's process. It answers ``GET /metrics`` (``http.server``; any other path: 404).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from .config import Config

if TYPE_CHECKING:
    from .._native import FrontBoard

logger = logging.getLogger("ferroloop.error")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def new_board(capacity: int) -> FrontBoard:
    from .. import _native

    return _native.FrontBoard(capacity)


class _Handler(BaseHTTPRequestHandler):
    board: Any = None  # set on the subclass made per exporter

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404, "only /metrics is served here")
            return
        body = self.board.exposition().encode()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # scrapes are not access-logged


class MetricsExporter:
    """The metrics listener and its thread."""

    def __init__(self, config: Config, board: FrontBoard) -> None:
        handler = type("Handler", (_Handler,), {"board": board})
        try:
            address = (config.metrics_address, config.metrics_port)
            self._server = ThreadingHTTPServer(address, handler)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot serve metrics on {config.metrics_address}:{config.metrics_port}: "
                f"{exc.strerror} (choose another --metrics-port)",
            ) from None
        self._server.daemon_threads = True
        self.address = self._server.server_address
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="ferroloop-metrics", daemon=True
        )

    def start(self) -> None:
        """Serves on a thread of this process."""
        self._thread.start()
        self._log_started()

    def start_process(self, die_with_parent: Any = None, parent_only: Sequence[Any] = ()) -> int:
        """Serves in a forked process of its own (for a process that forks workers and must
        stay single-threaded); returns its pid. The listener closes here; ``parent_only``
        (the server's listening sockets) close in the child, so that a drain that closes them
        everywhere else refuses new connections."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        pid = os.fork()
        if pid:
            self._server.server_close()
            self._log_started(f" (process [{pid}])")
            return pid
        status = 1
        try:
            for sock in parent_only:
                sock.close()
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            if callable(die_with_parent):
                die_with_parent()
            self._server.serve_forever()
            status = 0
        except BaseException:
            logger.exception("The metrics process [%d] failed", os.getpid())
        finally:
            os._exit(status)

    def _log_started(self, where: str = "") -> None:
        host, port = self.address[:2]
        logger.info("Serving metrics on http://%s:%d/metrics%s", host, port, where)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._server.shutdown()
        self._server.server_close()
