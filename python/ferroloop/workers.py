"""A gunicorn worker class: ``gunicorn -k ferroloop.workers.FerroloopWorker module:app``.

gunicorn's master binds the listening sockets, forks the workers, restarts them and watches
their heartbeats; each worker here runs the ferroloop server (``ferroloop.server.Server``) on a
ferroloop loop over the sockets it inherited. What gunicorn's settings mean for it:

- ``--keep-alive`` is ``timeout_keep_alive``; ``--graceful-timeout`` is
  ``timeout_graceful_shutdown``; ``--max-requests`` (with gunicorn's jitter already applied) is
  ``limit_max_requests``; ``--forwarded-allow-ips`` is ``forwarded_allow_ips``.
- The heartbeat: the server awaits ``callback_notify`` every half ``--timeout`` (gunicorn kills a
  worker silent for a whole ``--timeout``), which touches the worker's heartbeat file; a worker
  whose master is gone (its parent changed) stops.
- Signals: SIGTERM stops gracefully (in-flight requests finish), SIGQUIT and SIGINT quickly (as
  gunicorn's quick shutdown), SIGUSR1 reopens the log files.
- Logs: ``ferroloop.error`` and ``ferroloop.access`` go to gunicorn's error and access logs.
- gunicorn's TLS settings are refused: the ferroloop server has no TLS yet (docs/server.md).

Importing this module needs gunicorn; nothing else in ferroloop imports it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import Any

from gunicorn.arbiter import Arbiter
from gunicorn.workers.base import Worker

from ._runner import run as run_on_ferroloop
from .server.config import SSL_PROTOCOL_VERSION, Config
from .server.server import Server

__all__ = ["FerroloopWorker"]


def _route_logger(name: str, source: logging.Logger) -> None:
    """``name`` writes through gunicorn's ``source`` logger's handlers, at its level."""
    logger = logging.getLogger(name)
    logger.handlers = source.handlers
    logger.setLevel(source.level)
    logger.propagate = False


class FerroloopWorker(Worker):
    """Runs the ferroloop server in a gunicorn worker process."""

    # Extra ``Config`` keyword arguments; a subclass may add its own.
    CONFIG_KWARGS: dict[str, Any] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _route_logger("ferroloop.error", self.log.error_log)
        _route_logger("ferroloop.access", self.log.access_log)
        max_requests = self.max_requests if self.max_requests < sys.maxsize else None
        options: dict[str, Any] = {
            "app": None,  # the app gunicorn loads, set in run()
            "log_config": None,  # gunicorn configured logging
            "timeout_keep_alive": self.cfg.keepalive,
            "timeout_graceful_shutdown": self.cfg.graceful_timeout,
            "limit_max_requests": max_requests,
            "forwarded_allow_ips": self.cfg.forwarded_allow_ips,
            "timeout_notify": max(self.timeout / 2, 0.5),
            "callback_notify": self.callback_notify,
        }
        if self.cfg.is_ssl:
            # gunicorn's TLS settings, as uvicorn's worker maps them.
            ssl_options = self.cfg.ssl_options
            options.update(
                ssl_keyfile=ssl_options.get("keyfile"),
                ssl_certfile=ssl_options.get("certfile"),
                ssl_version=int(ssl_options.get("ssl_version") or SSL_PROTOCOL_VERSION),
                ssl_cert_reqs=int(ssl_options.get("cert_reqs") or 0),
                ssl_ca_certs=ssl_options.get("ca_certs"),
                ssl_ciphers=ssl_options.get("ciphers") or "TLSv1",
            )
        options.update(self.CONFIG_KWARGS)
        # A setting the server cannot honour (say an OpenSSL cipher list) is a boot error,
        # reported by run() so that gunicorn's master sees the worker's boot-error status.
        self.config_error: ValueError | None = None
        try:
            self.config = Config(**options)
        except ValueError as exc:
            self.config_error = exc
        self.server: Server | None = None

    def init_signals(self) -> None:
        # The server handles SIGINT/SIGTERM on its loop while it runs; gunicorn's own handlers
        # (which would only set `self.alive`) are not installed, and every signal gunicorn
        # names is back to its default until then.
        for sig in self.SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGUSR1, self.handle_usr1)
        signal.siginterrupt(signal.SIGUSR1, False)

    def run(self) -> None:
        if self.config_error is not None:
            self.log.error("ferroloop cannot run with these settings: %s", self.config_error)
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
        self.config.app = self.wsgi
        self.server = Server(self.config)
        run_on_ferroloop(self._serve(self.server))
        if not self.server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)

    async def _serve(self, server: Server) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGQUIT, self._quick_exit, server)
        try:
            await server.serve(sockets=[s.sock for s in self.sockets])
        finally:
            loop.remove_signal_handler(signal.SIGQUIT)

    @staticmethod
    def _quick_exit(server: Server) -> None:
        server.should_exit = True
        server.force_exit = True

    async def callback_notify(self) -> None:
        """The heartbeat gunicorn's master watches; stops the server if the master is gone."""
        self.notify()
        if os.getppid() != self.ppid and self.server is not None:
            self.log.info("Parent changed, shutting down: %s", self)
            self.server.should_exit = True
