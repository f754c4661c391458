"""Strict framing: a request whose length is ambiguous or malformed is rejected and the
connection closed (RFC 9112 sections 6.1 and 6.3, 5.1/5.2 for header field syntax and 3.2 for
Host), so
that no front proxy and this server can disagree about where a request ends.

Each case is sent in one write and, to show the server does not read past the error, is
followed by a well-formed request that must not be answered.
"""

from __future__ import annotations

import json

import pytest

HOST = b"Host: test\r\n"
TRAILING_REQUEST = b"GET /hello HTTP/1.1\r\nHost: test\r\n\r\n"

ferroloop_only = pytest.mark.ferroloop_only

CASES = [
    pytest.param(
        b"POST /echo HTTP/1.1\r\n"
        + HOST
        + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        {400},
        id="content-length-and-transfer-encoding",
        marks=ferroloop_only(reason="h11 lets Transfer-Encoding win (RFC 9112 allows it)"),
    ),
    pytest.param(
        b"POST /echo HTTP/1.1\r\n" + HOST + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        {400},
        id="two-differing-content-lengths",
    ),
    pytest.param(
        b"POST /echo HTTP/1.1\r\n" + HOST + b"Content-Length: 5, 6\r\n\r\nhello!",
        {400},
        id="differing-content-length-list",
    ),
    pytest.param(
        b"POST /echo HTTP/1.1\r\n" + HOST + b"Content-Length: -5\r\n\r\nhello",
        {400},
        id="negative-content-length",
    ),
    pytest.param(
        b"POST /echo HTTP/1.1\r\n" + HOST + b"Content-Length: five\r\n\r\nhello",
        {400},
        id="non-numeric-content-length",
    ),
    pytest.param(
        b"POST /echo HTTP/1.1\r\n"
        + HOST
        + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        {400},
        id="bad-chunk-size",
    ),
    pytest.param(
        b"POST /echo HTTP/1.1\r\n"
        + HOST
        + b"Transfer-Encoding: chunked\r\n\r\n10000000000000000000\r\nhello\r\n0\r\n\r\n",
        {400},
        id="chunk-size-overflow",
        marks=ferroloop_only(
            reason="h11 parses any number of hex digits and waits for 2**76 bytes"
        ),
    ),
    pytest.param(
        b"POST /echo HTTP/1.1\r\n"
        + HOST
        + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
        {400},
        id="chunk-data-longer-than-its-size",
    ),
    pytest.param(
        b"GET /hello HTTP/1.1\r\n" + HOST + b"X-Folded: first\r\n  continued\r\n\r\n",
        {400},
        id="obs-fold",
        marks=ferroloop_only(reason="h11 unfolds obs-fold lines (RFC 9112 allows it)"),
    ),
    pytest.param(
        b"POST /echo HTTP/1.1\r\n"
        + HOST
        + b"Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        {501},
        id="unsupported-transfer-coding",
        marks=ferroloop_only(reason="uvicorn answers 400 to every parse error"),
    ),
    pytest.param(
        # chunked is not the final coding: RFC 9112 6.3 says 400, 6.1 allows 501.
        b"POST /echo HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: gzip\r\n\r\nhello",
        {400, 501},
        id="transfer-encoding-without-chunked",
    ),
    # RFC 9112 3.2: an HTTP/1.1 request has exactly one Host line; two could name different
    # hosts to a proxy in front and to the app behind it.
    pytest.param(b"GET /hello HTTP/1.1\r\n\r\n", {400}, id="http11-without-host"),
    pytest.param(
        b"GET /hello HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n",
        {400},
        id="two-host-lines",
    ),
    pytest.param(b"HELLO\r\n\r\n", {400}, id="garbage-request-line"),
    pytest.param(b"GET /hello HTTP/1.1 extra\r\n" + HOST + b"\r\n", {400}, id="extra-token"),
    pytest.param(
        b"GET /hello HTTP/1.1\r\n" + HOST + b"Bad Header: x\r\n\r\n",
        {400},
        id="space-in-header-name",
    ),
    pytest.param(
        b"GET /hello HTTP/1.1\r\n" + HOST + b"X-Name : x\r\n\r\n",
        {400},
        id="space-before-colon",
    ),
    pytest.param(
        b"GET /hello HTTP/1.1\r\n" + HOST + b"no colon here\r\n\r\n",
        {400},
        id="header-line-without-colon",
    ),
]


