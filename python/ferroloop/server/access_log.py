"""The two logging callbacks the native ``HttpServer`` calls.

``AccessLog`` runs once per completed response, on the loop thread, so it does as little as it
can: one ``Logger.info`` call with uvicorn's format string and arguments. Formatting happens only
if a handler takes the record, and ``access_log_callback`` returns ``None`` (the native side
then skips the call altogether) when access logging is off or ``ferroloop.access`` would drop
INFO records anyway.
"""

from __future__ import annotations

import logging

ACCESS_LOGGER = "ferroloop.access"
ERROR_LOGGER = "ferroloop.error"

# The same format string and argument order as uvicorn's access records, so that its
# AccessFormatter (and ours) can rebuild client_addr / request_line / status_code from the args.
ACCESS_FORMAT = '%s - "%s %s HTTP/%s" %d'


def format_client_addr(client: tuple[str, int] | None) -> str:
    """``"host:port"``, or ``""`` when the peer has no IP address (a Unix socket)."""
    if not client:
        return ""
    host, port = client[0], client[1]
    return f"{host}:{port}" if port is not None else str(host)


class AccessLog:
    """``access_log(client, method, path, http_version, status)`` → one INFO record.

    ``path`` already includes ``?query`` when the request had one; ``http_version`` is
    ``"1.1"`` or ``"1.0"`` (an ``"HTTP/"`` prefix is tolerated).
    """

    __slots__ = ("_logger",)

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._logger = logger if logger is not None else logging.getLogger(ACCESS_LOGGER)

    def __call__(
        self,
        client: tuple[str, int] | None,
        method: str,
        path: str,
        http_version: str,
        status: int,
    ) -> None:
        if http_version.startswith("HTTP/"):
            http_version = http_version[5:]
        self._logger.info(
            ACCESS_FORMAT, format_client_addr(client), method, path, http_version, status
        )


def access_log_callback(enabled: bool) -> AccessLog | None:
    """The callable to hand to the native server, or ``None`` if nothing would be logged."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not enabled or not logger.isEnabledFor(logging.INFO) or not logger.hasHandlers():
        return None
    return AccessLog(logger)


class ErrorLog:
    """``log_error(message, exc)``: logs ``message`` on ``ferroloop.error``, with the traceback
    of ``exc`` when one is given (an exception raised by the app, say)."""

    __slots__ = ("_logger",)

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._logger = logger if logger is not None else logging.getLogger(ERROR_LOGGER)

    def warning(self, message: str) -> None:
        """A client's fault, not the server's (a malformed request): logged at WARNING, as
        uvicorn logs "Invalid HTTP request received."."""
        self._logger.warning(message)

    def websocket(self, client: tuple[str, int] | None, path: str, outcome: str) -> None:
        """A WebSocket handshake's outcome (``[accepted]``, or the refusal's status), at INFO,
        in uvicorn's words: ``127.0.0.1:51234 - "WebSocket /chat" [accepted]``."""
        self._logger.info('%s - "WebSocket %s" %s', format_client_addr(client), path, outcome)

    def __call__(self, message: str, exc: BaseException | None = None) -> None:
        if exc is not None:
            self._logger.error(message, exc_info=exc)
        else:
            self._logger.error(message)
