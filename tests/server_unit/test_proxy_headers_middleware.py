"""ProxyHeadersMiddleware: trust decisions (IPs, CIDR, '*', Unix peers) and what it rewrites."""

from __future__ import annotations

import pytest
from ferroloop.server.proxy_headers import ProxyHeadersMiddleware, TrustedHosts, parse_host_port


def run(middleware: ProxyHeadersMiddleware, scope: dict) -> dict:
    """Calls the middleware synchronously (its __call__ is a plain function) and returns the
    scope the inner app saw."""
    seen = {}

    def inner(scope, receive, send):
        seen.update(scope)
        return "awaitable"

    middleware.app = inner
    assert middleware(scope, None, None) == "awaitable"
    return seen


def http_scope(client=("127.0.0.1", 5000), headers=(), kind="http", scheme="http") -> dict:
    return {"type": kind, "scheme": scheme, "client": client, "headers": list(headers)}


XFF = b"x-forwarded-for"
XFP = b"x-forwarded-proto"


def test_trusted_peer_client_and_scheme_are_replaced():
    mw = ProxyHeadersMiddleware(None, "127.0.0.1")
    scope = run(mw, http_scope(headers=[(XFF, b"1.2.3.4"), (XFP, b"https")]))
    assert scope["client"] == ("1.2.3.4", 0)
    assert scope["scheme"] == "https"


def test_untrusted_peer_is_left_alone():
    mw = ProxyHeadersMiddleware(None, "127.0.0.1")
    original = http_scope(client=("10.0.0.9", 1), headers=[(XFF, b"1.2.3.4"), (XFP, b"https")])
    scope = run(mw, dict(original))
    assert scope["client"] == ("10.0.0.9", 1)
    assert scope["scheme"] == "http"


def test_rightmost_untrusted_hop_is_the_client():
    mw = ProxyHeadersMiddleware(None, "127.0.0.1, 10.0.0.0/8")
    scope = run(mw, http_scope(headers=[(XFF, b"6.6.6.6, 1.2.3.4, 10.1.1.1, 10.2.2.2")]))
    assert scope["client"] == ("1.2.3.4", 0)


def test_several_forwarded_for_headers_are_one_list():
    mw = ProxyHeadersMiddleware(None, "127.0.0.1, 10.0.0.0/8")
    scope = run(mw, http_scope(headers=[(XFF, b"1.2.3.4"), (XFF, b"10.0.0.5")]))
    assert scope["client"] == ("1.2.3.4", 0)


def test_all_hops_trusted_gives_the_leftmost():
    mw = ProxyHeadersMiddleware(None, "127.0.0.1, 10.0.0.0/8")
    scope = run(mw, http_scope(headers=[(XFF, b"10.0.0.1, 10.0.0.2")]))
    assert scope["client"] == ("10.0.0.1", 0)


def test_star_trusts_everyone_and_takes_the_leftmost():
    mw = ProxyHeadersMiddleware(None, "*")
    scope = run(mw, http_scope(client=("8.8.8.8", 1), headers=[(XFF, b"1.1.1.1, 2.2.2.2")]))
    assert scope["client"] == ("1.1.1.1", 0)


def test_cidr_network_peer_is_trusted():
    mw = ProxyHeadersMiddleware(None, ["192.168.0.0/16"])
    scope = run(mw, http_scope(client=("192.168.4.2", 1), headers=[(XFF, b"1.2.3.4")]))
    assert scope["client"] == ("1.2.3.4", 0)


def test_ipv6_peer_and_bracketed_hop_with_port():
    mw = ProxyHeadersMiddleware(None, "::1")
    scope = run(mw, http_scope(client=("::1", 1), headers=[(XFF, b"[2001:db8::1]:4321")]))
    assert scope["client"] == ("2001:db8::1", 4321)


def test_hop_with_port():
    mw = ProxyHeadersMiddleware(None, "127.0.0.1")
    scope = run(mw, http_scope(headers=[(XFF, b"1.2.3.4:8080")]))
    assert scope["client"] == ("1.2.3.4", 8080)


def test_unix_socket_peer_is_trusted_by_default():
    mw = ProxyHeadersMiddleware(None, "127.0.0.1")
    scope = run(mw, http_scope(client=None, headers=[(XFF, b"1.2.3.4"), (XFP, b"https")]))
    assert scope["client"] == ("1.2.3.4", 0)
    assert scope["scheme"] == "https"
    strict = ProxyHeadersMiddleware(None, "127.0.0.1", trust_unix_clients=False)
    scope = run(strict, http_scope(client=None, headers=[(XFF, b"1.2.3.4")]))
    assert scope["client"] is None


def test_empty_forwarded_for_keeps_the_peer():
    mw = ProxyHeadersMiddleware(None, "127.0.0.1")
    scope = run(mw, http_scope(headers=[(XFF, b"")]))
    assert scope["client"] == ("127.0.0.1", 5000)


@pytest.mark.parametrize(
    ("kind", "proto", "expected"),
    [
        ("http", b"https", "https"),
        ("http", b"HTTP", "http"),
        ("http", b"wss", "https"),
        ("websocket", b"https", "wss"),
        ("websocket", b"http", "ws"),
        ("websocket", b"wss", "wss"),
        ("http", b"gopher", "http"),  # unknown: unchanged
        ("http", b"https, http", "http"),  # a list: unchanged, as uvicorn
    ],
)
def test_forwarded_proto_mapping(kind, proto, expected):
    mw = ProxyHeadersMiddleware(None, "127.0.0.1")
    scheme = "ws" if kind == "websocket" else "http"
    scope = run(mw, http_scope(kind=kind, scheme=scheme, headers=[(XFP, proto)]))
    assert scope["scheme"] == expected


def test_lifespan_scope_passes_through():
    mw = ProxyHeadersMiddleware(None, "*")
    scope = run(mw, {"type": "lifespan", "state": {}})
    assert scope == {"type": "lifespan", "state": {}}


def test_trusted_hosts_literals_and_bad_input():
    trusted = TrustedHosts("127.0.0.1, /tmp/proxy.sock, 10.0.0.0/8")
    assert "127.0.0.1" in trusted
    assert "/tmp/proxy.sock" in trusted
    assert "10.200.0.1" in trusted
    assert "11.0.0.1" not in trusted
    assert "" not in trusted
    assert None not in trusted
    assert "not-an-ip" not in trusted


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1.2.3.4", ("1.2.3.4", 0)),
        ("1.2.3.4:80", ("1.2.3.4", 80)),
        ("1.2.3.4:x", ("1.2.3.4:x", 0)),
        ("::1", ("::1", 0)),
        ("[::1]", ("::1", 0)),
        ("[::1]:80", ("::1", 80)),
        ("[::1", ("[::1", 0)),
        ("[::1]x", ("[::1]x", 0)),
    ],
)
def test_parse_host_port(value, expected):
    assert parse_host_port(value) == expected
