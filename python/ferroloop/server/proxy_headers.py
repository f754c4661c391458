"""``X-Forwarded-For`` / ``X-Forwarded-Proto`` from trusted proxies (``--proxy-headers``).

When the direct peer of a request is trusted (``--forwarded-allow-ips``: IP addresses, CIDR
networks, other literals, or ``*`` for everyone), ``scope["client"]`` becomes the client named
by ``X-Forwarded-For`` and ``scope["scheme"]`` the one named by ``X-Forwarded-Proto``.

Which ``X-Forwarded-For`` entry: every proxy appends the address it received the request from,
so the list is read from the right and the first address that is *not* a trusted proxy is the
client. If all are trusted (or the setting is ``*``) the leftmost entry is used. An entry may
carry a port (``1.2.3.4:5678``, ``[::1]:5678``); otherwise the port is 0. This is uvicorn's rule.

A connection with no IP peer address (``scope["client"]`` is ``None``: a Unix-socket peer) is
trusted when ``trust_unix_clients`` is true, the default: only processes on this host that may
open the socket file can connect, which is the same trust as a loopback proxy. (uvicorn trusts
such peers only with ``*``.)

The middleware is a plain function returning the wrapped app's awaitable, not a coroutine
function, so it adds no coroutine frame to a request's path.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Iterable
from functools import lru_cache
from typing import Any

from .importer import ASGIApp, Receive, Scope, Send

_HTTP_SCHEMES = {"http": "http", "https": "https", "ws": "http", "wss": "https"}
_WS_SCHEMES = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _split_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",")]


def parse_host_port(value: str) -> tuple[str, int]:
    """``"1.2.3.4"``, ``"1.2.3.4:80"``, ``"[::1]:80"``, ``"::1"`` → ``(host, port or 0)``.

    A malformed value comes back whole with port 0, so that it can only match a literal.
    """
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return value, 0
        host, rest = value[1:end], value[end + 1 :]
        if not rest:
            return host, 0
        if rest.startswith(":") and rest[1:].isdigit():
            return host, int(rest[1:])
        return value, 0
    if value.count(":") == 1:
        host, _, port = value.partition(":")
        if port.isdigit():
            return host, int(port)
        return value, 0
    return value, 0


class TrustedHosts:
    """The parsed ``forwarded_allow_ips`` setting: ``host in trusted`` answers for one host."""

    def __init__(self, trusted: str | Iterable[str]) -> None:
        items = _split_list(trusted) if isinstance(trusted, str) else [t.strip() for t in trusted]
        items = [item for item in items if item]
        self.always_trust = "*" in items
        self.addresses: set[IPAddress] = set()
        self.networks: list[IPNetwork] = []
        self.literals: set[str] = set()
        for item in items:
            try:
                if "/" in item:
                    self.networks.append(ipaddress.ip_network(item, strict=False))
                else:
                    self.addresses.add(ipaddress.ip_address(item))
            except ValueError:
                # Not an IP: a literal such as a Unix socket path, compared as a string.
                self.literals.add(item)
        self._cached = lru_cache(maxsize=4096)(self._compute)

    def __contains__(self, host: object) -> bool:
        if self.always_trust:
            return True
        if not isinstance(host, str) or not host:
            return False
        if len(host) > 253:  # longer than any DNS name; not worth a cache slot
            return self._compute(host)
        return self._cached(host)

    def _compute(self, host: str) -> bool:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return host in self.literals
        return ip in self.addresses or any(ip in network for network in self.networks)

    def client_from_forwarded_for(self, forwarded_for: str) -> tuple[str, int]:
        """The client address named by an ``X-Forwarded-For`` value (see the module doc)."""
        hops = _split_list(forwarded_for)
        if not self.always_trust:
            for hop in reversed(hops):
                host, port = parse_host_port(hop)
                if host not in self:
                    return host, port
        return parse_host_port(hops[0])


class ProxyHeadersMiddleware:
    """ASGI 3 middleware applying the proxy headers of trusted peers to the scope (in place)."""

    def __init__(
        self,
        app: ASGIApp,
        trusted_hosts: str | Iterable[str] = "127.0.0.1",
        *,
        trust_unix_clients: bool = True,
    ) -> None:
        self.app = app
        self.trusted_hosts = TrustedHosts(trusted_hosts)
        self.trust_unix_clients = trust_unix_clients

    def is_trusted(self, client: Any) -> bool:
        if client is None:
            return self.trust_unix_clients or self.trusted_hosts.always_trust
        return client[0] in self.trusted_hosts

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        scope_type = scope["type"]
        if (scope_type == "http" or scope_type == "websocket") and self.is_trusted(
            scope.get("client")
        ):
            self.apply(scope)
        return self.app(scope, receive, send)

    def rewrite(self, scope: Scope) -> None:
        """``apply`` if the peer is trusted: what ``__call__`` does before calling the app (the
        native WSGI path calls it directly, with no ASGI app in between)."""
        if self.is_trusted(scope.get("client")):
            self.apply(scope)

    def apply(self, scope: Scope) -> None:
        proto: bytes | None = None
        forwarded_for: list[bytes] = []
        for name, value in scope["headers"]:
            if name == b"x-forwarded-proto":
                proto = value
            elif name == b"x-forwarded-for":
                forwarded_for.append(value)
        if proto is not None:
            schemes = _WS_SCHEMES if scope["type"] == "websocket" else _HTTP_SCHEMES
            scheme = schemes.get(proto.decode("latin-1").strip().lower())
            if scheme is not None:
                scope["scheme"] = scheme
        if forwarded_for:
            value = b", ".join(forwarded_for).decode("latin-1")
            host, port = self.trusted_hosts.client_from_forwarded_for(value)
            if host:  # an empty header names nobody; keep the peer
                scope["client"] = (host, port)
