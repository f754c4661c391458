"""A plain ASGI 3 app (no framework) with one endpoint per behaviour the server tests probe.

Results that a test cannot see in the response itself (a disconnect the app observed, how far
a stream got before the client stopped reading) are kept in this process (with ``--workers``, in
a directory all the workers share: ``shared_state.py``) and read back through
``/result?key=...`` on a new connection; tests use a fresh key each time.

Lifespan: startup puts ``{"token": "lifespan-state-ok"}`` into the state; if the environment
names ``FERROLOOP_TEST_MARKER_DIR``, startup and shutdown each write a file there.

Other entry points: ``create_app`` (for ``--factory``), ``no_lifespan_app`` (raises on a
lifespan scope, as apps without lifespan support do), ``failing_startup_app`` (answers the
startup event with ``lifespan.startup.failed``).
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import hashlib
import json
import os
import random
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from shared_state import SharedDict

# Shared by the workers of a server started with --workers (see shared_state.py).
RESULTS = SharedDict("results")
RELEASED = SharedDict("released")

CHUNK = 65536


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("latin-1")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)


def _query(scope: dict[str, Any]) -> dict[str, str]:
    return dict(parse_qsl(scope["query_string"].decode("latin-1")))


def _marker(name: str) -> None:
    directory = os.environ.get("FERROLOOP_TEST_MARKER_DIR")
    if directory:
        Path(directory, name).write_text(str(os.getpid()))


async def _respond(
    send: Any,
    body: bytes,
    status: int = 200,
    content_type: bytes = b"text/plain",
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _json(send: Any, value: Any, status: int = 200) -> None:
    await _respond(send, json.dumps(value).encode(), status, b"application/json")


async def _read_body(receive: Any) -> tuple[bytes, list[str]]:
    """The whole request body, and the types of the messages that carried it."""
    body = bytearray()
    types: list[str] = []
    while True:
        message = await receive()
        types.append(message["type"])
        if message["type"] != "http.request":
            return bytes(body), types
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return bytes(body), types


async def lifespan(scope: dict[str, Any], receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            if "state" in scope:
                scope["state"]["token"] = "lifespan-state-ok"
            _marker("startup")
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            _marker("shutdown")
            await send({"type": "lifespan.shutdown.complete"})
            return


# ----------------------------------------------------------------------------- endpoints


async def hello(scope: Any, receive: Any, send: Any) -> None:
    await _respond(send, b"hello, world")


async def echo(scope: Any, receive: Any, send: Any) -> None:
    body, types = await _read_body(receive)
    await _respond(send, body, headers=[(b"x-receive-count", str(len(types)).encode())])


async def digest(scope: Any, receive: Any, send: Any) -> None:
    """Consume the body slowly (a pause every few messages); report its length and sha256."""
    sha = hashlib.sha256()
    length = 0
    messages = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return
        chunk = message.get("body", b"")
        sha.update(chunk)
        length += len(chunk)
        messages += 1
        if messages % 8 == 0:
            await asyncio.sleep(0.001)
        if not message.get("more_body", False):
            break
    await _json(send, {"length": length, "sha256": sha.hexdigest()})


async def dump_scope(scope: Any, receive: Any, send: Any) -> None:
    """The scope as JSON (bytes decoded as latin-1), plus the Python types JSON loses."""
    await _read_body(receive)
    dumped = _jsonable(scope)
    dumped["_types"] = {
        "headers": type(scope["headers"]).__name__,
        "header_items": sorted(
            {f"{type(k).__name__},{type(v).__name__}" for k, v in scope["headers"]}
        ),
        "raw_path": type(scope.get("raw_path")).__name__,
        "query_string": type(scope["query_string"]).__name__,
        "client": type(scope.get("client")).__name__,
        "server": type(scope.get("server")).__name__,
    }
    await _json(send, dumped)


async def mutate_state(scope: Any, receive: Any, send: Any) -> None:
    """Report the state this request saw, then scribble on it (must not leak to others)."""
    seen = _jsonable(dict(scope.get("state", {})))
    scope.get("state", {})["scribbled"] = "by an earlier request"
    await _json(send, seen)


async def chunked_response(scope: Any, receive: Any, send: Any) -> None:
    parts = int(_query(scope).get("parts", "3"))
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for index in range(parts):
        body = f"part {index}\n".encode()
        await send({"type": "http.response.body", "body": body, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def single_body_no_length(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"one body, no length"})


async def respond_without_reading(scope: Any, receive: Any, send: Any) -> None:
    await _respond(send, b"did not read the body")


async def block_then_respond(scope: Any, receive: Any, send: Any) -> None:
    """Blocks the loop for ``?ms=`` milliseconds (``time.sleep``), yields once, then answers: what
    the client did meanwhile (say a half-close) reaches the server in the same loop iteration
    as this response, right behind it."""
    time.sleep(int(_query(scope).get("ms", "300")) / 1000)
    await asyncio.sleep(0)
    await _respond(send, b"answered after blocking")


async def raise_before_start(scope: Any, receive: Any, send: Any) -> None:
    key = _query(scope).get("key", "")
    raise RuntimeError(f"deliberate failure before the response started {key}")


async def raise_after_start(scope: Any, receive: Any, send: Any) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100")]}
    )
    await send({"type": "http.response.body", "body": b"0123456789", "more_body": True})
    raise RuntimeError("deliberate failure after the response started")


async def raise_after_start_chunked(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"0123456789", "more_body": True})
    raise RuntimeError("deliberate failure after the response started")


async def cancel_self(scope: Any, receive: Any, send: Any) -> None:
    """The app's task cancels itself before responding; the cancel message is the ``key``
    reversed (the key itself is in the access log)."""
    asyncio.current_task().cancel(_query(scope)["key"][::-1])  # type: ignore[union-attr]
    await asyncio.sleep(0)


async def no_response(scope: Any, receive: Any, send: Any) -> None:
    await _read_body(receive)


async def incomplete_response(scope: Any, receive: Any, send: Any) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100")]}
    )
    await send({"type": "http.response.body", "body": b"0123456789", "more_body": True})


async def record_disconnect(scope: Any, receive: Any, send: Any) -> None:
    """Receive until something other than a body part arrives; record what and how much."""
    key = _query(scope)["key"]
    RESULTS[key + ":started"] = True
    received = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            RESULTS[key] = {"type": message["type"], "received": received}
            return
        received += len(message.get("body", b""))
        if not message.get("more_body", False):
            # The body is complete; the next receive() waits for the disconnect.
            RESULTS[key + ":complete"] = received


async def respond_after_disconnect(scope: Any, receive: Any, send: Any) -> None:
    """Read the body, wait for what comes next (``http.disconnect`` once the client has shut
    its side), then respond anyway: a half-closed client still reads."""
    body, types = await _read_body(receive)
    if types[-1] == "http.request":
        types.append((await receive())["type"])
    await _respond(send, f"{len(body)} {types[-1]}".encode())


async def result(scope: Any, receive: Any, send: Any) -> None:
    key = _query(scope)["key"]
    if key in RESULTS:
        await _json(send, RESULTS[key])
    else:
        await _json(send, None, status=404)


async def stream(scope: Any, receive: Any, send: Any) -> None:
    """``size`` pseudo-random bytes in CHUNK parts; the sha256 is sent in a header up front."""
    size = int(_query(scope)["size"])
    rng = random.Random(size)
    chunks = []
    remaining = size
    while remaining > 0:
        chunks.append(rng.randbytes(min(CHUNK, remaining)))
        remaining -= len(chunks[-1])
    sha = hashlib.sha256(b"".join(chunks)).hexdigest().encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(size).encode()), (b"x-sha256", sha)],
        }
    )
    for chunk in chunks:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def stream_unbounded(scope: Any, receive: Any, send: Any) -> None:
    """Send up to ``total`` bytes as fast as send() lets us; RESULTS[key] counts them."""
    query = _query(scope)
    key, total = query["key"], int(query["total"])
    RESULTS[key] = 0
    await send({"type": "http.response.start", "status": 200, "headers": []})
    chunk = b"x" * CHUNK
    try:
        while RESULTS[key] < total:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            RESULTS[key] += len(chunk)
        await send({"type": "http.response.body", "body": b""})
    except OSError:
        pass  # ASGI 2.4: send() may raise once the client is gone


async def concurrent_sends(scope: Any, receive: Any, send: Any) -> None:
    """``parts`` body parts of CHUNK bytes sent two at a time (two send() calls waiting at
    once, as two tasks of an app may do), then the end; every send() must return."""
    parts = int(_query(scope)["parts"])
    size = parts * CHUNK
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(size).encode())],
        }
    )
    chunk = b"c" * CHUNK
    for _ in range(parts // 2):
        await asyncio.gather(
            send({"type": "http.response.body", "body": chunk, "more_body": True}),
            send({"type": "http.response.body", "body": chunk, "more_body": True}),
        )
    await send({"type": "http.response.body", "body": b""})


async def hold_upload(scope: Any, receive: Any, send: Any) -> None:
    """Do not call receive() until /release?key=... was requested; then digest the body."""
    key = _query(scope)["key"]
    RESULTS[key] = "holding"
    while key not in RELEASED:
        await asyncio.sleep(0.01)
    await digest(scope, receive, send)


async def upload_chunks(scope: Any, receive: Any, send: Any) -> None:
    """Receive the body one message at a time and answer with the size of each body part.

    With ``mark_at=K`` the app first connects to this server itself and, right after the
    K-th part arrived, sends ``GET /mark?key=...`` on that connection (from this coroutine, so
    the small request leaves at a known point of the upload); the answer's ``"mark"`` is how
    many parts this upload had received when the app of that small request ran.
    """
    query = _query(scope)
    key, mark_at = query["key"], int(query.get("mark_at", "0"))
    sizes: list[int] = []
    RESULTS[f"{key}:parts"] = sizes
    loop = asyncio.get_running_loop()
    probe = None
    if mark_at:
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        probe.setblocking(False)
        await loop.sock_connect(probe, tuple(scope["server"]))
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return
        sizes.append(len(message["body"]))
        if probe is not None and len(sizes) == mark_at:
            # A few dozen bytes into an empty socket buffer: taken at once.
            probe.send(f"GET /mark?key={key} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        if not message.get("more_body", False):
            break
    if probe is not None:
        answer = await loop.sock_recv(probe, 4096)
        probe.close()
        assert answer.startswith(b"HTTP/1.1 200"), answer
    await _json(send, {"sizes": sizes, "mark": RESULTS.pop(f"{key}:mark", None)})


async def mark(scope: Any, receive: Any, send: Any) -> None:
    """Record how many body parts the upload with this key has received so far."""
    key = _query(scope)["key"]
    RESULTS[f"{key}:mark"] = len(RESULTS[f"{key}:parts"])
    await _respond(send, b"marked")


async def release(scope: Any, receive: Any, send: Any) -> None:
    RELEASED[_query(scope)["key"]] = True
    await _respond(send, b"released")


RELEASE_POLLS = 3000  # 10 ms apart: a test that never releases is cut off after 30 s


async def _released(scope: dict[str, Any]) -> None:
    """Wait (without blocking the loop) until the file named by ``?release=`` exists."""
    release_file = Path(_query(scope)["release"])
    for _ in range(RELEASE_POLLS):
        if release_file.exists():
            return
        await asyncio.sleep(0.01)


async def slow(scope: Any, receive: Any, send: Any) -> None:
    """Start a chunked response, then finish it once the file ``release`` exists."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"started\n", "more_body": True})
    await _released(scope)
    await send({"type": "http.response.body", "body": b"finished\n"})


