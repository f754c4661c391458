"""Graceful shutdown on SIGTERM: in-flight requests finish, idle keep-alive connections are
closed (after answering a request that reaches them first), every response says Connection:
close, no new connection is served (connects are refused), and the process exits cleanly."""

from __future__ import annotations

import signal
import socket

import pytest


def test_sigterm_lets_the_in_flight_request_finish_then_exits(spawn_server, connect, tmp_path):
    server = spawn_server(
        "raw_asgi:app", "--timeout-keep-alive", "60", "--timeout-graceful-shutdown", "30"
    )
    release = tmp_path / "release"
    idle = connect(server)
    assert idle.request("GET", "/hello").status == 200  # now idle, kept alive for 60 s

    busy = connect(server)
    busy.send(f"GET /slow?release={release} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    assert busy.read_head().status == 200
    assert busy.read_line() is not None  # the size line of the first chunk: the app is running

    server.proc.send_signal(signal.SIGTERM)
    # The idle connection is closed by the shutdown (its keep-alive timeout is far away).
    assert idle.closed_by_peer()
    # A connection attempted now is refused, or never answered.
    late = server.try_connect()
    if late is not None:
        late.settimeout(10)
        late.sendall(b"GET /hello HTTP/1.1\r\nHost: t\r\n\r\n")
    # The in-flight request holds the process up until it completes.
    assert server.proc.poll() is None
    release.touch()
    rest = busy.read_until_close()
    assert b"finished\n" in rest
    assert rest.endswith(b"0\r\n\r\n"), rest
    server.assert_exits_cleanly()
    if late is not None:
        try:
            assert late.recv(1024) == b"", "a connection made during shutdown was served"
        except ConnectionResetError:
            pass
        finally:
            late.close()


def test_sigterm_with_only_idle_connections_exits(spawn_server, connect):
    server = spawn_server("raw_asgi:app", "--timeout-keep-alive", "60")
    idle = [connect(server) for _ in range(3)]
    for connection in idle:
        assert connection.request("GET", "/hello").status == 200
    server.proc.send_signal(signal.SIGTERM)
    for connection in idle:
        assert connection.closed_by_peer()
    server.assert_exits_cleanly()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", server.port), 2):
        pass


# The drain (docs/server.md, "Graceful shutdown"): 25 keep-alive and 25 new-connection
# clients call an app that takes 0.5 s, SIGTERM arrives mid-run with a graceful timeout of 5 s.
# Every request sent before the listening socket closed gets a complete response, later
# connects are refused (never accepted and then reset), and every response after SIGTERM says
# Connection: close.

DRAIN_OPTIONS = ("--timeout-graceful-shutdown", "5", "--log-level", "warning")


@pytest.mark.ferroloop_only(reason="the drain contract is ferroloop's; uvicorn does not state one")
def test_sigterm_under_load_loses_no_request(spawn_server, drain_under_load):
    server = spawn_server("raw_asgi:app", *DRAIN_OPTIONS)
    drain_under_load(server.port, lambda: server.proc.send_signal(signal.SIGTERM))
    server.assert_exits_cleanly()


@pytest.mark.ferroloop_only(reason="the drain contract is ferroloop's; uvicorn does not state one")
def test_sigterm_under_load_with_workers_loses_no_request(spawn_server, drain_under_load):
    # The parent holds the listening socket too: it must close its copy, or connections made
    # after the workers stopped accepting are completed by the kernel and then reset.
    server = spawn_server("raw_asgi:app", "--workers", "2", *DRAIN_OPTIONS)
    drain_under_load(server.port, lambda: server.proc.send_signal(signal.SIGTERM))
    server.assert_exits_cleanly()


@pytest.mark.ferroloop_only(reason="Connection: close during the drain is ferroloop's contract")
def test_request_on_an_idle_connection_right_after_sigterm_is_answered(
    spawn_server, connect, tmp_path
):
    # The client was told its connection stays open; a request it sends just as the shutdown
    # begins is served (with Connection: close), not met by a close it cannot tell from a loss.
    server = spawn_server(
        "raw_asgi:app", "--timeout-keep-alive", "60", "--timeout-graceful-shutdown", "5"
    )
    release = tmp_path / "release"
    busy = connect(server)  # keeps the process up while the idle connection is checked
    busy.send(f"GET /slow?release={release} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    assert busy.read_head().status == 200
    idle = connect(server)
    first = idle.request("GET", "/hello")
    assert first.status == 200 and first.header("connection") is None
    server.proc.send_signal(signal.SIGTERM)
    server.wait_for_shutdown_start()  # the drain has begun: the request comes after it
    second = idle.request("GET", "/hello")
    assert second.status == 200 and second.body == b"hello, world"
    assert second.header("connection") == "close"
    assert idle.closed_by_peer()
    release.touch()
    rest = busy.read_until_close()
    assert rest.endswith(b"0\r\n\r\n"), rest
    server.assert_exits_cleanly()
