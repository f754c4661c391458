"""Limits: header section size and count (431, for a chunked body's trailer section too), URI
length (414), body size (413), header-read timeout (slowloris) and keep-alive timeout (in
test_connection.py).

The options --limit-header-size, --limit-headers, --limit-uri, --limit-body and
--timeout-header are ferroloop's own (uvicorn has none of them), so those tests are
ferroloop-only; the defaults are tested on both servers where uvicorn agrees.
"""

from __future__ import annotations

import time

import pytest

ferroloop_only = pytest.mark.ferroloop_only


def assert_rejected(connection, statuses: set[int]) -> None:
    response = connection.read_response()
    assert response.status in statuses, response
    assert connection.closed_by_peer()


# uvicorn's h11 option --h11-max-incomplete-event-size is taken as --limit-header-size (h11
# itself applies it only to a head still incomplete in its buffer).
@ferroloop_only(reason="--limit-header-size is a ferroloop option")
@pytest.mark.parametrize("option", ["--limit-header-size", "--h11-max-incomplete-event-size"])
def test_header_section_over_the_limit_gets_431(serve, connect, option):
    server = serve("raw_asgi:app", option, "1024")
    ok = connect(server).request("GET", "/hello", headers=[("X-Filler", "a" * 600)])
    assert ok.status == 200
    connection = connect(server)
    connection.send(
        b"GET /hello HTTP/1.1\r\nHost: t\r\nX-Filler: " + b"a" * 2000 + b"\r\n\r\n",
        allow_reset=True,
    )
    assert_rejected(connection, {431})


@ferroloop_only(reason="--limit-header-size is a ferroloop option")
def test_header_section_over_the_limit_is_rejected_before_it_ends(serve, connect):
    # The server must not buffer an endless head: it answers without seeing its end.
    server = serve("raw_asgi:app", "--limit-header-size", "1024")
    connection = connect(server)
    connection.send(b"GET /hello HTTP/1.1\r\nHost: t\r\nX-Filler: " + b"a" * 4000, allow_reset=True)
    assert_rejected(connection, {431})


def test_huge_header_section_is_rejected_by_default(serve, connect):
    # ferroloop answers 431 (tested above); h11 under uvicorn answers 400.
    server = serve("raw_asgi:app")
    connection = connect(server)
    connection.send(
        b"GET /hello HTTP/1.1\r\nHost: t\r\nX-Filler: " + b"a" * 1_000_000 + b"\r\n\r\n",
        allow_reset=True,
    )
    assert_rejected(connection, {400, 431})


@ferroloop_only(reason="--limit-headers is a ferroloop option")
def test_too_many_headers_gets_431(serve, connect):
    server = serve("raw_asgi:app", "--limit-headers", "10")
    few = [(f"X-H{index}", "v") for index in range(5)]
    assert connect(server).request("GET", "/hello", headers=few).status == 200
    many = [(f"X-H{index}", "v") for index in range(20)]
    connection = connect(server)
    connection.send(
        b"GET /hello HTTP/1.1\r\nHost: t\r\n"
        + b"".join(f"{k}: {v}\r\n".encode() for k, v in many)
        + b"\r\n"
    )
    assert_rejected(connection, {431})


CHUNKED_UP_TO_TRAILERS = (
    b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n"
)


@ferroloop_only(reason="--limit-header-size is a ferroloop option")
def test_trailer_section_over_the_header_size_limit_gets_431(serve, connect):
    # The trailer section is a header section: it gets the head's limit, not a larger one.
    server = serve("raw_asgi:app", "--limit-header-size", "1024")
    ok = connect(server)
    ok.send(CHUNKED_UP_TO_TRAILERS + b"X-Filler: " + b"a" * 600 + b"\r\n\r\n")
    assert (ok.read_response().body, ok.request("GET", "/hello").status) == (b"hello", 200)
    connection = connect(server)
    connection.send(
        CHUNKED_UP_TO_TRAILERS + b"X-Filler: " + b"a" * 2000 + b"\r\n\r\n", allow_reset=True
    )
    assert_rejected(connection, {431})


@ferroloop_only(reason="--limit-headers is a ferroloop option")
def test_more_trailer_fields_than_the_header_limit_gets_431(serve, connect):
    server = serve("raw_asgi:app", "--limit-headers", "10")
    fields = b"".join(b"X-T%d: v\r\n" % index for index in range(10))
    ok = connect(server)
    ok.send(CHUNKED_UP_TO_TRAILERS + fields + b"\r\n")
    assert ok.read_response().status == 200
    connection = connect(server)
    connection.send(CHUNKED_UP_TO_TRAILERS + fields + b"X-T10: v\r\n\r\n", allow_reset=True)
    assert_rejected(connection, {431})


@ferroloop_only(reason="--limit-uri is a ferroloop option")
def test_uri_over_the_limit_gets_414(serve, connect):
    server = serve("raw_asgi:app", "--limit-uri", "256")
    assert connect(server).request("GET", "/hello?" + "q" * 200).status == 200
    connection = connect(server)
    connection.send(b"GET /hello?" + b"q" * 300 + b" HTTP/1.1\r\nHost: t\r\n\r\n")
    assert_rejected(connection, {414})


