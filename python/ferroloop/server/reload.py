"""``--reload``: restart the server when a watched file changes (for development).

The parent binds the socket, forks one server process (``supervisor.spawn_worker``: the parent
never imports the app, so each child imports the code afresh) and polls the files: every
``reload_delay`` seconds (0.25) it compares the modification times of the files under
``reload_dirs`` (default: the current directory) whose names match ``reload_includes``
(``*.py``) and none of ``reload_excludes`` (hidden files and directories, ``*.py[cod]``, editor
swap files, ``__pycache__``). An excluded directory is not entered. A change (a new, modified
or removed file) stops the child (SIGTERM: graceful shutdown; SIGINT after 5 s: forced; SIGKILL
after 5 s more) and starts a new one. A child that exits by itself (a syntax error, say) is
started again at the next change. Polling needs no dependency; watching a large tree costs one
``stat`` per file per period.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import signal
import socket
import time
from collections.abc import Iterable
from pathlib import Path

from .config import Config, jittered_request_limit
from .supervisor import describe_status, spawn_worker

logger = logging.getLogger("ferroloop.error")

STOP_ESCALATION = 5.0  # seconds between SIGTERM, SIGINT (forced exit) and SIGKILL


class FileWatcher:
    """Polls modification times; ``changes()`` returns the paths changed since the last call."""

    def __init__(
        self, dirs: Iterable[Path], includes: Iterable[str], excludes: Iterable[str]
    ) -> None:
        self.dirs = [Path(d) for d in dirs]
        self.includes = list(includes)
        self.excludes = list(excludes)
        self._mtimes = self.snapshot()

    def _excluded(self, name: str) -> bool:
        return any(fnmatch.fnmatch(name, pattern) for pattern in self.excludes)

    def _included(self, name: str) -> bool:
        return any(fnmatch.fnmatch(name, pattern) for pattern in self.includes)

    def snapshot(self) -> dict[Path, float]:
        mtimes: dict[Path, float] = {}
        for top in self.dirs:
            for root, dirnames, filenames in os.walk(top):
                dirnames[:] = [d for d in dirnames if not self._excluded(d)]
                for name in filenames:
                    if self._included(name) and not self._excluded(name):
                        path = Path(root, name)
                        with contextlib.suppress(OSError):
                            mtimes[path] = path.stat().st_mtime
        return mtimes

    def changes(self) -> list[Path]:
        current = self.snapshot()
        before = self._mtimes
        changed = [p for p, mtime in current.items() if before.get(p) != mtime]
        changed += [p for p in before if p not in current]
        self._mtimes = current
        return sorted(changed)


def _display(paths: list[Path]) -> str:
    cwd = Path.cwd()
    shown = []
    for path in paths[:5]:
        try:
            shown.append(f"'{path.relative_to(cwd)}'")
        except ValueError:
            shown.append(f"'{path}'")
    more = f" and {len(paths) - 5} more" if len(paths) > 5 else ""
    return ", ".join(shown) + more


class Reloader:
    """Runs one server child on ``sockets`` and restarts it on file changes."""

    def __init__(self, config: Config, sockets: list[socket.socket]) -> None:
        self.config = config
        self.sockets = sockets
        self.should_exit = False
        self.pid: int | None = None
        self.watcher = FileWatcher(
            config.reload_dirs, config.reload_includes, config.reload_excludes
        )

    def handle_signal(self, sig: int, frame: object = None) -> None:
        self.should_exit = True

    def start_child(self) -> None:
        limit = jittered_request_limit(
            self.config.limit_max_requests, self.config.max_requests_jitter
        )
        self.pid = spawn_worker(self.config, self.sockets, limit)

    def stop_child(self) -> None:
        pid, self.pid = self.pid, None
        if pid is None:
            return
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            deadline = time.monotonic() + STOP_ESCALATION
            while time.monotonic() < deadline:
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    return
                if done:
                    return
                time.sleep(0.05)

    def _child_exited(self) -> None:
        if self.pid is None:
            return
        try:
            done, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            self.pid = None
            return
        if done:
            logger.warning(
                "Server process [%d] stopped (%s); waiting for a change to restart it.",
                self.pid,
                describe_status(status),
            )
            self.pid = None

    def run(self) -> int:
        logger.info(
            "Will watch for changes in these directories: %s",
            sorted(str(d) for d in self.config.reload_dirs),
        )
        logger.info("Started reloader process [%d] using polling", os.getpid())
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_signal) for sig in handled}
        try:
            self.start_child()
            while not self.should_exit:
                time.sleep(self.config.reload_delay)
                self._child_exited()
                changed = self.watcher.changes()
                if changed and not self.should_exit:
                    logger.warning("Detected change in %s, reloading", _display(changed))
                    self.stop_child()
                    self.start_child()
            self.stop_child()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        logger.info("Stopping reloader process [%d]", os.getpid())
        return 0
