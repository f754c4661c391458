"""The native pipe transports: asyncio's ``_UnixReadPipeTransport`` and
``_UnixWritePipeTransport`` over the Rust ``StreamCore`` of the stream socket transport.

``connect_read_pipe``/``connect_write_pipe`` build them, and so does every subprocess pipe
(``base_subprocess`` connects the child's stdin, stdout and stderr through those two). The
classes subclass asyncio's own (so ``isinstance`` checks, reprs and log lines are asyncio's) and
keep asyncio's code for every cold path: ``__repr__``, ``__del__`` and its ``ResourceWarning``,
``_fatal_error`` (with its ``EIO`` rule for ptys), ``pause_reading``/``resume_reading``,
``close``, ``abort``, ``set_write_buffer_limits`` and the flow-control callbacks. The hot paths
are a ``StreamCore`` made with ``pipe="read"`` or ``pipe="write"``
(``crates/py/src/transport/``):

- read pipe: the core is the fd's reader (``_read_ready``): readiness → ``read`` into the
  per-thread buffer → ``protocol.data_received(bytes)``; EOF runs ``_read_ready__on_eof`` below;
- write pipe: ``write`` and ``get_write_buffer_size`` are the core's bound methods stored on the
  instance; ``write`` tries ``writev`` at once, queues the rest in the core and the core, as
  the fd's writer, flushes it when the pipe is writable;
- ``_protocol``, ``_closing``, ``_conn_lost`` and the write side's flow-control state live in the
  core (properties here).

The methods below are asyncio's, restated only where asyncio's touched its ``bytearray``
buffer or did the read inline. What asyncio accepts, this accepts (pipes, sockets and character
devices such as ptys; anything else is asyncio's ``ValueError``), so there is no fallback class.
"""

from __future__ import annotations

import os
import stat
from asyncio import futures, transports, unix_events
from asyncio.log import logger
from typing import Any, NoReturn

from ._native import StreamCore
from ._socket_transport import CoreStateMixin, core_attr


def _file_type(fileno: int) -> tuple[bool, bool, bool]:
    """Whether ``fileno`` is a character device, a pipe (FIFO) or a socket."""
    mode = os.fstat(fileno).st_mode
    return stat.S_ISCHR(mode), stat.S_ISFIFO(mode), stat.S_ISSOCK(mode)


def _refuse(transport: Any, message: str) -> NoReturn:
    """asyncio's way out of a constructor given another kind of file: the transport forgets
    the pipe (so ``__del__`` neither warns nor closes it) and the core lets go of it."""
    transport._pipe = None
    transport._fileno = None
    transport._protocol = None
    transport._core._release()
    raise ValueError(message)


class _UnixReadPipeTransport(CoreStateMixin, unix_events._UnixReadPipeTransport):
    def __init__(
        self, loop: Any, pipe: Any, protocol: Any, waiter: Any = None, extra: Any = None
    ) -> None:
        # The steps of asyncio's constructor, with the core as the reader. The core comes
        # first: every attribute asyncio's __repr__ and __del__ read must exist from here on.
        fileno = pipe.fileno()
        core = StreamCore._attach(loop, self, fileno, pipe="read")
        self._core = core
        self._read_ready = core  # type: ignore[method-assign]
        self.is_closing = core.is_closing  # type: ignore[method-assign]
        transports.ReadTransport.__init__(self, extra)
        self._extra["pipe"] = pipe
        self._loop = loop
        self._pipe = pipe
        self._fileno = fileno
        self.set_protocol(protocol)
        self._closing = False
        self._paused = False

        is_char, is_fifo, is_socket = _file_type(fileno)
        if not (is_fifo or is_socket or is_char):
            _refuse(self, "Pipe transport is for pipes/sockets only.")

        os.set_blocking(fileno, False)

        loop.call_soon(protocol.connection_made, self)
        # Reading starts once connection_made() has run; then the waiter is woken.
        loop.call_soon(self._add_reader, fileno, core)
        if waiter is not None:
            loop.call_soon(futures._set_result_unless_cancelled, waiter, None)

    def set_protocol(self, protocol: Any) -> None:
        # A pipe always calls data_received (asyncio's pipe knows no BufferedProtocol).
        self._core.set_protocol(protocol, False)

    def _read_ready__on_eof(self) -> None:
        # The EOF branch of asyncio's _read_ready: the writer closed, so does the transport.
        if self._loop.get_debug():
            logger.info("%r was closed by peer", self)
        self._closing = True
        self._loop._remove_reader(self._fileno)
        self._loop.call_soon(self._protocol.eof_received)
        self._loop.call_soon(self._call_connection_lost, None)


class _UnixWritePipeTransport(CoreStateMixin, unix_events._UnixWritePipeTransport):
    _protocol_paused = core_attr("_protocol_paused")
    _high_water = core_attr("_high_water")
    _low_water = core_attr("_low_water")

    def __init__(
        self, loop: Any, pipe: Any, protocol: Any, waiter: Any = None, extra: Any = None
    ) -> None:
        # The steps of asyncio's constructor, with the core in place of the Python buffer.
        fileno = pipe.fileno()
        core = StreamCore._attach(loop, self, fileno, pipe="write")
        self._core = core
        self.write = core.write  # type: ignore[method-assign]
        self.get_write_buffer_size = core.get_write_buffer_size  # type: ignore[method-assign]
        self.is_closing = core.is_closing  # type: ignore[method-assign]
        transports._FlowControlMixin.__init__(self, extra, loop)
        self._extra["pipe"] = pipe
        self._pipe = pipe
        self._fileno = fileno
        self._protocol = protocol
        self._conn_lost = 0
        self._closing = False  # Set when close() or write_eof() called.

        is_char, is_fifo, is_socket = _file_type(fileno)
        if not (is_char or is_fifo or is_socket):
            _refuse(self, "Pipe transport is only for pipes, sockets and character devices")

        os.set_blocking(fileno, False)
        loop.call_soon(protocol.connection_made, self)

        # asyncio notices that the reading end closed through read readiness on the write end,
        # which Linux reports for pipes and sockets (not for character devices).
        if is_socket or is_fifo:
            loop.call_soon(loop._add_reader, fileno, self._read_ready)

        if waiter is not None:
            loop.call_soon(futures._set_result_unless_cancelled, waiter, None)

    def _read_ready(self) -> None:
        # The pipe's reading end was closed.
        if self._loop.get_debug():
            logger.info("%r was closed by peer", self)
        if self._core.get_write_buffer_size():
            self._close(BrokenPipeError())
        else:
            self._close()

    def write_eof(self) -> None:
        core = self._core
        if core._closing:
            return
        assert self._pipe
        core._closing = True
        if not core.get_write_buffer_size():
            self._loop._remove_reader(self._fileno)
            self._loop.call_soon(self._call_connection_lost, None)

    def _close(self, exc: BaseException | None = None) -> None:
        core = self._core
        core._closing = True
        if core._discard_buffer():
            self._loop._remove_writer(self._fileno)
        self._loop._remove_reader(self._fileno)
        self._loop.call_soon(self._call_connection_lost, exc)
