"""Bodies: Content-Length and chunked both ways, HEAD, 100-continue, the Date and Server headers."""

from __future__ import annotations

import email.utils
import http.client
import socket

import pytest


@pytest.fixture(scope="module")
def server(serve):
    return serve("raw_asgi:app")


# 2047-2049: around the size up to which a body is copied behind the head (one buffer, one send).
@pytest.mark.parametrize("size", [0, 1, 1000, 2047, 2048, 2049, 300_000])
def test_content_length_body_is_echoed(server, connect, size):
    body = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    connection = connect(server)
    response = connection.request(
        "POST", "/echo", headers=[("Content-Length", str(size))], body=body
    )
    assert response.status == 200
    assert response.body == body
    # The connection stays usable: the body was consumed exactly.
    assert connection.request("GET", "/hello").body == b"hello, world"


def test_pipelined_content_length_responses_of_mixed_sizes_arrive_in_order(
    server, connect, request_bytes
):
    # Small bodies are copied behind their heads, larger ones sent from the app's buffer; with
    # pipelining the responses queue behind each other, and none may overtake another.
    sizes = [5, 2048, 3000, 1, 70_000, 2049, 0, 12]
    bodies = [bytes([i + 1]) * size for i, size in enumerate(sizes)]
    connection = connect(server)
    connection.send(
        b"".join(
            request_bytes("POST", "/echo", [("Content-Length", str(len(b)))], b) for b in bodies
        )
    )
    for body in bodies:
        response = connection.read_response("POST")
        assert (response.status, response.body) == (200, body)


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"


def test_chunked_request_body_is_echoed(server, connect):
    parts = [b"hello", b", ", b"chunked " * 1000, b"world"]
    connection = connect(server)
    response = connection.request(
        "POST", "/echo", headers=[("Transfer-Encoding", "chunked")], body=chunked(*parts)
    )
    assert response.status == 200
    assert response.body == b"".join(parts)
    assert connection.request("GET", "/hello").body == b"hello, world"


def test_chunked_request_with_extensions_and_trailers(server, connect):
    body = (
        b"5;name=value\r\nhello\r\n"
        b'7; quoted="a;b"\r\n, world\r\n'
        b"0;last\r\n"
        b"X-Checksum: abc\r\n"
        b"X-Other: 1\r\n"
        b"\r\n"
    )
    connection = connect(server)
    response = connection.request(
        "POST", "/echo", headers=[("Transfer-Encoding", "chunked")], body=body
    )
    assert response.status == 200
    assert response.body == b"hello, world"
    # The trailer section was consumed: the next request on the connection parses.
    assert connection.request("GET", "/hello").body == b"hello, world"


def test_chunked_request_sent_byte_by_byte(server, connect, request_bytes):
    data = request_bytes(
        "POST", "/echo", headers=[("Transfer-Encoding", "chunked")], body=chunked(b"ab", b"cdef")
    )
    connection = connect(server)
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for index in range(len(data)):
        connection.send(data[index : index + 1])
    assert connection.read_response().body == b"abcdef"


def test_upper_case_chunk_size_is_accepted(server, connect):
    body = b"A\r\n0123456789\r\n0\r\n\r\n"
    connection = connect(server)
    response = connection.request(
        "POST", "/echo", headers=[("Transfer-Encoding", "chunked")], body=body
    )
    assert response.body == b"0123456789"


def test_streamed_response_is_chunked_and_decodes(server, connect):
    connection = connect(server)
    response = connection.request("GET", "/chunked-response?parts=5")
    assert response.status == 200
    assert response.header("transfer-encoding") == "chunked"
    assert response.header("content-length") is None
    assert response.framing == "chunked"
    assert response.body == b"".join(b"part %d\n" % index for index in range(5))
    assert connection.request("GET", "/hello").body == b"hello, world"


def test_streamed_response_through_http_client(server):
    client = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        client.request("GET", "/chunked-response?parts=3")
        response = client.getresponse()
        assert response.status == 200
        assert response.read() == b"part 0\npart 1\npart 2\n"
        client.request("GET", "/hello")
        assert client.getresponse().read() == b"hello, world"
    finally:
        client.close()


def test_single_body_without_length_is_framed(server, connect):
    connection = connect(server)
    response = connection.request("GET", "/no-length")
    assert response.status == 200
    assert response.framing in ("content-length", "chunked")
    assert response.body == b"one body, no length"
    if response.framing == "content-length":
        assert response.header("content-length") == str(len(b"one body, no length"))
    assert connection.request("GET", "/hello").body == b"hello, world"


