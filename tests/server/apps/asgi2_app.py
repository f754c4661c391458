"""An ASGI 2 ("double callable", class style) app: the server must detect and wrap it."""

from __future__ import annotations

from typing import Any


class App:
    def __init__(self, scope: dict[str, Any]) -> None:
        assert scope["type"] in ("http", "lifespan"), scope["type"]
        self.scope = scope

    async def __call__(self, receive: Any, send: Any) -> None:
        if self.scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = f"asgi2 {self.scope['method']} {self.scope['path']}".encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
