"""Transports, servers, pipes and subprocesses on ferroloop.

Stream transports over plain TCP and Unix sockets are native (``_socket_transport``, over
``crates/py/src/transport``), also under TLS (asyncio's ``sslproto`` layered on top, with its
per-record path native: ``_ssl_protocol``; ``ssl=`` connections get it through
``_make_ssl_transport``, upgrades through ``start_tls``, which is ferroloop's own because
asyncio's names its class), and so are datagram transports over plain UDP and Unix datagram
sockets (``_datagram_transport``) and the read- and write-pipe transports (``_pipe_transport``),
which carry every subprocess pipe. Everything else is asyncio's own implementation: the
subprocess transport (it orchestrates the child and its pipe transports), and stream and
datagram transports over other socket objects. Those need only a few hooks from their loop:
``_add_reader``/``_add_writer``/``_remove_reader``/``_remove_writer`` (native), a
``_transports`` map from fd to transport, and the
``_start_serving``/``_accept_connection``/``_stop_serving`` plumbing. This mixin supplies those
hooks and borrows the stdlib methods that build on them, so create_connection, create_server,
create_datagram_endpoint, create_unix_connection/server, connect_read_pipe/write_pipe,
subprocess_exec/shell and sendfile behave exactly as in asyncio, driven by the native readiness
registry. The borrowed functions were checked to use neither a zero-argument `super()` nor the
selector.
"""

from __future__ import annotations

import os
import selectors
import socket
import ssl
import sys
import weakref
from asyncio import constants, selector_events, streams, unix_events
from asyncio.log import logger
from typing import Any

from ._datagram_transport import _SelectorDatagramTransport
from ._pipe_transport import _UnixReadPipeTransport, _UnixWritePipeTransport
from ._socket_transport import _SelectorSocketTransport, native_capable
from ._ssl_protocol import SSLProtocol

# Methods of asyncio.selector_events.BaseSelectorEventLoop used as they are.
_FROM_SELECTOR_LOOP = (
    "_start_serving",
    "_accept_connection",
    "_accept_connection2",
    "_ensure_fd_no_transport",
    "_sendfile_native",
)

# asyncio 3.12+ refuses to build a transport on a socket that another transport of the loop
# already uses ("File descriptor ... is used by transport ..."); 3.11 does not check.
_CHECKS_FD_FOR_NEW_TRANSPORTS = sys.version_info >= (3, 12)

# Methods of asyncio.unix_events._UnixSelectorEventLoop used as they are.
_FROM_UNIX_LOOP = (
    "_make_subprocess_transport",
    "_child_watcher_callback",
    "create_unix_connection",
    "create_unix_server",
)


class RegistryView:
    """Read-only ``selectors``-style view of the native fd registry, as ``loop._selector``.

    asyncio's transports only read it for their reprs (``_test_selector_event``:
    ``get_key(fd).events``); nothing registers through it.
    """

    def __init__(self, loop: Any) -> None:
        self._loop = weakref.ref(loop)

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        loop = self._loop()
        reading, writing = loop._fd_registered(fileobj) if loop is not None else (False, False)
        if not (reading or writing):
            raise KeyError(f"{fileobj!r} is not registered")
        events = selectors.EVENT_READ if reading else 0
        if writing:
            events |= selectors.EVENT_WRITE
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return selectors.SelectorKey(fileobj, fd, events, None)


