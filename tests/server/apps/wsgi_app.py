"""A plain PEP 3333 WSGI app (no framework) with one route per behaviour the WSGI tests probe.

Run as ``python -m ferroloop wsgi_app:app --interface wsgi``. Routes are chosen by PATH_INFO;
parameters come from the query string. ``/sleep`` writes ``sleep started KEY`` and ``sleep
finished KEY`` lines to stderr, so a test can see from the server's output when an app call
holds a thread (and in which order the calls ran) without measuring time.
"""

from __future__ import annotations

import http
import io
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from shared_state import SharedCounter

Environ = dict[str, Any]
StartResponse = Callable[..., Callable[[bytes], object]]

# How many times the server called close() on a /close-tracking response (PEP 3333 requires it).
_closes = SharedCounter("closes")


def _query(environ: Environ) -> dict[str, str]:
    return {name: values[-1] for name, values in parse_qs(environ["QUERY_STRING"]).items()}


def _text(start_response: StartResponse, body: bytes, status: str = "200 OK") -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def _json(start_response: StartResponse, value: object) -> list[bytes]:
    body = json.dumps(value).encode()
    start_response(
        "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    )
    return [body]


def _read_all(stream: Any, size: int) -> bytes:
    parts = []
    while part := stream.read(size):
        parts.append(part)
    return b"".join(parts)


def _read_lines(stream: Any) -> list[bytes]:
    lines = []
    while line := stream.readline():
        lines.append(line)
    return lines


class _CloseTracking:
    """A response iterable whose close() the server must call once it is done with it."""

    def __iter__(self) -> Iterator[bytes]:
        yield b"tracked"

    def close(self) -> None:
        _closes.increment()


def _stream(start_response: StartResponse, count: int) -> Iterator[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    for index in range(count):
        yield b"chunk %d\n" % index


def _error_mid_stream(start_response: StartResponse) -> Iterator[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    yield b"first chunk\n"
    raise RuntimeError("deliberate failure in the middle of the response body")


def _exc_info(start_response: StartResponse) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    try:
        raise ValueError("deliberate failure after start_response, before any body")
    except ValueError:
        body = b"replaced by the error page"
        start_response(
            "500 Internal Server Error",
            [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))],
            sys.exc_info(),
        )
        return [body]


def _write(start_response: StartResponse) -> list[bytes]:
    write = start_response("200 OK", [("Content-Type", "text/plain")])
    write(b"written-")
    return [b"returned"]


def _sleep(environ: Environ, start_response: StartResponse) -> list[bytes]:
    query = _query(environ)
    key = query.get("key", "")
    print(f"sleep started {key}", file=sys.stderr, flush=True)
    time.sleep(float(query["s"]))
    print(f"sleep finished {key}", file=sys.stderr, flush=True)
    return _text(start_response, b"slept")


def _status(environ: Environ, start_response: StartResponse) -> list[bytes]:
    code = int(_query(environ)["code"])
    start_response(f"{code} {http.HTTPStatus(code).phrase}", [("X-Status", str(code))])
    return []


# Blocks /big has produced so far (a test reads it to see flow control hold the app back).
_produced = 0


def _slow(environ: Environ, start_response: StartResponse) -> Iterator[bytes]:
    """Yields a line, waits until the file named by ``release`` exists, yields another."""
    release = _query(environ)["release"]
    start_response("200 OK", [("Content-Type", "text/plain")])
    yield b"started\n"
    deadline = time.monotonic() + 60
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.02)
    yield b"finished\n"


def _big(environ: Environ, start_response: StartResponse) -> Iterator[bytes]:
    """``blocks`` blocks of ``size`` bytes, counted in ``_produced`` as they are yielded."""
    global _produced
    query = _query(environ)
    blocks, size = int(query["blocks"]), int(query["size"])
    _produced = 0
    start_response("200 OK", [("Content-Type", "application/octet-stream")])
    block = b"b" * size
    for _ in range(blocks):
        _produced += 1
        yield block


# How many files /file-wrapper responses closed (PEP 3333: the wrapper's close() closes them).
_file_closes = SharedCounter("file-closes")


class _TrackedFile(io.FileIO):
    def close(self) -> None:
        if not self.closed:
            _file_closes.increment()
        super().close()


