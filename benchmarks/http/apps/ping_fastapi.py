"""FastAPI `GET /ping` -> `{"ping": "pong"}`: what a typical small JSON endpoint costs.

Routing, dependency resolution, response validation and JSON encoding dominate here, so the
server's share is smaller than in the hello world; this is the case most users actually run.
"""

from fastapi import FastAPI

app = FastAPI()


@app.get("/ping")
async def ping() -> dict[str, str]:
    return {"ping": "pong"}
