"""A plain WSGI app for ferroloop's WSGI mode: a greeting, a request-body echo and a streamed
countdown.

    python -m ferroloop wsgi_demo:app --app-dir examples --interface wsgi
    curl http://127.0.0.1:8000/
    curl -d 'hello' http://127.0.0.1:8000/echo
    curl -N http://127.0.0.1:8000/countdown
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def countdown() -> Iterator[bytes]:
    for n in range(5, 0, -1):
        yield b"%d\n" % n  # each line goes out as it is yielded
        time.sleep(0.5)  # blocking is fine: the app runs in a pool thread, not on the loop
    yield b"liftoff\n"


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    path = environ["PATH_INFO"]
    if path == "/echo":
        body = environ["wsgi.input"].read()
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return [body]
    if path == "/countdown":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return countdown()
    if path == "/":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"Hello from a WSGI app on ferroloop\n"]
    start_response("404 Not Found", [("Content-Type", "text/plain")])
    return [b"not found\n"]
