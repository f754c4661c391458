"""A Flask app (WSGI): JSON echo, a streaming response that reads the request inside the
stream, send_file of this very file, and URLs built with url_for (they include SCRIPT_NAME)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from flask import Flask, Response, jsonify, request, send_file, stream_with_context, url_for

app = Flask(__name__)


@app.post("/json")
def echo_json() -> Response:
    payload = request.get_json()
    return jsonify({"received": payload, "keys": sorted(payload)})


@app.get("/stream")
def stream() -> Response:
    @stream_with_context
    def lines() -> Iterator[bytes]:
        # request is only usable here, after the view returned, through stream_with_context.
        for index in range(int(request.args["count"])):
            yield f"line {index} of {request.path}\n".encode()

    return Response(lines(), mimetype="text/plain")


@app.get("/file")
def file() -> Response:
    return send_file(Path(__file__), mimetype="text/x-python")


@app.get("/urls")
def urls() -> Response:
    return jsonify(
        {
            "json": url_for("echo_json"),
            "file": url_for("file"),
            "script_root": request.script_root,
            "path": request.path,
        }
    )
