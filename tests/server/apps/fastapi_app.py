"""A FastAPI app: pydantic JSON bodies, path parameters, streaming, background tasks and
lifespan state. ``FERROLOOP_TEST_MARKER_DIR`` is where background tasks write their markers."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import BackgroundTasks, FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from pydantic import BaseModel


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, str]]:
    yield {"greeting": "hello from the fastapi lifespan"}


app = FastAPI(lifespan=lifespan)


class Item(BaseModel):
    name: str
    price: float
    tags: list[str] = []


@app.post("/items")
async def create_item(item: Item) -> dict[str, object]:
    return {"item": item.model_dump(), "total": item.price * 2}


@app.get("/items/{item_id}")
async def read_item(item_id: int, q: str | None = None) -> dict[str, object]:
    return {"item_id": item_id, "q": q}


@app.get("/stream")
async def stream(count: int = 5) -> StreamingResponse:
    async def lines() -> AsyncIterator[bytes]:
        for index in range(count):
            yield f"line {index}\n".encode()

    return StreamingResponse(lines(), media_type="text/plain")


def write_marker(name: str) -> None:
    Path(os.environ["FERROLOOP_TEST_MARKER_DIR"], name).write_text("done")


@app.post("/background/{name}")
async def background(name: str, tasks: BackgroundTasks) -> dict[str, str]:
    tasks.add_task(write_marker, name)
    return {"scheduled": name}


@app.get("/state")
async def state(request: Request) -> dict[str, str]:
    return {"greeting": request.state.greeting}


@app.websocket("/ws/items")
async def items_socket(websocket: WebSocket, prefix: str = "item") -> None:
    await websocket.accept()
    try:
        while True:
            item = await websocket.receive_json()
            await websocket.send_json({prefix: item["name"]})
    except WebSocketDisconnect:
        return
