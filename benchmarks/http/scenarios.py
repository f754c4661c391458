"""The three workloads, and the check that a server really does each one before it is timed.

| scenario | app (`benchmarks/http/apps/`) | request | response |
|---|---|---|---|
| `hello` | `hello_asgi:app`, plain ASGI | `GET /` | 200, `Hello, world!`, text/plain |
| `fastapi` | `ping_fastapi:app`, FastAPI | `GET /ping` | 200, `{"ping": "pong"}` |
| `echo10k` | `echo_asgi:app`, plain ASGI | `POST /echo`, 10 KiB body | 200, the same 10 KiB |

Before the warm-up and again after the measurement, one request is sent with `http.client` and
its status, body and headers are checked, so a server that answers fast but wrongly (an empty
200, a truncated echo) fails the cell instead of winning it. During the measurement wrk counts
responses with status >= 400 and socket errors, and the bytes it read per response are
compared with the body size ("short responses" in the notes if fewer). `tls.py` sends the
check over HTTPS, verifying the server's certificate.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import ssl
from dataclasses import dataclass, field

ECHO_BODY = b"x" * 10240


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    app: str  # module:attribute, importable from benchmarks/http/apps
    method: str
    path: str
    body: bytes = b""
    requires: tuple[str, ...] = ()  # modules the app imports
    expect_body: bytes = b""
    expect_json: object = None
    expect_content_type: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    def missing(self) -> str | None:
        """None if the app can be imported here, else which module is missing."""
        for module in self.requires:
            if importlib.util.find_spec(module) is None:
                return f"needs {module}, which is not installed"
        return None

    def wrk_prelude(self) -> str:
        """The request part of the wrk Lua script (the `done()` hook is added by wrk.py)."""
        if self.method == "GET" and not self.body:
            return "-- plain GET: wrk's default request"
        lines = [f'wrk.method = "{self.method}"']
        if self.body:
            # The body is a single repeated byte, so string.rep builds exactly ECHO_BODY.
            char = chr(self.body[0])
            assert self.body == char.encode() * len(self.body)
            lines.append(f'wrk.body = string.rep("{char}", {len(self.body)})')
        for name, value in self.headers.items():
            lines.append(f'wrk.headers["{name}"] = "{value}"')
        return "\n".join(lines)

    def min_response_bytes(self) -> int:
        """A lower bound for one response on the wire: its body (headers come on top)."""
        if self.expect_json is not None:
            return len(json.dumps(self.expect_json, separators=(",", ":")))
        return len(self.expect_body)

    def check(
        self, host: str, port: int, timeout: float = 10.0, ssl_context: ssl.SSLContext | None = None
    ) -> dict | None:
        """Send the request once; raise WrongResponse (or OSError) unless the reply is right.

        With `ssl_context`, over HTTPS (the server's certificate verified with that context);
        then returns the TLS version and cipher the handshake settled on, else None.
        """
        if ssl_context is None:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        else:
            conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl_context)
        negotiated = None
        try:
            if ssl_context is not None:
                conn.connect()  # the handshake; conn.sock is the SSLSocket until close()
                negotiated = {"version": conn.sock.version(), "cipher": conn.sock.cipher()[0]}
            conn.request(self.method, self.path, body=self.body or None, headers=self.headers)
            response = conn.getresponse()
            body = response.read()
        finally:
            conn.close()
        problems = []
        if response.status != 200:
            problems.append(f"status {response.status}")
        if self.expect_json is not None:
            try:
                if json.loads(body) != self.expect_json:
                    problems.append(f"body {body[:80]!r}")
            except ValueError:
                problems.append(f"body is not JSON: {body[:80]!r}")
        elif body != self.expect_body:
            problems.append(
                f"body of {len(body)} bytes, {body[:40]!r}..., expected "
                f"{len(self.expect_body)} bytes"
            )
        content_type = response.getheader("content-type", "")
        if self.expect_content_type and not content_type.startswith(self.expect_content_type):
            problems.append(f"content-type {content_type!r}")
        length = response.getheader("content-length")
        if length is None or int(length) != len(body):
            problems.append(f"content-length {length!r} for a body of {len(body)} bytes")
        if problems:
            raise WrongResponse(f"{self.method} {self.path}: " + "; ".join(problems))
        return negotiated


class WrongResponse(Exception):
    """The server answered, but not with what the app sends."""


SCENARIOS = (
    Scenario(
        name="hello",
        title="plain ASGI hello world, GET /",
        app="hello_asgi:app",
        method="GET",
        path="/",
        expect_body=b"Hello, world!",
        expect_content_type="text/plain",
    ),
    Scenario(
        name="fastapi",
        title="FastAPI GET /ping",
        app="ping_fastapi:app",
        method="GET",
        path="/ping",
        requires=("fastapi",),
        expect_json={"ping": "pong"},
        expect_content_type="application/json",
    ),
    Scenario(
        name="echo10k",
        title="POST echo of 10 KiB, plain ASGI",
        app="echo_asgi:app",
        method="POST",
        path="/echo",
        body=ECHO_BODY,
        headers={"Content-Type": "application/octet-stream"},
        expect_body=ECHO_BODY,
        expect_content_type="application/octet-stream",
    ),
)
BY_NAME = {scenario.name: scenario for scenario in SCENARIOS}