# A chunked body up to its last chunk; the trailer section follows (RFC 9112 7.1.2). Trailer
# fields are header fields: a token name, no whitespace before the colon, no folded line, no
# NUL, CR or LF in the value; a trailer section that breaks these rules could be read
# differently by a proxy in front (a request line there is a smuggling attempt).
CHUNKED_UP_TO_TRAILERS = (
    b"POST /echo HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n"
)

TRAILER_CASES = [
    pytest.param(b"nocolon\r\n\r\n", id="no-colon"),
    pytest.param(b": value\r\n\r\n", id="empty-name"),
    pytest.param(b"X-Sum: a\x00b\r\n\r\n", id="nul-in-value"),
    pytest.param(b"X-S\x00um: ab\r\n\r\n", id="nul-in-name"),
    pytest.param(
        b"X-Sum: a\x01b\r\n\r\n",
        id="control-byte-in-value",
        marks=ferroloop_only(reason="h11 refuses only NUL, CR and LF in field values"),
    ),
    pytest.param(b"X-Sum : 1\r\n\r\n", id="space-before-colon"),
    pytest.param(
        b"X-Sum: 1\r\n folded\r\n\r\n",
        id="obs-fold",
        marks=ferroloop_only(reason="h11 unfolds obs-fold lines (RFC 9112 allows it)"),
    ),
    pytest.param(
        b"X-Sum: 1\r\n\tfolded\r\n\r\n",
        id="obs-fold-tab",
        marks=ferroloop_only(reason="h11 unfolds obs-fold lines (RFC 9112 allows it)"),
    ),
    pytest.param(b" X-Sum: 1\r\n\r\n", id="whitespace-before-the-first-line"),
    pytest.param(b"GET /smuggled HTTP/1.1\r\n\r\n", id="request-line"),
    pytest.param(b"GET /smuggled HTTP/1.1\r\n" + HOST + b"\r\n", id="request-with-host"),
]


@pytest.fixture(scope="module")
def server(serve):
    return serve("raw_asgi:app")


@pytest.mark.parametrize(("data", "statuses"), CASES)
def test_malformed_request_is_rejected_and_the_connection_closed(server, connect, data, statuses):
    connection = connect(server)
    connection.send(data + TRAILING_REQUEST)
    response = connection.read_response()
    assert response.status in statuses, response
    rest = connection.read_until_close()
    assert connection.eof
    assert b"hello, world" not in response.body + rest, "the trailing request was answered"


@pytest.mark.parametrize("trailers", TRAILER_CASES)
def test_malformed_trailer_is_rejected_and_the_connection_closed(server, connect, trailers):
    # /echo reads the whole body, so the server meets the trailer section before it answers.
    connection = connect(server)
    connection.send(CHUNKED_UP_TO_TRAILERS + trailers + TRAILING_REQUEST, allow_reset=True)
    response = connection.read_response()
    assert response.status == 400, response
    rest = connection.read_until_close()
    assert connection.eof
    assert b"hello, world" not in response.body + rest, "the trailing request was answered"


def test_well_formed_trailers_are_accepted(server, connect):
    connection = connect(server)
    connection.send(
        CHUNKED_UP_TO_TRAILERS
        + b"X-Sum: 1\r\nX-Empty:\r\nX-Spaces: \t a b \t\r\nX-Latin1: caf\xe9\r\n"
        + b"!#$%&'*+-.^_`|~09: v:w\r\n\r\n"
        + TRAILING_REQUEST
    )
    response = connection.read_response()
    assert (response.status, response.body) == (200, b"hello")
    # The trailer section was consumed to its end: the next request on the connection parses.
    assert connection.read_response().body == b"hello, world"


