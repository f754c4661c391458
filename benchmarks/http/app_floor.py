"""The app's own CPU cost per request, with no server: a floor for any server's req/s.

    python benchmarks/http/app_floor.py [--requests 20000] [--rounds 5]

Calls an ASGI app (`benchmarks/http/apps`: the hello world and FastAPI `GET /ping`) directly,
one request after another in one coroutine on a ferroloop loop, with a prebuilt scope, a
`receive` that returns the empty body and a `send` that drops the messages: no socket, no
parser, no task per request. The CPU time per call (process time, medians over rounds) is
what the app alone costs; `cores / cost` is the most requests per second any server could
serve with that many cores given entirely to the app, before the server's and the load
generator's own work. Issue 27 compares ferroloop `--workers 2` with granian `--workers 2` on
this 2-core machine; this shows how far the app leaves room for that.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "apps"))

APPS = {"hello": ("hello_asgi", "/"), "fastapi": ("ping_fastapi", "/ping")}


def scope(path: str) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"wrk")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }


async def calls(app, path: str, n: int) -> float:
    """CPU seconds for n requests."""
    request = {"type": "http.request", "body": b"", "more_body": False}
    sent = []

    async def receive() -> dict:
        return request

    async def send(message: dict) -> None:
        sent.append(message)

    start = time.process_time()
    for _ in range(n):
        await app(dict(scope(path)), receive, send)
        if len(sent) > 64:
            sent.clear()
    return time.process_time() - start


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    import ferroloop

    for name, (module, path) in APPS.items():
        app = importlib.import_module(module).app
        costs = []
        for _ in range(args.rounds):
            loop = ferroloop.new_event_loop()
            try:
                loop.run_until_complete(calls(app, path, 1000))  # warm-up
                costs.append(loop.run_until_complete(calls(app, path, args.requests)))
            finally:
                loop.close()
        per = statistics.median(costs) / args.requests
        print(
            f"{name:8} {per * 1e6:6.1f} us CPU per request (app alone); "
            f"1 core: {1 / per:8,.0f} req/s, 2 cores: {2 / per:8,.0f} req/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
