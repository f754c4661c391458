"""Config: option checks, environment defaults, and load(): import errors, factories, ASGI 2
detection and wrapping, the proxy-headers middleware."""

from __future__ import annotations

import logging
import os
import random
import sys

import pytest
from ferroloop.server.config import STARTUP_FAILURE, Config, jittered_request_limit
from ferroloop.server.importer import (
    ASGI2Middleware,
    ImportFromStringError,
    detect_interface,
    import_from_string,
)
from ferroloop.server.proxy_headers import ProxyHeadersMiddleware


def config(app, **kwargs) -> Config:
    kwargs.setdefault("log_config", None)
    return Config(app, **kwargs)


async def asgi3_app(scope, receive, send):
    pass


class ASGI2App:
    def __init__(self, scope):
        self.scope = scope

    async def __call__(self, receive, send):
        await send({"type": "asgi2", "scope": self.scope})


class ASGI3Instance:
    async def __call__(self, scope, receive, send):
        pass


# -- import strings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("import_str", "message"),
    [
        ("nocolon", 'Import string "nocolon" must be in format "<module>:<attribute>".'),
        (":app", 'Import string ":app" must be in format "<module>:<attribute>".'),
        ("ferroloop_no_such_module:app", 'Could not import module "ferroloop_no_such_module".'),
        ("os:no_such_attr", 'Attribute "no_such_attr" not found in module "os".'),
        ("os:path.nope", 'Attribute "path.nope" not found in module "os".'),
    ],
)
def test_import_from_string_errors_are_uvicorns_messages(import_str, message):
    with pytest.raises(ImportFromStringError) as info:
        import_from_string(import_str)
    assert str(info.value) == message


def test_import_from_string_nested_attribute():
    import os.path

    assert import_from_string("os:path.join") is os.path.join


def test_missing_dependency_inside_the_app_module_is_not_hidden(make_module):
    name = make_module("import ferroloop_missing_dependency\napp = None\n")
    with pytest.raises(ModuleNotFoundError, match="ferroloop_missing_dependency"):
        import_from_string(f"{name}:app")


def test_load_bad_module_logs_and_exits_3(caplog):
    cfg = config("ferroloop_no_such_module:app")
    caplog.set_level(logging.ERROR, logger="ferroloop.error")
    with pytest.raises(SystemExit) as info:
        cfg.load()
    assert info.value.code == STARTUP_FAILURE
    assert 'Error loading ASGI app. Could not import module "ferroloop_no_such_module".' in (
        caplog.text
    )


def test_load_not_callable_exits_3(make_module, caplog):
    name = make_module("app = 42\n")
    with pytest.raises(SystemExit) as info:
        config(f"{name}:app").load()
    assert info.value.code == STARTUP_FAILURE
    assert "is not callable" in caplog.text


def test_app_dir_is_put_on_sys_path(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "ferroloop_appdir_mod.py").write_text("async def app(s, r, se):\n    pass\n")
    cfg = config("ferroloop_appdir_mod:app", app_dir=str(tmp_path), proxy_headers=False)
    try:
        cfg.load()
        assert sys.path[0] == str(tmp_path)
        assert cfg.loaded_app.__name__ == "app"
    finally:
        sys.modules.pop("ferroloop_appdir_mod", None)


# -- factories -----------------------------------------------------------------------------------


def test_factory_is_called(make_module):
    name = make_module(
        """
        async def app(scope, receive, send):
            pass

        def create_app():
            return app
        """
    )
    cfg = config(f"{name}:create_app", factory=True, proxy_headers=False)
    cfg.load()
    assert cfg.loaded_app is sys.modules[name].app


def test_factory_needing_arguments_exits_3(make_module, caplog):
    name = make_module("def create_app(x):\n    return x\n")
    with pytest.raises(SystemExit) as info:
        config(f"{name}:create_app", factory=True).load()
    assert info.value.code == STARTUP_FAILURE
    assert "Error loading ASGI app factory" in caplog.text


