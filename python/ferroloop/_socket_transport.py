"""The native stream socket transport: asyncio's ``_SelectorSocketTransport`` over a Rust core.

The class subclasses asyncio's own ``_SelectorSocketTransport`` (so ``isinstance(t,
asyncio.Transport)`` holds and keeps its name, which asyncio prints in reprs and logs) and keeps
asyncio's code for every cold path: ``close``-related bookkeeping, ``_fatal_error``,
``_read_ready__on_eof``, flow-control callbacks, ``pause_reading``/``resume_reading``, the
sendfile hooks, ``__repr__`` and ``__del__``. The hot paths are the native ``StreamCore``
(``crates/py/src/transport/``):

- the core is the fd's reader callback (``_read_ready``): readiness → ``recv`` into a reused
  buffer → ``data_received(bytes)``, or ``recv`` into the buffer of a ``BufferedProtocol``;
- ``write`` and ``is_closing`` are native method descriptors of the class that find the core in
  the ``_core`` slot (so the interpreter specialises ``transport.write(data)`` as it does a call
  of any method), and ``get_write_buffer_size`` is the core's bound method stored on the
  instance: calling them runs no Python frame;
- the state both sides read (``_protocol``, ``_conn_lost``, ``_closing``, ``_eof``,
  ``_empty_waiter``, ``_protocol_paused``, ``_high_water``, ``_low_water``) lives in the core and
  appears here as properties; the write buffer is the core's ``OutQueue``.

Used for plain ``socket.socket`` objects of type ``SOCK_STREAM`` in ``AF_INET``, ``AF_INET6`` and
``AF_UNIX``; anything else gets asyncio's class (see ``_transports.TransportOps``).
"""

from __future__ import annotations

import inspect
import socket
from asyncio import base_events, futures, protocols, selector_events, transports, trsock
from operator import attrgetter
from typing import Any

from ._native import StreamCore, _install_transport_methods


def core_attr(name: str) -> Any:
    """A transport attribute that lives in the native core (``self._core.<name>``)."""

    def set_(self: Any, value: Any) -> None:
        setattr(self._core, name, value)

    return property(attrgetter(f"_core.{name}"), set_)


class CoreStateMixin:
    """What every transport over a native core shares: the state the core holds, and dropping
    the core's reference to the transport once ``connection_lost`` has run."""

    __slots__ = ()
    _core: Any
    # asyncio 3.15's transports run the protocol's callbacks in a context of their own, which
    # their borrowed `_add_reader`/`_add_writer`/`_call_soon` pass on; a native core's
    # callbacks run in the loop's context (not done yet: tests/py315/EXCEPTIONS.md).
    _context: Any = None

    _protocol = core_attr("_protocol")
    _conn_lost = core_attr("_conn_lost")
    _closing = core_attr("_closing")

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        try:
            super()._call_connection_lost(exc)  # type: ignore[misc]
        finally:
            # Breaks the transport <-> core cycle now rather than at the next GC pass.
            self._core._release()


class NativeCoreMixin(CoreStateMixin):
    """What the stream and datagram socket transports share: asyncio's ``close`` and
    ``_force_close`` with the core's queue in place of ``_buffer``, and the extra info."""

    __slots__ = ()
    _extra: dict[str, Any]
    _loop: Any
    _sock_fd: int

    def _init_extra(self, loop: Any, sock: socket.socket, extra: Any) -> None:
        """asyncio's ``_SelectorTransport.__init__`` up to ``peername``: flow-control limits and
        the ``socket``/``sockname``/``peername`` extra info."""
        transports._FlowControlMixin.__init__(self, extra, loop)  # type: ignore[arg-type]
        self._extra["socket"] = trsock.TransportSocket(sock)
        try:
            self._extra["sockname"] = sock.getsockname()
        except OSError:
            self._extra["sockname"] = None
        if "peername" not in self._extra:
            try:
                self._extra["peername"] = sock.getpeername()
            except OSError:
                self._extra["peername"] = None

    def close(self) -> None:
        core = self._core
        if core._closing:
            return
        core._closing = True
        self._loop._remove_reader(self._sock_fd)
        if not core.get_write_buffer_size():
            core._conn_lost += 1
            self._loop._remove_writer(self._sock_fd)
            self._loop.call_soon(self._call_connection_lost, None)

    def _force_close(self, exc: BaseException | None) -> None:
        core = self._core
        if core._conn_lost:
            return
        if core._discard_buffer():
            self._loop._remove_writer(self._sock_fd)
        if not core._closing:
            core._closing = True
            self._loop._remove_reader(self._sock_fd)
        core._conn_lost += 1
        self._loop.call_soon(self._call_connection_lost, exc)