def _file_wrapper(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
    """This file from ``offset`` through ``wsgi.file_wrapper``: a real file (sent with
    sendfile by ferroloop), or with ``kind=bytesio`` an in-memory one (iterated)."""
    query = _query(environ)
    offset = int(query.get("offset", "0"))
    if query.get("kind") == "bytesio":
        filelike: Any = io.BytesIO(Path(__file__).read_bytes())
    else:
        filelike = _TrackedFile(__file__)
    filelike.seek(offset)
    headers = [("Content-Type", "text/x-python")]
    if "declare" in query:
        size = Path(__file__).stat().st_size - offset
        headers.append(("Content-Length", str(size)))
    start_response("200 OK", headers)
    wrapper = environ.get("wsgi.file_wrapper")
    if wrapper is None:  # a server without one (PEP 3333 makes it optional)
        return iter(lambda: filelike.read(4096), b"")
    return wrapper(filelike, 4096)


def _declared(environ: Environ, start_response: StartResponse) -> Iterator[bytes]:
    """Declares ``Content-Length: declare`` and yields the comma-separated ``parts``."""
    query = _query(environ)
    start_response("200 OK", [("Content-Length", query["declare"])])
    for part in query["parts"].split(","):
        yield part.encode()


def app(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
    path = environ["PATH_INFO"]
    stream = environ["wsgi.input"]
    if path == "/":
        return _text(start_response, b"Hello, world!")
    if path == "/no-cl":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"Hello, world!"]
    if path == "/te-chunked":
        # A hop-by-hop header PEP 3333 tells apps not to set; the server must not add a
        # Content-Length that would contradict it.
        start_response("200 OK", [("Content-Type", "text/plain"), ("Transfer-Encoding", "chunked")])
        return [b"Hello, world!"]
    if path == "/environ":
        plain = (str, int, bool, tuple, list)
        return _json(start_response, {k: v for k, v in environ.items() if isinstance(v, plain)})
    if path == "/headers":
        return _json(start_response, {k: v for k, v in environ.items() if k.startswith("HTTP_")})
    if path == "/echo":
        body = stream.read()
        start_response(
            "200 OK",
            [("Content-Type", "application/octet-stream"), ("Content-Length", str(len(body)))],
        )
        return [body]
    if path == "/echo-read-n":
        return _text(start_response, _read_all(stream, int(_query(environ)["n"])))
    if path == "/lines":
        return _json(start_response, [line.decode("latin-1") for line in _read_lines(stream)])
    if path == "/lines-iter":
        return _json(start_response, [line.decode("latin-1") for line in stream])
    if path == "/readlines":
        return _json(start_response, [line.decode("latin-1") for line in stream.readlines()])
    if path == "/stream":
        return _stream(start_response, int(_query(environ)["n"]))
    if path == "/write":
        return _write(start_response)
    if path == "/error-before":
        key = _query(environ).get("key", "")
        raise RuntimeError(f"deliberate failure before start_response {key}")
    if path == "/error-mid-stream":
        return _error_mid_stream(start_response)
    if path == "/exc-info":
        return _exc_info(start_response)
    if path == "/no-start-response":
        return [b"x"]
    if path == "/close-tracking":
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "7")])
        return _CloseTracking()
    if path == "/close-count":
        return _text(start_response, str(_closes.value()).encode())
    if path == "/sleep":
        return _sleep(environ, start_response)
    if path == "/slow":
        return _slow(environ, start_response)
    if path == "/big":
        return _big(environ, start_response)
    if path == "/declared":
        return _declared(environ, start_response)
    if path == "/file-wrapper":
        return _file_wrapper(environ, start_response)
    if path == "/file-closes":
        return _text(start_response, str(_file_closes.value()).encode())
    if path == "/produced":
        return _text(start_response, str(_produced).encode())
    if path == "/status":
        return _status(environ, start_response)
    if path == "/bad-header":
        # ?key= in the header's name (so the error names it), a NUL in its value.
        key = _query(environ)["key"]
        start_response("200 OK", [("Content-Type", "text/plain"), (f"X-Bad-{key}", "a\x00b")])
        return [b"never sent"]
    if path.startswith("/unicode-path/"):
        return _text(start_response, path.encode("latin-1"))
    return _text(start_response, b"not found", "404 Not Found")
