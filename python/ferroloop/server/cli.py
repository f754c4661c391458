"""``ferroloop [OPTIONS] APP`` (and ``python -m ferroloop``): uvicorn's command line.

Each option has uvicorn's name and default, so switching is changing the program's name; the
ferroloop-only ones are the HTTP limits (``--timeout-header``, ``--limit-*``) and
``--reuse-port``. uvicorn's ``--loop`` is accepted and ignored (with a warning), so that existing
command lines keep working; ``--http`` picks the protocols (``auto``: HTTP/1.1 and HTTP/2; its
``h11`` and ``httptools`` mean HTTP/1.1 only); ``--ws`` picks between the native WebSocket
implementation (``auto`` and uvicorn's implementation names) and ``none``. docs/server.md lists
every option.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence
from typing import Any

from .config import DEFAULT_FORWARDED_ALLOW_IPS, SSL_PROTOCOL_VERSION, Config
from .logging_config import LOG_LEVELS, LOGGING_CONFIG
from .serve import run_config

_BOOL = argparse.BooleanOptionalAction


def _header(text: str) -> tuple[str, str]:
    """``--header NAME:VALUE`` as uvicorn takes it (spaces around the value dropped)."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME:VALUE, got {text!r}")
    return name.strip(), value.strip()


def _flag_value(text: str) -> bool:
    """A value after a boolean option, as uvicorn's click options take it (``--x false``)."""
    value = text.strip().lower()
    if value in ("1", "true", "t", "yes", "y", "on"):
        return True
    if value in ("0", "false", "f", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _version() -> str:
    from .. import __version__

    return (
        f"Running ferroloop {__version__} with {platform.python_implementation()} "
        f"{platform.python_version()} on {platform.system()}"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ferroloop",
        description="Serve an ASGI app on ferroloop. APP is 'module:attribute', e.g. 'main:app'.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("app", metavar="APP", nargs="?", help="the app as an import string, 'module:attr'")
    add("--host", default="127.0.0.1", help="bind the socket to this host")
    add("--port", type=int, default=8000, help="bind the socket to this port (0: any free port)")
    add("--uds", default=None, help="bind to this Unix domain socket path instead")
    add("--fd", type=int, default=None, help="serve the already bound socket of this descriptor")
    add(
        "--workers",
        type=int,
        default=None,
        help="number of worker processes (default: $WEB_CONCURRENCY, or 1)",
    )
    add("--factory", action="store_true", help="APP is a () -> ASGI app factory")
    add("--app-dir", default="", help="put this directory first on sys.path ('': the cwd)")
    add("--root-path", default="", help="the ASGI root_path of an app mounted below a URL path")
    add("--proxy-headers", action=_BOOL, default=True, help="use X-Forwarded-For/-Proto")
    add(
        "--forwarded-allow-ips",
        default=None,
        help="comma-separated IPs, networks or literals trusted for proxy headers; '*' for all "
        f"(default: $FORWARDED_ALLOW_IPS, or '{DEFAULT_FORWARDED_ALLOW_IPS}')",
    )
    add("--log-level", choices=list(LOG_LEVELS), default=None, help="level of the server's logs")
    add("--log-config", default=None, help="logging config file: .json, .yaml or .ini")
    add("--use-colors", action=_BOOL, default=None, help="coloured log output (default: on a tty)")
    add("--access-log", action=_BOOL, default=True, help="log one line per response")
    add("--limit-concurrency", type=int, default=None, help="answer 503 beyond this many tasks")
    add(
        "--limit-max-requests",
        "--max-requests",
        dest="limit_max_requests",
        type=int,
        default=None,
        help="a worker exits (and is replaced) after this many responses",
    )
    add(
        "--max-requests-jitter",
        "--limit-max-requests-jitter",
        dest="max_requests_jitter",
        type=int,
        default=0,
        help="add a random 0..N to each worker's --limit-max-requests",
    )
    add("--backlog", type=int, default=2048, help="listen() backlog")
    add("--timeout-keep-alive", type=float, default=5, help="close idle connections after (s)")
    add(
        "--timeout-worker-healthcheck",
        type=float,
        default=5,
        help="with --workers: kill and replace a worker that does not answer a health check "
        "within this many seconds",
    )
    add(
        "--timeout-graceful-shutdown",
        type=float,
        default=None,
        help="on shutdown, wait at most this long (s) for busy connections (default: no limit)",
    )
    add("--lifespan", choices=["auto", "on", "off"], default="auto", help="lifespan protocol")
    add(
        "--interface",
        choices=["auto", "asgi3", "asgi2", "wsgi"],
        default="auto",
        help="app interface ('wsgi': a PEP 3333 app, run in --wsgi-threads threads)",
    )
    add(
        "--wsgi-threads",
        type=int,
        default=10,
        help="with --interface wsgi: threads per worker that run the app",
    )
    add("--env-file", default=None, help="load environment variables from this .env file")
    add("--reload", action="store_true", help="restart when a file changes (development)")
    add(
        "--reload-dir",
        dest="reload_dirs",
        action="append",
        default=None,
        help="watch this directory (repeatable; default: the cwd)",
    )
    add(
        "--reload-include",
        dest="reload_includes",
        action="append",
        default=None,
        help="watch file names matching this glob (repeatable; default: *.py)",
    )
    add(
        "--reload-exclude",
        dest="reload_excludes",
        action="append",
        default=None,
        help="ignore names matching this glob (repeatable; default: .* .py[cod] .sw.* ~*)",
    )
    add("--reload-delay", type=float, default=0.25, help="seconds between two file scans")
    add("--server-header", action=_BOOL, default=True, help="send 'server: ferroloop'")
    add("--date-header", action=_BOOL, default=True, help="send the 'date' header")
    add(
        "--header",
        dest="headers",
        action="append",
        type=_header,
        default=None,
        metavar="NAME:VALUE",
        help="send this header with every response (repeatable; the app's own wins)",
    )
    add(
        "--reset-contextvars",
        action="store_true",
        help="run each request's app in a new empty contextvars.Context",
    )
    add(
        "--app-task",
        choices=["native", "asyncio"],
        default="native",
        help="the task each request's app runs in: ferroloop.Task (native) or asyncio.Task",
    )
    add("--reuse-port", action="store_true", help="SO_REUSEPORT; each worker binds its own")
    add(
        "--dispatch",
        choices=["front", "kernel"],
        default="front",
        help="with --workers: 'front' (a front process holds the connections and hands each "
        "request to a free worker) or 'kernel' (every worker accepts on the shared socket)",
    )
    add(
        "--lane-bulk-body",
        type=int,
        default=1024 * 1024,
        help="with the front: a request body over this many bytes (or chunked) is bulk work",
    )
    add(
        "--lane-fast-workers",
        type=int,
        default=1,
        help="with the front: workers started besides --workers that never take bulk work",
    )
    add(
        "--metrics",
        action="store_true",
        help="serve Prometheus metrics (requests, durations, workers) on a listener of their own",
    )
    add("--metrics-address", default="127.0.0.1", help="address of the metrics listener")
    add("--metrics-port", type=int, default=9090, help="port of the metrics listener")
    add(
        "--timeout-header",
        type=float,
        default=10.0,
        help="seconds to receive a complete request head (slowloris guard)",
    )
    add("--limit-header-size", type=int, default=65536, help="bytes of a request head (431)")
    add("--limit-headers", type=int, default=100, help="number of request headers (431)")
    add("--limit-uri", type=int, default=8192, help="bytes of the request target (414)")
    add("--limit-body", type=int, default=None, help="bytes of a request body (413; no limit)")
    add(
        "--h11-max-incomplete-event-size",
        type=int,
        default=None,
        help="uvicorn's h11 limit, taken as --limit-header-size",
    )
    add(
        "--ws",
        default="auto",
        help="WebSocket support: 'auto' (the native implementation; uvicorn's 'websockets', "
        "'websockets-sansio' and 'wsproto' choose it too) or 'none' (upgrades are plain HTTP)",
    )
    add("--ws-max-size", type=int, default=16777216, help="largest WebSocket message (1009)")
    add(
        "--ws-max-queue",
        type=int,
        default=32,
        help="WebSocket messages received and not yet read by the app before reading pauses",
    )
    add(
        "--ws-ping-interval",
        type=float,
        default=20.0,
        help="seconds between WebSocket keepalive pings (0: none)",
    )
    add(
        "--ws-ping-timeout",
        type=float,
        default=20.0,
        help="seconds a keepalive ping waits for its pong before closing with 1011 (0: no limit)",
    )
    # uvicorn spells it `--ws-per-message-deflate BOOLEAN`; the bare flag and the `--no-` form
    # work too.
    add(
        "--ws-per-message-deflate",
        nargs="?",
        const=True,
        default=True,
        type=_flag_value,
        metavar="BOOL",
        help="negotiate permessage-deflate (RFC 7692) with clients that offer it (default: on)",
    )
    add(
        "--no-ws-per-message-deflate",
        dest="ws_per_message_deflate",
        action="store_false",
        help="never compress WebSocket messages",
    )
    add("--ssl-keyfile", default=None, help="TLS: the private key file (PEM)")
    add("--ssl-certfile", default=None, help="TLS: the certificate chain file (PEM); enables https")
    add("--ssl-keyfile-password", default=None, help="TLS: the password of an encrypted key")
    add(
        "--ssl-version",
        type=int,
        default=SSL_PROTOCOL_VERSION,
        help="TLS: an ssl.PROTOCOL_* value; the default negotiates TLS 1.2 or 1.3, "
        "5 (PROTOCOL_TLSv1_2) allows TLS 1.2 only",
    )
    add(
        "--ssl-cert-reqs",
        type=int,
        default=0,
        help="TLS client certificates: 0 none, 1 optional, 2 required (ssl.CERT_* values)",
    )
    add("--ssl-ca-certs", default=None, help="TLS: CA file (PEM) that client certificates chain to")
    add("--ssl-ciphers", default="TLSv1", help="TLS: only the default is accepted (see docs)")
    add("--loop", default=None, help="uvicorn option, accepted and ignored")
    add(
        "--http",
        default=None,
        choices=["auto", "1", "2", "h11", "httptools"],
        help="protocols: auto (HTTP/1.1, and HTTP/2 by its preface or TLS ALPN; the default), "
        "1 (HTTP/1.1 only), 2 (HTTP/2 only); uvicorn's h11 and httptools mean 1",
    )
    add("--version", action="store_true", help="print the version and exit")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    """The ``Config`` keyword arguments (``app`` included) for a command line; ``None`` if
    ``--version`` was given (it has been printed). Usage errors exit with status 2."""
    parser = build_parser()
    namespace = parser.parse_args(argv)
    if namespace.version:
        print(_version())
        return None
    if not namespace.app:
        parser.error("the following arguments are required: APP")
    options = vars(namespace)
    del options["version"]
    if options["log_config"] is None:
        options["log_config"] = LOGGING_CONFIG  # no --log-config: the default, not "leave alone"
    return options


def main(argv: Sequence[str] | None = None) -> None:
    options = parse_args(argv)
    if options is None:
        return
    app = options.pop("app")
    if options["app_dir"] not in sys.path:
        sys.path.insert(0, options["app_dir"])
    try:
        config = Config(app, **options)
    except ValueError as exc:
        print(f"ferroloop: error: {exc}", file=sys.stderr)
        sys.exit(2)
    status = run_config(config)
    if status:
        sys.exit(status)


if __name__ == "__main__":
    main()