@pytest.mark.parametrize(
    ("data", "status"),
    [
        pytest.param(b"HEAD /hello HTTP/1.1\r\n" + HOST + HOST + b"\r\n", 400, id="bad-head"),
        pytest.param(
            b"\r\nHEAD /hello HTTP/1.1\r\n" + HOST + HOST + b"\r\n", 400, id="after-empty-line"
        ),
        pytest.param(
            b"HEAD /echo HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
            400,
            id="bad-chunk-size",
        ),
        pytest.param(
            b"HEAD /raise-before-start HTTP/1.1\r\n" + HOST + b"\r\n", 500, id="app-error"
        ),
    ],
)
@ferroloop_only(reason="uvicorn sends its error message as a body whatever the method")
def test_error_response_to_head_has_no_body(server, connect, data, status):
    # RFC 9110 §9.3.2: no content in a response to HEAD. A client reads none, so a message
    # there would be taken for the start of the next response.
    connection = connect(server)
    connection.send(data)
    response = connection.read_response("HEAD")
    assert response.status == status
    assert int(response.header("content-length") or 0) > 0
    assert connection.read_until_close() == b""


def test_server_keeps_serving_after_a_rejected_request(server, connect):
    bad = connect(server)
    bad.send(b"HELLO\r\n\r\n")
    assert bad.read_response().status == 400
    assert connect(server).request("GET", "/hello").body == b"hello, world"


@pytest.mark.parametrize("version", [b"HTTP/1.2", b"HTTP/1.9"])
@ferroloop_only(reason="uvicorn serves it too, but with the request's 1.2 in the scope")
def test_higher_http1_minor_version_is_served_as_http11(server, connect, version):
    # RFC 9112 2.3: a server answers a request with a higher minor version than it supports
    # as the highest it does: here HTTP/1.1, with HTTP/1.1's rules (keep-alive, Host).
    connection = connect(server)
    connection.send(b"GET /scope HTTP/1.1\r\n".replace(b"HTTP/1.1", version) + HOST + b"\r\n")
    response = connection.read_response()
    assert (response.http_version, response.status) == ("1.1", 200)
    assert json.loads(response.body)["http_version"] == "1.1"
    assert connection.request("GET", "/hello").body == b"hello, world"


@pytest.mark.parametrize("version", [b"HTTP/2.0", b"HTTP/3.0", b"HTTP/2"])
@ferroloop_only(reason="uvicorn answers 400 to every parse error")
def test_http2_or_http3_request_line_gets_505(server, connect, version):
    connection = connect(server)
    connection.send(b"GET /hello " + version + b"\r\n" + HOST + b"\r\n" + TRAILING_REQUEST)
    response = connection.read_response()
    assert response.status == 505, response
    assert b"hello, world" not in response.body + connection.read_until_close()
    assert connection.eof


def test_http10_request_without_host_is_served(server, connect):
    connection = connect(server)
    connection.send(b"GET /hello HTTP/1.0\r\n\r\n")
    assert connection.read_response().body == b"hello, world"


def test_malformed_request_is_logged_as_the_clients_fault(spawn_server, connect):
    # A client's bad request is a WARNING, not an ERROR (uvicorn: "Invalid HTTP request
    # received." at WARNING); --log-level error therefore silences it.
    server = spawn_server("raw_asgi:app")
    bad = connect(server)
    bad.send(b"HELLO\r\n\r\n")
    assert bad.read_response().status == 400
    line = next(
        line
        for line in server.wait_for_output("nvalid HTTP request").splitlines()
        if "nvalid HTTP request" in line
    )
    assert line.startswith("WARNING:"), line
    quiet = spawn_server("raw_asgi:app", "--log-level", "error")
    bad = connect(quiet)
    bad.send(b"HELLO\r\n\r\n")
    assert bad.read_response().status == 400
    assert connect(quiet).request("GET", "/hello").status == 200
    assert "nvalid HTTP request" not in quiet.output_text()
