"""``--log-level trace``: every ASGI message an app receives and sends, on ``ferroloop.asgi``.

uvicorn's trace output, with its wording, so that what users grep for in uvicorn's logs is there:

    TRACE:    127.0.0.1:51234 - ASGI [3] Started scope={'type': 'http', ...}
    TRACE:    127.0.0.1:51234 - ASGI [3] Receive {'type': 'http.request', 'body': '<12 bytes>', ...}
    TRACE:    127.0.0.1:51234 - ASGI [3] Send {'type': 'http.response.start', 'status': 200, ...}
    TRACE:    127.0.0.1:51234 - ASGI [3] Completed

Bodies, texts and header lists are replaced by a placeholder (``<N bytes>``, ``<...>``), so a log
never holds request or response content. The number counts the app calls of this process.

The app is wrapped only when the server's logger is at trace level when the app is loaded
(``Config.load``), so at any other level nothing is added to a request's path.

At the same level the server logs each connection, on ``ferroloop.error`` as uvicorn does on
``uvicorn.error``: the native server calls ``trace_connection`` when it accepts a connection and
when it closes one (``HttpServer(trace_connections=...)``, set only at trace level)::

    TRACE:    127.0.0.1:51234 - HTTP connection made
    TRACE:    127.0.0.1:51234 - HTTP connection lost
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

from .logging_config import TRACE_LOG_LEVEL

_PLACEHOLDERS = {
    "body": "<{} bytes>",
    "bytes": "<{} bytes>",
    "text": "<{} chars>",
}


def _loggable(message: Any) -> Any:
    """A shallow copy of ``message`` with contents replaced by placeholders."""
    shown = dict(message)
    for key, template in _PLACEHOLDERS.items():
        value = shown.get(key)
        if value is not None:
            shown[key] = template.format(len(value))
    if shown.get("headers") is not None:
        shown["headers"] = "<...>"
    return shown


class MessageLoggerMiddleware:
    """Wraps an ASGI 3 app; logs its scope, messages and outcome at trace level."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.logger = logging.getLogger("ferroloop.asgi")
        self._calls = itertools.count(1)

    def _trace(self, text: str, *args: Any) -> None:
        self.logger.log(TRACE_LOG_LEVEL, text, *args)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        number = next(self._calls)
        client = scope.get("client")
        prefix = f"{client[0]}:{client[1]} - ASGI" if client else "ASGI"

        async def logged_receive() -> Any:
            message = await receive()
            self._trace("%s [%d] Receive %s", prefix, number, _loggable(message))
            return message

        async def logged_send(message: Any) -> None:
            self._trace("%s [%d] Send %s", prefix, number, _loggable(message))
            await send(message)

        self._trace("%s [%d] Started scope=%s", prefix, number, _loggable(scope))
        try:
            await self.app(scope, logged_receive, logged_send)
        except BaseException:
            self._trace("%s [%d] Raised exception", prefix, number)
            raise
        self._trace("%s [%d] Completed", prefix, number)


def wanted() -> bool:
    """Whether the server's logger lets trace records through (``--log-level trace``)."""
    return logging.getLogger("ferroloop.error").isEnabledFor(TRACE_LOG_LEVEL)


def trace_connection(client: Any, made: bool) -> None:
    """Logs a connection accepted (``made``) or closed, with uvicorn's wording; ``client`` is the
    scope's ``(host, port)``, or None on a Unix socket."""
    prefix = f"{client[0]}:{client[1]} - " if client else ""
    logging.getLogger("ferroloop.error").log(
        TRACE_LOG_LEVEL, "%sHTTP connection %s", prefix, "made" if made else "lost"
    )
