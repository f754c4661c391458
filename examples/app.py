"""An ASGI 3 app for ``make run``: ``ferroloop app:app --app-dir examples``.

Routes: ``GET /`` says hello, ``POST /echo`` returns the request body, ``GET /stream`` streams
five chunks, ``GET /state`` shows the lifespan state every request scope gets a copy of, and the
WebSocket ``ws://127.0.0.1:8000/ws`` echoes every message back (text upper-cased), e.g.
``python -m websockets ws://127.0.0.1:8000/ws``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                scope["state"]["started"] = True
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] == "websocket":
        await websocket_echo(receive, send)
        return
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/echo" and scope["method"] == "POST":
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await respond(send, 200, bytes(body), b"application/octet-stream")
    elif path == "/stream":
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/plain")],
            }
        )
        for i in range(5):
            await send(
                {"type": "http.response.body", "body": f"chunk {i}\n".encode(), "more_body": True}
            )
            await asyncio.sleep(0.05)
        await send({"type": "http.response.body", "body": b""})
    elif path == "/state":
        await respond(send, 200, json.dumps(scope.get("state", {})).encode(), b"application/json")
    elif path == "/":
        await respond(send, 200, b"Hello from ferroloop!\n", b"text/plain")
    else:
        await respond(send, 404, b"Not Found\n", b"text/plain")


async def respond(send: Any, status: int, body: bytes, content_type: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def websocket_echo(receive: Any, send: Any) -> None:
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        if message.get("text") is not None:
            await send({"type": "websocket.send", "text": message["text"].upper()})
        else:
            await send({"type": "websocket.send", "bytes": message["bytes"]})
