"""Connection management: keep-alive, pipelining, HTTP/1.0, Connection: close, idle timeout."""

from __future__ import annotations

import json
import socket

import pytest


@pytest.fixture(scope="module")
def server(serve):
    return serve("raw_asgi:app")


def test_keep_alive_serves_several_requests_on_one_connection(server, connect):
    connection = connect(server)
    for index in range(5):
        body = f"request {index}".encode()
        response = connection.request("POST", "/echo", body=body)
        assert response.status == 200
        assert response.body == body
        assert response.header("connection") != "close"
    response = connection.request("GET", "/hello")
    assert (response.status, response.body) == (200, b"hello, world")


@pytest.mark.parametrize("split", ["one write", "byte by byte"])
def test_pipelined_requests_are_answered_in_order(server, connect, request_bytes, split):
    connection = connect(server)
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = (
        request_bytes("GET", "/scope/first")
        + request_bytes("POST", "/echo", body=b"second, with a body")
        + request_bytes("GET", "/scope/third?x=3")
    )
    if split == "one write":
        connection.send(data)
    else:
        for index in range(len(data)):
            connection.send(data[index : index + 1])
    first = connection.read_response()
    second = connection.read_response()
    third = connection.read_response()
    assert [first.status, second.status, third.status] == [200, 200, 200]
    assert json.loads(first.body)["path"] == "/scope/first"
    assert second.body == b"second, with a body"
    assert json.loads(third.body)["query_string"] == "x=3"
    assert all(r.complete for r in (first, second, third))
    # The connection is still usable afterwards.
    assert connection.request("GET", "/hello").body == b"hello, world"


def test_pipelined_request_after_a_streamed_response(server, connect, request_bytes):
    connection = connect(server)
    connection.send(
        request_bytes("GET", "/chunked-response?parts=4") + request_bytes("GET", "/hello")
    )
    first = connection.read_response()
    second = connection.read_response()
    assert first.body == b"part 0\npart 1\npart 2\npart 3\n"
    assert second.body == b"hello, world"


def test_http10_connection_closes_after_the_response(server, connect, request_bytes):
    connection = connect(server)
    connection.send(request_bytes("GET", "/hello", version="HTTP/1.0"))
    response = connection.read_response()
    assert response.status == 200
    assert response.body == b"hello, world"
    assert connection.closed_by_peer()


def test_http10_streamed_response_is_not_chunked(server, connect, request_bytes):
    # An HTTP/1.0 client does not know chunked coding: the body is delimited otherwise.
    connection = connect(server)
    connection.send(request_bytes("GET", "/chunked-response?parts=3", version="HTTP/1.0"))
    response = connection.read_response()
    assert response.status == 200
    assert response.framing in ("close", "content-length")
    assert response.body == b"part 0\npart 1\npart 2\n"
    assert connection.closed_by_peer()


@pytest.mark.ferroloop_only(reason="uvicorn closes every HTTP/1.0 connection")
def test_http10_keep_alive_keeps_the_connection_open(server, connect, request_bytes):
    connection = connect(server)
    for _ in range(3):
        connection.send(
            request_bytes(
                "GET", "/hello", headers=[("Connection", "keep-alive")], version="HTTP/1.0"
            )
        )
        response = connection.read_response()
        assert (response.status, response.body) == (200, b"hello, world")
        assert (response.header("connection") or "").lower() == "keep-alive"
    connection.send(request_bytes("GET", "/hello", version="HTTP/1.0"))
    assert connection.read_response().body == b"hello, world"
    assert connection.closed_by_peer()


def test_connection_close_request_gets_the_response_then_eof(server, connect):
    connection = connect(server)
    response = connection.request("GET", "/hello", headers=[("Connection", "close")])
    assert (response.status, response.body) == (200, b"hello, world")
    assert (response.header("connection") or "").lower() == "close"
    assert connection.closed_by_peer()


def test_connection_close_drops_requests_pipelined_after_it(server, connect, request_bytes):
    connection = connect(server)
    connection.send(
        request_bytes("GET", "/hello", headers=[("Connection", "close")])
        + request_bytes("GET", "/scope/never-answered")
    )
    assert connection.read_response().body == b"hello, world"
    assert connection.read_until_close() == b""


def test_idle_keep_alive_connection_is_closed_after_the_timeout(serve, connect):
    server = serve("raw_asgi:app", "--timeout-keep-alive", "1")
    connection = connect(server)
    assert connection.request("GET", "/hello").status == 200
    # Waits at most IO_TIMEOUT (10 s) for the server to close the idle connection.
    assert connection.closed_by_peer()
