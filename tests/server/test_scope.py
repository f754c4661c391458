"""The ASGI 3 http scope, as the app sees it (dumped as JSON, bytes decoded as latin-1)."""

from __future__ import annotations

import json
import re

import pytest


@pytest.fixture(scope="module")
def server(serve):
    return serve("raw_asgi:app")


def scope_of(connection, method="GET", target="/scope", headers=None, body=b""):
    response = connection.request(method, target, headers, body)
    assert response.status == 200, response
    return json.loads(response.body)


def test_fixed_fields(server, connect):
    scope = scope_of(connect(server))
    assert scope["type"] == "http"
    assert scope["asgi"]["version"] == "3.0"
    assert re.fullmatch(r"2\.\d+", scope["asgi"]["spec_version"])
    assert scope["http_version"] == "1.1"
    assert scope["scheme"] == "http"
    assert scope["method"] == "GET"
    assert scope["root_path"] == ""
    assert scope["path"] == "/scope"
    assert scope["raw_path"] == "/scope"
    assert scope["query_string"] == ""
    assert scope["_types"]["raw_path"] == "bytes"
    assert scope["_types"]["query_string"] == "bytes"


def test_client_and_server_addresses(server, connect):
    connection = connect(server)
    scope = scope_of(connection)
    local_host, local_port = connection.sock.getsockname()
    assert scope["client"] == [local_host, local_port]
    assert scope["server"] == ["127.0.0.1", server.port]


def test_proxy_headers_of_a_trusted_peer_apply_per_request_on_one_connection(server, connect):
    # 127.0.0.1 is trusted by default. Requests with and without X-Forwarded-* headers
    # alternate on one keep-alive connection: each gets its own answer.
    connection = connect(server)
    local_host, local_port = connection.sock.getsockname()
    forwarded = [("X-Forwarded-For", "203.0.113.7"), ("X-Forwarded-Proto", "https")]
    for _ in range(2):
        scope = scope_of(connection, headers=forwarded)
        assert (scope["client"], scope["scheme"]) == (["203.0.113.7", 0], "https")
        scope = scope_of(connection)
        assert (scope["client"], scope["scheme"]) == ([local_host, local_port], "http")
    scope = scope_of(connection, headers=[("X-Forwarded-Proto", "https")])
    assert (scope["client"], scope["scheme"]) == ([local_host, local_port], "https")


def test_proxy_headers_of_an_untrusted_peer_are_ignored(serve, connect):
    server = serve("raw_asgi:app", "--forwarded-allow-ips", "192.0.2.1")
    connection = connect(server)
    local_host, local_port = connection.sock.getsockname()
    forwarded = [("X-Forwarded-For", "203.0.113.7"), ("X-Forwarded-Proto", "https")]
    scope = scope_of(connection, headers=forwarded)
    assert (scope["client"], scope["scheme"]) == ([local_host, local_port], "http")


def test_http_version_of_an_http10_request(server, connect, request_bytes):
    connection = connect(server)
    connection.send(request_bytes("GET", "/scope", version="HTTP/1.0"))
    assert json.loads(connection.read_response().body)["http_version"] == "1.0"


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "PURGE"])
def test_method(server, connect, method):
    assert scope_of(connect(server), method, "/scope", body=b"x")["method"] == method


def test_path_is_percent_decoded_and_raw_path_is_not(server, connect):
    scope = scope_of(connect(server), target="/scope/caf%C3%A9/a%20b?x=%20y&z")
    assert scope["path"] == "/scope/café/a b"
    assert scope["raw_path"] == "/scope/caf%C3%A9/a%20b"
    assert scope["query_string"] == "x=%20y&z"


def test_query_string_is_passed_through_verbatim(server, connect):
    scope = scope_of(connect(server), target="/scope?a=1&a=2&b=%E2%9C%93&empty=&flag")
    assert scope["query_string"] == "a=1&a=2&b=%E2%9C%93&empty=&flag"
    assert scope["path"] == "/scope"


def test_headers_are_lowercased_ordered_and_duplicates_kept(server, connect, request_bytes):
    connection = connect(server)
    connection.send(
        b"GET /scope HTTP/1.1\r\nHost: example.test\r\nX-Dup: first\r\nX-Other: middle\r\n"
        b"X-DUP: second\r\nContent-Type: Text/Plain\r\nX-Latin: caf\xe9\r\n\r\n"
    )
    scope = json.loads(connection.read_response().body)
    assert scope["headers"] == [
        ["host", "example.test"],
        ["x-dup", "first"],
        ["x-other", "middle"],
        ["x-dup", "second"],
        ["content-type", "Text/Plain"],  # values keep their case
        ["x-latin", "caf\xe9"],  # obs-text survives as the same byte
    ]
    assert scope["_types"]["header_items"] == ["bytes,bytes"]


def test_state_from_lifespan_is_in_the_scope(server, connect):
    assert scope_of(connect(server))["state"]["token"] == "lifespan-state-ok"


def test_state_changes_of_one_request_do_not_leak_into_the_next(server, connect):
    connection = connect(server)
    first = connection.request("GET", "/mutate-state")
    second = connection.request("GET", "/mutate-state")
    assert json.loads(first.body)["token"] == "lifespan-state-ok"
    assert "scribbled" not in json.loads(second.body)


def test_root_path_option(serve, connect):
    server = serve("raw_asgi:app", "--root-path", "/api")
    scope = scope_of(connect(server), target="/scope?q=1")
    assert scope["root_path"] == "/api"
    # As uvicorn (since 0.26) does, and as Starlette's routing expects: path includes root_path.
    assert scope["path"] == "/api/scope"
    assert scope["raw_path"] == "/api/scope"
    assert scope["query_string"] == "q=1"


@pytest.mark.ferroloop_only(reason="uvicorn's HTTP/1.1 protocols advertise no extensions")
def test_extensions_advertise_pathsend_trailers_and_zerocopysend(server, connect):
    extensions = scope_of(connect(server))["extensions"]
    for name in ("http.response.pathsend", "http.response.trailers", "http.response.zerocopysend"):
        assert extensions.get(name) == {}, f"{name} is not advertised: {extensions}"
