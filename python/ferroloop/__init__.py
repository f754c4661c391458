"""ferroloop: an asyncio event loop with a Rust core, and an ASGI server on it.

import ferroloop
ferroloop.run(main())                       # like asyncio.run
asyncio.run(main(), loop_factory=ferroloop.new_event_loop)   # Python 3.12+
ferroloop.install()                         # make it asyncio's default loop
ferroloop.serve(app, port=8000)             # serve an ASGI app (or: ferroloop module:app)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._loop import Loop, new_event_loop
from ._native import Handle, Task, TimerHandle, __version__
from ._runner import EventLoopPolicy, install, run
from ._task import task_factory

if TYPE_CHECKING:
    from .server import Config, Server, serve

__all__ = [
    "Config",
    "EventLoopPolicy",
    "Handle",
    "Loop",
    "Server",
    "Task",
    "TimerHandle",
    "__version__",
    "get_include",
    "install",
    "new_event_loop",
    "run",
    "serve",
    "task_factory",
]


def get_include() -> str:
    """The directory of ``ferroloop.h``, the C API for waking the loop from native threads
    (compile with ``-I`` this directory, as with ``numpy.get_include()``)."""
    import os

    return os.path.join(os.path.dirname(__file__), "include")


def __getattr__(name: str) -> Any:
    # The server's modules (logging.config, ipaddress...) load only when asked for, so that
    # `import ferroloop` stays as light as the loop alone.
    if name in ("Config", "Server", "serve"):
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module 'ferroloop' has no attribute {name!r}")