class _SelectorSocketTransport(NativeCoreMixin, selector_events._SelectorSocketTransport):
    # A slot, not an instance attribute: the native `write` and `is_closing` read it at a fixed
    # offset (`crates/py/src/transport/methods.rs`).
    __slots__ = ("_core",)

    _eof = core_attr("_eof")
    _empty_waiter = core_attr("_empty_waiter")
    _protocol_paused = core_attr("_protocol_paused")
    _high_water = core_attr("_high_water")
    _low_water = core_attr("_low_water")

    def __init__(
        self,
        loop: Any,
        sock: socket.socket,
        protocol: Any,
        waiter: Any = None,
        extra: Any = None,
        server: Any = None,
    ) -> None:
        # The same steps as asyncio's _SelectorTransport/_SelectorSocketTransport constructors,
        # with the core in place of the Python buffer and callbacks.
        core = StreamCore._attach(loop, self, sock.fileno())
        self._core = core
        self._read_ready = core
        self.get_write_buffer_size = core.get_write_buffer_size  # type: ignore[method-assign]
        self._init_extra(loop, sock, extra)
        self._sock = sock
        self._sock_fd = sock.fileno()
        self._protocol_connected = False
        self.set_protocol(protocol)
        self._server = server
        self._paused = False
        if server is not None:
            attach_to_server(server, self)
        loop._transports[self._sock_fd] = self

        base_events._set_nodelay(sock)
        loop.call_soon(protocol.connection_made, self)
        # Reading starts once connection_made() has run; then the waiter is woken.
        loop.call_soon(self._add_reader, self._sock_fd, core)
        if waiter is not None:
            loop.call_soon(futures._set_result_unless_cancelled, waiter, None)

    def set_protocol(self, protocol: Any) -> None:
        self._core.set_protocol(protocol, isinstance(protocol, protocols.BufferedProtocol))
        self._protocol_connected = True
        # asyncio's reader callback for the protocol's kind. Nothing here calls it (the core
        # reads), but code that inspects a transport does: CPython 3.12+'s test_ssl tells a
        # closed transport by it.
        self._read_ready_cb = self._core

    def close(self) -> None:
        if CLOSE_CLEARS_READ_READY_CB:
            self._read_ready_cb = None
        super().close()

    def writelines(self, list_of_data: Any) -> None:
        # asyncio 3.11's WriteTransport.writelines, spelled out: later versions of the parent
        # class replace it with one that appends to the Python buffer this class does not have.
        self.write(b"".join(list_of_data))

    def write_eof(self) -> None:
        core = self._core
        if core._closing or core._eof:
            return
        core._eof = True
        if not core.get_write_buffer_size():
            self._sock.shutdown(socket.SHUT_WR)

    def _make_empty_waiter(self) -> Any:
        if self._empty_waiter is not None:
            raise RuntimeError("Empty waiter is already set")
        waiter = self._loop.create_future()
        self._empty_waiter = waiter
        if not self.get_write_buffer_size():
            waiter.set_result(None)
        return waiter


# `write` and `is_closing` (native, reading the `_core` slot).
_install_transport_methods(_SelectorSocketTransport)


# asyncio 3.13 tracks a server's transports (`Server._attach(transport)`, for
# `close_clients`/`abort_clients`); 3.11 and 3.12.3 only count them (`Server._attach()`).
_ATTACH_TAKES_TRANSPORT = len(inspect.signature(base_events.Server._attach).parameters) > 1


# asyncio with the gh-115514 fix (CPython PR 128037: 3.12 and 3.13 releases since early 2025)
# clears the reader callback in `_SelectorSocketTransport.close()`; 3.11 keeps it.
CLOSE_CLEARS_READ_READY_CB = (
    "_read_ready_cb" in selector_events._SelectorSocketTransport.close.__code__.co_names
)


def attach_to_server(server: Any, transport: Any) -> None:
    """``server._attach`` in the form this Python's asyncio defines."""
    if _ATTACH_TAKES_TRANSPORT:
        server._attach(transport)
    else:
        server._attach()


NATIVE_FAMILIES = frozenset({socket.AF_INET, socket.AF_INET6, socket.AF_UNIX})


def native_capable(sock: Any, kind: int = socket.SOCK_STREAM) -> bool:
    """Whether a native transport covers ``sock``: a plain socket (no wrapper) of type ``kind``
    (``SOCK_STREAM`` for the stream transport, ``SOCK_DGRAM`` for the datagram one) in one of
    the families the native address conversion knows."""
    return type(sock) is socket.socket and sock.type == kind and sock.family in NATIVE_FAMILIES
