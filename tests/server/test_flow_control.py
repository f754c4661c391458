"""Flow control both ways, and a client that goes away mid-request.

Correctness is asserted (every byte arrives, in order); the "bounded" tests assert how much a
side managed to push while the other stopped consuming, which is a property of the buffering,
not of timing: a server without flow control lets the whole payload through.
"""

from __future__ import annotations

import hashlib
import json
import random
import select
import time
import uuid

import pytest

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def server(serve):
    return serve("raw_asgi:app")


def fetch_result(http_request, wait_until, server, key: str):
    def check():
        response = http_request(server, "GET", f"/result?key={key}")
        return json.loads(response.body) if response.status == 200 else None

    return wait_until(check, f"the app to record a result under {key!r}")


def test_large_upload_to_a_slow_consumer_arrives_intact(server, connect):
    body = random.Random(50).randbytes(50 * MiB)
    connection = connect(server)
    response = connection.request("POST", "/digest", body=body)
    assert response.status == 200
    assert json.loads(response.body) == {
        "length": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
    }


def test_large_chunked_upload_arrives_intact(server, connect):
    body = random.Random(8).randbytes(8 * MiB)
    connection = connect(server)
    connection.send(b"POST /digest HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n")
    step = 100_000  # not a power of two: chunk boundaries fall anywhere in the server's reads
    for start in range(0, len(body), step):
        part = body[start : start + step]
        connection.send(b"%x\r\n%s\r\n" % (len(part), part))
    connection.send(b"0\r\n\r\n")
    response = connection.read_response()
    assert json.loads(response.body) == {
        "length": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
    }


def test_large_response_to_a_slow_reader_arrives_intact(server, connect):
    size = 16 * MiB + 123
    connection = connect(server, rcvbuf=65536)
    connection.send(b"GET /stream?size=%d HTTP/1.1\r\nHost: test\r\n\r\n" % size)
    head = connection.read_head()
    assert head.status == 200
    sha = hashlib.sha256()
    received = 0
    while received < size:
        data = connection.read_exact(min(32768, size - received))
        assert data, f"the stream ended after {received} of {size} bytes"
        sha.update(data)
        received += len(data)
        if received % (32768 * 16) == 0:
            time.sleep(0.002)  # a slow reader: the server's writes must wait for it
    assert sha.hexdigest() == head.header("x-sha256")
    assert connection.request("GET", "/hello").body == b"hello, world"


def test_two_sends_waiting_at_once_both_return(server, connect):
    """Two send() calls that both wait for the write queue to drain are both resumed (the
    second once replaced the first one's waiter, which then never returned)."""
    parts = 128  # 8 MiB in 64 KiB parts: far over the queue's high-water mark
    connection = connect(server, rcvbuf=65536)
    connection.send(b"GET /concurrent-sends?parts=%d HTTP/1.1\r\nHost: test\r\n\r\n" % parts)
    head = connection.read_head()
    assert head.status == 200
    received = 0
    while received < parts * 65536:
        data = connection.read_exact(min(262144, parts * 65536 - received))
        assert data, f"the stream ended after {received} bytes"
        received += len(data)
        time.sleep(0.001)  # a slow reader, so that send() has to wait
    assert connection.request("GET", "/hello").body == b"hello, world"


def test_response_stream_to_a_client_that_stops_reading_is_bounded(
    server, connect, http_request, wait_until
):
    """send() applies backpressure: with nobody reading, the app cannot push 256 MiB."""
    key = uuid.uuid4().hex
    total = 256 * MiB
    connection = connect(server, rcvbuf=65536)
    connection.send(
        f"GET /stream-unbounded?key={key}&total={total} HTTP/1.1\r\nHost: t\r\n\r\n".encode()
    )
    progress: list[int] = []

    def stalled() -> bool:
        time.sleep(0.1)  # spaces the samples out; a stall must last several of them
        response = http_request(server, "GET", f"/result?key={key}")
        if response.status == 200:
            progress.append(json.loads(response.body))
        return len(progress) >= 3 and progress[-1] == progress[-3]

    wait_until(stalled, "the streaming app to stop making progress", timeout=20)
    assert progress[-1] < 32 * MiB, f"the app pushed {progress[-1]} bytes nobody read"
    # Once the client reads again, the rest flows.
    received = 0
    head = connection.read_head()
    assert head.status == 200
    while received < 8 * MiB:
        data = connection.read_some()
        assert data
        received += len(data)


def test_upload_to_an_app_that_does_not_read_is_bounded(
    server, connect, http_request, wait_until, request_bytes
):
    """Reading pauses while the app has not consumed the body; it resumes when it does."""
    key = uuid.uuid4().hex
    body = random.Random(24).randbytes(24 * MiB)
    connection = connect(server, sndbuf=65536)
    connection.send(
        request_bytes("POST", f"/hold-upload?key={key}", [("Content-Length", str(len(body)))])
    )
    wait_until(
        lambda: http_request(server, "GET", f"/result?key={key}").status == 200,
        "the app to hold the upload",
    )
    sent = 0
    connection.sock.setblocking(False)
    # Push until the socket stays unwritable for a while: the server stopped reading.
    while sent < len(body):
        _, writable, _ = select.select([], [connection.sock], [], 0.5)
        if not writable:
            break
        try:
            sent += connection.sock.send(body[sent : sent + 65536])
        except BlockingIOError:
            continue
    assert sent < 12 * MiB, f"the server took {sent} bytes the app never asked for"
    connection.sock.setblocking(True)
    connection.sock.settimeout(10)
    assert http_request(server, "GET", f"/release?key={key}").status == 200
    connection.send(body[sent:])
    response = connection.read_response()
    assert json.loads(response.body) == {
        "length": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
    }


def test_client_disconnect_mid_body_gives_http_disconnect(
    server, connect, http_request, wait_until, request_bytes
):
    key = uuid.uuid4().hex
    connection = connect(server)
    connection.send(
        request_bytes("POST", f"/record-disconnect?key={key}", [("Content-Length", "1000")])
        + b"x" * 100
    )
    # Hang up only once the request reached the app.
    assert fetch_result(http_request, wait_until, server, f"{key}:started") is True
    connection.close()
    result = fetch_result(http_request, wait_until, server, key)
    assert result["type"] == "http.disconnect"
    assert result["received"] <= 100


def test_client_disconnect_after_the_body_gives_http_disconnect(
    server, connect, http_request, wait_until, request_bytes
):
    """An app that read the whole body and calls receive() again waits for the disconnect."""
    key = uuid.uuid4().hex
    connection = connect(server)
    connection.send(request_bytes("POST", f"/record-disconnect?key={key}", body=b"hello"))
    assert fetch_result(http_request, wait_until, server, f"{key}:complete") == 5
    connection.close()
    assert fetch_result(http_request, wait_until, server, key) == {
        "type": "http.disconnect",
        "received": 5,
    }