def test_factory_without_flag_is_detected_with_a_warning(make_module, caplog):
    name = make_module(
        """
        async def app(scope, receive, send):
            pass

        def create_app():
            return app
        """
    )
    cfg = config(f"{name}:create_app", proxy_headers=False)
    with caplog.at_level(logging.WARNING, logger="ferroloop.error"):
        cfg.load()
    assert cfg.loaded_app is sys.modules[name].app
    assert "ASGI app factory detected" in caplog.text


def test_asgi3_app_is_never_called_as_a_probe():
    calls = []

    class App:
        async def __call__(self, scope, receive, send):
            calls.append(scope)

    cfg = config(App(), proxy_headers=False)
    cfg.load()
    assert calls == []
    assert cfg.interface == "asgi3"


# -- ASGI 2 / 3 ----------------------------------------------------------------------------------


def test_detect_interface():
    async def coroutine_function(scope, receive, send):
        pass

    def asgi2_function(scope):
        return None

    assert detect_interface(coroutine_function) == "asgi3"
    assert detect_interface(ASGI3Instance()) == "asgi3"
    assert detect_interface(ASGI2App) == "asgi2"
    assert detect_interface(asgi2_function) == "asgi2"


def test_asgi2_class_is_wrapped_and_runs():
    import ferroloop

    cfg = config(ASGI2App, proxy_headers=False)
    cfg.load()
    assert isinstance(cfg.loaded_app, ASGI2Middleware)
    assert cfg.asgi_version == "2.0"
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {}

    ferroloop.run(cfg.loaded_app({"type": "http"}, receive, send))
    assert sent == [{"type": "asgi2", "scope": {"type": "http"}}]


def test_proxy_headers_middleware_is_outermost_and_optional():
    with_proxy = config(asgi3_app, forwarded_allow_ips="10.0.0.1")
    with_proxy.load()
    assert isinstance(with_proxy.loaded_app, ProxyHeadersMiddleware)
    assert with_proxy.loaded_app.app is asgi3_app
    # What the native server calls for requests without X-Forwarded-* headers.
    assert with_proxy.plain_app is asgi3_app
    without = config(asgi3_app, proxy_headers=False)
    without.load()
    assert without.loaded_app is asgi3_app
    assert without.plain_app is None


def wsgi_app(environ, start_response):
    start_response("200 OK", [])
    return [b""]


def test_wsgi_app_is_not_wrapped_and_gets_the_proxy_rewrite():
    cfg = config(wsgi_app, interface="wsgi", forwarded_allow_ips="10.0.0.1")
    cfg.load()
    # Never called to guess a factory, never wrapped in ASGI middleware.
    assert cfg.loaded_app is wsgi_app
    assert cfg.plain_app is None
    rewrite = cfg.wsgi_proxy
    assert rewrite is not None
    scope = {
        "type": "http",
        "client": ("10.0.0.1", 5000),
        "scheme": "http",
        "headers": [(b"x-forwarded-for", b"1.2.3.4"), (b"x-forwarded-proto", b"https")],
    }
    rewrite(scope)
    assert (scope["client"][0], scope["scheme"]) == ("1.2.3.4", "https")
    untrusted = {**scope, "client": ("10.9.9.9", 5000), "scheme": "http"}
    rewrite(untrusted)
    assert (untrusted["client"][0], untrusted["scheme"]) == ("10.9.9.9", "http")
    assert cfg.http_server_options()["ws"] is False
    no_proxy = config(wsgi_app, interface="wsgi", proxy_headers=False)
    no_proxy.load()
    assert no_proxy.wsgi_proxy is None


def test_load_twice_is_a_no_op():
    cfg = config(asgi3_app)
    cfg.load()
    first = cfg.loaded_app
    cfg.load()
    assert cfg.loaded_app is first


# -- options ---------------------------------------------------------------------------------


