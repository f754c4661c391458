"""``ferroloop.Loop``: the native core plus asyncio's own cold-path policy code.

The class is ``Loop(LoopCore, SocketOps, SignalOps, asyncio.BaseEventLoop)``:

- ``LoopCore`` (Rust) owns the hot path: ``call_soon``/``call_later``/``call_at``/
  ``call_soon_threadsafe``, the ready queue, the timer heap, the fd registry, ``time()`` and the
  iteration itself, and exposes ``_closed``, ``_stopping``, ``_debug`` and ``_thread_id`` so
  that inherited code reads the native state.
- ``asyncio.BaseEventLoop`` supplies the code users expect to behave *exactly* like asyncio and
  that runs once per operation, not per event: ``run_until_complete``, task factories, the
  exception handler, async-generator hooks, executors, ``getaddrinfo``, the sendfile fallback.
- ``SocketOps`` and ``SignalOps`` are ferroloop's ``sock_*`` and signal implementations.
"""

from __future__ import annotations

import atexit
import collections.abc
import os
import sys
import threading
from asyncio import base_events, events
from typing import Any

from . import _task_registry
from ._hooks import callback_source
from ._native import (
    Handle,
    LoopCore,
    SocketOperation,
    _after_fork_in_child,
    _install_fast_methods,
    _prepare_exit,
)
from ._signals import SignalOps
from ._sockets import SocketOps
from ._transports import TransportOps


class Loop(LoopCore, SocketOps, SignalOps, TransportOps, base_events.BaseEventLoop):  # type: ignore[misc]
    """An asyncio event loop whose core is written in Rust."""

    # Every attribute that asyncio's ``BaseEventLoop`` (3.11 to 3.15) and the mixins set on a loop
    # is a slot, so the instance ``__dict__`` stays empty (not even made) unless a user sets an
    # attribute of their own. CPython 3.12 and 3.13 specialise method loads (``loop.call_soon``)
    # only on an object whose dict has not been made; 3.13 makes it for the first attribute that
    # is not a slot, as the loop's instance layout is not an empty object's (docs/measurements.md,
    # 2026-11-28 "calling shapes"). ``tests/loop/test_calling_shapes.py`` checks that a loop's
    # life leaves its dict empty. The native core's own attributes (``_closed``, ``_stopping``,
    # ``_debug``, ``_thread_id``, ``_task_factory``) are descriptors of ``LoopCore``.
    __slots__ = (
        "_asyncgens",
        "_asyncgens_shutdown_called",
        "_clock_resolution",
        "_coroutine_origin_tracking_enabled",
        "_coroutine_origin_tracking_saved_depth",
        "_csock",
        "_current_handle",
        "_default_executor",
        "_exception_handler",
        "_executor_shutdown_called",
        "_internal_fds",
        "_old_agen_hooks",
        "_ready",
        "_scheduled",
        "_selector",
        "_signal_handlers",
        "_ssock",
        "_timer_cancelled_count",
        "_transports",
        "_unix_server_sockets",
        "_wakeup_restore",
        "_watcher",  # 3.14+: the loop's own child watcher (_transports.py)
        "slow_callback_duration",
    )

    def __init__(self) -> None:
        super().__init__()
        self._signals_init()
        self._transports_init()

    # -- running --------------------------------------------------------------------------------

    def run_forever(self) -> None:
        """Runs until ``stop()`` is called (asyncio semantics, native iteration)."""
        self._check_closed()
        self._check_running()
        self._set_coroutine_origin_tracking(self._debug)
        old_agen_hooks = sys.get_asyncgen_hooks()
        try:
            self._thread_id = threading.get_ident()
            sys.set_asyncgen_hooks(
                firstiter=self._asyncgen_firstiter_hook,
                finalizer=self._asyncgen_finalizer_hook,
            )
            events._set_running_loop(self)
            self._signals_begin()
            self._run_forever_native()
        finally:
            self._signals_end()
            self._stopping = False
            self._thread_id = None
            events._set_running_loop(None)
            self._set_coroutine_origin_tracking(False)
            sys.set_asyncgen_hooks(*old_agen_hooks)

    def close(self) -> None:
        """Closes the loop: drops pending callbacks, leaves the poller, shuts the executor."""
        if self.is_running():
            raise RuntimeError("Cannot close a running event loop")
        if self.is_closed():
            return
        self._signals_close()
        # C API work already accepted runs while the loop can still schedule callbacks.
        self._close_remotes()
        super().close()
        self._close_native()
        self._transports_close()

    # -- called by the native core ----------------------------------------------------------

    def _callback_failed(self, handle: Any, exc: BaseException) -> None:
        if isinstance(handle, Handle):
            source = callback_source(handle)
            context: dict[str, Any] = {
                "message": f"Exception in callback {source}",
                "exception": exc,
                "handle": handle,
            }
            if handle._source_traceback:
                context["source_traceback"] = handle._source_traceback
        elif isinstance(handle, str):
            context = {"message": handle, "exception": exc}
        else:
            context = {
                "message": "Exception in a task handed to the loop by Rust code",
                "exception": exc,
            }
        self.call_exception_handler(context)

    def _run_handle_debug(self, handle: Handle) -> None:
        self._current_handle = handle
        try:
            t0 = self.time()
            handle._run()
            dt = self.time() - t0
            if dt >= self.slow_callback_duration:
                base_events.logger.warning(
                    "Executing %s took %.3f seconds", base_events._format_handle(handle), dt
                )
        finally:
            self._current_handle = None
            # A traceback made under the callback links this frame (``f_back``), so the handle
            # and its callback (a task's step: a cycle through the task's exception) would live
            # until the next collection. asyncio's ``Handle._run`` drops ``self`` the same way.
            del handle

    def _debug_check_callback(self, callback: Any, method: str) -> None:
        self._check_callback(callback, method)

    def _timer_handle_cancelled(self, handle: Any) -> None:
        """asyncio's hook; ferroloop's timers leave the heap in ``TimerHandle.cancel`` itself."""

    def _write_to_self(self) -> None:
        """asyncio's self-pipe wake-up: an empty thread-safe call wakes the native loop."""
        self.call_soon_threadsafe(_noop)


def _noop() -> None:
    pass


# Native sock_recv/sock_recv_into/sock_sendall return SocketOperation objects: coroutines to
# asyncio (create_task, ensure_future and iscoroutine accept them).
collections.abc.Coroutine.register(SocketOperation)

# The hottest method gets a raw fast-call entry point (crates/py/src/fastcall.rs); same semantics.
_install_fast_methods(Loop)

# At interpreter exit, loops still running in other (daemon) threads park at their next
# iteration, with the GIL released, before CPython finalizes: CPython ends such threads with
# pthread_exit when they next take the GIL, which Rust frames cannot survive (crates/py/src/gil.rs).
# Registered at import, so it runs after the exit functions registered later.
EXIT_PARK_TIMEOUT_S = 0.5
atexit.register(_prepare_exit, EXIT_PARK_TIMEOUT_S)
os.register_at_fork(after_in_child=_after_fork_in_child)

# asyncio's task registry gets a native add (crates/py/src/task_registry.rs); same semantics.
_task_registry.install()


def new_event_loop() -> Loop:
    """A new ferroloop loop (use as ``asyncio.run(main(), loop_factory=new_event_loop)``)."""
    return Loop()
