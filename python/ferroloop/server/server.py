"""``Server``: one process serving the app on a ferroloop loop.

Life of ``serve()``, in order (each step logged on ``ferroloop.error`` as uvicorn logs it):

1. ``config.load()`` (import, factory, wrapping); check that the running loop is ferroloop's.
2. Bind the listening sockets, unless ``sockets`` were given (workers get them from the
   supervisor). Binding first means a port conflict fails before the app's start-up runs.
3. Lifespan start-up; a failure exits with status 3.
4. One native ``HttpServer`` per listening socket; ``started`` becomes true.
5. Tick every 0.1 s until ``should_exit`` (SIGINT/SIGTERM, which also wake the tick at once,
   or set by the embedding program) or until ``limit_max_requests`` responses have been sent.
6. Graceful shutdown: stop accepting (``HttpServer.close``, which first accepts the connections
   the kernel has already completed), close the listening sockets (and unlink the Unix socket)
   so that new connections are refused, ``HttpServer.shutdown`` (the drain, see
   ``crates/py/src/server/drain.rs``: every response says ``Connection: close`` and ends its
   connection; an idle one is closed once quiet for 0.5 s, a request arriving first is
   served), wait until no connection and no app task (background work after a response) is
   left, at most ``timeout_graceful_shutdown`` seconds (``None``: no limit) and only until
   ``force_exit`` (a second SIGINT); then ``HttpServer.abort`` for whatever is left (logged);
   then lifespan shutdown (skipped on a forced exit).

The native ``HttpServer`` is created and started only in ``_start_http_servers``; tests put a
fake in ``http_server_class``. Its surface used here: ``start``, ``close``, ``shutdown``,
``abort`` and the ``connections``, ``requests`` and ``tasks`` counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from .access_log import ErrorLog, access_log_callback
from .config import STARTUP_FAILURE, Config, jittered_request_limit
from .front import WorkerChannel
from .lifespan import Lifespan
from .sockets import bind_sockets, log_listeners, remove_unix_socket

logger = logging.getLogger("ferroloop.error")

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
TICK = 0.1
LOOP_STATS_PERIOD = 1.0  # seconds between copies of the loop's counters to the seat (--metrics)
WSGI_THREAD_JOIN = 1.0  # seconds to wait for each WSGI thread once the pool is closed


def native_http_server_class() -> type:
    """``ferroloop._native.HttpServer``, or a clear error if this build has none."""
    from .. import _native

    cls = getattr(_native, "HttpServer", None)
    if cls is None:
        raise RuntimeError(
            "this build of ferroloop has no native HTTP server (ferroloop._native.HttpServer); "
            "rebuild the extension with `make build`"
        )
    return cls  # type: ignore[no-any-return]


def require_ferroloop_loop(loop: asyncio.AbstractEventLoop) -> None:
    from .._loop import Loop

    if not isinstance(loop, Loop):
        raise RuntimeError(
            f"ferroloop's server runs on a ferroloop loop, not on {type(loop).__module__}."
            f"{type(loop).__qualname__}: its HTTP path is native to that loop. Use "
            "Server.run(), ferroloop.run(server.serve()) or "
            "asyncio.run(..., loop_factory=ferroloop.new_event_loop)"
        )


class Server:
    """Serves ``config.app``; ``run()`` blocks, ``serve()`` is the coroutine."""

    http_server_class: type | None = None  # None: the native HttpServer

    def __init__(self, config: Config) -> None:
        self.config = config
        # (board, seat): where this process counts its requests (``--metrics``, the front).
        self.seat: tuple[Any, int] | None = None
        self.started = False
        self.should_exit = False
        self.force_exit = False
        self.servers: list[Any] = []
        self.lifespan: Lifespan | None = None
        self.limit_max_requests = jittered_request_limit(
            config.limit_max_requests, config.max_requests_jitter
        )
        self._owns_sockets = False
        self._wakeup: asyncio.Event | None = None  # set by a signal: the tick ends at once
        self.wsgi_pool: Any = None
        self._wsgi_threads: list[threading.Thread] = []

    # -- running -------------------------------------------------------------------------------

    def run(
        self, sockets: list[socket.socket] | None = None, channel: WorkerChannel | None = None
    ) -> None:
        """Runs ``serve()`` on a new ferroloop loop (``ferroloop.run``)."""
        from .._runner import run as run_on_ferroloop

        if not self.config.loaded:
            self.config.load()  # fail before a loop exists
        run_on_ferroloop(self.serve(sockets=sockets, channel=channel))

    async def serve(
        self, sockets: list[socket.socket] | None = None, channel: WorkerChannel | None = None
    ) -> None:
        """``channel``: a worker behind the front serves what it hands over (``front.py``)."""
        loop = asyncio.get_running_loop()
        require_ferroloop_loop(loop)
        with self.capture_signals(loop):
            await self._serve(loop, sockets, channel)

    async def _serve(
        self,
        loop: asyncio.AbstractEventLoop,
        sockets: list[socket.socket] | None,
        channel: WorkerChannel | None = None,
    ) -> None:
        config = self.config
        http_server_class = self.http_server_class or native_http_server_class()
        if not config.loaded:
            config.load()
        pid = os.getpid()
        logger.info("Started server process [%d]", pid)

        self._owns_sockets = sockets is None and channel is None
        if channel is not None:
            listeners: list[socket.socket] = []
        else:
            listeners = bind_sockets(config) if sockets is None else list(sockets)
        for sock in listeners:
            # The native accept runs on the loop's thread: a caller's blocking listener would
            # block the whole loop in accept() (asyncio's create_server(sock=...) does the same).
            sock.setblocking(False)

        # A WSGI app has no lifespan protocol.
        lifespan_mode = "off" if config.interface == "wsgi" else config.lifespan
        self.lifespan = Lifespan(config.loaded_app, lifespan_mode, config.asgi_version)
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            self._close_listeners(listeners)
            sys.exit(STARTUP_FAILURE)

        try:
            self._start_http_servers(loop, http_server_class, listeners, channel)
        except BaseException:
            for srv in self.servers:
                srv.abort()
            self._stop_wsgi_pool()
            self._close_listeners(listeners)
            raise
        if self._owns_sockets:
            log_listeners(config, listeners)
        self.started = True

        try:
            if not self.should_exit:
                await self.main_loop()
        except BaseException:
            # Cancelled by an embedding program (or worse): no graceful phase, but no leaks.
            for srv in self.servers:
                srv.close()
                srv.abort()
            self._stop_wsgi_pool()
            self._close_listeners(listeners)
            raise
        await self.shutdown(listeners)
        logger.info("Finished server process [%d]", pid)

    def _start_http_servers(
        self,
        loop: asyncio.AbstractEventLoop,
        cls: type,
        listeners: Sequence[socket.socket],
        channel: WorkerChannel | None = None,
    ) -> None:
        assert self.lifespan is not None
        options = self.config.http_server_options()
        access_log = access_log_callback(self.config.access_log)
        log_error = ErrorLog()
        app = self.config.loaded_app
        if self.config.interface == "wsgi":
            app = self._start_wsgi_pool()
        if channel is not None:
            options.update(
                handoff=True,
                server=channel.server,
                lane=channel.lane,
                bulk_body=self.config.lane_bulk_body,
            )
        if self.seat is not None:
            # This process's seat on the board (metrics.py): it counts its requests there.
            board, seat = self.seat
            board.seat_open(seat, os.getpid())
            options.update(board=board, seat=seat)
            if self.config.metrics:
                # ferroloop_loop_*: this loop's counters, copied to the seat once a second.
                loop.enable_metrics()  # type: ignore[attr-defined]
                self._publish_loop_stats(loop, board, seat)
        for sock in [channel.sock] if channel is not None else listeners:
            srv = cls(
                loop,
                sock,
                app,
                state=self.lifespan.state,
                access_log=access_log,
                log_error=log_error,
                plain_app=self.config.plain_app,
                **options,
            )
            self.servers.append(srv)
            srv.start()  # accepting begins here, once the server is registered for cleanup

    def _start_wsgi_pool(self) -> Any:
        """The native pool a WSGI app runs in, and its ``wsgi_threads`` threads."""
        from .. import _native

        config = self.config
        pool = _native.WsgiPool(
            config.loaded_app, multiprocess=config.workers > 1, proxy=config.wsgi_proxy
        )
        self.wsgi_pool = pool
        for i in range(config.wsgi_threads):
            # Daemon threads: an app blocked for good cannot keep the process alive after the
            # graceful-shutdown timeout.
            thread = threading.Thread(target=pool.work, name=f"ferroloop-wsgi-{i}", daemon=True)
            thread.start()
            self._wsgi_threads.append(thread)
        return pool

    def _stop_wsgi_pool(self) -> None:
        if self.wsgi_pool is None:
            return
        self.wsgi_pool.close()
        for thread in self._wsgi_threads:
            thread.join(WSGI_THREAD_JOIN)
            if thread.is_alive():
                logger.warning("WSGI thread %s is still running the app; leaving it", thread.name)
        self._wsgi_threads.clear()

    @property
    def total_requests(self) -> int:
        return sum(srv.requests for srv in self.servers)

    @property
    def total_connections(self) -> int:
        return sum(srv.connections for srv in self.servers)

    @property
    def total_tasks(self) -> int:
        """App tasks still running; one may outlive its response (background work)."""
        return sum(srv.tasks for srv in self.servers)

    async def main_loop(self) -> None:
        loop = asyncio.get_running_loop()
        last_notified: float | None = None
        self._wakeup = asyncio.Event()
        while True:
            # uvicorn's heartbeat for process managers (gunicorn's worker): `callback_notify`
            # at start-up and then every `timeout_notify` seconds while the server runs.
            notify = self.config.callback_notify
            if notify is not None and not self.should_exit:
                now = loop.time()
                if last_notified is None or now - last_notified > self.config.timeout_notify:
                    last_notified = now
                    await notify()
            if self.on_tick():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), TICK)

    def on_tick(self) -> bool:
        """True when the server should stop."""
        if self.should_exit:
            return True
        limit = self.limit_max_requests
        if limit is not None and self.total_requests >= limit:
            logger.info("Maximum request limit of %d exceeded. Terminating process.", limit)
            return True
        return False

    # -- stopping ------------------------------------------------------------------------------

    async def shutdown(self, sockets: Sequence[socket.socket] = ()) -> None:
        logger.info("Shutting down")
        # Accept what the kernel has already completed, stop accepting, then close the
        # listeners: from here new connections are refused (in this process; a worker's
        # supervisor closes its own copy, see supervisor.py).
        for srv in self.servers:
            srv.close()
        self._close_listeners(sockets)
        # The drain: a connection idle when it starts, or accepted just now, is closed only
        # once quiet for 0.5 s, so a request already on its way is served (with `Connection:
        # close`) rather than met by a close the client cannot tell from a lost request.
        for srv in self.servers:
            srv.shutdown()

        timeout = self.config.timeout_graceful_shutdown
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        for what, remaining, message in (
            ("connection(s)", lambda: self.total_connections, "connections to close"),
            ("app task(s)", lambda: self.total_tasks, "background tasks to complete"),
        ):
            if remaining() and not self.force_exit:
                logger.info("Waiting for %s. (CTRL+C to force quit)", message)
            while remaining() and not self.force_exit:
                if deadline is not None and loop.time() >= deadline:
                    logger.error(
                        "Closing %d %s: graceful shutdown exceeded timeout_graceful_shutdown (%ss)",
                        remaining(),
                        what,
                        timeout,
                    )
                    break
                await asyncio.sleep(TICK)
        for srv in self.servers:
            srv.abort()
        await asyncio.sleep(0)  # let the cancelled app tasks of aborted connections unwind
        self._stop_wsgi_pool()

        if not self.force_exit and self.lifespan is not None:
            await self.lifespan.shutdown()

    def _close_listeners(self, sockets: Sequence[socket.socket]) -> None:
        for sock in sockets:
            sock.close()
        if self._owns_sockets:
            remove_unix_socket(self.config)

    def _publish_loop_stats(self, loop: Any, board: Any, seat: int) -> None:
        board.seat_loop(seat, loop)
        if not self.should_exit:
            loop.call_later(LOOP_STATS_PERIOD, self._publish_loop_stats, loop, board, seat)

    # -- signals -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def capture_signals(self, loop: asyncio.AbstractEventLoop) -> Iterator[None]:
        """SIGINT/SIGTERM start a graceful shutdown while ``serve()`` runs (main thread only).

        Afterwards the previous handlers are back. Unlike uvicorn, the signal is not raised
        again: ``serve()`` returns normally and the command line exits with status 0 after a
        graceful SIGTERM or Ctrl-C (a supervisor or systemd sees a clean exit).
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.getsignal(sig) for sig in HANDLED_SIGNALS}
        for sig in HANDLED_SIGNALS:
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                if handler is not None:
                    signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: object = None) -> None:
        """First signal: graceful shutdown. A second SIGINT: ``force_exit`` (a SIGTERM after a
        SIGINT does not force: a worker gets both when Ctrl-C reaches the process group and
        the supervisor passes SIGTERM on)."""
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True
        if self._wakeup is not None:
            self._wakeup.set()