def test_defaults_match_uvicorn(monkeypatch):
    monkeypatch.delenv("WEB_CONCURRENCY", raising=False)
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    cfg = config("m:app")
    assert (cfg.host, cfg.port, cfg.backlog, cfg.workers) == ("127.0.0.1", 8000, 2048, 1)
    assert cfg.forwarded_allow_ips == "127.0.0.1,::1"
    assert cfg.timeout_keep_alive == 5 and cfg.timeout_graceful_shutdown is None
    assert cfg.lifespan == "auto" and cfg.proxy_headers and cfg.access_log


def test_environment_defaults(monkeypatch):
    monkeypatch.setenv("WEB_CONCURRENCY", "3")
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")
    cfg = config("m:app")
    assert cfg.workers == 3
    assert cfg.forwarded_allow_ips == "*"
    assert config("m:app", workers=2, forwarded_allow_ips="1.2.3.4").workers == 2


def test_env_file_is_loaded_before_environment_defaults(tmp_path, monkeypatch):
    names = ("WEB_CONCURRENCY", "FERROLOOP_TEST_FROM_ENV_FILE")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    env = tmp_path / ".env"
    env.write_text("WEB_CONCURRENCY=4\nFERROLOOP_TEST_FROM_ENV_FILE=yes\n")
    try:
        cfg = config("m:app", env_file=str(env))
        assert cfg.workers == 4
        assert os.environ["FERROLOOP_TEST_FROM_ENV_FILE"] == "yes"
    finally:
        for name in names:  # set by the env file, behind monkeypatch's back
            os.environ.pop(name, None)


def test_missing_env_file_warns(tmp_path, caplog):
    config("m:app", env_file=str(tmp_path / "nope.env"))
    assert "not found" in caplog.text


def test_jitter_alias():
    assert config("m:app", limit_max_requests_jitter=7).max_requests_jitter == 7
    assert config("m:app", max_requests_jitter=5).limit_max_requests_jitter == 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lifespan": "maybe"}, "lifespan must be"),
        ({"interface": "wsgi3"}, "interface must be 'auto', 'asgi3', 'asgi2' or 'wsgi'"),
        ({"interface": "wsgi", "wsgi_threads": 0}, "wsgi_threads must be more than zero"),
        ({"log_level": "loud"}, "log_level must be one of"),
        ({"port": 70000}, "port must be between"),
        ({"backlog": 0}, "backlog must be more than zero"),
        ({"limit_concurrency": -1}, "limit_concurrency must be more than zero"),
        ({"timeout_graceful_shutdown": -1}, "timeout_graceful_shutdown must be zero or more"),
        ({"limit_uri": 0}, "limit_uri must be more than zero"),
        ({"h11_max_incomplete_event_size": 0}, "limit_header_size must be more than zero"),
        ({"headers": [("bad name", "x")]}, "header name 'bad name' is not an HTTP token"),
        ({"headers": [("x-a", "one\r\nx-b: two")]}, "header 'x-a' has a value with CR, LF"),
        ({"headers": [("x-a", "snow \u2603")]}, "header 'x-a' has a value that is not latin-1"),
    ],
)
def test_bad_options_are_rejected_with_the_option_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        config("m:app", **kwargs)


def test_connection_tracing_is_passed_only_at_trace_level():
    from ferroloop.server import message_logger
    from ferroloop.server.logging_config import TRACE_LOG_LEVEL

    logger = logging.getLogger("ferroloop.error")
    level = logger.level
    try:
        logger.setLevel(logging.DEBUG)
        assert config("m:app").http_server_options()["trace_connections"] is None
        logger.setLevel(TRACE_LOG_LEVEL)
        traced = config("m:app").http_server_options()["trace_connections"]
        assert traced is message_logger.trace_connection
    finally:
        logger.setLevel(level)


def test_uvicorn_only_options_warn(caplog):
    config("m:app", loop="uvloop", http="httptools")
    assert "loop='uvloop' is a uvicorn option that ferroloop ignores" in caplog.text


