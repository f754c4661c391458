"""The servers of the isolation benchmark and their command lines, with `--workers N`.

Each serves `upload_app:app` with access logging off, in the configuration its users run for
FastAPI in production:

- ferroloop: `python -m ferroloop APP --host H --port P --workers N --no-access-log`
- uvicorn: `python -m uvicorn APP --workers N --loop uvloop --http httptools --no-access-log`
- granian: `python -m granian --interface asgi --loop uvloop --workers N --runtime-threads 1
  --http 1 --no-access-log APP` (as benchmarks/http/servers.py, with N workers)
- gunicorn: `python -m gunicorn APP --workers N --worker-class uvicorn_worker.UvicornWorker`:
  the pre-fork manager with uvicorn's worker, which picks uvloop and httptools when they are
  installed (its `loop="auto"`, `http="auto"`); gunicorn writes no access log unless asked. The
  worker class lives in the `uvicorn-worker` package: `uvicorn.workers`, where it used to be, is
  deprecated and warns on import (uvicorn 0.54) in favour of that package.

With `tls` set (`run.py --tls`), each gets the same certificate and key: ferroloop and uvicorn
`--ssl-certfile CERT --ssl-keyfile KEY`, granian `--ssl-certificate CERT --ssl-keyfile KEY`,
gunicorn `--certfile CERT --keyfile KEY`.

Every server is started by benchmarks/http/servers.py's `ServerProcess` (its own session,
SIGTERM, then SIGKILL to the whole process group), so no worker outlives its cell.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Server:
    name: str
    module: str  # run as `python -m MODULE`
    requires: tuple[str, ...]  # modules the command line needs besides `module`
    workers: int = 1
    tls: tuple[str, str] | None = None  # (certificate file, key file): serve HTTPS

    def command(self, app: str, port: int | str) -> list[str]:
        plain = self.plain_command(app, port)
        if self.tls is None:
            return plain
        cert, key = self.tls
        options = {
            "ferroloop": ["--ssl-certfile", cert, "--ssl-keyfile", key],
            "uvicorn": ["--ssl-certfile", cert, "--ssl-keyfile", key],
            "granian": ["--ssl-certificate", cert, "--ssl-keyfile", key],
            "gunicorn": ["--certfile", cert, "--keyfile", key],
        }
        if self.name == "granian":  # its app argument comes last
            return [*plain[:-1], *options["granian"], plain[-1]]
        return [*plain, *options[self.name]]

    def plain_command(self, app: str, port: int | str) -> list[str]:
        py, port, n = [sys.executable, "-m", self.module], str(port), str(self.workers)
        if self.name == "ferroloop":
            return [*py, app, "--host", HOST, "--port", port, "--workers", n, "--no-access-log"]
        if self.name == "uvicorn":
            return [
                *py, app, "--host", HOST, "--port", port, "--workers", n, "--loop", "uvloop",
                "--http", "httptools", "--no-access-log", "--log-level", "warning",
            ]  # fmt: skip
        if self.name == "granian":
            return [
                *py, "--interface", "asgi", "--loop", "uvloop", "--host", HOST, "--port", port,
                "--workers", n, "--runtime-threads", "1", "--http", "1", "--no-access-log",
                "--log-level", "warning", app,
            ]  # fmt: skip
        if self.name == "gunicorn":
            return [
                *py, app, "--bind", f"{HOST}:{port}", "--workers", n,
                "--worker-class", "uvicorn_worker.UvicornWorker", "--log-level", "warning",
            ]  # fmt: skip
        raise ValueError(f"unknown server {self.name!r}")


# Column order in every table and plot: the peers, then ferroloop last (as in benchmarks/http).
SERVERS = (
    Server("granian", "granian", ("uvloop",)),
    Server("uvicorn", "uvicorn", ("uvloop", "httptools")),
    Server("gunicorn", "gunicorn", ("uvicorn_worker", "uvloop", "httptools")),
    Server("ferroloop", "ferroloop", ()),
)
BY_NAME = {server.name: server for server in SERVERS}
NAMES = tuple(BY_NAME)