@pytest.mark.parametrize("target", ["/hello", "/chunked-response?parts=2"])
def test_head_response_has_headers_but_no_body(server, connect, request_bytes, target):
    connection = connect(server)
    # A GET pipelined behind the HEAD: if the HEAD response carried body bytes, they would be
    # read as the start of the GET response and break it.
    connection.send(request_bytes("HEAD", target) + request_bytes("GET", "/hello"))
    head = connection.read_response("HEAD")
    assert head.status == 200
    if target == "/hello":
        assert head.header("content-length") == "12"
    get = connection.read_response()
    assert (get.status, get.body) == (200, b"hello, world")


def test_date_and_server_headers_are_present(server, connect):
    response = connect(server).request("GET", "/hello")
    assert response.header("server")
    date = response.header("date")
    assert date is not None
    assert email.utils.parsedate_to_datetime(date).tzinfo is not None
    assert date.endswith(" GMT")
    assert len(response.header_values("date")) == 1
    assert len(response.header_values("server")) == 1


@pytest.mark.ferroloop_only(reason="the Server header names the server")
def test_server_header_names_ferroloop(server, connect):
    response = connect(server).request("GET", "/hello")
    assert response.header("server") == "ferroloop"


def test_no_server_header_and_no_date_header_options(serve, connect):
    server = serve("raw_asgi:app", "--no-server-header", "--no-date-header")
    response = connect(server).request("GET", "/hello")
    assert response.status == 200
    assert response.header("server") is None
    assert response.header("date") is None


def test_header_option_adds_fields_to_every_response(serve, connect):
    server = serve("raw_asgi:app", "--header", "X-Frame-Options:DENY", "--header", "x-team:core")
    for target in ("/hello", "/echo", "/chunked-response"):
        response = connect(server).request("GET", target)
        assert response.status == 200
        assert response.header_values("x-frame-options") == ["DENY"], target
        assert response.header_values("x-team") == ["core"], target


def test_header_option_named_server_replaces_the_server_header(serve, connect):
    server = serve("raw_asgi:app", "--header", "Server:edge-proxy")
    response = connect(server).request("GET", "/hello")
    assert response.header_values("server") == ["edge-proxy"]


@pytest.mark.ferroloop_only(reason="uvicorn sends both the --header field and the app's")
def test_the_apps_own_field_wins_over_a_header_option(serve, connect):
    server = serve("raw_asgi:app", "--header", "x-team:core", "--header", "x-other:kept")
    response = connect(server).request("GET", "/with-header?name=X-Team&value=app")
    assert response.header_values("x-team") == ["app"]
    assert response.header_values("x-other") == ["kept"]


@pytest.mark.ferroloop_only(reason="the server's own error responses; uvicorn's h11 differ")
def test_error_responses_carry_the_header_option_and_server_fields(serve, connect):
    server = serve("raw_asgi:app", "--header", "x-team:core")
    connection = connect(server)
    connection.send(b"GET / HTTP/1.1\r\nHost: test\r\nContent-Length: x\r\n\r\n")
    rejected = connection.read_response()
    assert rejected.status == 400
    assert rejected.header_values("x-team") == ["core"]
    assert rejected.header_values("server") == ["ferroloop"]
    failed = connect(server).request("GET", "/raise-before-start")
    assert failed.status == 500
    assert failed.header_values("x-team") == ["core"]


def send_head_with_expect(connection, target: str, body: bytes) -> None:
    connection.send(
        (
            f"POST {target} HTTP/1.1\r\nHost: test\r\nContent-Length: {len(body)}\r\n"
            "Expect: 100-continue\r\n\r\n"
        ).encode()
    )


def test_100_continue_is_sent_when_the_app_reads_the_body(server, connect):
    body = b"the body, sent after 100 Continue"
    connection = connect(server)
    send_head_with_expect(connection, "/echo", body)
    # Nothing of the body has been sent: the server must answer 100 to get it.
    interim = connection.read_response()
    assert interim.status == 100
    assert interim.http_version == "1.1"
    connection.send(body)
    final = connection.read_response()
    assert (final.status, final.body) == (200, body)


def test_100_continue_is_not_sent_when_the_app_responds_without_reading(server, connect):
    body = b"never read"
    connection = connect(server)
    send_head_with_expect(connection, "/respond-without-reading", body)
    response = connection.read_response()
    assert response.status == 200, "the first response must be the final one, not 100"
    assert response.body == b"did not read the body"


def test_100_continue_then_the_app_sees_the_whole_body_in_chunks(server, connect):
    connection = connect(server)
    connection.send(
        b"POST /echo HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n"
        b"Expect: 100-continue\r\n\r\n"
    )
    assert connection.read_response().status == 100
    connection.send(chunked(b"part one, ", b"part two"))
    assert connection.read_response().body == b"part one, part two"


def test_two_megabyte_body_is_accepted_by_default(server, connect):
    body = b"x" * (2 * 1024 * 1024)
    response = connect(server).request("POST", "/digest", body=body)
    assert response.status == 200
    assert b'"length": 2097152' in response.body