@pytest.mark.parametrize(
    ("given", "served"),
    [(None, "auto"), ("auto", "auto"), ("1", "1"), ("2", "2"), ("h11", "1"), ("httptools", "1")],
)
def test_http_option_names_the_protocols(given, served):
    assert config("m:app", http=given).http_server_options()["http"] == served


def test_http_option_refuses_unknown_values():
    with pytest.raises(ValueError, match="http='3'"):
        config("m:app", http="3")


def test_http_server_options():
    cfg = config(
        "m:app",
        root_path="/api",
        limit_concurrency=10,
        timeout_keep_alive=7,
        limit_body=1024,
        server_header=False,
    )
    assert cfg.http_server_options() == {
        "root_path": "/api",
        "scheme": "http",
        "limit_concurrency": 10,
        "timeout_keep_alive": 7.0,
        "timeout_header": 10.0,
        "limit_header_size": 65536,
        "limit_headers": 100,
        "limit_uri": 8192,
        "limit_body": 1024,
        "server_header": False,
        "date_header": True,
        "headers": [],
        "reset_contextvars": False,
        "native_tasks": True,
        "trace_connections": None,  # set only at trace level
        "ws": True,
        "ws_max_size": 16 * 1024 * 1024,
        "ws_max_queue": 32,
        "ws_ping_interval": 20.0,
        "ws_ping_timeout": 20.0,
        "ws_per_message_deflate": True,
        "http": "auto",
    }
    cfg = config(
        "m:app",
        headers=[("X-Frame-Options", "DENY"), ("Server", "edge")],
        reset_contextvars=True,
        h11_max_incomplete_event_size=4096,
    )
    options = cfg.http_server_options()
    # uvicorn's encoding: lowercase latin-1 names, the values as given.
    assert options["headers"] == [(b"x-frame-options", b"DENY"), (b"server", b"edge")]
    assert options["reset_contextvars"] is True
    assert options["limit_header_size"] == 4096
    assert config("m:app", app_task="asyncio").http_server_options()["native_tasks"] is False
    with pytest.raises(ValueError, match="app_task must be 'native' or 'asyncio'"):
        config("m:app", app_task="trio")


def test_log_level_applies_to_server_loggers():
    config("m:app", log_level="warning")
    assert logging.getLogger("ferroloop.error").level == logging.WARNING
    assert logging.getLogger("ferroloop.access").level == logging.WARNING


def test_default_log_config_installs_uvicorn_shaped_loggers():
    Config("m:app", access_log=False)
    assert logging.getLogger("ferroloop").propagate is False
    assert logging.getLogger("ferroloop").handlers
    assert logging.getLogger("ferroloop.access").handlers == []


# -- request limit jitter ----------------------------------------------------------------------


def test_jittered_request_limit():
    assert jittered_request_limit(None, 10) is None
    assert jittered_request_limit(100, 0) == 100
    rng = random.Random(1)
    values = {jittered_request_limit(100, 10, rng) for _ in range(500)}
    assert values == set(range(100, 111))  # inclusive on both ends, every value reachable


def test_websocket_options():
    assert config("m:app", ws="none").http_server_options()["ws"] is False
    for name in ("auto", "websockets", "websockets-sansio", "wsproto"):
        assert config("m:app", ws=name).http_server_options()["ws"] is True
    # uvicorn's 0 means "no pings" / "no pong deadline".
    options = config("m:app", ws_ping_interval=0, ws_ping_timeout=0).http_server_options()
    assert options["ws_ping_interval"] is None and options["ws_ping_timeout"] is None
    with pytest.raises(ValueError, match="ws must be one of"):
        config("m:app", ws="asyncio")
    with pytest.raises(ValueError, match="ws_max_size must be more than zero"):
        config("m:app", ws_max_size=0)
    with pytest.raises(ValueError, match="ws_ping_interval must be"):
        config("m:app", ws_ping_interval=-1)
