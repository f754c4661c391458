"""Python helpers the native core calls on cold paths: handle reprs and debug-mode stacks.

Kept in Python so that reprs and source tracebacks read exactly as asyncio's do (the same
``format_helpers``), while the hot path stays native.
"""

from __future__ import annotations

import sys
from asyncio import format_helpers
from typing import Any


def handle_repr(handle: Any) -> str:
    """``<Handle cb() at file:line>`` / ``<TimerHandle when=... cb()>``, as asyncio writes them."""
    info = [type(handle).__name__]
    cancelled = handle.cancelled()
    if cancelled:
        info.append("cancelled")
    if handle._callback is not None:
        info.append(format_helpers._format_callback_source(handle._callback, handle._args))
    tb = handle._source_traceback
    if tb:
        frame = tb[-1]
        info.append(f"created at {frame[0]}:{frame[1]}")
    if hasattr(handle, "when"):
        info.insert(2 if cancelled else 1, f"when={handle.when()}")
    return "<{}>".format(" ".join(info))


def extract_stack() -> Any:
    """The stack of the Python code that called the (frameless) native loop method."""
    return format_helpers.extract_stack(sys._getframe(1))
