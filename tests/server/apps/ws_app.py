"""A raw ASGI app for the WebSocket tests: the path picks the behaviour.

WebSocket paths (``ws://host/PATH``):

* ``/echo``: accepts (with the first offered subprotocol), then echoes every text and binary
  message until the client leaves; the disconnect message is recorded.
* ``/scope``: accepts and sends the scope (without ``state``) as JSON text.
* ``/headers``: accepts with an extra response header ``x-ws: yes``.
* ``/reject``: answers ``websocket.connect`` with ``websocket.close`` (a 403).
* ``/deny``: answers with ``websocket.http.response.start`` 401 and a body in two parts.
* ``/noaccept``: returns without accepting; ``/raise-before``: raises before accepting.
* ``/raise-after``: accepts, then raises; ``/return-after``: accepts, then returns.
* ``/close-code``: accepts and closes with 4001 "bye", then records what ``receive()`` gives.
* ``/wait``: accepts and waits for the disconnect, which it records.
* ``/send-after-close``: accepts, waits for the disconnect, then tries to send, and records the
  exception that raised.
* ``/bulk``: accepts, reads a text count N, sends N binary messages of 64 KiB (each filled
  with its index), then a text "done".

HTTP paths: ``/last`` returns what the last WebSocket recorded, as JSON, and ``/plain`` returns
the scope's type (for ``--ws none``).
"""

from __future__ import annotations

import json

from shared_state import SharedDict

# Shared by the workers of a server started with --workers (see shared_state.py).
RECORDED = SharedDict("recorded")


async def _http(scope, receive, send):
    if scope["path"] == "/last":
        body = json.dumps(dict(RECORDED)).encode()
    else:
        headers = dict(scope["headers"])
        body = json.dumps(
            {"type": scope["type"], "upgrade": headers.get(b"upgrade", b"").decode()}
        ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _until_disconnect(receive):
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return message


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    if scope["type"] == "http":
        await _http(scope, receive, send)
        return
    path = scope["path"]
    connect = await receive()
    assert connect == {"type": "websocket.connect"}, connect
    if path == "/reject":
        await send({"type": "websocket.close"})
        return
    if path == "/deny":
        await send(
            {
                "type": "websocket.http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"text/plain"), (b"x-denied", b"1")],
            }
        )
        await send({"type": "websocket.http.response.body", "body": b"go ", "more_body": True})
        await send({"type": "websocket.http.response.body", "body": b"away"})
        return
    if path == "/noaccept":
        return
    if path == "/raise-before":
        raise RuntimeError("raised before accepting")
    subprotocols = scope["subprotocols"]
    accept = {"type": "websocket.accept", "subprotocol": subprotocols[0] if subprotocols else None}
    if path == "/headers":
        accept["headers"] = [(b"x-ws", b"yes")]
    await send(accept)
    if path == "/raise-after":
        raise RuntimeError("raised after accepting")
    if path == "/return-after":
        return
    if path == "/scope":
        shown = {key: value for key, value in scope.items() if key != "state"}
        shown["headers"] = [[n.decode(), v.decode()] for n, v in scope["headers"]]
        for key in ("raw_path", "query_string"):
            shown[key] = scope[key].decode()
        shown["server"] = list(scope["server"])
        shown["client"] = list(scope["client"])
        await send({"type": "websocket.send", "text": json.dumps(shown)})
        await _until_disconnect(receive)
        return
    if path == "/close-code":
        await send({"type": "websocket.close", "code": 4001, "reason": "bye"})
        RECORDED.clear()
        RECORDED["after_close"] = await receive()
        return
    if path == "/wait":
        RECORDED.clear()
        RECORDED["disconnect"] = await _until_disconnect(receive)
        return
    if path == "/send-after-close":
        RECORDED.clear()
        RECORDED["disconnect"] = await _until_disconnect(receive)
        try:
            await send({"type": "websocket.send", "text": "too late"})
        except Exception as exc:  # the test checks which one
            RECORDED["error"] = type(exc).__name__
            RECORDED["is_oserror"] = isinstance(exc, OSError)
        return
    if path == "/bulk":
        message = await receive()
        count = int(message["text"])
        for index in range(count):
            await send({"type": "websocket.send", "bytes": bytes([index % 256]) * 65536})
        await send({"type": "websocket.send", "text": "done"})
        await _until_disconnect(receive)
        return
    # /echo
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            RECORDED.clear()
            RECORDED["disconnect"] = message
            return
        if message.get("text") is not None:
            await send({"type": "websocket.send", "text": message["text"]})
        else:
            await send({"type": "websocket.send", "bytes": message["bytes"]})
