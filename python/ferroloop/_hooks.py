"""Python helpers the native core calls on cold paths: handle reprs and debug-mode stacks.

Kept in Python so that reprs and source tracebacks read exactly as asyncio's do (the same
``format_helpers``), while the hot path stays native.
"""

from __future__ import annotations

import inspect
import sys
from asyncio import format_helpers
from typing import Any

# asyncio 3.13 (and later 3.12 releases) show a callback's arguments only in debug mode, since
# they may hold sensitive data: ``_format_callback_source(func, args, *, debug=False)``.
_FORMAT_TAKES_DEBUG = (
    "debug" in inspect.signature(format_helpers._format_callback_source).parameters
)


def callback_source(handle: Any) -> str:
    """``cb(args) at file:line`` for a handle's callback, as this Python's asyncio writes it."""
    if _FORMAT_TAKES_DEBUG:
        return format_helpers._format_callback_source(
            handle._callback, handle._args, debug=handle._loop.get_debug()
        )
    return format_helpers._format_callback_source(handle._callback, handle._args)


def handle_repr(handle: Any) -> str:
    """``<Handle cb() at file:line>`` / ``<TimerHandle when=... cb()>``, as asyncio writes them."""
    info = [type(handle).__name__]
    cancelled = handle.cancelled()
    if cancelled:
        info.append("cancelled")
    if handle._callback is not None:
        info.append(callback_source(handle))
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


def log_server_warning(message: str) -> None:
    """The HTTP server's log of a client's fault when the Python side gave it none."""
    import logging

    logging.getLogger("ferroloop.error").warning(message)


def log_server_error(message: str, exc: BaseException | None) -> None:
    """The HTTP server's error log when the Python side gave it none: ``ferroloop.error``."""
    import logging

    logger = logging.getLogger("ferroloop.error")
    if exc is None:
        logger.error(message)
    else:
        logger.error(message, exc_info=(type(exc), exc, exc.__traceback__))


def _task_step_type() -> type | None:
    """The type of the callable a C ``Task`` hands to ``loop.call_soon`` for each step.

    CPython's ``_asyncio`` creates a ``TaskStepMethWrapper`` per step, passes it to
    ``call_soon(step, context=...)`` and drops the returned handle at once; nothing else can get
    one. Found once by letting a Task schedule its first step on a probe loop. ``None`` when
    asyncio's Task is not the C one (the Python Task's step is a bound method, which must not
    be special-cased). Asks for ``asyncio.tasks._CTask`` by name, so a test that swapped
    ``asyncio.Task`` for the Python one when this first runs cannot switch the shortcut off.
    """
    step, _ = _probe_c_task(await_future=False)
    return type(step) if type(step).__name__ == "TaskStepMethWrapper" else None


def task_wakeup_probe() -> Any:
    """A C Task's wake-up callback (``task_wakeup`` bound to a finished probe task), or ``None``.

    When a C Task awaits a Future, ``_asyncio`` adds ``task_wakeup`` (a built-in function bound to
    the task) as the Future's done callback; the Future schedules it with
    ``call_soon(wakeup, future, context=...)`` and drops the handle. The native loop keeps only the
    function's method definition (which ``_asyncio`` holds statically) and drops this object.
    """
    step, wakeup = _probe_c_task(await_future=True)
    if step is None or getattr(wakeup, "__name__", None) != "task_wakeup":
        return None
    return wakeup


def _probe_c_task(*, await_future: bool) -> tuple[Any, Any]:
    """Runs a C Task's first step on a probe loop: (its step callable, the wake-up it added)."""
    from asyncio import futures, tasks

    c_task = getattr(tasks, "_CTask", None)
    c_future = getattr(futures, "_CFuture", None)
    if c_task is None or c_future is None:
        return None, None
    captured: list[Any] = []

    class _Probe:
        def get_debug(self) -> bool:
            return False

        def call_soon(self, callback: Any, *args: Any, context: Any = None) -> None:
            captured.append(callback)

    probe = _Probe()
    future = c_future(loop=probe)

    async def _wait() -> None:
        if await_future:
            await future

    coro = _wait()
    try:
        task = c_task(coro, loop=probe)
        task._log_destroy_pending = False
        if await_future and captured:
            captured[0]()
    finally:
        coro.close()
    step = captured[0] if captured else None
    wakeup = future._callbacks[0][0] if future._callbacks else None
    if wakeup is not None:
        future.remove_done_callback(wakeup)
    return step, wakeup


try:
    TASK_STEP_TYPE = _task_step_type()
except Exception:  # an optimisation only: without it every step simply gets a Handle
    TASK_STEP_TYPE = None


def is_coroutine(obj: Any) -> bool:
    """What ``ferroloop.Task`` accepts, as asyncio's Task does."""
    from asyncio import coroutines

    return coroutines.iscoroutine(obj)


def task_repr(task: Any) -> str:
    """``repr()`` of a ``ferroloop.Task``, in the words of asyncio's own Task repr."""
    from asyncio import base_tasks

    info = " ".join(base_tasks._task_repr_info(task))
    return f"<{type(task).__name__} {info}>"
