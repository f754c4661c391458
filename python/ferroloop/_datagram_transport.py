"""The native datagram transport: asyncio's ``_SelectorDatagramTransport`` over a Rust core.

The same shape as the stream transport (``_socket_transport``): a subclass of asyncio's class
(``isinstance(t, asyncio.DatagramTransport)`` holds, reprs and logs keep asyncio's name) that
keeps asyncio's code for every cold path (``_fatal_error``, ``abort``, flow control and
``set_write_buffer_limits``, ``pause_reading``/``resume_reading``, ``get_extra_info``,
``__repr__``, the ``ResourceWarning`` in ``__del__``) and holds a native ``DatagramCore``
(``crates/py/src/transport/datagram.rs``):

- the core is the fd's reader (``_read_ready``): readiness → ``recvfrom`` into the per-thread
  buffer → ``datagram_received(bytes, addr)``, the address in ``socket.recvfrom``'s form;
- ``sendto`` and ``get_write_buffer_size`` are the core's bound methods stored on the instance
  (no Python frame per call); a datagram that would block is queued in the core (with its
  address) and flushed in order by the core as the fd's writer;
- ``_protocol``, ``_conn_lost`` and ``_closing`` live in the core (properties here).

Once ``connection_lost`` has run the core lets go of the socket and ``sendto`` is asyncio's own
method again (its answers on a closed transport are asyncio's). Used for plain ``socket.socket``
objects of type ``SOCK_DGRAM`` in ``AF_INET``, ``AF_INET6`` and ``AF_UNIX``; anything else gets
asyncio's class (see ``_transports.TransportOps``).
"""

from __future__ import annotations

import collections
import socket
from asyncio import futures, selector_events, transports
from typing import Any

from ._native import DatagramCore
from ._socket_transport import NativeCoreMixin


class _SelectorDatagramTransport(
    NativeCoreMixin, selector_events._SelectorDatagramTransport, transports.DatagramTransport
):
    def __init__(
        self,
        loop: Any,
        sock: socket.socket,
        protocol: Any,
        address: Any = None,
        waiter: Any = None,
        extra: Any = None,
    ) -> None:
        # The steps of asyncio's _SelectorTransport/_SelectorDatagramTransport constructors,
        # with the core in place of the Python queue and callbacks.
        self._init_extra(loop, sock, extra)
        core = DatagramCore._attach(
            loop, self, sock, sock.fileno(), sock.family, address, bool(self._extra["peername"])
        )
        self._core = core
        self._read_ready = core
        self.sendto = core.sendto  # type: ignore[method-assign]
        self.get_write_buffer_size = core.get_write_buffer_size  # type: ignore[method-assign]
        self._sock = sock
        self._sock_fd = sock.fileno()
        self._protocol_connected = False
        self.set_protocol(protocol)
        self._server = None
        self._paused = False
        loop._transports[self._sock_fd] = self
        self._address = address

        loop.call_soon(protocol.connection_made, self)
        # Reading starts once connection_made() has run; then the waiter is woken.
        loop.call_soon(self._add_reader, self._sock_fd, core)
        if waiter is not None:
            loop.call_soon(futures._set_result_unless_cancelled, waiter, None)

    @property
    def _buffer(self) -> collections.deque[tuple[bytes, Any]]:
        """asyncio's queue of ``(data, addr)``, as a copy of the core's (read-only)."""
        return collections.deque(self._core._queued())

    @property
    def _buffer_size(self) -> int:
        return self._core.get_write_buffer_size()

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        if self._core._discard_buffer():
            # Queued by a sendto() after close() (asyncio would leave the writer registered
            # on a closed fd).
            self._loop._remove_writer(self._sock_fd)
        try:
            super()._call_connection_lost(exc)
        finally:
            # The core has let go of the socket: asyncio's own sendto answers from now on.
            self.__dict__.pop("sendto", None)
