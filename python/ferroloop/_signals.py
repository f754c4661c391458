"""Unix signals for ``ferroloop.Loop``: ``add_signal_handler`` and a clean Ctrl-C.

Python's C-level handler writes each signal number to the "wakeup fd". While a ferroloop loop
runs in the main thread, that fd is the write end of a socketpair whose read end the loop
watches, so a signal wakes a loop sleeping in epoll even if the kernel delivered it to another
thread. Reading the numbers back runs the handlers registered with ``add_signal_handler``
(as ``Handle``s, in the loop), and any pending Python-level handler (``KeyboardInterrupt``,
``asyncio.Runner``'s SIGINT handler) runs as soon as the loop executes Python code.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from typing import Any

_MAX_SIGNAL = signal.NSIG


def _noop(signum: int, frame: Any) -> None:
    """Installed as the Python-level handler; the real work happens in the loop."""


class SignalOps:
    """Mixin for ``ferroloop.Loop``."""

    _signal_handlers: dict[int, Any]
    _ssock: socket.socket | None
    _csock: socket.socket | None
    _wakeup_restore: int | None

    def _signals_init(self) -> None:
        self._signal_handlers = {}
        self._ssock = self._csock = None
        self._wakeup_restore = None

    def _signal_pipe(self) -> socket.socket:
        if self._csock is None:
            self._ssock, self._csock = socket.socketpair()
            self._ssock.setblocking(False)
            self._csock.setblocking(False)
            self._add_reader(self._ssock.fileno(), self._read_signals)  # type: ignore[attr-defined]
        return self._csock

    def _read_signals(self) -> None:
        assert self._ssock is not None
        while True:
            try:
                data = self._ssock.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            if not data:
                return
            for signum in data:
                handle = self._signal_handlers.get(signum)
                if handle is not None and not handle.cancelled():
                    self._add_callback_signalsafe(handle)

    def _add_callback_signalsafe(self, handle: Any) -> None:
        self.call_soon(handle._run)  # type: ignore[attr-defined]

    def _signals_begin(self) -> None:
        """run_forever, main thread: route signal wake-ups to this loop while it runs."""
        if threading.current_thread() is not threading.main_thread():
            return
        fd = self._signal_pipe().fileno()
        try:
            old = signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
        except ValueError:
            return
        self._wakeup_restore = old if old != fd else -1

    def _signals_end(self) -> None:
        if self._wakeup_restore is None:
            return
        restore, self._wakeup_restore = self._wakeup_restore, None
        if self._signal_handlers:
            return  # handlers stay active between runs, as in asyncio
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(restore)

    def _check_signal(self, sig: int) -> None:
        if not isinstance(sig, int):
            raise TypeError(f"sig must be an int, not {sig!r}")
        if sig not in signal.valid_signals():
            raise ValueError(f"invalid signal number {sig}")

    def add_signal_handler(self, sig: int, callback: Any, *args: Any) -> None:
        """Calls ``callback(*args)`` in the loop when signal ``sig`` arrives (main thread only)."""
        import asyncio
        from asyncio import coroutines

        # 3.14 deprecates asyncio.iscoroutinefunction; its own add_signal_handler uses the
        # private, warning-free one, which earlier versions do not have.
        is_coroutine_function = getattr(
            coroutines, "_iscoroutinefunction", coroutines.iscoroutinefunction
        )
        if coroutines.iscoroutine(callback) or is_coroutine_function(callback):
            raise TypeError("coroutines cannot be used with add_signal_handler()")
        self._check_signal(sig)
        self._check_closed()  # type: ignore[attr-defined]
        fd = self._signal_pipe().fileno()
        try:
            signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
        except (ValueError, OSError) as exc:
            raise RuntimeError(str(exc)) from None
        handle = asyncio.Handle(callback, args, self, None)  # type: ignore[arg-type]
        self._signal_handlers[sig] = handle
        try:
            signal.signal(sig, _noop)
            signal.siginterrupt(sig, False)
        except OSError as exc:
            del self._signal_handlers[sig]
            if not self._signal_handlers:
                with contextlib.suppress(ValueError, OSError):
                    signal.set_wakeup_fd(-1)
            if exc.errno == 22:  # EINVAL
                raise RuntimeError(f"sig {sig:d} cannot be caught") from None
            raise

    def remove_signal_handler(self, sig: int) -> bool:
        """Removes the handler for ``sig``; returns whether one was set."""
        self._check_signal(sig)
        try:
            del self._signal_handlers[sig]
        except KeyError:
            return False
        handler = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
        try:
            signal.signal(sig, handler)
        except OSError as exc:
            if exc.errno == 22:
                raise RuntimeError(f"sig {sig:d} cannot be caught") from None
            raise
        if not self._signal_handlers and self._wakeup_restore is None:
            with contextlib.suppress(ValueError, OSError):
                signal.set_wakeup_fd(-1)
        return True

    def _signals_close(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in list(self._signal_handlers):
                self.remove_signal_handler(sig)
        self._signal_handlers.clear()
        if self._ssock is not None:
            self.remove_reader(self._ssock.fileno())  # type: ignore[attr-defined]
            self._ssock.close()
            assert self._csock is not None
            self._csock.close()
            self._ssock = self._csock = None
