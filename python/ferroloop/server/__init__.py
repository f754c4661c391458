"""ferroloop's ASGI server, the Python side: options, app loading, CLI, lifespan, logging,
graceful shutdown, workers and reload. The HTTP path itself is native
(``ferroloop._native.HttpServer``); see docs/server.md.

    ferroloop main:app --workers 4            # command line (uvicorn's options)
    ferroloop.server.serve("main:app", port=8000)
    ferroloop.run(Server(Config(app)).serve())
"""

from __future__ import annotations

from .._native import ClientDisconnected
from .config import Config
from .serve import serve
from .server import Server

__all__ = ["ClientDisconnected", "Config", "Server", "serve"]
