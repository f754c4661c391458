"""ferroloop's TLS protocol: asyncio's ``sslproto.SSLProtocol`` with the per-record path native.

The class subclasses asyncio's ``SSLProtocol``, so the state machine (handshake, flushing,
shutdown, their timeouts), ``_fatal_error``, the flow-control callbacks, the app transport
(``_SSLProtocolTransport``) and ``isinstance`` checks are asyncio's own code. The methods that run
for every TLS record are replaced by the bound methods of a native ``TlsRecords``
(``crates/py/src/transport/tls.rs``) stored on the instance: ``get_buffer``, ``buffer_updated``,
``_do_read``, ``_do_write``, ``_process_outgoing``, ``_write_appdata``, and the app transport's
``write``. In the ``WRAPPED`` state they do asyncio's work without Python frames, calling the C
``_ssl._SSLSocket`` and ``MemoryBIO`` methods directly; in any other state they call asyncio's
method. These method names and bodies are the same in CPython 3.11, 3.12 and 3.13.

The attributes those methods read for every record (``TlsRecords._SLOTS``: ``_state``,
``_write_backlog``, the water marks, ``_app_protocol``, ...) are ``__slots__`` of this class, so
the native side reads them at fixed offsets instead of looking them up; asyncio's code reads
and writes them as plain attributes, as before. They do not appear in ``vars(protocol)``.

The loop builds it for ``ssl=`` connections and servers (``_transports.TransportOps.
_make_ssl_transport``) and for ``start_tls`` upgrades (``TransportOps.start_tls``, with
``call_connection_made=False``); the constructor takes asyncio's arguments unchanged.

A custom ``SSLContext.sslobject_class`` (anything but ``ssl.SSLObject``) keeps asyncio's code
throughout, since its ``read``/``write`` may differ from the C object's.
"""

from __future__ import annotations

import ssl
from asyncio import sslproto
from typing import Any

from ._native import TlsRecords

# The protocol's attributes that become the native object's bound methods (the first two, and
# the app transport's ``write``, are set from ``_fast_methods``: the same methods as built-ins
# that take their one argument without PyO3's argument parsing).
_NATIVE = (
    ("_do_read", "do_read"),
    ("_do_write", "do_write"),
    ("_process_outgoing", "process_outgoing"),
    ("_write_appdata", "write_appdata"),
)


class SSLProtocol(sslproto.SSLProtocol):
    """asyncio's SSL protocol whose per-record methods are native (see the module docstring)."""

    __slots__ = TlsRecords._SLOTS
    _records: TlsRecords | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        sslobj = self._sslobj
        if type(sslobj) is not ssl.SSLObject:
            return
        records = TlsRecords._attach(self, sslobj._sslobj, self._incoming, self._outgoing)
        if records is None:
            return
        self._records = records
        self.get_buffer, self.buffer_updated, app_write = records._fast_methods()  # type: ignore[method-assign]
        for name, native in _NATIVE:
            setattr(self, name, getattr(records, native))
        self._app_transport.write = app_write  # type: ignore[method-assign]
        self._records_transport = self._app_transport

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self._unhook()

    def _unhook(self) -> None:
        """Back to asyncio's methods, and the native object lets go of the protocol (this ends
        the reference cycle between the protocol and its bound methods)."""
        records = self._records
        if records is None:
            return
        self._records = None
        for name in ("get_buffer", "buffer_updated", *(name for name, _ in _NATIVE)):
            self.__dict__.pop(name, None)
        transport = self.__dict__.pop("_records_transport", None)
        if transport is not None:
            transport.__dict__.pop("write", None)
        records._release()
