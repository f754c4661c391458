"""Creating the listening sockets from the options (``host``/``port``, ``uds`` or ``fd``).

Every socket returned is listening (``backlog``), non-blocking and inheritable (workers and the
reloader's child get it by ``fork``). The caller owns and closes them. ``host`` goes through
``getaddrinfo`` like asyncio's ``create_server``: ``localhost`` binds both ``127.0.0.1`` and
``::1``; ``""`` or ``None`` every interface of both families.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import sys

from .config import STARTUP_FAILURE, Config

logger = logging.getLogger("ferroloop.error")


def _tcp_sockets(config: Config, reuse_port: bool) -> list[socket.socket]:
    host = config.host or None
    infos = socket.getaddrinfo(
        host, config.port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
    )
    seen: set[tuple[int, object]] = set()
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                # As asyncio does: an IPv6 socket takes only IPv6, so that the IPv4 socket of
                # the same getaddrinfo answer can bind the same port.
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _is_live(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        return False  # refused (stale) or unreachable: safe to replace
    finally:
        probe.close()
    return True


def _unix_socket(path: str) -> socket.socket:
    mode = 0o666
    try:
        existing = os.stat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(existing.st_mode):
            raise OSError(errno.EEXIST, f"{path} exists and is not a socket; not replacing it")
        if _is_live(path):
            raise OSError(errno.EADDRINUSE, f"{path} is in use by a running server")
        mode = stat.S_IMODE(existing.st_mode)
        os.unlink(path)  # a stale socket left by an earlier run
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, mode)
    except BaseException:
        sock.close()
        raise
    return sock


def _fd_socket(fd: int) -> socket.socket:
    # socket(fileno=...) reads the family and type from the descriptor (uvicorn's fromfd
    # assumes AF_UNIX); dup so that closing ours leaves the inherited descriptor alone.
    return socket.socket(fileno=os.dup(fd))


def create_sockets(config: Config, *, reuse_port: bool | None = None) -> list[socket.socket]:
    """Binds and listens per ``config``; raises ``OSError`` on failure."""
    if config.uds is not None:
        sockets = [_unix_socket(config.uds)]
    elif config.fd is not None:
        sockets = [_fd_socket(config.fd)]
    else:
        sockets = _tcp_sockets(config, config.reuse_port if reuse_port is None else reuse_port)
    try:
        for sock in sockets:
            sock.listen(config.backlog)
            sock.setblocking(False)
            sock.set_inheritable(True)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def bind_sockets(config: Config, *, reuse_port: bool | None = None) -> list[socket.socket]:
    """``create_sockets``, but a failure is logged and exits with status 3 (uvicorn's way)."""
    try:
        return create_sockets(config, reuse_port=reuse_port)
    except OSError as exc:
        logger.error(exc)
        sys.exit(STARTUP_FAILURE)


def describe_listeners(config: Config, sockets: list[socket.socket]) -> tuple[str, list[object]]:
    """The "running on" log message and its arguments (``http://127.0.0.1:8000`` and kin)."""
    if config.uds is not None:
        return "ferroloop running on unix socket %s (Press CTRL+C to quit)", [config.uds]
    if config.fd is not None:
        return "ferroloop running on socket %s (Press CTRL+C to quit)", [sockets[0].getsockname()]
    host = config.host or "0.0.0.0"
    port = config.port or sockets[0].getsockname()[1]
    address = f"[{host}]" if ":" in host else host
    return "ferroloop running on %s://%s:%d (Press CTRL+C to quit)", [
        "https" if config.is_ssl else "http",
        address,
        port,
    ]


def log_listeners(config: Config, sockets: list[socket.socket]) -> None:
    message, args = describe_listeners(config, sockets)
    logger.info(message, *args)


def remove_unix_socket(config: Config) -> None:
    """Unlinks the ``uds`` path if it is (still) a socket."""
    if config.uds is None:
        return
    try:
        if stat.S_ISSOCK(os.stat(config.uds).st_mode):
            os.unlink(config.uds)
    except FileNotFoundError:
        pass
