"""The FastAPI app of the isolation benchmark: large JSON uploads next to cheap endpoints.

- `POST /upload/list` takes `{"items": [str, ...]}` (pydantic `Items`) and answers
  `{"count": len(items), "pid": PID}`: the expensive body, about 1.8 M short strings in 25 MB,
  each one a Python `str` to build and a pydantic item to validate.
- `POST /upload/string` takes `{"data": str}` (`Blob`) and answers `{"count": len(data), ...}`:
  the same 25 MB as one string, cheap to parse and validate; what is left is moving the bytes.
- `GET /ping` answers `{"ping": "pong"}`: the health check or small read that has to stay fast.
- `GET /pid` answers `{"pid": PID}`, and the uploads answer with `"pid"` too: which worker
  process served a connection, so the report can tell whether the small client's keep-alive
  connection shared its worker with the uploads.

The endpoints are `async def`, as in FastAPI's tutorial: FastAPI reads the body, runs
`json.loads` and validates the model on the event loop's thread in either case (a `def`
endpoint only moves the function's own call to a thread), so while one upload is being parsed,
its worker's loop runs nothing else. The same module is served by every server.

If `ISOLATION_READY_DIR` is set, each serving process writes `{pid}.ready` there at lifespan
startup, so the benchmark can wait until all `--workers` have the app loaded (a supervisor that
imports the app without serving it writes nothing).
"""

import os
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from pydantic import BaseModel


class Items(BaseModel):
    items: list[str]


class Blob(BaseModel):
    data: str


@asynccontextmanager
async def lifespan(app: FastAPI):
    ready_dir = os.environ.get("ISOLATION_READY_DIR")
    if ready_dir:
        Path(ready_dir, f"{os.getpid()}.ready").write_text("")
    yield


app = FastAPI(lifespan=lifespan)


@app.get("/ping")
async def ping() -> dict[str, str]:
    return {"ping": "pong"}


@app.get("/pid")
async def pid() -> dict[str, int]:
    return {"pid": os.getpid()}


@app.post("/upload/list")
async def upload_list(body: Items) -> dict[str, int]:
    return {"count": len(body.items), "pid": os.getpid()}


@app.post("/upload/string")
async def upload_string(body: Blob) -> dict[str, int]:
    return {"count": len(body.data), "pid": os.getpid()}
