"""Flask `GET /ping` -> `{"ping": "pong"}`: what a typical small JSON endpoint of a WSGI app costs.

The WSGI twin of `ping_fastapi.py`. Flask's routing, request and response objects and JSON
encoding dominate, so the server's share is smaller than in the hello world; this is the case most
WSGI users actually run.
"""

from flask import Flask

app = Flask(__name__)


@app.get("/ping")
def ping() -> dict[str, str]:
    return {"ping": "pong"}
