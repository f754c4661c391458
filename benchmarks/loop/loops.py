"""The loops under comparison and how a child process builds one.

Each benchmark child imports exactly one loop implementation, so a loop that fails to import or
crashes only costs its own column. `probe()` runs in a child too: the runner never imports a
native loop module itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
from collections.abc import Callable
from pathlib import Path

# Column order in every table: the stdlib baseline first, ferroloop last.
NAMES = ("asyncio", "uvloop", "rloop", "ferroloop")
PEERS = ("asyncio", "uvloop", "rloop")


def factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "asyncio":
        return asyncio.new_event_loop
    if name not in NAMES:
        raise ValueError(f"unknown loop {name!r}; choose from {', '.join(NAMES)}")
    return importlib.import_module(name).new_event_loop


def probe(name: str) -> dict[str, object]:
    """Import the loop, build and close one instance, and describe the build."""
    info: dict[str, object] = {"loop": name}
    if name == "asyncio":
        import sys

        info["version"] = sys.version.split()[0]
    else:
        module = importlib.import_module(name)
        info["version"] = getattr(module, "__version__", "unknown")
    if name == "ferroloop":
        native = importlib.import_module("ferroloop._native")
        info["debug_build"] = getattr(native, "DEBUG_BUILD", None)
        # Which build was measured: the lead rebuilds often, and versions do not change.
        info["native_sha256"] = hashlib.sha256(Path(native.__file__).read_bytes()).hexdigest()[:12]
    loop = factory(name)()
    info["class"] = f"{type(loop).__module__}.{type(loop).__qualname__}"
    loop.close()
    return info