async def block(scope: Any, receive: Any, send: Any) -> None:
    """Block the whole loop (a synchronous wait, as a blocking app does) until the file
    ``release`` exists; meanwhile requests pile up in the sockets, and the loop then finds
    them all ready at once."""
    release_file = Path(_query(scope)["release"])
    _marker("blocking")
    for _ in range(RELEASE_POLLS):
        if release_file.exists():
            break
        time.sleep(0.01)
    await _respond(send, b"unblocked")


async def linger(scope: Any, receive: Any, send: Any) -> None:
    """Respond at once, then keep the task running (background work) until the file
    ``release`` exists."""
    await _respond(send, b"lingering")
    await _released(scope)


async def gc_counts(scope: Any, receive: Any, send: Any) -> None:
    """How many collections each generation of the cyclic garbage collector has run."""
    await _json(send, [generation["collections"] for generation in gc.get_stats()])


async def sleep(scope: Any, receive: Any, send: Any) -> None:
    """Answer after ``?s=`` seconds (0.5 by default) of asyncio.sleep: a request that is in
    flight for a known time without blocking the loop."""
    await asyncio.sleep(float(_query(scope).get("s", "0.5")))
    await _respond(send, f"slept {os.getpid()}".encode())


async def pid(scope: Any, receive: Any, send: Any) -> None:
    await _json(send, {"pid": os.getpid(), "ppid": os.getppid()})


