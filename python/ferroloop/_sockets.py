"""Low-level socket operations (``loop.sock_*``) on top of the native reader/writer registry.

Each operation first tries the non-blocking syscall at once and only registers interest in the
fd when it would block, so a ready socket costs no trip through the poller. Semantics follow
asyncio's selector loop: the waiting registration is removed when the future completes or is
cancelled, unless another operation has replaced it in the meantime.
"""

from __future__ import annotations

import errno
import functools
import io
import os
import socket
import ssl
import sys
from asyncio import base_events, exceptions
from collections.abc import Coroutine
from typing import Any

_RETRY = (BlockingIOError, InterruptedError)


def _check_sock(loop: Any, sock: socket.socket) -> None:
    """asyncio's checks: never an SSL socket; in debug mode, only non-blocking sockets."""
    if isinstance(sock, ssl.SSLSocket):
        raise TypeError("Socket cannot be of type SSLSocket")
    if loop._debug and sock.gettimeout() != 0:
        raise ValueError("the socket must be non-blocking")


def _byte_view(data: Any) -> memoryview:
    try:
        view = memoryview(data)
    except TypeError:
        # asyncio's sock_sendall fails in socket.send, with socket's message.
        raise TypeError(f"a bytes-like object is required, not '{type(data).__name__}'") from None
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


