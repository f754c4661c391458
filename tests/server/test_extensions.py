"""The ASGI extensions ferroloop implements: http.response.pathsend, http.response.trailers and
http.response.zerocopysend. uvicorn's HTTP/1.1 protocols implement none of them."""

from __future__ import annotations

import hashlib
import random

import pytest

pytestmark = pytest.mark.ferroloop_only(reason="uvicorn does not implement these extensions")


@pytest.fixture(scope="module")
def server(serve):
    return serve("raw_asgi:app")


@pytest.fixture(scope="module")
def payload_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("files") / "payload.bin"
    path.write_bytes(random.Random(3).randbytes(3 * 1024 * 1024 + 17))
    return path


def test_pathsend_serves_the_file(server, connect, payload_file):
    connection = connect(server)
    response = connection.request("GET", f"/pathsend?path={payload_file}")
    assert response.status == 200
    assert response.body == payload_file.read_bytes()
    assert connection.request("GET", "/hello").body == b"hello, world"


def test_trailers_sent_in_several_messages_all_follow_the_last_chunk(server, connect):
    connection = connect(server)
    response = connection.request("GET", "/split-trailers", headers=[("TE", "trailers")])
    assert response.status == 200
    assert response.framing == "chunked"
    assert response.body == b"body"
    assert response.trailers == [("x-one", "1"), ("x-two", "2")]
    assert connection.request("GET", "/hello").body == b"hello, world"


def test_pathsend_head_sends_no_body(server, connect, request_bytes, payload_file):
    connection = connect(server)
    connection.send(request_bytes("HEAD", f"/pathsend?path={payload_file}") + request_bytes())
    head = connection.read_response("HEAD")
    assert head.header("content-length") == str(payload_file.stat().st_size)
    assert connection.read_response().body == b"hello, world"


@pytest.mark.parametrize(("offset", "count"), [(0, 100), (1000, 2 * 1024 * 1024), (5, 1)])
def test_zerocopysend_sends_count_bytes_from_offset(server, connect, payload_file, offset, count):
    connection = connect(server)
    response = connection.request(
        "GET", f"/zerocopysend?path={payload_file}&offset={offset}&count={count}"
    )
    assert response.status == 200
    assert response.body == payload_file.read_bytes()[offset : offset + count]
    assert connection.request("GET", "/hello").body == b"hello, world"


def test_trailers_arrive_after_the_chunked_body(server, connect):
    connection = connect(server)
    response = connection.request("GET", "/trailers", headers=[("TE", "trailers")])
    assert response.status == 200
    assert response.framing == "chunked"
    assert response.body == b"first part\nsecond part\n"
    assert response.trailers == [
        ("x-digest", hashlib.sha256(b"first part\nsecond part\n").hexdigest())
    ]
    assert connection.request("GET", "/hello").body == b"hello, world"