async def declared_length(scope: Any, receive: Any, send: Any) -> None:
    """Declare ``content-length: <declare>`` and send the comma-separated ``parts``; what
    send() raised, if anything, is kept under ``key``."""
    query = _query(scope)
    parts = [part.encode() for part in query["parts"].split(",")]
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", query["declare"].encode())],
        }
    )
    try:
        for index, part in enumerate(parts):
            more = index < len(parts) - 1
            await send({"type": "http.response.body", "body": part, "more_body": more})
    except Exception as exc:
        RESULTS[query["key"]] = f"{type(exc).__name__}: {exc}"
        raise
    RESULTS[query["key"]] = "no error"


class _HeaderList(list):
    """A list subclass: the server must iterate it, not read it by index."""


def _header_shapes(shape: str) -> Any:
    pairs = [(b"content-length", b"2"), (b"x-shape", shape.encode())]
    shapes: dict[str, Any] = {
        "list-of-tuples": lambda: pairs,
        "tuple-of-tuples": lambda: tuple(pairs),
        "list-of-lists": lambda: [list(p) for p in pairs],
        "generator": lambda: (p for p in pairs),
        "list-subclass": lambda: _HeaderList(pairs),
        "three-item-tuple": lambda: [*pairs, (b"x-a", b"1", b"extra")],
        "one-item-list": lambda: [*pairs, [b"x-a"]],
        "str-value": lambda: [*pairs, (b"x-a", "1")],
    }
    return shapes[shape]()


