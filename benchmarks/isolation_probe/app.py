"""The probe's FastAPI app: a large JSON upload parsed by pydantic, and a tiny GET."""

from __future__ import annotations

from fastapi import FastAPI, Request
from pydantic import BaseModel

app = FastAPI()


class Items(BaseModel):
    items: list[str]


class Text(BaseModel):
    text: str


@app.post("/upload/items")
async def upload_items(body: Items) -> dict[str, int]:
    return {"n": len(body.items)}


@app.post("/upload/text")
async def upload_text(body: Text) -> dict[str, int]:
    return {"n": len(body.text)}


@app.get("/ping")
async def ping() -> dict[str, bool]:
    return {"ok": True}


@app.post("/upload/sink")
async def upload_sink(request: Request) -> dict[str, int]:
    """Reads the body chunk by chunk and drops it: the cost of body delivery alone."""
    n = 0
    async for chunk in request.stream():
        n += len(chunk)
    return {"n": n}