class TransportOps:
    """Mixin for ``ferroloop.Loop``: the loop-side hooks asyncio's transports call."""

    _transports: weakref.WeakValueDictionary[int, Any]
    _selector: RegistryView | None

    def _transports_init(self) -> None:
        self._transports = weakref.WeakValueDictionary()
        self._selector = RegistryView(self)
        # Listening Unix sockets whose file ``_stop_serving`` removes, with the file's inode:
        # filled by asyncio 3.13's ``create_unix_server`` (``cleanup_socket=True``), never by
        # 3.11's, which leaves the file in place.
        self._unix_server_sockets: dict[socket.socket, int] = {}
        if sys.version_info >= (3, 14):
            # 3.14's `_make_subprocess_transport` (borrowed above) asks the loop's own child
            # watcher, which its Unix loop makes in `__init__` (child watchers left the policy).
            self._watcher = (
                unix_events._PidfdChildWatcher()  # type: ignore[attr-defined]
                if unix_events.can_use_pidfd()  # type: ignore[attr-defined]
                else unix_events._ThreadedChildWatcher()  # type: ignore[attr-defined]
            )

    def _stop_serving(self, sock: socket.socket) -> None:
        """The selector loop's ``_stop_serving``, then, for a Unix socket ``create_unix_server``
        registered, the removal of its file if it is still the same file (asyncio 3.13's
        ``_UnixSelectorEventLoop._stop_serving``, which cannot be borrowed: it calls
        ``super()``)."""
        path = sock.getsockname() if sock in self._unix_server_sockets else None
        selector_events.BaseSelectorEventLoop._stop_serving(self, sock)  # type: ignore[arg-type]
        if path is None:
            return
        prev_ino = self._unix_server_sockets.pop(sock)
        try:
            if os.stat(path).st_ino == prev_ino:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as err:
            logger.error("Unable to clean up listening UNIX socket %r: %r", path, err)

    def _make_socket_transport(
        self,
        sock: Any,
        protocol: Any,
        waiter: Any = None,
        *,
        extra: Any = None,
        server: Any = None,
        context: Any = None,
    ) -> Any:
        """The native transport for plain stream sockets; asyncio's class for anything else.

        ``context`` (asyncio 3.15 passes each connection a copy of its creator's context, in
        which its transport runs the protocol's callbacks) is accepted and not used yet: the
        protocol's callbacks run in the loop's context, as on 3.14 (tests/py315/EXCEPTIONS.md)."""
        self._check_no_transport(sock)
        if not native_capable(sock):
            cls = selector_events._SelectorSocketTransport
            if context is not None:  # only 3.15's asyncio passes one, and takes one
                return cls(self, sock, protocol, waiter, extra, server, context=context)
            return cls(self, sock, protocol, waiter, extra, server)
        return _SelectorSocketTransport(self, sock, protocol, waiter, extra, server)

    def _make_datagram_transport(
        self, sock: Any, protocol: Any, address: Any = None, waiter: Any = None, extra: Any = None
    ) -> Any:
        """The native transport for plain datagram sockets; asyncio's class for anything else."""
        self._check_no_transport(sock)
        cls = (
            _SelectorDatagramTransport
            if native_capable(sock, socket.SOCK_DGRAM)
            else selector_events._SelectorDatagramTransport
        )
        return cls(self, sock, protocol, address, waiter, extra)

    def _make_read_pipe_transport(
        self, pipe: Any, protocol: Any, waiter: Any = None, extra: Any = None
    ) -> Any:
        """The native read-pipe transport (``connect_read_pipe``, a subprocess's stdout/stderr)."""
        return _UnixReadPipeTransport(self, pipe, protocol, waiter, extra)

    def _make_write_pipe_transport(
        self, pipe: Any, protocol: Any, waiter: Any = None, extra: Any = None
    ) -> Any:
        """The native write-pipe transport (``connect_write_pipe``, a subprocess's stdin)."""
        return _UnixWritePipeTransport(self, pipe, protocol, waiter, extra)

    def _make_ssl_transport(
        self,
        rawsock: Any,
        protocol: Any,
        sslcontext: Any,
        waiter: Any = None,
        *,
        server_side: bool = False,
        server_hostname: str | None = None,
        extra: Any = None,
        server: Any = None,
        ssl_handshake_timeout: float = constants.SSL_HANDSHAKE_TIMEOUT,
        ssl_shutdown_timeout: float = constants.SSL_SHUTDOWN_TIMEOUT,
        context: Any = None,
    ) -> Any:
        """asyncio's TLS layering (an ``sslproto.SSLProtocol`` over a socket transport), with
        ferroloop's subclass whose per-record path is native (``_ssl_protocol``) and the socket
        transport chosen as ``_make_socket_transport`` chooses it (native when it can)."""
        self._check_no_transport(rawsock)
        ssl_protocol = SSLProtocol(
            self,
            protocol,
            sslcontext,
            waiter,
            server_side,
            server_hostname,
            ssl_handshake_timeout=ssl_handshake_timeout,
            ssl_shutdown_timeout=ssl_shutdown_timeout,
        )
        self._make_socket_transport(rawsock, ssl_protocol, extra=extra, server=server)
        return ssl_protocol._app_transport

    async def start_tls(
        self,
        transport: Any,
        protocol: Any,
        sslcontext: Any,
        *,
        server_side: bool = False,
        server_hostname: str | None = None,
        ssl_handshake_timeout: float | None = None,
        ssl_shutdown_timeout: float | None = None,
    ) -> Any:
        """Upgrade ``transport`` to TLS and return the transport ``protocol`` uses from now on.

        asyncio's ``BaseEventLoop.start_tls`` (the same in 3.11, 3.12 and 3.13: the same checks
        and messages, in the same order) with ferroloop's ``SSLProtocol``, so an upgraded
        connection takes the native per-record path as one made with ``ssl=`` does. The TLS
        protocol replaces ``protocol`` on the transport without a second ``connection_made``;
        reading is paused across the switch so no bytes reach the TLS protocol before its own
        ``connection_made`` (which starts the handshake) has run. If the handshake fails or the
        caller is cancelled, the transport is closed and the pending switch callbacks dropped.
        """
        if not isinstance(sslcontext, ssl.SSLContext):
            raise TypeError(
                f"sslcontext is expected to be an instance of ssl.SSLContext, got {sslcontext!r}"
            )
        if not getattr(transport, "_start_tls_compatible", False):
            raise TypeError(f"transport {transport!r} is not supported by start_tls()")

        handshake_done = self.create_future()  # type: ignore[attr-defined]
        ssl_protocol = SSLProtocol(
            self,
            protocol,
            sslcontext,
            handshake_done,
            server_side,
            server_hostname,
            ssl_handshake_timeout=ssl_handshake_timeout,
            ssl_shutdown_timeout=ssl_shutdown_timeout,
            call_connection_made=False,
        )
        transport.pause_reading()
        if server_side:
            # gh-142352 (asyncio 3.14.3+, applied on every version: without it the bytes are
            # lost and the handshake waits forever): what a StreamReader already buffered (the
            # client's first TLS record, read before the server called start_tls) is TLS input.
            stream_reader = getattr(protocol, "_stream_reader", None)
            buffer = getattr(stream_reader, "_buffer", None)
            if isinstance(protocol, streams.StreamReaderProtocol) and buffer:
                ssl_protocol._incoming.write(buffer)
                buffer.clear()
        transport.set_protocol(ssl_protocol)
        switch = (
            self.call_soon(ssl_protocol.connection_made, transport),  # type: ignore[attr-defined]
            self.call_soon(transport.resume_reading),  # type: ignore[attr-defined]
        )
        try:
            await handshake_done
        except BaseException:
            transport.close()
            for handle in switch:
                handle.cancel()
            raise
        return ssl_protocol._app_transport

    def _check_no_transport(self, sock: Any) -> None:
        """As the running asyncio's ``_make_*_transport``: on 3.12+, ``RuntimeError`` if a
        transport of this loop already uses the socket's fd."""
        if _CHECKS_FD_FOR_NEW_TRANSPORTS:
            self._ensure_fd_no_transport(sock)  # type: ignore[attr-defined]

    def _transports_close(self) -> None:
        # As asyncio's selector loop: a closed loop has no selector (transport reprs say "open").
        self._selector = None


for _name in _FROM_SELECTOR_LOOP:
    setattr(TransportOps, _name, getattr(selector_events.BaseSelectorEventLoop, _name))
for _name in _FROM_UNIX_LOOP:
    setattr(TransportOps, _name, getattr(unix_events._UnixSelectorEventLoop, _name))
del _name
