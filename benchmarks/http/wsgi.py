"""WSGI server benchmarks: ferroloop against granian, uvicorn, hypercorn and gunicorn in one run.

    python benchmarks/http/wsgi.py [--servers granian,uvicorn,hypercorn,gunicorn,ferroloop]
        [--scenarios hello,flask,echo10k] [--connections 64,256] [--duration 8] [--repeats 3]
        [--out DIR]

The same runner as `run.py` (its functions, its checks, its report), with PEP 3333 apps and the
servers' WSGI modes; results in benchmarks/results/wsgi.{md,json,png}. Every server runs one
process (one worker) with access logging off, and runs the app in a thread pool of its default
size unless said otherwise:

- ferroloop: `python -m ferroloop APP --interface wsgi --no-access-log`; parsing and socket I/O
  native on the loop thread, the app in `--wsgi-threads` threads (default 10).
- granian: `--interface wsgi --workers 1 --runtime-threads 1 --http 1 --no-access-log`. Its
  WSGI options are left at their defaults: `--blocking-threads` (the threads that run the app)
  defaults for WSGI to `--backpressure` / 2 = `--backlog` / workers / 2 = 512, started as
  needed and dropped after `--blocking-threads-idle-timeout` (30 s) idle; `--runtime-mode` auto,
  `--runtime-blocking-threads` 512. `--loop` does not apply to WSGI.
- uvicorn: `--interface wsgi --loop uvloop --http httptools --no-access-log`: its built-in
  `WSGIMiddleware` (deprecated upstream in favour of a2wsgi, but what `--interface wsgi` runs),
  a ThreadPoolExecutor of 10 threads.
- hypercorn: `wsgi:APP --worker-class uvloop --workers 1`. Hypercorn has no interface option: it
  treats an app that is neither a coroutine function nor has a coroutine `__call__` as WSGI
  (`hypercorn.utils.is_asgi`); the `wsgi:` prefix of the app path states that explicitly. It
  buffers the whole request body (up to `wsgi_max_body_size`, 16 MiB) and runs the app with
  `run_in_executor(None, ...)`, asyncio's default pool: min(32, CPUs + 4) threads.
- gunicorn: `-w 1 -k gthread --threads 10`: the classic pre-fork server with its threaded
  worker, 10 threads as ferroloop (no access log by default).
"""

from __future__ import annotations

import sys

import run
import scenarios
import servers


class WsgiServer(servers.Server):
    """A server started in its WSGI mode; `run.py`'s Server is its ASGI mode."""

    def command(self, app: str, port: int | str) -> list[str]:
        py = [sys.executable, "-m", self.module]
        host, port = servers.HOST, str(port)
        if self.name == "ferroloop":
            return [*py, app, "--interface", "wsgi", "--host", host, "--port", port,
                    "--no-access-log"]  # fmt: skip
        if self.name == "granian":
            return [
                *py, "--interface", "wsgi", "--host", host, "--port", port, "--workers", "1",
                "--runtime-threads", "1", "--http", "1", "--no-access-log",
                "--log-level", "warning", app,
            ]  # fmt: skip
        if self.name == "uvicorn":
            return [
                *py, app, "--interface", "wsgi", "--host", host, "--port", port,
                "--loop", "uvloop", "--http", "httptools", "--no-access-log",
                "--log-level", "warning",
            ]  # fmt: skip
        if self.name == "hypercorn":
            return [*py, f"wsgi:{app}", "--bind", f"{host}:{port}", "--worker-class", "uvloop",
                    "--workers", "1", "--log-level", "warning"]  # fmt: skip
        if self.name == "gunicorn":
            return [*py, app, "--bind", f"{host}:{port}", "--workers", "1",
                    "--worker-class", "gthread", "--threads", "10",
                    "--log-level", "warning"]  # fmt: skip
        raise ValueError(f"unknown server {self.name!r}")


# Column order: the peers, then ferroloop last, as in run.py.
SERVERS = (
    WsgiServer("granian", "granian", ()),
    WsgiServer("uvicorn", "uvicorn", ("uvloop", "httptools")),
    WsgiServer("hypercorn", "hypercorn", ("uvloop",)),
    WsgiServer("gunicorn", "gunicorn", ()),
    WsgiServer("ferroloop", "ferroloop", ()),
)

SCENARIOS = (
    scenarios.Scenario(
        name="hello",
        title="plain WSGI hello world, GET /",
        app="hello_wsgi:app",
        method="GET",
        path="/",
        expect_body=b"Hello, world!",
        expect_content_type="text/plain",
    ),
    scenarios.Scenario(
        name="flask",
        title="Flask GET /ping",
        app="ping_flask:app",
        method="GET",
        path="/ping",
        requires=("flask",),
        expect_json={"ping": "pong"},
        expect_content_type="application/json",
    ),
    scenarios.Scenario(
        name="echo10k",
        title="POST echo of 10 KiB, plain WSGI",
        app="echo_wsgi:app",
        method="POST",
        path="/echo",
        body=scenarios.ECHO_BODY,
        headers={"Content-Type": "application/octet-stream"},
        expect_body=scenarios.ECHO_BODY,
        expect_content_type="application/octet-stream",
    ),
)

WSGI = run.Suite(
    script="benchmarks/http/wsgi.py",
    description=__doc__.split("\n")[0],
    servers={server.name: server for server in SERVERS},
    scenarios={scenario.name: scenario for scenario in SCENARIOS},
    stem="wsgi",
    what="WSGI server",
)


if __name__ == "__main__":
    sys.exit(run.main(sys.argv[1:], WSGI))
