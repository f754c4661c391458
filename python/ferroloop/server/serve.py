"""``serve(app, **options)`` and ``run_config(config)``: one process, workers, or the reloader.

This is what the CLI and ``ferroloop.serve`` share (uvicorn's ``uvicorn.run``). Workers and
reload need the app as an import string (``"module:attr"``), because the processes that serve
import it themselves.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
from typing import Any

from .config import STARTUP_FAILURE, Config
from .metrics import MetricsExporter, new_board
from .reload import Reloader
from .server import Server
from .sockets import bind_sockets, log_listeners, remove_unix_socket
from .supervisor import Supervisor

logger = logging.getLogger("ferroloop.error")


def run_config(config: Config) -> int:
    """Serves until stopped; returns the process exit status (0, or 3 if start-up failed).

    A ``SystemExit`` from loading or starting the app in this process propagates.
    """
    if config.use_subprocess and not isinstance(config.app, str):
        logger.warning(
            "You must pass the application as an import string to enable 'reload' or 'workers'."
        )
        return STARTUP_FAILURE

    if config.use_subprocess and config.is_ssl:
        # Unusable TLS files stop the parent once, with the reason, before any worker starts;
        # each worker reads them again (so a reload picks up renewed certificates).
        config.load_tls()
        config.tls_material = None
    if config.should_reload:
        if config.metrics:
            logger.warning("--metrics is not served with --reload (a development mode).")
        sockets = bind_sockets(config)
        return _run_parent(config, sockets, lambda: Reloader(config, sockets).run())
    if config.workers > 1:
        own_sockets = config.reuse_port and config.uds is None and config.fd is None
        if own_sockets:
            # Each worker binds its own SO_REUSEPORT socket and logs its own "running on" line.
            return Supervisor(config, None).run()
        sockets = bind_sockets(config)
        return _run_parent(config, sockets, lambda: Supervisor(config, sockets).run())

    server = Server(config)
    exporter = None
    if config.metrics:
        board = new_board(1)
        try:
            exporter = MetricsExporter(config, board)
        except OSError as exc:
            logger.error("%s", exc.strerror)
            return 1
        server.seat = (board, 0)
        exporter.start()
    try:
        # A Ctrl-C that arrives before serve() has taken over SIGINT (while the app is imported).
        with contextlib.suppress(KeyboardInterrupt):
            server.run()
    finally:
        if exporter is not None:
            exporter.stop()
    return 0 if server.started else STARTUP_FAILURE


def _run_parent(config: Config, sockets: list[socket.socket], body: Any) -> int:
    log_listeners(config, sockets)
    try:
        return int(body())
    finally:
        for sock in sockets:
            sock.close()
        remove_unix_socket(config)


def serve(app: Any, **options: Any) -> None:
    """Serves ``app`` (an ASGI app, or an import string ``"module:attr"``) with the ``Config``
    options; returns when the server stops, ``sys.exit(3)`` if it could not start.

    The ferroloop equivalent of ``uvicorn.run(app, ...)``.
    """
    app_dir = options.get("app_dir")
    if app_dir is not None and app_dir not in sys.path:
        sys.path.insert(0, app_dir)
    status = run_config(Config(app, **options))
    if status:
        sys.exit(status)
