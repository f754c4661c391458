"""HTTP/2 (``--http auto``, the default; ``--http 1``, ``--http 2``): h2c with prior knowledge
on the HTTP/1.1 port and h2 over TLS by ALPN, each stream an ASGI http scope.

Clients: httpx with its ``h2`` extra (``httpx[http2]``), an independent implementation, for
ordinary requests; and the ``h2`` package's sans-IO connection over a raw socket
(``H2Socket``) where a test needs frame-level control: a reader that leaves a stream's window
closed, a client reset of one stream, the server's GOAWAY. uvicorn (the oracle of the other
server tests) serves no HTTP/2 here, so every test is ``ferroloop_only``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import ssl
import uuid
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import httpx
import hyperframe.frame
import pytest
import trustme

pytestmark = pytest.mark.ferroloop_only(reason="uvicorn has no HTTP/2")

# Upper bound of one wait here (the server conftest's IO_TIMEOUT); loopback needs far less.
IO_TIMEOUT = 10.0
# The conftest's fixtures (``serve``, ``spawn_server``) and what they return.
Server = Any
ServerFactory = Any

APP = "raw_asgi:app"


class H2Socket:
    """A client HTTP/2 connection: the ``h2`` package's state machine over a blocking socket.
    Connection-level flow control is granted as data arrives; a stream's window only when
    ``grant`` says so (so a test can leave one closed)."""

    def __init__(self, sock: socket.socket, authority: str = "127.0.0.1") -> None:
        self.sock = sock
        self.sock.settimeout(IO_TIMEOUT)
        self.authority = authority
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.flush()
        self.bodies: dict[int, bytearray] = {}
        self.headers: dict[int, dict[bytes, bytes]] = {}
        self.ended: set[int] = set()
        self.reset: dict[int, int] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.closed = False

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def request(self, path: str, method: str = "GET", end: bool = True) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        headers = [
            (":method", method),
            (":path", path),
            (":scheme", "http"),
            (":authority", self.authority),
        ]
        self.conn.send_headers(stream_id, headers, end_stream=end)
        self.bodies[stream_id] = bytearray()
        self.flush()
        return stream_id

    def grant(self, stream_id: int, amount: int) -> None:
        """Opens the stream's window by ``amount`` bytes."""
        self.conn.increment_flow_control_window(amount, stream_id=stream_id)
        self.flush()

    def read_events(self, auto_grant: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        """One read from the socket; its events recorded."""
        data = self.sock.recv(65536)
        if not data:
            self.closed = True
            return
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                self.headers[event.stream_id] = dict(event.headers)
            elif isinstance(event, h2.events.DataReceived):
                self.bodies[event.stream_id] += event.data
                if event.flow_controlled_length:
                    self.conn.increment_flow_control_window(event.flow_controlled_length)
                    if event.stream_id in auto_grant:
                        # The stream may be closed already (its end came in the same read).
                        with contextlib.suppress(h2.exceptions.StreamClosedError):
                            self.conn.increment_flow_control_window(
                                event.flow_controlled_length, stream_id=event.stream_id
                            )
            elif isinstance(event, h2.events.StreamEnded):
                self.ended.add(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                self.reset[event.stream_id] = event.error_code
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.goaway = event
        self.flush()

    def until(self, done, auto_grant: set[int] = frozenset()) -> None:  # type: ignore[no-untyped-def]
        while not done():
            if self.closed:
                raise AssertionError("the server closed the connection")
            self.read_events(auto_grant)

    def close(self) -> None:
        self.sock.close()

    def raw_frames(self):  # type: ignore[no-untyped-def]
        """The frames that follow, parsed one by one without the state machine (which takes a
        GOAWAY as the end of the connection and refuses every frame after it, while a
        server's graceful shutdown sends more: a PING, the last GOAWAY, the streams' ends).
        PINGs are answered. Ends when the server closes."""
        buf = bytearray()
        while True:
            while len(buf) < 9 or len(buf) < 9 + int.from_bytes(buf[:3], "big"):
                data = self.sock.recv(65536)
                if not data:
                    self.closed = True
                    return
                buf += data
            frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(buf[:9]))
            frame.parse_body(memoryview(buf[9 : 9 + length]))
            del buf[: 9 + length]
            if isinstance(frame, hyperframe.frame.PingFrame) and "ACK" not in frame.flags:
                pong = hyperframe.frame.PingFrame(0)
                pong.flags.add("ACK")
                pong.opaque_data = frame.opaque_data
                self.sock.sendall(pong.serialize())
            yield frame


def h2_socket(server: Server) -> H2Socket:
    return H2Socket(socket.create_connection((server.host, server.port), timeout=IO_TIMEOUT))


def h2c_client() -> httpx.Client:
    """httpx speaking HTTP/2 with prior knowledge to an http:// URL."""
    return httpx.Client(http1=False, http2=True, timeout=IO_TIMEOUT)


# ----------------------------------------------------------------------------- h2c


def test_h2c_prior_knowledge_and_http1_share_the_port(serve: ServerFactory) -> None:
    server = serve(APP)
    with h2c_client() as client:
        response = client.get(f"{server.url}/hello")
        assert response.http_version == "HTTP/2"
        assert response.status_code == 200
        assert response.text == "hello, world"
        assert response.headers["server"] == "ferroloop"
        assert "date" in response.headers
    with httpx.Client(timeout=IO_TIMEOUT) as client:
        response = client.get(f"{server.url}/hello")
        assert response.http_version == "HTTP/1.1"
        assert response.text == "hello, world"


def test_stream_scope_is_http2(serve: ServerFactory) -> None:
    server = serve(APP)
    with h2c_client() as client:
        response = client.get(f"{server.url}/scope/a%20b?x=1&y=2", headers={"x-custom": "v"})
    scope = response.json()
    assert scope["type"] == "http"
    assert scope["http_version"] == "2"
    assert scope["method"] == "GET"
    assert scope["path"] == "/scope/a b"
    assert scope["raw_path"] == "/scope/a%20b"
    assert scope["query_string"] == "x=1&y=2"
    assert scope["scheme"] == "http"
    headers = dict(scope["headers"])
    assert headers["x-custom"] == "v"
    # The :authority pseudo-header is the scope's host field.
    assert headers["host"] == f"127.0.0.1:{server.port}"
    assert not any(name.startswith(":") for name, _ in scope["headers"])
    assert scope["_types"]["header_items"] == ["bytes,bytes"]


@pytest.mark.parametrize("size", [0, 1, 100_000, 3_000_000])
def test_post_bodies_are_echoed(serve: ServerFactory, size: int) -> None:
    server = serve(APP)
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    with h2c_client() as client:
        response = client.post(f"{server.url}/echo", content=body)
    assert response.http_version == "HTTP/2"
    assert response.status_code == 200
    assert response.content == body


def test_large_response_arrives_whole(serve: ServerFactory) -> None:
    server = serve(APP)
    with h2c_client() as client:
        response = client.get(f"{server.url}/stream?size=5000000")
    assert len(response.content) == 5_000_000
    import hashlib

    assert hashlib.sha256(response.content).hexdigest() == response.headers["x-sha256"]


def test_concurrent_streams_share_one_connection(serve: ServerFactory) -> None:
    server = serve(APP)

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(http1=False, http2=True, timeout=IO_TIMEOUT) as client:
            # The connection is open before the requests start, so they all take it.
            await client.get(f"{server.url}/hello")
            # Each sleeping request is in flight while the others run.
            requests = [client.get(f"{server.url}/sleep?s=0.2") for _ in range(10)]
            requests += [
                client.post(f"{server.url}/echo", content=str(i).encode() * 1000) for i in range(10)
            ]
            requests.append(client.get(f"{server.url}/scope"))
            requests.append(client.get(f"{server.url}/scope"))
            return await asyncio.gather(*requests)

    responses = asyncio.run(run())
    assert all(r.status_code == 200 and r.http_version == "HTTP/2" for r in responses)
    assert all(r.text.startswith("slept") for r in responses[:10])
    assert [r.content for r in responses[10:20]] == [str(i).encode() * 1000 for i in range(10)]
    # One TCP connection: both scopes name the same client port.
    ports = {json.loads(r.content)["client"][1] for r in responses[20:]}
    assert len(ports) == 1


def test_app_errors_are_500_or_reset_for_that_stream_only(serve: ServerFactory) -> None:
    server = serve(APP)
    with h2c_client() as client:
        assert client.get(f"{server.url}/raise-before-start").status_code == 500
        assert client.get(f"{server.url}/no-response").status_code == 500
        with pytest.raises(httpx.RemoteProtocolError):
            client.get(f"{server.url}/raise-after-start")
    with h2c_client() as client:
        assert client.get(f"{server.url}/hello").text == "hello, world"


# ----------------------------------------------------------------------------- flow control


def result(server: Server, key: str) -> object:
    with httpx.Client(timeout=IO_TIMEOUT) as client:
        response = client.get(f"{server.url}/result", params={"key": key})
    return response.json() if response.status_code == 200 else None


def test_slow_reader_holds_back_its_stream_only(serve: ServerFactory) -> None:
    """A stream whose window the client keeps closed stops its app's send() (backpressure),
    while another stream on the same connection is answered; once the client reads, the
    whole body arrives."""
    server = serve(APP)
    key = uuid.uuid4().hex
    total = 8 * 1024 * 1024
    client = h2_socket(server)
    try:
        slow = client.request(f"/stream-unbounded?key={key}&total={total}")
        client.until(lambda: len(client.bodies[slow]) >= 65_535)
        # Another stream on the same connection is served meanwhile.
        other = client.request("/hello")
        client.until(lambda: other in client.ended)
        assert bytes(client.bodies[other]) == b"hello, world"
        sent = result(server, key)
        assert isinstance(sent, int)
        # The app was held back: the stream's window (64 KiB), the server's queue (64 KiB)
        # and one part in hand, far from the 8 MiB it would send unchecked.
        assert sent < 1024 * 1024, sent
        assert slow not in client.ended
        # Now read: every byte arrives.
        client.grant(slow, len(client.bodies[slow]))
        client.until(lambda: slow in client.ended, auto_grant={slow})
        assert len(client.bodies[slow]) == total
    finally:
        client.close()


def test_client_reset_is_a_disconnect_for_that_stream_only(
    serve: ServerFactory, wait_until: Any
) -> None:
    server = serve(APP)
    key = uuid.uuid4().hex
    client = h2_socket(server)
    try:
        # A request whose body never ends: its app waits in receive().
        waiting = client.request(f"/record-disconnect?key={key}", method="POST", end=False)
        wait_until(lambda: result(server, key + ":started"), "the app started")
        client.conn.reset_stream(waiting, error_code=8)  # CANCEL
        client.flush()
        assert wait_until(lambda: result(server, key), "the app saw the reset") == {
            "type": "http.disconnect",
            "received": 0,
        }
        # The connection goes on.
        other = client.request("/hello")
        client.until(lambda: other in client.ended)
        assert bytes(client.bodies[other]) == b"hello, world"
    finally:
        client.close()


# ----------------------------------------------------------------------------- shutdown


def test_graceful_shutdown_sends_goaway_and_finishes_streams(
    spawn_server: ServerFactory, tmp_path: Path
) -> None:
    server = spawn_server(APP)
    release = tmp_path / "release"
    client = h2_socket(server)
    try:
        in_flight = client.request(f"/slow?release={release}")
        client.until(lambda: bytes(client.bodies[in_flight]) == b"started\n")
        server.proc.send_signal(signal.SIGTERM)
        goaways = []
        rest = bytearray()
        ended = False
        for frame in client.raw_frames():
            if isinstance(frame, hyperframe.frame.GoAwayFrame):
                goaways.append((frame.error_code, frame.last_stream_id))
                # The stream in flight may finish now.
                release.write_text("go")
            elif isinstance(frame, hyperframe.frame.DataFrame) and frame.stream_id == in_flight:
                rest += frame.data
                ended = ended or "END_STREAM" in frame.flags
        # GOAWAY without an error, never refusing the stream in flight, and its response
        # finished before the server closed.
        assert goaways and all(code == 0 and last >= in_flight for code, last in goaways)
        assert ended and bytes(rest) == b"finished\n"
    finally:
        client.close()
    server.assert_exits_cleanly()


def test_idle_connection_gets_goaway_after_keep_alive_timeout(
    spawn_server: ServerFactory,
) -> None:
    server = spawn_server(APP, "--timeout-keep-alive", "1")
    client = h2_socket(server)
    try:
        first = client.request("/hello")
        client.until(lambda: first in client.ended)
        goaways = [
            frame.error_code
            for frame in client.raw_frames()
            if isinstance(frame, hyperframe.frame.GoAwayFrame)
        ]
        # The server said why (no error) and closed the connection.
        assert goaways and set(goaways) == {0}
        assert client.closed
    finally:
        client.close()


# ----------------------------------------------------------------------------- --http


def test_http_1_serves_no_http2(spawn_server: ServerFactory) -> None:
    server = spawn_server(APP, "--http", "1")
    with h2c_client() as client, pytest.raises(httpx.HTTPError):
        client.get(f"{server.url}/hello")
    with httpx.Client(timeout=IO_TIMEOUT) as client:
        assert client.get(f"{server.url}/hello").http_version == "HTTP/1.1"


def test_http_2_serves_no_http1(spawn_server: ServerFactory) -> None:
    server = spawn_server(APP, "--http", "2")
    with h2c_client() as client:
        assert client.get(f"{server.url}/hello").http_version == "HTTP/2"
    with httpx.Client(timeout=IO_TIMEOUT) as client, pytest.raises(httpx.HTTPError):
        client.get(f"{server.url}/hello")


def test_uvicorn_http_implementations_mean_http1(spawn_server: ServerFactory) -> None:
    server = spawn_server(APP, "--http", "h11")
    with h2c_client() as client, pytest.raises(httpx.HTTPError):
        client.get(f"{server.url}/hello")


# ----------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    directory = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    for index, blob in enumerate(leaf.cert_chain_pems):
        blob.write_to_path(str(directory / "cert.pem"), append=index > 0)
    leaf.private_key_pem.write_to_path(str(directory / "key.pem"))
    return directory / "ca.pem", directory / "cert.pem", directory / "key.pem"


def test_tls_alpn_picks_h2_then_http1(
    serve: ServerFactory, tls_files: tuple[Path, Path, Path]
) -> None:
    ca, cert, key = tls_files
    server = serve(APP, "--ssl-certfile", str(cert), "--ssl-keyfile", str(key))
    url = f"https://127.0.0.1:{server.port}"
    context = ssl.create_default_context(cafile=str(ca))
    with httpx.Client(http2=True, verify=context, timeout=IO_TIMEOUT) as client:
        response = client.post(f"{url}/echo", content=b"y" * 200_000)
        assert response.http_version == "HTTP/2"
        assert response.content == b"y" * 200_000
        scope = client.get(f"{url}/scope").json()
        assert scope["http_version"] == "2"
        assert scope["scheme"] == "https"
    with httpx.Client(verify=context, timeout=IO_TIMEOUT) as client:
        response = client.get(f"{url}/hello")
        assert response.http_version == "HTTP/1.1"
        assert response.text == "hello, world"
    # ALPN as the server offers it: h2 first.
    raw = ssl.create_default_context(cafile=str(ca))
    raw.set_alpn_protocols(["http/1.1", "h2"])
    sock = socket.create_connection((server.host, server.port), timeout=IO_TIMEOUT)
    with raw.wrap_socket(sock, server_hostname="127.0.0.1") as tls_sock:
        assert tls_sock.selected_alpn_protocol() == "h2"


# ----------------------------------------------------------------------------- frameworks


def test_fastapi_app_over_h2c(serve: ServerFactory) -> None:
    server = serve("fastapi_app:app")
    with h2c_client() as client:
        created = client.post(f"{server.url}/items", json={"name": "pen", "price": 1.5})
        assert created.http_version == "HTTP/2"
        assert created.status_code == 200
        assert created.json() == {
            "item": {"name": "pen", "price": 1.5, "tags": []},
            "total": 3.0,
        }
        state = client.get(f"{server.url}/state")
        assert state.json() == {"greeting": "hello from the fastapi lifespan"}
        read = client.get(f"{server.url}/items/3", params={"q": "x"})
        assert read.json() == {"item_id": 3, "q": "x"}
        streamed = client.get(f"{server.url}/stream", params={"count": 3})
        assert streamed.status_code == 200
        assert streamed.text.count("\n") == 3


def test_starlette_app_over_h2c(serve: ServerFactory) -> None:
    server = serve("starlette_app:app")
    with h2c_client() as client:
        response = client.post(f"{server.url}/echo", json={"b": 1, "a": [2]})
        assert response.http_version == "HTTP/2"
        assert response.json() == {"received": {"b": 1, "a": [2]}, "keys": ["a", "b"]}
        streamed = client.get(f"{server.url}/stream", params={"count": 3})
        assert streamed.text == "part 0;part 1;part 2;"
        state = client.get(f"{server.url}/state")
        assert state.json() == {"greeting": "hello from the starlette lifespan"}
