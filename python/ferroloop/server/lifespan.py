"""The ASGI lifespan protocol (``--lifespan auto|on|off``).

The app runs as one task for the whole life of the server: ``startup()`` hands it
``lifespan.startup`` and waits for ``lifespan.startup.complete`` / ``.failed``; ``shutdown()``
hands it ``lifespan.shutdown`` and waits for ``lifespan.shutdown.complete`` / ``.failed``.
``state`` is the dict in the lifespan scope; the server gives it to the native ``HttpServer``,
which copies it (shallowly) into every request scope.

Modes:

- ``off``: the app never sees a lifespan scope.
- ``auto`` (default): an app that raises before it has called ``receive()`` does not speak the
  protocol (``assert scope["type"] == "http"``, say). That is logged at INFO ("ASGI 'lifespan'
  protocol appears unsupported.") and the server starts. An app that raises *after* receiving
  ``lifespan.startup`` has a broken start-up; it is logged at ERROR with the traceback and, as
  under uvicorn, the server still starts.
- ``on``: any exception aborts start-up ("Application startup failed. Exiting.").

``lifespan.startup.failed`` aborts start-up in every mode; ``lifespan.shutdown.failed`` is
logged. A message that breaks the protocol's order raises ``RuntimeError`` in the app's
``send()``. If the app returns without ever answering, start-up ends as in the "raised" case.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

logger = logging.getLogger("ferroloop.error")

LifespanMode = Literal["auto", "on", "off"]


class Lifespan:
    """Runs the lifespan protocol of ``app``; one instance per server run."""

    def __init__(self, app: Any, mode: LifespanMode = "auto", asgi_version: str = "3.0") -> None:
        if mode not in ("auto", "on", "off"):
            raise ValueError(f"lifespan must be 'auto', 'on' or 'off', not {mode!r}")
        self.app = app
        self.mode: LifespanMode = mode
        self.asgi_version = asgi_version
        self.state: dict[str, Any] = {}
        self.should_exit = False
        self.error_occurred = False
        self.startup_failed = False
        self.shutdown_failed = False
        self._received_first = False
        self._task: asyncio.Task[None] | None = None
        self._queue: asyncio.Queue[dict[str, Any]] | None = None
        self._startup_done: asyncio.Event | None = None
        self._shutdown_done: asyncio.Event | None = None

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    async def startup(self) -> None:
        if not self.enabled:
            return
        logger.info("Waiting for application startup.")
        self._queue = asyncio.Queue()
        self._startup_done = asyncio.Event()
        self._shutdown_done = asyncio.Event()
        # The task is kept on self: a task nobody references can be collected mid-run.
        self._task = asyncio.get_running_loop().create_task(self._main())
        self._queue.put_nowait({"type": "lifespan.startup"})
        await self._startup_done.wait()
        if self.startup_failed or (self.error_occurred and self.mode == "on"):
            logger.error("Application startup failed. Exiting.")
            self.should_exit = True
        else:
            logger.info("Application startup complete.")

    async def shutdown(self) -> None:
        if not self.enabled or self.error_occurred or self._queue is None:
            return
        assert self._shutdown_done is not None
        logger.info("Waiting for application shutdown.")
        self._queue.put_nowait({"type": "lifespan.shutdown"})
        await self._shutdown_done.wait()
        if self.shutdown_failed or (self.error_occurred and self.mode == "on"):
            logger.error("Application shutdown failed. Exiting.")
            self.should_exit = True
        else:
            logger.info("Application shutdown complete.")

    async def _main(self) -> None:
        assert self._startup_done is not None and self._shutdown_done is not None
        scope = {
            "type": "lifespan",
            "asgi": {"version": self.asgi_version, "spec_version": "2.0"},
            "state": self.state,
        }
        try:
            await self.app(scope, self.receive, self.send)
        except asyncio.CancelledError:
            self.error_occurred = True  # the loop is going away (forced exit); nothing to report
            raise
        except BaseException as exc:
            self.error_occurred = True
            if self.startup_failed or self.shutdown_failed:
                pass  # already reported through the failed message
            elif self.mode == "auto" and not self._received_first:
                logger.info("ASGI 'lifespan' protocol appears unsupported.")
            else:
                logger.error("Exception in 'lifespan' protocol\n", exc_info=exc)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt and SystemExit go on
        else:
            if not self._startup_done.is_set():
                # Returned without answering lifespan.startup: treat as unsupported / failed.
                self.error_occurred = True
                if self.mode == "auto" and not self._received_first:
                    logger.info("ASGI 'lifespan' protocol appears unsupported.")
                else:
                    logger.error("The app returned from 'lifespan' before startup completed.")
        finally:
            self._startup_done.set()
            self._shutdown_done.set()

    async def receive(self) -> dict[str, Any]:
        assert self._queue is not None
        message = await self._queue.get()
        self._received_first = True
        return message

    async def send(self, message: dict[str, Any]) -> None:
        assert self._startup_done is not None and self._shutdown_done is not None
        kind = message.get("type")
        started, stopped = self._startup_done.is_set(), self._shutdown_done.is_set()
        if kind in ("lifespan.startup.complete", "lifespan.startup.failed"):
            if started or stopped:
                raise RuntimeError(f"lifespan: {kind!r} sent after startup had already ended")
            self._startup_done.set()
            if kind == "lifespan.startup.failed":
                self.startup_failed = True
                if message.get("message"):
                    logger.error(message["message"])
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            if not started or stopped:
                raise RuntimeError(f"lifespan: {kind!r} sent before startup or twice")
            self._shutdown_done.set()
            if kind == "lifespan.shutdown.failed":
                self.shutdown_failed = True
                if message.get("message"):
                    logger.error(message["message"])
        else:
            raise RuntimeError(
                f"lifespan: unexpected message type {kind!r}; expected "
                "lifespan.startup.complete/failed or lifespan.shutdown.complete/failed"
            )
