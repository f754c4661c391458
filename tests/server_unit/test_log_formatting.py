"""The access line, the error callback, and the formatters (uvicorn's output, ferroloop's names)."""

from __future__ import annotations

import io
import logging

import pytest
from ferroloop.server.access_log import (
    AccessLog,
    ErrorLog,
    access_log_callback,
    format_client_addr,
)
from ferroloop.server.logging_config import (
    LOGGING_CONFIG,
    AccessFormatter,
    DefaultFormatter,
    configure_logging,
)


def access_output(*args, use_colors=False) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        AccessFormatter(
            '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s',
            use_colors=use_colors,
        )
    )
    logger = logging.getLogger("ferroloop.access")
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    AccessLog(logger)(*args)
    return stream.getvalue()


def test_access_line_is_uvicorns():
    line = access_output(("127.0.0.1", 54321), "GET", "/items?id=3", "1.1", 200)
    assert line == 'INFO:     127.0.0.1:54321 - "GET /items?id=3 HTTP/1.1" 200 OK\n'


def test_access_line_unknown_status_and_unix_client():
    line = access_output(None, "POST", "/", "HTTP/1.0", 599)
    assert line == 'INFO:      - "POST / HTTP/1.0" 599 \n'


def test_access_line_colours():
    line = access_output(("::1", 1), "GET", "/", "1.1", 404, use_colors=True)
    assert "\x1b[32mINFO\x1b[0m" in line
    assert "\x1b[1mGET / HTTP/1.1\x1b[0m" in line
    assert "\x1b[31m404 Not Found\x1b[0m" in line


def test_access_record_args_are_uvicorns(caplog):
    caplog.set_level(logging.INFO, logger="ferroloop.access")
    AccessLog()(("10.0.0.1", 80), "GET", "/", "1.1", 204)
    (record,) = caplog.records
    assert record.name == "ferroloop.access"
    assert record.args == ("10.0.0.1:80", "GET", "/", "1.1", 204)
    assert record.getMessage() == '10.0.0.1:80 - "GET / HTTP/1.1" 204'


def test_format_client_addr():
    assert format_client_addr(("1.2.3.4", 5)) == "1.2.3.4:5"
    assert format_client_addr(None) == ""
    assert format_client_addr(("/tmp/s", None)) == "/tmp/s"


def test_access_log_callback_none_when_nothing_would_be_logged():
    configure_logging(LOGGING_CONFIG, None, True, False)
    assert isinstance(access_log_callback(True), AccessLog)
    assert access_log_callback(False) is None
    logging.getLogger("ferroloop.access").setLevel(logging.WARNING)
    assert access_log_callback(True) is None


def test_access_log_off_removes_the_handler():
    configure_logging(LOGGING_CONFIG, None, False, False)
    assert logging.getLogger("ferroloop.access").handlers == []
    assert access_log_callback(True) is None


def test_error_log_with_and_without_exception(caplog):
    log_error = ErrorLog()
    try:
        raise ValueError("boom")
    except ValueError as exc:
        log_error("Exception in ASGI application", exc)
    log_error("100% plain")
    first, second = caplog.records
    assert first.name == "ferroloop.error" and first.levelno == logging.ERROR
    assert first.exc_info is not None and first.exc_info[0] is ValueError
    assert second.getMessage() == "100% plain" and second.exc_info is None


def test_error_log_websocket_outcomes_in_uvicorns_words(caplog):
    caplog.set_level(logging.INFO, logger="ferroloop.error")
    log_error = ErrorLog()
    log_error.websocket(("127.0.0.1", 5000), "/chat?room=1", "[accepted]")
    log_error.websocket(None, "/chat", "403")
    first, second = caplog.records
    assert first.levelno == logging.INFO
    assert first.getMessage() == '127.0.0.1:5000 - "WebSocket /chat?room=1" [accepted]'
    assert second.getMessage() == ' - "WebSocket /chat" 403'


def test_default_formatter_levelprefix_and_color_message():
    formatter = DefaultFormatter("%(levelprefix)s %(message)s", use_colors=False)
    record = logging.LogRecord("ferroloop.error", logging.WARNING, "", 0, "hi %s", ("x",), None)
    assert formatter.format(record) == "WARNING:  hi x"
    coloured = DefaultFormatter("%(levelprefix)s %(message)s", use_colors=True)
    record.color_message = "hi [%s]"
    assert coloured.format(record) == "\x1b[33mWARNING\x1b[0m:  hi [x]"


def test_log_config_file_formats(tmp_path):
    json_config = tmp_path / "log.json"
    json_config.write_text(
        '{"version": 1, "disable_existing_loggers": false,'
        ' "loggers": {"ferroloop.error": {"level": "DEBUG"}}}'
    )
    configure_logging(str(json_config), None, True, None)
    assert logging.getLogger("ferroloop.error").level == logging.DEBUG
    ini = tmp_path / "log.ini"
    ini.write_text(
        "[loggers]\nkeys=root,fl\n[handlers]\nkeys=\n[formatters]\nkeys=\n"
        "[logger_root]\nhandlers=\n[logger_fl]\nqualname=ferroloop.error\nlevel=ERROR\nhandlers=\n"
    )
    configure_logging(ini, None, True, None)
    assert logging.getLogger("ferroloop.error").level == logging.ERROR


def test_trace_level_name():
    configure_logging(None, "trace", True, None)
    assert logging.getLevelName(5) == "TRACE"
    assert logging.getLogger("ferroloop.error").level == 5


def test_use_colors_applies_to_both_formatters():
    configure_logging(LOGGING_CONFIG, None, True, True)
    handler = logging.getLogger("ferroloop").handlers[0]
    assert handler.formatter.use_colors is True  # type: ignore[union-attr]
    assert LOGGING_CONFIG["formatters"]["default"]["use_colors"] is None  # not mutated


@pytest.fixture(autouse=True)
def _restore_root_handlers():
    root = logging.getLogger()
    saved = list(root.handlers), root.level
    yield
    root.handlers, level = saved
    root.setLevel(level)
