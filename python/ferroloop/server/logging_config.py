"""The server's loggers and formatters, named as uvicorn's with ``ferroloop`` for ``uvicorn``.

Loggers:

- ``ferroloop.error``: the server's own messages (start-up, shutdown, errors, tracebacks of the
  app). It has no handler of its own and propagates to ``ferroloop``.
- ``ferroloop.access``: one line per completed response (see ``access_log.py``).
- ``ferroloop``: the parent with the default handler (stderr).

``LOGGING_CONFIG`` is the default ``log_config`` (a ``logging.config.dictConfig`` dict); a user
passes their own dict, or a ``.json``/``.yaml``/``.ini`` file, or ``None`` to leave logging alone.
The formatters understand uvicorn's format fields: ``%(levelprefix)s`` in both, and
``%(client_addr)s``, ``%(request_line)s``, ``%(status_code)s`` in the access formatter, so a
uvicorn log config works after renaming its loggers.
"""

from __future__ import annotations

import copy
import http
import json
import logging
import logging.config
import os
import sys
from typing import Any, Literal

TRACE_LOG_LEVEL = 5

LOG_LEVELS: dict[str, int] = {
    "critical": logging.CRITICAL,
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "trace": TRACE_LOG_LEVEL,
}

LOGGING_CONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "default": {
            "()": "ferroloop.server.logging_config.DefaultFormatter",
            "fmt": "%(levelprefix)s %(message)s",
            "use_colors": None,
        },
        "access": {
            "()": "ferroloop.server.logging_config.AccessFormatter",
            "fmt": '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s',
        },
    },
    "handlers": {
        "default": {
            "formatter": "default",
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
        },
        "access": {
            "formatter": "access",
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stdout",
        },
    },
    "loggers": {
        "ferroloop": {"handlers": ["default"], "level": "INFO", "propagate": False},
        "ferroloop.error": {"level": "INFO"},
        "ferroloop.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
    },
}

# SGR codes: the level names and status classes get the same colours as under uvicorn.
_LEVEL_COLOURS = {
    TRACE_LOG_LEVEL: "34",  # blue
    logging.DEBUG: "36",  # cyan
    logging.INFO: "32",  # green
    logging.WARNING: "33",  # yellow
    logging.ERROR: "31",  # red
    logging.CRITICAL: "91",  # bright red
}
_STATUS_COLOURS = {1: "97", 2: "32", 3: "33", 4: "31", 5: "91"}


def _sgr(text: str, code: str) -> str:
    return f"\x1b[{code}m{text}\x1b[0m"


class DefaultFormatter(logging.Formatter):
    """Adds ``%(levelprefix)s`` ("INFO:     "), coloured when ``use_colors`` (default: a tty).

    A record with ``extra={"color_message": ...}`` uses that message when colours are on.
    """

    def __init__(
        self,
        fmt: str | None = None,
        datefmt: str | None = None,
        style: Literal["%", "{", "$"] = "%",
        use_colors: bool | None = None,
    ) -> None:
        self.use_colors = use_colors if use_colors in (True, False) else self._stream_is_tty()
        super().__init__(fmt=fmt, datefmt=datefmt, style=style)

    def _stream_is_tty(self) -> bool:
        return sys.stderr.isatty()

    def formatMessage(self, record: logging.LogRecord) -> str:
        record = copy.copy(record)
        levelname = record.levelname
        padding = " " * max(0, 8 - len(levelname))
        if self.use_colors:
            levelname = _sgr(levelname, _LEVEL_COLOURS.get(record.levelno, "0"))
            color_message = record.__dict__.get("color_message")
            if color_message is not None:
                record.msg = color_message
                record.message = record.getMessage()
        record.levelprefix = f"{levelname}:{padding}"
        return super().formatMessage(record)


class AccessFormatter(DefaultFormatter):
    """Formats the records of ``ferroloop.access``.

    A record's args are ``(client_addr, method, path, http_version, status_code)``, as uvicorn
    logs them; this formatter adds ``client_addr``, ``request_line`` ("GET /path HTTP/1.1") and
    ``status_code`` ("200 OK") as record fields.
    """

    def _stream_is_tty(self) -> bool:
        return sys.stdout.isatty()

    def formatMessage(self, record: logging.LogRecord) -> str:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5:
            client_addr, method, path, http_version, status = args
            record = copy.copy(record)
            record.client_addr = client_addr
            request_line = f"{method} {path} HTTP/{http_version}"
            record.request_line = _sgr(request_line, "1") if self.use_colors else request_line
            record.status_code = self._status(int(status))  # type: ignore[call-overload]
        return super().formatMessage(record)

    def _status(self, status: int) -> str:
        try:
            phrase = http.HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        text = f"{status} {phrase}"
        if self.use_colors:
            return _sgr(text, _STATUS_COLOURS.get(status // 100, "0"))
        return text


def configure_logging(
    log_config: dict[str, Any] | str | os.PathLike[str] | None,
    log_level: str | int | None,
    access_log: bool,
    use_colors: bool | None,
) -> None:
    """Applies the logging options (uvicorn's ``Config.configure_logging``, same order)."""
    logging.addLevelName(TRACE_LOG_LEVEL, "TRACE")
    if log_config is not None:
        if isinstance(log_config, os.PathLike):
            log_config = os.fspath(log_config)
        if isinstance(log_config, dict):
            log_config = copy.deepcopy(log_config)
            if use_colors in (True, False):
                for name in ("default", "access"):
                    formatter = log_config.get("formatters", {}).get(name)
                    if formatter is not None:
                        formatter["use_colors"] = use_colors
            logging.config.dictConfig(log_config)
        elif log_config.endswith(".json"):
            with open(log_config) as file:
                logging.config.dictConfig(json.load(file))
        elif log_config.endswith((".yaml", ".yml")):
            try:
                import yaml  # type: ignore[import-untyped]
            except ImportError as exc:
                raise ImportError(
                    f"--log-config {log_config}: reading YAML needs PyYAML (pip install pyyaml); "
                    "or give a .json or .ini file"
                ) from exc
            with open(log_config) as file:
                logging.config.dictConfig(yaml.safe_load(file))
        else:
            logging.config.fileConfig(log_config, disable_existing_loggers=False)

    if log_level is not None:
        level = LOG_LEVELS[log_level.lower()] if isinstance(log_level, str) else log_level
        for name in ("ferroloop.error", "ferroloop.access", "ferroloop.asgi"):
            logging.getLogger(name).setLevel(level)
    if not access_log:
        access_logger = logging.getLogger("ferroloop.access")
        access_logger.handlers = []
        access_logger.propagate = False