@ferroloop_only(reason="--limit-body is a ferroloop option")
def test_content_length_over_the_body_limit_gets_413(serve, connect):
    server = serve("raw_asgi:app", "--limit-body", "1000")
    assert connect(server).request("POST", "/echo", body=b"b" * 1000).body == b"b" * 1000
    connection = connect(server)
    # Declared too large: rejected from the head alone, before any body byte is sent.
    connection.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1001\r\n\r\n")
    assert_rejected(connection, {413})


@ferroloop_only(reason="--limit-body is a ferroloop option")
def test_chunked_body_over_the_body_limit_gets_413(serve, connect):
    server = serve("raw_asgi:app", "--limit-body", "1000")
    connection = connect(server)
    connection.send(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"64\r\n" + b"c" * 100 + b"\r\n" for _ in range(20))
        + b"0\r\n\r\n",
        allow_reset=True,
    )
    assert_rejected(connection, {413})


@ferroloop_only(reason="--timeout-header is a ferroloop option")
def test_half_sent_head_is_cut_off_by_the_header_timeout(serve, connect):
    server = serve("raw_asgi:app", "--timeout-header", "1")
    connection = connect(server)
    connection.send(b"GET /hello HTTP/1.1\r\nHost: t\r\nX-Slow: ")
    data = connection.read_until_close()  # bounded by IO_TIMEOUT
    assert connection.eof
    assert data == b"" or data.startswith(b"HTTP/1.1 408 "), data


@ferroloop_only(reason="--timeout-header is a ferroloop option")
def test_trickled_head_is_cut_off_by_the_header_timeout(serve, connect):
    """The header timeout bounds the whole head, not the gap between two bytes."""
    server = serve("raw_asgi:app", "--timeout-header", "1")
    connection = connect(server)
    connection.send(b"GET /hello HTTP/1.1\r\nHost: t\r\nX-Slow: ")
    deadline = time.monotonic() + 8  # eight times the timeout: only a bound on waiting
    while time.monotonic() < deadline:
        try:
            connection.send(b"a")
        except (BrokenPipeError, ConnectionResetError):
            break
        time.sleep(0.2)
    else:
        pytest.fail("the server kept reading a head that never ends")


@ferroloop_only(reason="--timeout-header is a ferroloop option")
def test_header_timeout_stops_once_the_head_is_complete(serve, connect):
    server = serve("raw_asgi:app", "--timeout-header", "1", "--timeout-keep-alive", "30")
    connection = connect(server)
    connection.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nab")
    time.sleep(1.5)  # longer than the header timeout: the body is not the head
    connection.send(b"cd")
    assert connection.read_response().body == b"abcd"


@pytest.mark.single_process(
    reason="--limit-concurrency is counted by each worker, and idle connections are with the front"
)
@pytest.mark.ferroloop_only(
    reason="uvicorn answers 503 from the limit-th connection on; ferroloop once there are "
    "more connections than the limit"
)
def test_more_connections_than_the_concurrency_limit_get_503(serve, connect, request_bytes):
    server = serve("raw_asgi:app", "--limit-concurrency", "2")
    first, second = connect(server), connect(server)
    assert first.request("GET", "/hello").status == 200
    assert second.request("GET", "/hello").status == 200
    third = connect(server)
    third.send(request_bytes("GET", "/hello"))
    assert_rejected(third, {503})


@pytest.mark.single_process(
    reason="--limit-concurrency is counted by each worker; the requests may reach different workers"
)
@pytest.mark.ferroloop_only(reason="how ferroloop counts app starts it has queued")
def test_queued_app_starts_count_towards_the_concurrency_limit(
    spawn_server, connect, request_bytes, tmp_path, wait_until
):
    """Two app tasks outlive their responses; with a limit of 3, one more request may start.
    Two requests arrive together while the loop is blocked: the first is admitted and its app
    start queued, so the second finds the limit reached and gets 503."""
    server = spawn_server(
        "raw_asgi:app",
        "--limit-concurrency",
        "3",
        env={"FERROLOOP_TEST_MARKER_DIR": str(tmp_path)},
    )
    release = tmp_path / "release"
    a, b, c = connect(server), connect(server), connect(server)
    try:
        for connection in (a, b):
            assert connection.request("GET", f"/linger?release={release}").body == b"lingering"
        c.send(request_bytes("GET", f"/block?release={release}-block"))
        wait_until((tmp_path / "blocking").exists, "the app that blocks the loop")
        a.send(request_bytes("GET", "/hello"))
        b.send(request_bytes("GET", "/hello"))
        (tmp_path / "release-block").write_text("go")
        assert c.read_response().body == b"unblocked"
        statuses = sorted([a.read_response().status, b.read_response().status])
        assert statuses == [200, 503]
    finally:
        release.write_text("go")
