"""The servers under comparison: how each is started, checked for readiness, measured and stopped.

Each runs one worker with access logging off, in its best configuration for HTTP/1.1:

- ferroloop: `python -m ferroloop APP --host H --port P --no-access-log`
- granian: `--interface asgi --loop uvloop --workers 1 --runtime-threads 1 --http 1
  --no-access-log --log-level warning` (ASGI on uvloop, its fastest loop for ASGI; `--http 1`
  because wrk speaks HTTP/1.1 only, as uvicorn and this benchmark do)
- uvicorn: `--loop uvloop --http httptools --no-access-log --log-level warning`
- hypercorn: `--worker-class uvloop --workers 1 --log-level warning` (no access log by default)

A server is started fresh for every measurement, from `benchmarks/http/apps` (cwd and
PYTHONPATH), pinned to core 0 with `taskset` (a worker process it spawns inherits the pin), its
output going to a log file whose tail is shown if it fails. It is stopped with SIGTERM, then
SIGKILL after 10 s; it runs in its own session, so any worker left behind is killed by that
process group's id.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.metadata
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

APPS_DIR = Path(__file__).resolve().parent / "apps"
HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Server:
    name: str
    module: str  # run as `python -m MODULE`
    requires: tuple[str, ...]  # modules the command line needs besides `module`

    def command(self, app: str, port: int | str) -> list[str]:
        py = [sys.executable, "-m", self.module]
        if self.name == "ferroloop":
            return [*py, app, "--host", HOST, "--port", str(port), "--no-access-log"]
        if self.name == "granian":
            return [
                *py, "--interface", "asgi", "--loop", "uvloop", "--host", HOST,
                "--port", str(port), "--workers", "1", "--runtime-threads", "1",
                "--http", "1", "--no-access-log", "--log-level", "warning", app,
            ]  # fmt: skip
        if self.name == "uvicorn":
            return [
                *py, app, "--host", HOST, "--port", str(port), "--loop", "uvloop",
                "--http", "httptools", "--no-access-log", "--log-level", "warning",
            ]  # fmt: skip
        if self.name == "hypercorn":
            return [
                *py, app, "--bind", f"{HOST}:{port}", "--worker-class", "uvloop",
                "--workers", "1", "--log-level", "warning",
            ]  # fmt: skip
        raise ValueError(f"unknown server {self.name!r}")


# Column order in every table and plot: the peers, then ferroloop last (as in benchmarks/loop).
SERVERS = (
    Server("granian", "granian", ("uvloop",)),
    Server("uvicorn", "uvicorn", ("uvloop", "httptools")),
    Server("hypercorn", "hypercorn", ("uvloop",)),
    Server("ferroloop", "ferroloop", ()),
)
BY_NAME = {server.name: server for server in SERVERS}
NAMES = tuple(BY_NAME)
PEERS = tuple(name for name in NAMES if name != "ferroloop")

FERROLOOP_PROBE = """
import hashlib, json, ferroloop, ferroloop._native as native
print(json.dumps({
    "version": getattr(ferroloop, "__version__", "unknown"),
    "debug_build": getattr(native, "DEBUG_BUILD", None),
    "native_sha256": hashlib.sha256(open(native.__file__, "rb").read()).hexdigest()[:12],
}))
"""


def probe(server: Server) -> dict:
    """Describe an installed server ({"version": ...}); raise LookupError if it cannot run.

    ferroloop is imported in a child process (its build flag and native library hash are
    recorded); the peers are only looked up, never imported into the runner.
    """
    for module in (server.module, *server.requires):
        if importlib.util.find_spec(module) is None:
            raise LookupError(f"{module} is not installed")
    if server.name == "ferroloop":
        done = subprocess.run(
            [sys.executable, "-c", FERROLOOP_PROBE], capture_output=True, text=True, timeout=60
        )
        if done.returncode != 0:
            raise LookupError(f"cannot import ferroloop: {tail(done.stderr, 1)}")
        return json.loads(done.stdout)
    info = {"version": importlib.metadata.version(server.module)}
    for module in server.requires:
        info[module] = importlib.metadata.version(module)
    return info


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class StartFailed(Exception):
    """The server exited, or did not answer correctly, within STARTUP_TIMEOUT_S."""


class ServerDied(Exception):
    """The server exited while it was being measured."""


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU time of `root` and every live descendant, from /proc."""
    parents, ticks = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # exited while we looked
        fields = stat[stat.rfind(")") + 2 :].split()  # fields 3.. of proc(5); comm may have spaces
        parents[int(entry)] = int(fields[1])
        ticks[int(entry)] = int(fields[11]) + int(fields[12])  # utime, stime
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    return sum(ticks.get(pid, 0) for pid in tree) / CLOCK_TICKS


class ServerProcess:
    """One running server: `with ServerProcess(...) as server:` starts it and always stops it."""

    def __init__(
        self,
        server: Server,
        app: str,
        pin: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.server = server
        self.env = env or {}
        self.port = free_port()
        self.command = [*pin, *server.command(app, self.port)]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        env = dict(os.environ, **self.env)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(APPS_DIR), env.get("PYTHONPATH", "")) if p
        )
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command,
                cwd=APPS_DIR,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, for the cleanup below
            )
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 15) -> str:
        try:
            return tail(self.log_path.read_text(errors="replace"), lines)
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, check) -> float:
        """Wait until `check(host, port)` passes; return the seconds that took.

        Port open is not enough: granian and hypercorn listen in a supervisor before their
        worker has imported the app. A WrongResponse from `check` is final; a refused or
        reset connection is retried until the timeout.
        """
        started = time.monotonic()
        deadline = started + STARTUP_TIMEOUT_S
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise StartFailed(f"exited with status {code} before serving\n{self.log_tail()}")
            try:
                check(HOST, self.port, timeout=max(0.5, deadline - time.monotonic()))
                return time.monotonic() - started
            except (OSError, http.client.HTTPException) as exc:
                last_error = exc
                time.sleep(0.05)
        raise StartFailed(
            f"not serving after {STARTUP_TIMEOUT_S:.0f} s (last error: {last_error!r})\n"
            f"{self.log_tail()}"
        )

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return tree_cpu_seconds(self.proc.pid)

    def stop(self) -> int | None:
        """SIGTERM, up to STOP_TIMEOUT_S for a graceful exit, then SIGKILL; returns the status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._kill_group()
                self.proc.wait()
        self._kill_group()  # a worker that outlived its supervisor
        return self.proc.returncode

    def _kill_group(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