class SocketOps:
    """Mixin for ``ferroloop.Loop``; relies on ``_add_reader``/``_add_writer`` of the core."""

    _add_reader: Any
    _add_writer: Any
    _ensure_fd_no_transport: Any
    remove_reader: Any
    remove_writer: Any
    create_future: Any

    # -- completion plumbing ------------------------------------------------------------------

    def _sock_read_done(self, fd: int, fut: Any, handle: Any = None) -> None:
        if handle is None or not handle.cancelled():
            self.remove_reader(fd)

    def _sock_write_done(self, fd: int, fut: Any, handle: Any = None) -> None:
        if handle is None or not handle.cancelled():
            self.remove_writer(fd)

    def _wait_readable(self, sock: socket.socket, op: Any, *args: Any) -> Coroutine[Any, Any, Any]:
        """Runs ``op(*args)`` each time ``sock`` is readable until it does not block."""
        return self._wait_ready(sock, self._add_reader, self._sock_read_done, op, args)

    def _wait_writable(self, sock: socket.socket, op: Any, *args: Any) -> Coroutine[Any, Any, Any]:
        """Runs ``op(*args)`` each time ``sock`` is writable until it does not block."""
        return self._wait_ready(sock, self._add_writer, self._sock_write_done, op, args)

    async def _wait_ready(
        self, sock: socket.socket, watch: Any, done: Any, op: Any, args: tuple[Any, ...]
    ) -> Any:
        fut = self.create_future()
        fd = sock.fileno()
        self._ensure_fd_no_transport(fd)
        handle = watch(fd, self._finish, fut, op, *args)
        fut.add_done_callback(functools.partial(done, fd, handle=handle))
        try:
            return await fut
        finally:
            # A raised error's traceback holds this frame: without the future (and the handle,
            # whose arguments hold it) the error is not kept alive in a cycle through them.
            del fut, handle

    @staticmethod
    def _finish(fut: Any, op: Any, *args: Any) -> None:
        """Retries ``op(*args)`` once the fd is ready; finishes ``fut`` with its result or
        error, unless it would block again."""
        if fut.done():
            return
        try:
            result = op(*args)
        except _RETRY:
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            fut.set_exception(exc)
            # The error's traceback holds this frame; no cycle through the future.
            del fut
        else:
            fut.set_result(result)

    # -- reads ----------------------------------------------------------------------------------

    async def sock_recv(self, sock: socket.socket, n: int) -> bytes:
        _check_sock(self, sock)
        try:
            return sock.recv(n)
        except _RETRY:
            pass
        return await self._wait_readable(sock, _sock_call, sock, "recv", n)

    async def sock_recv_into(self, sock: socket.socket, buf: Any) -> int:
        _check_sock(self, sock)
        try:
            return sock.recv_into(buf)
        except _RETRY:
            pass
        return await self._wait_readable(sock, _sock_call, sock, "recv_into", buf)

    async def sock_recvfrom(self, sock: socket.socket, bufsize: int) -> tuple[bytes, Any]:
        _check_sock(self, sock)
        try:
            return sock.recvfrom(bufsize)
        except _RETRY:
            pass
        return await self._wait_readable(sock, _sock_call, sock, "recvfrom", bufsize)

    async def sock_recvfrom_into(
        self, sock: socket.socket, buf: Any, nbytes: int = 0
    ) -> tuple[int, Any]:
        _check_sock(self, sock)
        if not nbytes:
            nbytes = len(buf)
        try:
            return sock.recvfrom_into(buf, nbytes)
        except _RETRY:
            pass
        return await self._wait_readable(sock, _sock_call, sock, "recvfrom_into", buf, nbytes)

    async def sock_accept(self, sock: socket.socket) -> tuple[socket.socket, Any]:
        _check_sock(self, sock)
        try:
            conn, address = sock.accept()
        except _RETRY:
            conn, address = await self._wait_readable(sock, _sock_call, sock, "accept")
        conn.setblocking(False)
        return conn, address

    # -- writes ---------------------------------------------------------------------------------

    async def sock_sendall(self, sock: socket.socket, data: Any) -> None:
        _check_sock(self, sock)
        view = _byte_view(data)
        try:
            sent = sock.send(view)
        except _RETRY:
            sent = 0
        if sent == view.nbytes:
            return
        await self._wait_writable(sock, _sendall_step, sock, view, [sent])

    async def sock_sendto(self, sock: socket.socket, data: Any, address: Any) -> int:
        _check_sock(self, sock)
        try:
            return sock.sendto(data, address)
        except _RETRY:
            pass
        return await self._wait_writable(sock, _sock_call, sock, "sendto", data, address)

    async def sock_connect(self, sock: socket.socket, address: Any) -> None:
        _check_sock(self, sock)
        if sock.family == socket.AF_INET or (
            base_events._HAS_IPv6 and sock.family == socket.AF_INET6
        ):
            resolved = await self._ensure_resolved(  # type: ignore[attr-defined]
                address, family=sock.family, type=sock.type, proto=sock.proto, loop=self
            )
            _, _, _, _, address = resolved[0]
        try:
            sock.connect(address)
            return
        except _RETRY:
            pass
        await self._wait_writable(sock, _connect_result, sock, address)

    # -- sendfile -------------------------------------------------------------------------------

    async def _sock_sendfile_native(
        self, sock: socket.socket, file: Any, offset: int, count: int | None
    ) -> int:
        """Zero-copy ``os.sendfile``; ``SendfileNotAvailableError`` makes asyncio fall back."""
        try:
            fileno = file.fileno()
            fsize = os.fstat(fileno).st_size
        except (AttributeError, io.UnsupportedOperation, OSError) as err:
            raise exceptions.SendfileNotAvailableError("not a regular file") from err
        total = 0
        try:
            while True:
                want = (count - total) if count else (fsize - offset - total)
                if want <= 0:
                    break
                try:
                    sent = os.sendfile(sock.fileno(), fileno, offset + total, min(want, 1 << 30))
                except _RETRY:
                    await self._wait_writable(sock, _writable)
                    continue
                except OSError as exc:
                    # As asyncio: a failure before the first byte means "use the fallback";
                    # a peer gone mid-way is a ConnectionError on every platform.
                    if total == 0:
                        raise exceptions.SendfileNotAvailableError(
                            "os.sendfile call failed"
                        ) from exc
                    if exc.errno == errno.ENOTCONN and type(exc) is not ConnectionError:
                        raise ConnectionError("socket is not connected", errno.ENOTCONN) from exc
                    raise
                if sent == 0:
                    break
                total += sent
        finally:
            # As the running asyncio: 3.15 moves the file position past what was sent even
            # when that is nothing; earlier versions only after sending something.
            if total > 0 or _SEEKS_WHEN_NOTHING_SENT:
                file.seek(offset + total)
        return total


_SEEKS_WHEN_NOTHING_SENT = sys.version_info >= (3, 15)


def _sock_call(sock: socket.socket, method: str, *args: Any) -> Any:
    """``sock.<method>(*args)``, looked up on every retry as asyncio does, so a socket object
    whose method was replaced meanwhile is honoured."""
    return getattr(sock, method)(*args)


def _connect_result(sock: socket.socket, address: Any) -> None:
    """The outcome of a non-blocking connect, once the socket is writable."""
    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err != 0:
        raise OSError(err, f"Connect call failed {address}")


def _sendall_step(sock: socket.socket, view: memoryview, pos: list[int]) -> None:
    """Sends what is left from ``pos[0]``; "would block" until everything is out."""
    pos[0] += sock.send(view[pos[0] :])
    if pos[0] < view.nbytes:
        raise BlockingIOError


def _writable() -> None:
    """The op of a plain wait for writability."""
