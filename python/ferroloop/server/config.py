"""``Config``: every server option, with uvicorn's names and defaults, and ``load()``.

Constructing a ``Config`` applies the process-wide options at once, as uvicorn's does: logging
(``log_config``, ``log_level``, ``access_log``, ``use_colors``), then the env file (so that it can
set ``WEB_CONCURRENCY`` and ``FORWARDED_ALLOW_IPS``, read next). ``load()`` imports the app; it
runs in the process that serves (a worker, not the supervisor), and on failure logs uvicorn's
message and exits with status 3, uvicorn's ``STARTUP_FAILURE``.

The options the native ``HttpServer`` takes are collected by ``http_server_options()``; nothing
else in this module knows about the native side.
"""

from __future__ import annotations

import logging
import os
import random
import re
import ssl
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from . import message_logger
from .env_file import load_env_file
from .importer import (
    ASGI2Middleware,
    ImportFromStringError,
    detect_interface,
    import_from_string,
    looks_like_asgi_app,
)
from .lifespan import LifespanMode
from .logging_config import LOG_LEVELS, LOGGING_CONFIG, configure_logging
from .proxy_headers import ProxyHeadersMiddleware

logger = logging.getLogger("ferroloop.error")

STARTUP_FAILURE = 3
"""Exit status when the app cannot be loaded or started (uvicorn's value)."""

InterfaceType = Literal["auto", "asgi3", "asgi2", "wsgi"]

DEFAULT_FORWARDED_ALLOW_IPS = "127.0.0.1,::1"
SSL_PROTOCOL_VERSION = int(ssl.PROTOCOL_TLS_SERVER)
"""uvicorn's default ``ssl_version``."""

DEFAULT_RELOAD_INCLUDES = ["*.py"]
DEFAULT_RELOAD_EXCLUDES = [".*", ".py[cod]", ".sw.*", "~*", "__pycache__"]


def jittered_request_limit(
    limit: int | None, jitter: int, rng: random.Random | None = None
) -> int | None:
    """``limit + randint(0, jitter)``: the request count after which one worker exits, spread so
    that workers started together do not all restart together (gunicorn's ``--max-requests``)."""
    if limit is None:
        return None
    if jitter <= 0:
        return limit
    return limit + (rng or random).randint(0, jitter)


