"""TLS echo through a Protocol: `create_server(ssl=...)`, echo in `data_received`; 1 KiB.

Most traffic that leaves a host is TLS, and a Python server that terminates it itself (no
proxy in front) pays for the TLS layer on the loop's thread: every record is decrypted and
encrypted through `ssl.SSLObject` and memory BIOs, with the loop's SSL protocol (asyncio's
`sslproto` or the loop's own) between the socket and user code. The AES work is the same for
every loop; the buffering and calls around it are what a loop can make cheaper. The server uses
CPython's test certificate `keycert3.pem` (CN localhost, signed by `pycacert.pem`); the client
(a separate process on core 1, the same for every server loop: echo_client.c with OpenSSL, or
echo_client.py with `--echo-client python`) verifies it against `pycacert.pem` with the name
`localhost`. Handshakes happen before the warm-up and are not measured; at the end each
connection exchanges close_notify with the server. 64 connections each keep one 1 KiB request
in flight. Server CPU per message is reported as for the TCP Protocol echo.

Without CPython's `test` package (some distributions ship Python without it) the benchmark is
skipped, with a message saying so.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import echo_measure
import echo_server
from metric import Metric

METRICS = (
    Metric("msgs_per_s", "TLS Protocol echo, 64 clients", "messages/s", True),
    Metric("server_cpu_us_per_msg", "TLS echo server CPU per message", "µs", False),
)
PARAMS = {"clients": 64, "size": 1024, "warmup_s": 0.5}
CASES = {"1KiB": ({**PARAMS, "duration_s": 3.0}, {**PARAMS, "duration_s": 1.0})}
CERT, CA = "keycert3.pem", "pycacert.pem"


def _certs() -> tuple[Path, Path] | str:
    """(server key+cert, CA cert) from CPython's test package, or why they cannot be found."""
    try:
        import test
    except ImportError:
        return "CPython's `test` package is not installed, so its test certificates are missing"
    base = Path(test.__file__).parent
    for folder in (base / "certdata", base):  # certdata/ in newer releases, test/ in older ones
        if (folder / CERT).is_file() and (folder / CA).is_file():
            return folder / CERT, folder / CA
    return f"{CERT} and {CA} not found in {base / 'certdata'} or {base}"


def unavailable() -> str | None:
    """Why this benchmark cannot run here, or None (called by run.py before any run)."""
    found = _certs()
    return found if isinstance(found, str) else None


async def _start(loop: asyncio.AbstractEventLoop, params: dict, tally: echo_server.Tally):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(params["certfile"])
    server = await loop.create_server(
        lambda: echo_server.EchoProtocol(tally), "127.0.0.1", 0, ssl=context, backlog=256
    )
    return server.sockets[0].getsockname()[1], server


def serve(loop: asyncio.AbstractEventLoop, params: dict) -> dict:
    return echo_server.run(loop, params, _start)


def measure(loop_name: str, params: dict, pins: tuple[list, list]) -> dict:
    cert, ca = _certs()
    return echo_measure.measure(
        "tls_echo",
        loop_name,
        params,
        pins,
        "tls",
        server_extra={"certfile": str(cert)},
        client_extra={"cafile": str(ca)},
    )
