"""--workers behind the dispatching front (``--dispatch front``, the default): each request goes
to a worker that is free, bulk uploads only to general workers, a connection's bytes already
read go along with it, and a worker's death costs only what it held.

A blocked worker is made with ``/block`` (a synchronous wait that stops its whole loop, as a
CPU-bound parse does); the tests assert what was answered while it was blocked, not how fast.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.ferroloop_only("the dispatching front is ferroloop's")

BULK = 4096  # --lane-bulk-body in these tests


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    directory = tmp_path / "markers"
    directory.mkdir()
    return directory


def answered_yet(connection) -> bool:
    try:
        return bool(connection.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except (BlockingIOError, TimeoutError):
        return False


def start(spawn_server, markers: Path, *args: str):
    return spawn_server(
        "raw_asgi:app",
        "--lane-bulk-body",
        str(BULK),
        "--timeout-graceful-shutdown",
        "10",
        *args,
        env={"FERROLOOP_TEST_MARKER_DIR": str(markers)},
    )


def pid_on(connection) -> int:
    response = connection.request("GET", "/pid")
    assert response.status == 200
    return int(json.loads(response.body)["pid"])


def block_a_worker(connect, server, markers: Path, release: Path, body: bytes = b""):
    """Sends a request that blocks the loop of the worker it lands on until ``release`` exists;
    returns (connection, that worker's pid)."""
    blocked = connect(server)
    method = "POST" if body else "GET"
    head = f"{method} /block?release={release} HTTP/1.1\r\nHost: t\r\n"
    if body:
        head += f"Content-Length: {len(body)}\r\n"
    marker = markers / "blocking"
    marker.unlink(missing_ok=True)
    blocked.send(head.encode() + b"\r\n" + body)
    deadline = time.monotonic() + 10
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline, "the blocking request never started"
        time.sleep(0.01)
    return blocked, int(marker.read_text())


def test_kept_connections_leave_a_worker_before_it_runs_an_upload(
    spawn_server, connect, markers, tmp_path
):
    # Two workers, no fast lane: each keeps a small client's connection between requests.
    server = start(spawn_server, markers, "--workers", "2", "--lane-fast-workers", "0")
    release = tmp_path / "release"
    first, second = connect(server), connect(server)
    pids = {pid_on(first), pid_on(second)}
    assert len(pids) == 2, "the front spreads new connections over the workers"
    # An upload over --lane-bulk-body blocks one of them; before it runs, that worker gives
    # its idle connection back to the front, which hands its next requests to the other one.
    blocked, blocked_pid = block_a_worker(connect, server, markers, release, body=b"x" * (BULK + 1))
    for _ in range(10):
        assert pid_on(first) != blocked_pid
        assert pid_on(second) != blocked_pid
    assert not answered_yet(blocked), "the blocked request was answered early"
    release.touch()
    assert blocked.read_response("POST").body == b"unblocked"


def test_new_connections_also_avoid_the_blocked_worker(spawn_server, connect, markers, tmp_path):
    server = start(spawn_server, markers, "--workers", "2", "--lane-fast-workers", "0")
    release = tmp_path / "release"
    blocked, blocked_pid = block_a_worker(connect, server, markers, release)
    for _ in range(20):
        fresh = connect(server)
        assert pid_on(fresh) != blocked_pid
        fresh.close()
    release.touch()
    assert blocked.read_response().status == 200


def test_bulk_uploads_go_to_general_workers_and_small_requests_to_the_fast_one(
    spawn_server, connect, markers, tmp_path
):
    # Two general workers and one fast-lane worker.
    server = start(spawn_server, markers, "--workers", "2", "--lane-fast-workers", "1")
    release = tmp_path / "release"
    # Two uploads over --lane-bulk-body block both general workers...
    upload = b"x" * (BULK + 1)
    first, g1 = block_a_worker(connect, server, markers, release, body=upload)
    second, g2 = block_a_worker(connect, server, markers, release, body=upload)
    assert g1 != g2
    # ... and small requests, on new and kept-alive connections, are all answered by the
    # fast one meanwhile.
    kept = connect(server)
    fast_pids = {pid_on(kept) for _ in range(5)}
    for _ in range(5):
        fresh = connect(server)
        fast_pids.add(pid_on(fresh))
        fresh.close()
    assert len(fast_pids) == 1
    assert not fast_pids & {g1, g2}
    release.touch()
    for blocked in (first, second):
        assert blocked.read_response("POST").body == b"unblocked"
    # Every bulk upload lands on a general worker, whichever connection carries it; a
    # chunked upload is bulk too.
    for _ in range(6):
        response = kept.request("POST", "/pid", body=b"y" * (BULK + 1))
        assert json.loads(response.body)["pid"] in {g1, g2}
    kept.send(
        b"POST /pid HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    )
    assert json.loads(kept.read_response("POST").body)["pid"] in {g1, g2}


def test_bytes_read_with_the_head_go_along_and_pipelined_requests_stay_in_order(
    spawn_server, connect, markers
):
    server = start(spawn_server, markers, "--workers", "2")
    connection = connect(server)
    # Three pipelined requests in one write: each is answered in order, whichever worker
    # serves it (the rest of the buffer goes back to the front with the connection).
    requests = b"".join(f"GET /scope?n={n} HTTP/1.1\r\nHost: t\r\n\r\n".encode() for n in range(3))
    connection.send(requests)
    for n in range(3):
        scope = json.loads(connection.read_response().body)
        assert scope["query_string"] == f"n={n}"
    # Half a body with the head, the rest later.
    body = bytes(range(256)) * 40
    head = f"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    connection.send(head + body[:1000])
    time.sleep(0.05)
    connection.send(body[1000:])
    assert connection.read_response("POST").body == body
    # Half a head, the rest later.
    connection.send(b"GET /hello HTTP/1.1\r\nHo")
    time.sleep(0.05)
    connection.send(b"st: t\r\n\r\n")
    assert connection.read_response().status == 200


def test_the_scope_has_the_client_and_server_addresses(spawn_server, connect, markers):
    server = start(spawn_server, markers, "--workers", "2")
    connection = connect(server)
    scope = json.loads(connection.request("GET", "/scope").body)
    assert scope["client"] == list(connection.sock.getsockname())
    assert scope["server"] == ["127.0.0.1", server.port]


def test_expect_continue_and_websocket_like_upgrades_pass_through(spawn_server, connect, markers):
    server = start(spawn_server, markers, "--workers", "2")
    connection = connect(server)
    connection.send(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
    )
    interim = connection.read_head()
    assert interim.status == 100
    connection.send(b"hello")
    assert connection.read_response("POST").body == b"hello"


def test_a_worker_killed_mid_request_costs_that_request_only(
    spawn_server, connect, markers, tmp_path, wait_until, is_gone
):
    server = start(spawn_server, markers, "--workers", "2", "--lane-fast-workers", "0")
    release = tmp_path / "release"
    kept = connect(server)
    assert pid_on(kept)
    blocked, blocked_pid = block_a_worker(connect, server, markers, release)
    os.kill(blocked_pid, signal.SIGKILL)
    # Its client sees the connection close without a response.
    assert blocked.closed_by_peer()
    wait_until(lambda: is_gone(blocked_pid), "the killed worker to exit")
    # The kept-alive connection was with the front, not the worker: it goes on.
    for _ in range(10):
        assert pid_on(kept) != blocked_pid
    assert "went away with 1 request(s) in flight" in server.output_text()
    assert server.proc.poll() is None


def test_a_worker_killed_between_requests_costs_only_its_kept_connections(
    spawn_server, connect, markers, wait_until, is_gone
):
    server = start(spawn_server, markers, "--workers", "2", "--lane-fast-workers", "0")
    kept = connect(server)
    first = pid_on(kept)
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: is_gone(first), "the killed worker to exit")
    # The connection it kept between requests closes with it, after a whole response (a
    # client may retry on a new connection); the others are served by the other worker.
    assert kept.closed_by_peer()
    for _ in range(10):
        fresh = connect(server)
        assert pid_on(fresh) != first
        fresh.close()


def test_sigterm_drains_requests_queued_in_the_front(spawn_server, connect, markers, tmp_path):
    # One worker: a second request waits behind the blocked one.
    server = start(spawn_server, markers, "--workers", "2", "--lane-fast-workers", "0")
    release = tmp_path / "release"
    blocked, _ = block_a_worker(connect, server, markers, release)
    queued = [connect(server) for _ in range(3)]
    for connection in queued:
        connection.send(b"GET /pid HTTP/1.1\r\nHost: t\r\n\r\n")
    time.sleep(0.1)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    # New connections are refused once the front has drained its listener.
    assert server.try_connect() is None
    release.touch()
    assert blocked.read_response().body == b"unblocked"
    for connection in queued:
        assert connection.read_response().status == 200
    server.assert_exits_cleanly()


def test_a_websocket_stays_on_the_worker_that_accepted_it(spawn_server):
    from websockets.sync.client import connect as ws_connect

    server = spawn_server("ws_app:app", "--workers", "2")
    for _ in range(3):
        with ws_connect(f"ws://127.0.0.1:{server.port}/echo", open_timeout=10) as ws:
            for n in range(5):
                ws.send(f"message {n}")
                assert ws.recv(timeout=10) == f"message {n}"


def test_wsgi_apps_run_behind_the_front(spawn_server, connect):
    server = spawn_server("wsgi_app:app", "--interface", "wsgi", "--workers", "2")
    connection = connect(server)
    for _ in range(5):
        assert connection.request("GET", "/").status == 200


def test_a_dead_front_stops_the_server_with_a_reason(spawn_server, connect, markers):
    server = start(spawn_server, markers, "--workers", "2")
    front_pid = int(
        server.wait_for_output("Started front process [")
        .split("Started front process [")[1]
        .split("]")[0]
    )
    os.kill(front_pid, signal.SIGKILL)
    code = server.wait_exit()
    assert code == 1
    assert f"The front process [{front_pid}] died (signal SIGKILL); stopping." in (
        server.output_text()
    )


def test_workers_replaced_at_their_request_limit_drop_nothing(spawn_server, connect, markers):
    # Each worker exits after 20 responses and is replaced; the front holds the connections
    # (and the requests that arrive meanwhile), so no request fails.
    server = start(spawn_server, markers, "--workers", "2", "--limit-max-requests", "20")
    kept = connect(server)
    deadline = time.monotonic() + 20
    n = 0
    while server.output_text().count("exited after its request limit") < 5:
        assert time.monotonic() < deadline, "workers were not replaced"
        assert kept.request("GET", "/hello").status == 200
        if n % 3 == 0:
            fresh = connect(server)
            assert fresh.request("GET", "/hello").status == 200
            fresh.close()
        n += 1
    assert "went away with" not in server.output_text()


def test_a_head_not_whole_in_time_gets_the_same_408_from_the_front(spawn_server, connect):
    """The front holds a connection until its head is whole, so it times the head out itself;
    its 408 is the one a single process sends: the same body naming the option, with `date`
    and the `--header` fields."""
    options = ("--timeout-header", "1", "--header", "x-team:core")
    answers = []
    for workers in ((), ("--workers", "2")):
        server = spawn_server("raw_asgi:app", *options, *workers)
        connection = connect(server)
        connection.send(b"GET /hello HTTP/1.1\r\nHo")
        head, _, body = connection.read_until_close().partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        fields = sorted(line.split(b":", 1)[0].lower() for line in lines[1:])
        answers.append((lines[0], fields, body))
    single, front = answers
    assert single[0] == b"HTTP/1.1 408 Request Timeout"
    assert b"date" in single[1] and b"x-team" in single[1]
    assert front == single


def test_the_front_publishes_each_worker_s_state_for_its_supervisor():
    """The board the supervisor reads (``FrontProcess.status()``): the front, a process of its
    own, lists each worker with its lane and what was handed to it, and its own counts."""
    from ferroloop.server.config import Config
    from ferroloop.server.front import channel_pair, start_front

    config = Config("unused:app", workers=1, lane_fast_workers=1)
    listener = socket.create_server(("127.0.0.1", 0))
    address = listener.getsockname()
    front = start_front(config, [listener], None)
    listener.close()
    ends = []
    try:
        for pid, lane in ((101, "general"), (102, "fast")):
            front_end, worker_end = channel_pair()
            front.add_worker(pid, lane, front_end)
            front_end.close()
            ends.append(worker_end)

        def status_when(done):
            deadline = time.monotonic() + 10
            while True:
                status = front.status()
                if done(status):
                    return status
                assert time.monotonic() < deadline, status
                time.sleep(0.01)

        status_when(lambda s: len(s["workers"]) == 2)
        with socket.create_connection(address) as client:
            client.sendall(b"POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: 2000000\r\n\r\n")
            status = status_when(lambda s: s["dispatched"] == 1)
        general, fast = status["workers"]
        assert (general["pid"], general["lane"], general["in_flight"]) == (101, "general", 1)
        assert (general["bulk_in_flight"], general["handed_total"]) == (1, 1)
        assert 0 < general["oldest_since"] <= time.monotonic()
        assert (fast["pid"], fast["lane"], fast["in_flight"], fast["oldest_since"]) == (
            102,
            "fast",
            0,
            None,
        )
        assert status["accepted"] == 1 and not status["draining"]
        assert 0 < status["updated"] <= time.monotonic()
        front.drain(0.0)
    finally:
        for end in ends:
            end.close()
        front.close()
        _, code = os.waitpid(front.pid, 0)
    assert os.WIFEXITED(code) and os.WEXITSTATUS(code) == 0


def test_tls_connections_are_placed_on_a_free_worker_kept_there_and_drained_there(
    spawn_server, connect, markers, tmp_path
):
    """TLS terminates in the workers, so the front cannot read a request: it places each
    connection when it is accepted, on a worker without bulk work, which keeps it until it
    closes, and drains it itself at shutdown."""
    import ssl

    import trustme

    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    for index, blob in enumerate(leaf.cert_chain_pems):
        blob.write_to_path(str(cert), append=index > 0)
    leaf.private_key_pem.write_to_path(str(key))
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(context)

    def tls_connect(server):
        connection = connect(server)
        connection.sock = context.wrap_socket(connection.sock, server_hostname="127.0.0.1")
        return connection

    server = start(
        spawn_server,
        markers,
        *("--workers", "2", "--lane-fast-workers", "0"),
        *("--ssl-certfile", str(cert), "--ssl-keyfile", str(key)),
        *("--timeout-keep-alive", "30"),
    )
    server.wait_for_output("Started front process")
    release = tmp_path / "release"
    blocked, blocked_pid = block_a_worker(
        tls_connect, server, markers, release, body=b"x" * (BULK + 1)
    )
    fresh = [tls_connect(server) for _ in range(4)]
    for connection in fresh:
        pid = pid_on(connection)
        assert pid != blocked_pid, "a new TLS connection was placed on the worker running bulk"
        assert {pid_on(connection) for _ in range(3)} == {pid}, "it left its worker"
    release.touch()
    assert blocked.read_response("POST").body == b"unblocked"
    # SIGTERM: an idle TLS connection is closed by its worker once quiet (close_notify, then
    # the end of the stream), long before its keep-alive timeout, and the server exits well
    # within --timeout-graceful-shutdown.
    idle = fresh[0]
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert idle.read_until_close() == b""
    assert time.monotonic() - started < 5
    server.assert_exits_cleanly()


def test_a_worker_counts_its_running_app_tasks_on_its_seat():
    """What only a worker knows (a kept connection is "in flight" to the front whether a
    request runs or not): the app tasks running on it and since when, on its seat of the
    front's board, written by ``HttpServer(board=, seat=)``."""
    import asyncio

    import ferroloop
    from ferroloop._native import FrontBoard, HttpServer

    board = FrontBoard(4)
    board.seat_open(2, os.getpid())
    entered = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        entered.append(board.seats())
        await asyncio.sleep(0.2)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    async def main():
        sock = socket.create_server(("127.0.0.1", 0))
        sock.setblocking(False)
        server = HttpServer(asyncio.get_running_loop(), sock, app, board=board, seat=2)
        server.start()
        try:
            loop = asyncio.get_running_loop()
            client = socket.create_connection(sock.getsockname())
            client.setblocking(False)
            await loop.sock_sendall(client, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            answer = b""
            while not answer.endswith(b"done"):
                answer += await loop.sock_recv(client, 4096)
            client.close()
            for _ in range(100):
                if board.seats()[0]["tasks_running"] == 0:
                    break
                await asyncio.sleep(0.01)
        finally:
            server.abort()
            sock.close()

    before = time.monotonic()
    ferroloop.run(main())
    [(during,)] = entered
    assert (during["seat"], during["pid"], during["tasks_running"]) == (2, os.getpid(), 1)
    assert before <= during["busy_since"] <= time.monotonic()
    [after] = board.seats()
    assert (after["tasks_running"], after["busy_since"], after["tasks_started"]) == (0, None, 1)
    board.seat_open(2, 0)
    assert board.seats() == []
