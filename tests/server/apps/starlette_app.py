"""A Starlette app: JSON echo, a streaming response and lifespan state."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[dict[str, str]]:
    yield {"greeting": "hello from the starlette lifespan"}


async def echo(request: Request) -> JSONResponse:
    payload = await request.json()
    return JSONResponse({"received": payload, "keys": sorted(payload)})


async def stream(request: Request) -> StreamingResponse:
    count = int(request.query_params.get("count", "4"))

    async def parts() -> AsyncIterator[bytes]:
        for index in range(count):
            yield f"part {index};".encode()

    return StreamingResponse(parts(), media_type="text/plain")


async def state(request: Request) -> JSONResponse:
    return JSONResponse({"greeting": request.state.greeting})


async def websocket(ws: WebSocket) -> None:
    await ws.accept()
    try:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("text") is not None:
                await ws.send_text("pong: " + message["text"])
            else:
                await ws.send_bytes(message["bytes"][::-1])
    except WebSocketDisconnect:
        return


app = Starlette(
    routes=[
        WebSocketRoute("/ws", websocket),
        Route("/echo", echo, methods=["POST"]),
        Route("/stream", stream),
        Route("/state", state),
    ],
    lifespan=lifespan,
)