def _positive(name: str, value: float | None, *, allow_zero: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "more than zero"
        raise ValueError(f"{name} must be {bound}, not {value!r}")


class Config:
    """The server's options; see docs/server.md for each one, its default and uvicorn's name."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 8000,
        uds: str | None = None,
        fd: int | None = None,
        workers: int | None = None,
        factory: bool = False,
        app_dir: str | None = None,
        root_path: str = "",
        proxy_headers: bool = True,
        forwarded_allow_ips: list[str] | str | None = None,
        log_config: dict[str, Any] | str | os.PathLike[str] | None = LOGGING_CONFIG,
        log_level: str | int | None = None,
        access_log: bool = True,
        use_colors: bool | None = None,
        limit_concurrency: int | None = None,
        limit_max_requests: int | None = None,
        max_requests_jitter: int = 0,
        backlog: int = 2048,
        timeout_keep_alive: float = 5,
        timeout_graceful_shutdown: float | None = None,
        lifespan: LifespanMode = "auto",
        interface: InterfaceType = "auto",
        env_file: str | os.PathLike[str] | None = None,
        reload: bool = False,
        reload_dirs: list[str] | str | None = None,
        reload_includes: list[str] | str | None = None,
        reload_excludes: list[str] | str | None = None,
        reload_delay: float = 0.25,
        server_header: bool = True,
        date_header: bool = True,
        reuse_port: bool = False,
        timeout_header: float = 10.0,
        limit_header_size: int = 65536,
        limit_headers: int = 100,
        limit_uri: int = 8192,
        limit_body: int | None = None,
        app_task: Literal["native", "asyncio"] = "native",
        *,
        ssl_keyfile: str | os.PathLike[str] | None = None,
        ssl_certfile: str | os.PathLike[str] | None = None,
        ssl_keyfile_password: str | None = None,
        ssl_version: int = SSL_PROTOCOL_VERSION,
        ssl_cert_reqs: int = ssl.CERT_NONE,
        ssl_ca_certs: str | os.PathLike[str] | None = None,
        ssl_ciphers: str = "TLSv1",
        timeout_worker_healthcheck: float = 5,
        timeout_notify: float = 30,
        callback_notify: Callable[[], Awaitable[None]] | None = None,
        headers: list[tuple[str, str]] | None = None,
        reset_contextvars: bool = False,
        h11_max_incomplete_event_size: int | None = None,
        limit_max_requests_jitter: int | None = None,
        loop: str | None = None,
        http: str | None = None,
        ws: str | None = "auto",
        ws_max_size: int = 16 * 1024 * 1024,
        ws_max_queue: int = 32,
        ws_ping_interval: float | None = 20.0,
        ws_ping_timeout: float | None = 20.0,
        ws_per_message_deflate: bool = True,
        wsgi_threads: int = 10,
        dispatch: Literal["front", "kernel"] = "front",
        lane_bulk_body: int = 1024 * 1024,
        lane_fast_workers: int = 1,
        metrics: bool = False,
        metrics_address: str = "127.0.0.1",
        metrics_port: int = 9090,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.uds = uds
        self.fd = fd
        self.workers = workers or 1
        # --workers N: "front" puts a dispatching front before the workers (supervisor.py);
        # "kernel" has every worker accept on the shared listener, as before.
        self.dispatch = dispatch
        self.lane_bulk_body = lane_bulk_body
        self.lane_fast_workers = lane_fast_workers
        # Prometheus text on a listener of its own (metrics.py).
        self.metrics = metrics
        self.metrics_address = metrics_address
        self.metrics_port = metrics_port
        self.factory = factory
        self.app_dir = app_dir
        self.root_path = root_path
        self.proxy_headers = proxy_headers
        self.log_config = log_config
        self.log_level = log_level
        self.access_log = access_log
        self.use_colors = use_colors
        self.limit_concurrency = limit_concurrency
        self.limit_max_requests = limit_max_requests
        # uvicorn >= 0.30 spells it limit_max_requests_jitter; both are accepted.
        self.max_requests_jitter = (
            limit_max_requests_jitter
            if limit_max_requests_jitter is not None
            else max_requests_jitter
        )
        self.backlog = backlog
        self.timeout_keep_alive = timeout_keep_alive
        self.timeout_graceful_shutdown = timeout_graceful_shutdown
        self.lifespan: LifespanMode = lifespan
        self.interface: InterfaceType = interface
        self.wsgi_threads = wsgi_threads
        # interface="wsgi": `ProxyHeadersMiddleware.rewrite` when proxy headers are trusted.
        self.wsgi_proxy: Callable[[dict[str, Any]], None] | None = None
        self.env_file = env_file
        self.reload = reload
        self.reload_delay = reload_delay
        self.server_header = server_header
        self.date_header = date_header
        self.app_task = app_task
        self.reuse_port = reuse_port
        self.timeout_header = timeout_header
        self.limit_header_size = limit_header_size
        self.limit_headers = limit_headers
        self.limit_uri = limit_uri
        self.limit_body = limit_body
        # uvicorn's h11 limit on an incomplete request head is this server's head size limit.
        if h11_max_incomplete_event_size is not None:
            self.limit_header_size = h11_max_incomplete_event_size
        self.headers = [(str(name), str(value)) for name, value in headers or []]
        self.encoded_headers = _encode_headers(self.headers)
        self.reset_contextvars = reset_contextvars
        self.timeout_worker_healthcheck = timeout_worker_healthcheck
        self.timeout_notify = timeout_notify
        self.callback_notify = callback_notify
        self.ws = "auto" if ws is None else ws
        self.ws_max_size = ws_max_size
        self.ws_max_queue = ws_max_queue
        # uvicorn takes 0 (or None) as "no keepalive pings" / "no pong deadline".
        self.ws_ping_interval = ws_ping_interval or None
        self.ws_ping_timeout = ws_ping_timeout or None
        # permessage-deflate (RFC 7692) is negotiated when the client offers it, as uvicorn does.
        self.ws_per_message_deflate = ws_per_message_deflate

        self.ssl_keyfile = ssl_keyfile
        self.ssl_certfile = ssl_certfile
        self.ssl_keyfile_password = ssl_keyfile_password
        self.ssl_version = ssl_version
        self.ssl_cert_reqs = ssl_cert_reqs
        self.ssl_ca_certs = ssl_ca_certs
        self.ssl_ciphers = ssl_ciphers
        # The PEM bytes the native server takes, read by load() (in the process that serves).
        self.tls_material: dict[str, Any] | None = None

        self.loaded = False
        self.loaded_app: Any = None
        # loaded_app without the proxy-headers middleware (None if there is none): the native
        # server calls it for requests without X-Forwarded-* headers, which the middleware
        # would pass through unchanged.
        self.plain_app: Any = None
        self._validate()
        if loop not in (None, "auto", "none"):
            logger.warning(
                "loop=%r is a uvicorn option that ferroloop ignores: the loop is always "
                "ferroloop's.",
                loop,
            )
        self.http = _http_mode(http)

        self.configure_logging()

        self.reload_dirs = [Path(d).resolve() for d in _as_list(reload_dirs)] or [Path.cwd()]
        self.reload_includes = _as_list(reload_includes) or list(DEFAULT_RELOAD_INCLUDES)
        self.reload_excludes = _as_list(reload_excludes) or list(DEFAULT_RELOAD_EXCLUDES)
        if (reload_dirs or reload_includes or reload_excludes) and not self.should_reload:
            logger.warning(
                "reload_dirs, reload_includes and reload_excludes have no effect without reload "
                "and an import string app ('module:attr')."
            )

        if env_file is not None:
            if os.path.isfile(env_file):
                logger.info("Loading environment from '%s'", env_file)
                load_env_file(env_file)
            else:
                logger.warning("Environment file '%s' not found; continuing without it.", env_file)

        if workers is None and "WEB_CONCURRENCY" in os.environ:
            self.workers = int(os.environ["WEB_CONCURRENCY"])
        self.forwarded_allow_ips: list[str] | str = (
            forwarded_allow_ips
            if forwarded_allow_ips is not None
            else os.environ.get("FORWARDED_ALLOW_IPS", DEFAULT_FORWARDED_ALLOW_IPS)
        )
        if self.reload and self.workers > 1:
            logger.warning('"workers" flag is ignored when reloading is enabled.')

    def _validate(self) -> None:
        if self.lifespan not in ("auto", "on", "off"):
            raise ValueError(f"lifespan must be 'auto', 'on' or 'off', not {self.lifespan!r}")
        if self.interface not in ("auto", "asgi3", "asgi2", "wsgi"):
            raise ValueError(
                f"interface must be 'auto', 'asgi3', 'asgi2' or 'wsgi', not {self.interface!r}"
            )
        _positive("wsgi_threads", self.wsgi_threads)
        if self.app_task not in ("native", "asyncio"):
            raise ValueError(f"app_task must be 'native' or 'asyncio', not {self.app_task!r}")
        if isinstance(self.log_level, str) and self.log_level.lower() not in LOG_LEVELS:
            raise ValueError(
                f"log_level must be one of {', '.join(LOG_LEVELS)}, not {self.log_level!r}"
            )
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, not {self.port}")
        _positive("workers", self.workers)
        if self.dispatch not in ("front", "kernel"):
            raise ValueError(f"dispatch must be 'front' or 'kernel', not {self.dispatch!r}")
        if self.lane_bulk_body < 0 or self.lane_fast_workers < 0:
            raise ValueError("lane_bulk_body and lane_fast_workers must not be negative")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be between 0 and 65535, not {self.metrics_port}")
        _positive("backlog", self.backlog)
        _positive("limit_concurrency", self.limit_concurrency)
        _positive("limit_max_requests", self.limit_max_requests)
        _positive("max_requests_jitter", self.max_requests_jitter, allow_zero=True)
        _positive("timeout_keep_alive", self.timeout_keep_alive, allow_zero=True)
        _positive("timeout_graceful_shutdown", self.timeout_graceful_shutdown, allow_zero=True)
        _positive("timeout_header", self.timeout_header)
        _positive("limit_header_size", self.limit_header_size)
        _positive("limit_headers", self.limit_headers)
        _positive("limit_uri", self.limit_uri)
        _positive("limit_body", self.limit_body, allow_zero=True)
        _positive("reload_delay", self.reload_delay)
        _positive("timeout_worker_healthcheck", self.timeout_worker_healthcheck)
        _positive("timeout_notify", self.timeout_notify)
        if self.ws not in WS_CHOICES:
            raise ValueError(f"ws must be one of {', '.join(WS_CHOICES)}, not {self.ws!r}")
        _positive("ws_max_size", self.ws_max_size)
        _positive("ws_max_queue", self.ws_max_queue)
        _positive("ws_ping_interval", self.ws_ping_interval)
        _positive("ws_ping_timeout", self.ws_ping_timeout)
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError("ssl_keyfile needs ssl_certfile (the certificate it belongs to)")
        if self.ssl_version not in _TLS_VERSIONS:
            raise ValueError(
                f"ssl_version {self.ssl_version!r} is not supported: ferroloop's TLS (rustls) "
                f"speaks TLS 1.2 and 1.3; use ssl.PROTOCOL_TLS_SERVER ({SSL_PROTOCOL_VERSION}, "
                f"the default) or ssl.PROTOCOL_TLSv1_2 ({int(ssl.PROTOCOL_TLSv1_2)}, TLS 1.2 only)"
            )
        if self.ssl_cert_reqs not in (ssl.CERT_NONE, ssl.CERT_OPTIONAL, ssl.CERT_REQUIRED):
            raise ValueError(
                f"ssl_cert_reqs must be 0 (CERT_NONE), 1 (CERT_OPTIONAL) or 2 (CERT_REQUIRED), "
                f"not {self.ssl_cert_reqs!r}"
            )
        if self.ssl_cert_reqs != ssl.CERT_NONE and self.ssl_ca_certs is None:
            raise ValueError("ssl_cert_reqs asks for client certificates: give ssl_ca_certs too")
        if self.ssl_ciphers not in _DEFAULT_CIPHERS:
            raise ValueError(
                f"ssl_ciphers={self.ssl_ciphers!r} is not supported: it is an OpenSSL cipher "
                "list, and ferroloop's TLS (rustls) has its own suites (TLS 1.3 AES-GCM and "
                "ChaCha20-Poly1305, TLS 1.2 ECDHE with the same); leave it at 'TLSv1'"
            )
        if self.callback_notify is not None and not callable(self.callback_notify):
            raise ValueError(f"callback_notify must be callable, not {self.callback_notify!r}")

    @property
    def is_ssl(self) -> bool:
        return self.ssl_certfile is not None

    def load_tls(self) -> None:
        """Reads the certificate, key and CA files for the native server (``tls_material``);
        an unreadable file or a wrong key password logs why and exits 3, as a bad app does."""
        if not self.is_ssl or self.tls_material is not None:
            return
        from .._native import check_tls

        try:
            material = read_tls_material(
                self.ssl_certfile,
                self.ssl_keyfile,
                self.ssl_keyfile_password,
                self.ssl_ca_certs,
            )
            material.update(
                tls_client_auth=int(self.ssl_cert_reqs),
                tls_versions=_TLS_VERSIONS[self.ssl_version],
            )
            # The native server's own checks (PEM, key type, the key matching the certificate),
            # now rather than once the app has started.
            check_tls(**material)
        except (OSError, ValueError) as exc:
            logger.error("Error loading the TLS certificate or key. %s", exc)
            sys.exit(STARTUP_FAILURE)
        self.tls_material = material

    @property
    def limit_max_requests_jitter(self) -> int:
        return self.max_requests_jitter

    @property
    def asgi_version(self) -> Literal["2.0", "3.0"]:
        return "2.0" if self.interface == "asgi2" else "3.0"

    @property
    def should_reload(self) -> bool:
        return isinstance(self.app, str) and self.reload

    @property
    def use_subprocess(self) -> bool:
        return bool(self.reload or self.workers > 1)

    def configure_logging(self) -> None:
        configure_logging(self.log_config, self.log_level, self.access_log, self.use_colors)

    def load_app(self) -> Any:
        """Imports the app object (before factory call and wrapping); exits 3 on failure."""
        if self.app_dir is not None and self.app_dir not in sys.path:
            sys.path.insert(0, self.app_dir)
        try:
            return import_from_string(self.app)
        except ImportFromStringError as exc:
            logger.error("Error loading ASGI app. %s", exc)
            sys.exit(STARTUP_FAILURE)

    def load(self) -> None:
        """Imports the app, calls the factory, wraps ASGI 2 and the proxy-headers middleware."""
        if self.loaded:
            return
        self.load_tls()
        app = self.load_app()
        if self.factory:
            try:
                app = app()
            except TypeError as exc:
                logger.error("Error loading ASGI app factory: %s", exc)
                sys.exit(STARTUP_FAILURE)
        elif self.interface == "wsgi":
            pass  # app(environ, start_response): never called here to guess a factory
        elif callable(app) and not looks_like_asgi_app(app):
            # A plain function: an ASGI 2 app(scope) or a factory. Like uvicorn, call it with no
            # arguments; a TypeError means it wants arguments, so it is the app itself.
            try:
                produced = app()
            except TypeError:
                pass
            else:
                logger.warning(
                    "ASGI app factory detected. Using it, but please consider setting the "
                    "--factory flag explicitly."
                )
                app = produced
        if not callable(app):
            logger.error(
                "Error loading ASGI app. %r is not callable; APP must name an ASGI application "
                "(or, with --factory, a function that returns one).",
                app,
            )
            sys.exit(STARTUP_FAILURE)

        if self.interface == "wsgi":
            # No ASGI wrapping: the native server runs it in its thread pool (WsgiPool), and
            # applies the proxy headers to the scope before the environ is built.
            if self.proxy_headers:
                self.wsgi_proxy = ProxyHeadersMiddleware(app, self.forwarded_allow_ips).rewrite
            self.loaded_app = app
            self.loaded = True
            return
        if self.interface == "auto":
            self.interface = detect_interface(app)
        if self.interface == "asgi2":
            app = ASGI2Middleware(app)
        if message_logger.wanted():
            app = message_logger.MessageLoggerMiddleware(app)
        if self.proxy_headers:
            self.plain_app = app
            app = ProxyHeadersMiddleware(app, self.forwarded_allow_ips)
        self.loaded_app = app
        self.loaded = True

    def http_server_options(self) -> dict[str, Any]:
        """The keyword arguments of the native ``HttpServer`` that come from the options."""
        return {
            "root_path": self.root_path,
            "scheme": "https" if self.is_ssl else "http",
            "limit_concurrency": self.limit_concurrency,
            "timeout_keep_alive": float(self.timeout_keep_alive),
            "timeout_header": float(self.timeout_header),
            "limit_header_size": self.limit_header_size,
            "limit_headers": self.limit_headers,
            "limit_uri": self.limit_uri,
            "limit_body": self.limit_body,
            "server_header": self.server_header,
            "date_header": self.date_header,
            "headers": self.encoded_headers,
            "reset_contextvars": self.reset_contextvars,
            "native_tasks": self.app_task == "native",
            "trace_connections": (
                message_logger.trace_connection if message_logger.wanted() else None
            ),
            "ws": self.ws != "none" and self.interface != "wsgi",
            "ws_max_size": self.ws_max_size,
            "ws_max_queue": self.ws_max_queue,
            "ws_ping_interval": self.ws_ping_interval,
            "ws_ping_timeout": self.ws_ping_timeout,
            "ws_per_message_deflate": self.ws_per_message_deflate,
            # A WSGI app is served HTTP/1.1 only (the native server reads auto so for it).
            "http": self.http,
            **(self.tls_material or {}),
        }


# --http: what ferroloop serves. uvicorn's HTTP/1.1 implementations (h11, httptools) are
# read as "1": HTTP/1.1 only, served natively.
_HTTP_MODES = {None: "auto", "auto": "auto", "1": "1", "2": "2", "h11": "1", "httptools": "1"}


def _http_mode(http: str | None) -> str:
    """``Config(http=...)`` as the native server's ``http``: ``auto`` (HTTP/1.1, and HTTP/2 by
    its preface or by ALPN), ``1`` or ``2``."""
    try:
        return _HTTP_MODES[http]
    except KeyError:
        raise ValueError(
            f"http={http!r}: expected 'auto' (HTTP/1.1 and HTTP/2), '1' (HTTP/1.1 only), "
            "'2' (HTTP/2 only), or uvicorn's 'h11'/'httptools' (read as '1')"
        ) from None


# ssl_version (an ssl.PROTOCOL_* value) -> the TLS versions rustls enables.
_TLS_VERSIONS = {
    int(ssl.PROTOCOL_TLS_SERVER): ["1.2", "1.3"],
    int(ssl.PROTOCOL_TLS): ["1.2", "1.3"],
    int(ssl.PROTOCOL_TLSv1_2): ["1.2"],
}
# uvicorn's default cipher list ("all TLS 1.0+ suites" to OpenSSL), which is all rustls has.
_DEFAULT_CIPHERS = ("TLSv1", "", None)


def read_tls_material(
    certfile: str | os.PathLike[str] | None,
    keyfile: str | os.PathLike[str] | None,
    password: str | None,
    ca_certs: str | os.PathLike[str] | None,
) -> dict[str, Any]:
    """The PEM bytes of the certificate chain, its key (from ``certfile`` when there is no
    ``keyfile``, as ``ssl.SSLContext.load_cert_chain`` takes it) and the client CA file. An
    encrypted key is decrypted here with ``password`` (this needs the ``cryptography``
    package); the native side takes unencrypted PEM only."""
    assert certfile is not None
    cert = Path(certfile).read_bytes()
    key = Path(keyfile).read_bytes() if keyfile is not None else cert
    if b"ENCRYPTED" in key:
        key = _decrypt_key(key, password)
    elif password is not None:
        logger.warning("ssl_keyfile_password is given but the key is not encrypted; ignored.")
    ca = Path(ca_certs).read_bytes() if ca_certs is not None else None
    return {"tls_cert": cert, "tls_key": key, "tls_client_ca": ca}


def _decrypt_key(pem: bytes, password: str | None) -> bytes:
    if password is None:
        raise ValueError("the key is encrypted: give its password (--ssl-keyfile-password)")
    try:
        from cryptography.hazmat.primitives import serialization
    except ImportError:
        raise ValueError(
            "the key is encrypted, and decrypting it needs the 'cryptography' package "
            "(pip install cryptography), or decrypt it once with "
            "'openssl pkey -in KEY -out PLAIN_KEY'"
        ) from None
    try:
        key = serialization.load_pem_private_key(pem, password.encode())
    except (ValueError, TypeError) as exc:
        raise ValueError(f"cannot decrypt the key with the password given: {exc}") from None
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


# uvicorn's --ws choices: each implementation name selects the native one here.
WS_CHOICES = ("auto", "none", "websockets", "websockets-sansio", "wsproto")

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def _encode_headers(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """``headers`` as the native server sends them: lowercase names, latin-1 bytes (uvicorn's
    encoding); a name that is not an RFC 9110 token or a value with CR, LF or NUL is refused."""
    encoded = []
    for name, value in headers:
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"header name {name!r} is not an HTTP token (e.g. 'X-Frame-Options')")
        if any(c in value for c in "\r\n\0"):
            raise ValueError(f"header {name!r} has a value with CR, LF or NUL")
        try:
            encoded.append((name.lower().encode("latin-1"), value.encode("latin-1")))
        except UnicodeEncodeError:
            raise ValueError(f"header {name!r} has a value that is not latin-1") from None
    return encoded


def _as_list(value: list[str] | str | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(dict.fromkeys(value))