async def header_shapes(scope: Any, receive: Any, send: Any) -> None:
    """Response headers in the container named by ``shape`` (valid ones add ``x-shape``)."""
    headers = _header_shapes(_query(scope)["shape"])
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


async def pathsend(scope: Any, receive: Any, send: Any) -> None:
    path = _query(scope)["path"]
    size = os.path.getsize(path)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(size).encode())],
        }
    )
    await send({"type": "http.response.pathsend", "path": path})


async def zerocopysend(scope: Any, receive: Any, send: Any) -> None:
    query = _query(scope)
    offset, count = int(query["offset"]), int(query["count"])
    with open(query["path"], "rb") as file:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(count).encode())],
            }
        )
        await send(
            {"type": "http.response.zerocopysend", "file": file, "offset": offset, "count": count}
        )


async def trailers(scope: Any, receive: Any, send: Any) -> None:
    parts = [b"first part\n", b"second part\n"]
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"trailer", b"x-digest")],
            "trailers": True,
        }
    )
    for part in parts:
        await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    digest = hashlib.sha256(b"".join(parts)).hexdigest().encode()
    await send(
        {
            "type": "http.response.trailers",
            "headers": [(b"x-digest", digest)],
            "more_trailers": False,
        }
    )


async def split_trailers(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [], "trailers": True})
    await send({"type": "http.response.body", "body": b"body", "more_body": False})
    await send(
        {"type": "http.response.trailers", "headers": [(b"x-one", b"1")], "more_trailers": True}
    )
    await send(
        {"type": "http.response.trailers", "headers": [(b"x-two", b"2")], "more_trailers": False}
    )


REQUEST_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("request_var", default="unset")
# Set when the server imports the app, in the context the server starts in: a request sees it
# unless the server runs requests in a new empty context (--reset-contextvars).
SERVER_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("server_var", default="unset")
SERVER_VAR.set("set-at-import")


