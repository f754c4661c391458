"""A client that shuts its write side (``shutdown(SHUT_WR)``, as ``nc -N`` or a client that
sends everything up front does) still reads: each request that arrived before its EOF is
answered, a body the EOF cuts short is the client's error, and the half-closed socket costs
the loop nothing while the app works.
"""

from __future__ import annotations

import json
import os
import socket
import time

import pytest


@pytest.fixture(scope="module")
def server(serve):
    return serve("raw_asgi:app")


@pytest.mark.ferroloop_only(reason="uvicorn closes at the EOF, dropping requests not yet answered")
def test_requests_sent_before_a_half_close_are_all_answered(server, connect, request_bytes):
    connection = connect(server)
    connection.send(
        request_bytes("GET", "/respond-after-disconnect")
        + request_bytes("POST", "/echo", body=b"second")
        + request_bytes("GET", "/hello")
    )
    connection.sock.shutdown(socket.SHUT_WR)
    # The first app answers only once it has seen the EOF (as http.disconnect), so the
    # requests behind it are still unanswered when the server learns the client is done.
    first = connection.read_response()
    second = connection.read_response()
    third = connection.read_response()
    assert (first.status, first.body) == (200, b"0 http.disconnect")
    assert (second.status, second.body) == (200, b"second")
    assert (third.status, third.body) == (200, b"hello, world")
    assert connection.closed_by_peer()


@pytest.mark.ferroloop_only(reason="uvicorn closes at the EOF, dropping the response not yet sent")
def test_response_sent_in_the_iteration_that_reads_the_eof_is_not_lost(
    server, connect, request_bytes
):
    # The app blocks the loop while the client half-closes, so the server reads the EOF in the
    # same ready batch as the one in which the response is sent, right after it: the response,
    # held back until that batch ends, must still be written before the connection closes.
    connection = connect(server)
    connection.send(request_bytes("GET", "/block-then-respond?ms=400"))
    time.sleep(0.15)
    connection.sock.shutdown(socket.SHUT_WR)
    response = connection.read_response()
    assert (response.status, response.body) == (200, b"answered after blocking")
    assert connection.closed_by_peer()


@pytest.mark.ferroloop_only(reason="uvicorn closes at the EOF without answering")
def test_body_cut_short_by_a_half_close_is_answered_400(server, connect, request_bytes):
    connection = connect(server)
    connection.send(request_bytes("POST", "/echo", headers=[("Content-Length", "10")], body=b"abc"))
    connection.sock.shutdown(socket.SHUT_WR)
    response = connection.read_response()
    assert response.status == 400
    assert b"cut short" in response.body
    assert connection.closed_by_peer()
    # The client's error, not the app's: no 500 and no "returned without" error logged.
    assert "ASGI callable returned" not in server.output_text()


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
@pytest.mark.ferroloop_only(reason="uvicorn closes at the EOF, so the response never finishes")
def test_half_closed_connection_does_not_spin_the_loop(
    server, connect, http_request, request_bytes, tmp_path
):
    pid = json.loads(http_request(server, "GET", "/pid").body)["pid"]
    release = tmp_path / "release"
    connection = connect(server)
    connection.send(request_bytes("GET", f"/slow?release={release}"))
    head = connection.read_head()
    assert head.status == 200
    assert connection.read_line() == b"8"  # the "started\n" chunk: the app is running
    connection.sock.shutdown(socket.SHUT_WR)
    before = _cpu_seconds(pid)
    time.sleep(1.0)
    used = _cpu_seconds(pid) - before
    release.touch()
    assert b"finished" in connection.read_until_close()
    # A socket at EOF stays readable; a server still watching it wakes up in a loop for as
    # long as the app runs (a whole core). Idle, it uses next to nothing.
    assert used < 0.2, f"the server used {used:.2f} s of CPU in 1 s while the app waited"


def test_app_that_returns_after_a_half_close_disconnect_is_not_an_error(
    server, connect, http_request, request_bytes
):
    key = "returns-after-half-close"
    connection = connect(server)
    connection.send(request_bytes("POST", f"/record-disconnect?key={key}", body=b"hello"))
    connection.sock.shutdown(socket.SHUT_WR)
    # The app read the body, was told the client is gone, and returned without a response,
    # as it may: the connection closes without a 500, and nothing is logged against the app.
    assert connection.read_until_close() == b""
    result = json.loads(http_request(server, "GET", f"/result?key={key}").body)
    assert result == {"type": "http.disconnect", "received": 5}
    assert "ASGI callable returned" not in server.output_text()
