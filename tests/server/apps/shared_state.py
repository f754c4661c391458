"""State a test app records in one request for a later request to read back, shared by every
worker process of one server.

Behind the front (``--workers N``) consecutive requests, even on one keep-alive connection, may
be served by different processes, so a module-level dict written by one request is not what the
next one reads. When ``FERROLOOP_TEST_SHARED_DIR`` names a directory (the test fixtures set it
for a server started with ``--workers``), the state lives there, one file per key, written
atomically; otherwise it lives in this process, as a plain dict and int would.

Values are JSON (what the apps send back is JSON anyway).
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

_ENV = "FERROLOOP_TEST_SHARED_DIR"


def _directory(name: str) -> Path | None:
    root = os.environ.get(_ENV)
    if not root:
        return None
    path = Path(root, name)
    path.mkdir(parents=True, exist_ok=True)
    return path


class SharedDict(MutableMapping[str, Any]):
    """A dict of JSON values: in ``$FERROLOOP_TEST_SHARED_DIR/<name>/`` if set, else in memory."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._local: dict[str, Any] = {}

    def _dir(self) -> Path | None:
        # Looked up on use, not at import: the app module is imported before the workers fork.
        return _directory(self._name)

    def __getitem__(self, key: str) -> Any:
        directory = self._dir()
        if directory is None:
            return self._local[key]
        try:
            return json.loads((directory / quote(key, safe="")).read_text())
        except FileNotFoundError:
            raise KeyError(key) from None

    def __setitem__(self, key: str, value: Any) -> None:
        directory = self._dir()
        if directory is None:
            self._local[key] = value
            return
        staging = directory / f".{uuid.uuid4().hex}"
        staging.write_text(json.dumps(value))
        os.replace(staging, directory / quote(key, safe=""))

    def __delitem__(self, key: str) -> None:
        directory = self._dir()
        if directory is None:
            del self._local[key]
            return
        try:
            (directory / quote(key, safe="")).unlink()
        except FileNotFoundError:
            raise KeyError(key) from None

    def __iter__(self) -> Iterator[str]:
        directory = self._dir()
        if directory is None:
            return iter(list(self._local))
        return iter(sorted(unquote(p.name) for p in directory.iterdir() if p.name[0] != "."))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class SharedCounter:
    """A count that any process or thread may raise: one file per increment if shared."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._local = 0
        self._lock = threading.Lock()

    def increment(self) -> None:
        directory = _directory(self._name)
        if directory is None:
            with self._lock:
                self._local += 1
            return
        (directory / uuid.uuid4().hex).touch()

    def value(self) -> int:
        directory = _directory(self._name)
        if directory is None:
            with self._lock:
                return self._local
        return sum(1 for _ in directory.iterdir())