async def server_var(scope: Any, receive: Any, send: Any) -> None:
    await _respond(send, SERVER_VAR.get().encode())


async def with_header(scope: Any, receive: Any, send: Any) -> None:
    """Responds with the header ``?name=`` set to ``?value=``."""
    query = _query(scope)
    await _respond(send, b"ok", headers=[(query["name"].encode(), query["value"].encode())])


async def with_status(scope: Any, receive: Any, send: Any) -> None:
    """Responds with the status ``?code=``; what send() raised, if anything, is kept under
    ``?key=`` and raised again."""
    query = _query(scope)
    try:
        await _respond(send, b"ok", status=int(query["code"]))
    except Exception as exc:
        RESULTS[query["key"]] = f"{type(exc).__name__}: {exc}"
        raise


async def task_info(scope: Any, receive: Any, send: Any) -> None:
    """How the app is driven: its task and context as seen in the first step and after an
    ``await`` that suspends. ``?value=`` is set into a context variable in between."""
    task = asyncio.current_task()
    first = {
        "task_type": f"{type(task).__module__}.{type(task).__qualname__}",
        "done": task.done() if task is not None else None,
        "in_all_tasks": task in asyncio.all_tasks(),
        "coro_running": task is not None and task.get_coro().cr_running,
        "var": REQUEST_VAR.get(),
        "name": task.get_name() if task is not None else None,
    }
    REQUEST_VAR.set(_query(scope).get("value", ""))
    await asyncio.sleep(0)
    after = {"same_task": asyncio.current_task() is task, "var": REQUEST_VAR.get()}
    await _json(send, {"first": first, "after": after})


ROUTES = {
    "/": hello,
    "/hello": hello,
    "/echo": echo,
    "/digest": digest,
    "/scope": dump_scope,
    "/mutate-state": mutate_state,
    "/chunked-response": chunked_response,
    "/no-length": single_body_no_length,
    "/respond-without-reading": respond_without_reading,
    "/block-then-respond": block_then_respond,
    "/raise-before-start": raise_before_start,
    "/raise-after-start": raise_after_start,
    "/raise-after-start-chunked": raise_after_start_chunked,
    "/no-response": no_response,
    "/cancel-self": cancel_self,
    "/incomplete-response": incomplete_response,
    "/record-disconnect": record_disconnect,
    "/respond-after-disconnect": respond_after_disconnect,
    "/result": result,
    "/stream": stream,
    "/stream-unbounded": stream_unbounded,
    "/hold-upload": hold_upload,
    "/upload-chunks": upload_chunks,
    "/mark": mark,
    "/concurrent-sends": concurrent_sends,
    "/release": release,
    "/slow": slow,
    "/pid": pid,
    "/sleep": sleep,
    "/block": block,
    "/linger": linger,
    "/gc-counts": gc_counts,
    "/pathsend": pathsend,
    "/declared-length": declared_length,
    "/zerocopysend": zerocopysend,
    "/trailers": trailers,
    "/split-trailers": split_trailers,
    "/header-shapes": header_shapes,
    "/task-info": task_info,
    "/server-var": server_var,
    "/with-header": with_header,
    "/with-status": with_status,
}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(scope, receive, send)
        return
    assert scope["type"] == "http", scope["type"]
    path = scope["path"]
    root_path = scope.get("root_path", "")
    if root_path and path.startswith(root_path):
        path = path[len(root_path) :] or "/"
    handler = ROUTES.get(path, dump_scope if path.startswith("/scope/") else None)
    if handler is None:
        await _respond(send, b"not found", status=404)
        return
    await handler(scope, receive, send)


def create_app() -> Any:
    """An app factory (``--factory``): the same app, with a header saying where it came from."""

    async def made_by_factory(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/factory":
            await _respond(send, b"made by the factory")
            return
        await app(scope, receive, send)

    return made_by_factory


async def no_lifespan_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        raise RuntimeError(f"this app does not support {scope['type']!r} scopes")
    await app(scope, receive, send)


async def failing_startup_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        message = await receive()
        assert message["type"] == "lifespan.startup"
        await send({"type": "lifespan.startup.failed", "message": "deliberate startup failure"})
        return
    await app(scope, receive, send)
