"""A server process for end-to-end tests of the process machinery (signals, workers, reload)
without the native HTTP server: ``harness.py`` runs ``run_config`` with a fake HttpServer that
serves nothing and counts 100 "requests" a second."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

HARNESS = """
    import json, sys, time
    from ferroloop.server.config import Config
    from ferroloop.server.serve import run_config
    from ferroloop.server.server import Server

    class FakeHttpServer:
        # Counts 100 "requests" a second, serves nothing.
        def __init__(self, loop, sock, app, **options):
            self.started_at = time.monotonic()
            self.connections = self.tasks = 0
        @property
        def requests(self):
            return int((time.monotonic() - self.started_at) * 100)
        def start(self): pass
        def close(self): pass
        def shutdown(self): pass
        def abort(self): pass

    Server.http_server_class = FakeHttpServer
    options = json.loads(sys.argv[1])
    sys.exit(run_config(Config(options.pop("app"), **options)))
"""


def start_harness(tmp_path, **options) -> subprocess.Popen[bytes]:
    (tmp_path / "harness.py").write_text(textwrap.dedent(HARNESS))
    if not (tmp_path / "ferroloop_sup_app.py").exists():
        (tmp_path / "ferroloop_sup_app.py").write_text(
            "async def app(scope, receive, send):\n    pass\n"
        )
    options = {"app": "ferroloop_sup_app:app", "port": 0, "lifespan": "off", **options}
    env = {
        k: v for k, v in os.environ.items() if k not in ("WEB_CONCURRENCY", "FORWARDED_ALLOW_IPS")
    }
    return subprocess.Popen(
        [sys.executable, "harness.py", json.dumps(options)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@contextlib.contextmanager
def running_harness(tmp_path, **options) -> Iterator[subprocess.Popen[bytes]]:
    """``start_harness``; the process is killed if the block fails."""
    proc = start_harness(tmp_path, **options)
    try:
        yield proc
    except BaseException:
        proc.kill()
        proc.communicate()
        raise


def read_until(proc: subprocess.Popen[bytes], needle: str, count: int = 1, timeout=15.0) -> str:
    """Reads the process's output until ``needle`` has appeared ``count`` times in it."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while seen.count(needle.encode()) < count:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"{needle!r} x{count} not seen in:\n{seen.decode()}"
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"process ended before {needle!r}:\n{seen.decode()}"
            seen += chunk
    return seen.decode()


def finish(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> str:
    """Waits for the process to exit (killing it after ``timeout``); returns the rest of its
    output."""
    try:
        rest, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rest, _ = proc.communicate()
    return rest.decode()
