"""Fixtures for the server's Python-only parts: app modules on disk, a fake native HttpServer,
and logging isolation (Config applies logging options process-wide)."""

from __future__ import annotations

import itertools
import logging
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_LOGGERS = ("ferroloop", "ferroloop.error", "ferroloop.access", "ferroloop.asgi")
_counter = itertools.count()


@pytest.fixture(autouse=True)
def isolated_loggers() -> Iterator[None]:
    saved = {}
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        saved[name] = (list(logger.handlers), logger.level, logger.propagate, logger.disabled)
    try:
        yield
    finally:
        for name, (handlers, level, propagate, disabled) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers = handlers
            logger.setLevel(level)
            logger.propagate = propagate
            logger.disabled = disabled


@pytest.fixture
def make_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], str]:
    """Writes ``source`` as a fresh, uniquely named module on sys.path; returns its name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    created: list[str] = []

    def make(source: str) -> str:
        name = f"ferroloop_test_app_{next(_counter)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        created.append(name)
        return name

    yield make  # type: ignore[misc]
    for name in created:
        sys.modules.pop(name, None)


class FakeHttpServer:
    """Stands in for ferroloop._native.HttpServer: records calls, simulates connections."""

    instances: list[FakeHttpServer] = []

    def __init__(self, loop: Any, sock: Any, app: Any, **options: Any) -> None:
        self.loop = loop
        self.sock = sock
        self.app = app
        self.options = options
        self.calls: list[str] = []
        self.connections = 0
        self.requests = 0
        self.tasks = 0
        # Connections that finish only after this many shutdown polls (None: never).
        self.busy_for: int | None = 0
        FakeHttpServer.instances.append(self)

    def start(self) -> None:
        self.calls.append("start")

    def close(self) -> None:
        self.calls.append("close")

    def shutdown(self) -> None:
        self.calls.append("shutdown")
        if self.busy_for == 0:
            self.connections = self.tasks = 0
        elif self.busy_for is not None:
            self.loop.call_later(0.1 * self.busy_for, self._finish)

    def _finish(self) -> None:
        self.connections = 0
        self.tasks = 0

    def abort(self) -> None:
        self.calls.append("abort")
        self.connections = 0
        self.tasks = 0


@pytest.fixture
def fake_http_server() -> Iterator[type[FakeHttpServer]]:
    FakeHttpServer.instances = []
    yield FakeHttpServer
    FakeHttpServer.instances = []
