"""TLS (``--ssl-*``): https and wss end to end, client certificates, protocol versions, key
loading, clean closes, and connections that do not speak TLS.

Certificates come from ``trustme``: one CA per module, a server certificate for 127.0.0.1 and
localhost, and client certificates. Clients are Python's ``ssl`` over raw sockets (the conftest's
``RawConnection`` reader over an ``SSLSocket``), httpx and the websockets library.

With ``FERROLOOP_TEST_SERVER=uvicorn`` the same tests run against uvicorn (Python's ``ssl``
module); the few where ferroloop deliberately differs are marked ``ferroloop_only``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import random
import signal
import socket
import ssl
import struct
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trustme
from cryptography.hazmat.primitives import serialization
from websockets.asyncio.client import connect as ws_connect

# Upper bound of one wait here (the server conftest's IO_TIMEOUT); loopback needs far less.
IO_TIMEOUT = 10.0
KEY_PASSWORD = "correct horse battery staple"
ON_FERROLOOP = os.environ.get("FERROLOOP_TEST_SERVER", "ferroloop") == "ferroloop"


@dataclass(frozen=True)
class TlsFiles:
    """A CA, and the PEM files of a server certificate it issued."""

    ca: trustme.CA
    ca_pem: Path
    cert_pem: Path
    key_pem: Path
    encrypted_key_pem: Path  # key_pem encrypted with KEY_PASSWORD
    client: trustme.LeafCert  # issued by ``ca``

    def server_args(self, *extra: str) -> tuple[str, ...]:
        return ("--ssl-certfile", str(self.cert_pem), "--ssl-keyfile", str(self.key_pem), *extra)

    def encrypted_key_args(self, password: str) -> tuple[str, ...]:
        """The options that serve the certificate with its encrypted key and ``password``."""
        return (
            "--ssl-certfile",
            str(self.cert_pem),
            "--ssl-keyfile",
            str(self.encrypted_key_pem),
            "--ssl-keyfile-password",
            password,
        )

    def client_context(self, alpn: list[str] | None = None) -> ssl.SSLContext:
        """A client context that trusts the CA (and nothing else) and checks the host name."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        context.load_verify_locations(cafile=str(self.ca_pem))
        if alpn is not None:
            context.set_alpn_protocols(alpn)
        return context


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsFiles:
    directory = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    for index, blob in enumerate(leaf.cert_chain_pems):
        blob.write_to_path(str(directory / "cert.pem"), append=index > 0)
    leaf.private_key_pem.write_to_path(str(directory / "key.pem"))
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    (directory / "encrypted-key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(KEY_PASSWORD.encode()),
        )
    )
    return TlsFiles(
        ca=ca,
        ca_pem=directory / "ca.pem",
        cert_pem=directory / "cert.pem",
        key_pem=directory / "key.pem",
        encrypted_key_pem=directory / "encrypted-key.pem",
        client=ca.issue_cert("client@example.org"),
    )


@pytest.fixture(scope="module")
def server(serve, tls):
    return serve("raw_asgi:app", *tls.server_args())


@pytest.fixture
def tls_connect(connect, tls):
    """``tls_connect(server, context=None, rcvbuf=None, **wrap_options)``: a ``RawConnection``
    whose socket is an ``SSLSocket`` that finished its handshake (closed at teardown, as
    ``connect``'s are)."""

    def tls_connect(
        server, context: ssl.SSLContext | None = None, rcvbuf: int | None = None, **wrap_options
    ):
        connection = connect(server, rcvbuf=rcvbuf)
        connection.sock = (context or tls.client_context()).wrap_socket(
            connection.sock, server_hostname="127.0.0.1", **wrap_options
        )
        return connection

    return tls_connect


def assert_tls_request_refused(tls_connect, server, context: ssl.SSLContext) -> None:
    """The server must refuse this client: the handshake fails, or (TLS 1.3, where the client
    finishes its handshake before the server has checked the client's certificate) the first
    read gets the alert or the end of the stream. Never a response, never a hang (a timeout
    propagates and fails the test)."""
    try:
        connection = tls_connect(server, context)
        connection.send(b"GET /hello HTTP/1.1\r\nHost: test\r\n\r\n", allow_reset=True)
        data = connection.read_until_close()
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return
    assert data == b"", f"the server answered a client it must refuse: {data[:200]!r}"


# --------------------------------------------------------------------------- requests


def test_get_over_https_sees_scheme_https(server, tls):
    with httpx.Client(verify=tls.client_context(), timeout=IO_TIMEOUT) as client:
        hello = client.get(f"https://127.0.0.1:{server.port}/hello")
        scope = client.get(f"https://localhost:{server.port}/scope").json()
    assert (hello.status_code, hello.text) == (200, "hello, world")
    assert hello.http_version == "HTTP/1.1"
    assert scope["scheme"] == "https"
    assert scope["type"] == "http"
    assert scope["server"] == ["127.0.0.1", server.port]


@pytest.mark.ferroloop_only(reason="uvicorn's ssl context sets no ALPN protocols (selects none)")
def test_alpn_selects_h2_first_then_http11(server, tls, tls_connect):
    # HTTP/2 is served (--http auto): a client offering both gets h2 (tests/server/test_http2.py
    # speaks it); one offering only HTTP/1.1 gets that.
    connection = tls_connect(server, tls.client_context(alpn=["h2", "http/1.1"]))
    assert connection.sock.selected_alpn_protocol() == "h2"
    connection = tls_connect(server, tls.client_context(alpn=["http/1.1"]))
    assert connection.sock.selected_alpn_protocol() == "http/1.1"
    assert connection.request("GET", "/hello").body == b"hello, world"


def test_keep_alive_and_pipelined_requests_over_one_tls_connection(
    server, tls_connect, request_bytes
):
    connection = tls_connect(server)
    for index in range(3):
        body = f"request {index}".encode()
        response = connection.request("POST", "/echo", body=body)
        assert (response.status, response.body) == (200, body)
        assert response.header("connection") != "close"
    pipelined = b"".join(
        request_bytes("POST", "/echo", body=f"pipelined {index}".encode())
        if index % 2
        else request_bytes("GET", f"/scope/pipelined-{index}")
        for index in range(8)
    )
    connection.send(pipelined)
    for index in range(8):
        response = connection.read_response()
        assert response.status == 200
        assert response.complete
        if index % 2:
            assert response.body == f"pipelined {index}".encode()
        else:
            assert json.loads(response.body)["path"] == f"/scope/pipelined-{index}"
    assert connection.request("GET", "/hello").body == b"hello, world"


def test_five_megabyte_request_body_is_echoed_intact(server, tls_connect):
    body = random.Random(5).randbytes(5 * 1024 * 1024)
    connection = tls_connect(server)
    response = connection.request("POST", "/echo", body=body)
    assert response.status == 200
    assert len(response.body) == len(body)
    assert response.body == body
    assert connection.request("GET", "/hello").body == b"hello, world"


def test_large_streamed_response_arrives_intact_to_a_slow_reader(server, tls_connect):
    # A small receive buffer: the server's socket fills, so ciphertext waits in the server
    # (backpressure) many times over the 6 MB.
    connection = tls_connect(server, rcvbuf=16384)
    size = 6 * 1024 * 1024 + 7
    response = connection.request("GET", f"/stream?size={size}")
    assert response.status == 200
    assert response.complete
    assert len(response.body) == size
    assert hashlib.sha256(response.body).hexdigest() == response.header("x-sha256")
    assert connection.request("GET", "/hello").body == b"hello, world"


@pytest.mark.ferroloop_only(reason="uvicorn implements neither pathsend nor zerocopysend")
@pytest.mark.parametrize(
    "target",
    [
        "/pathsend?path={path}",
        "/zerocopysend?path={path}&offset=1000&count=2097152",
    ],
    ids=["pathsend", "zerocopysend"],
)
def test_file_response_extension_arrives_intact_over_tls(server, tls_connect, tmp_path, target):
    path = tmp_path / "payload.bin"
    path.write_bytes(random.Random(4).randbytes(3 * 1024 * 1024 + 17))
    expected = path.read_bytes()
    if "offset" in target:
        expected = expected[1000 : 1000 + 2097152]
    connection = tls_connect(server)
    response = connection.request("GET", target.format(path=path))
    assert response.status == 200
    assert len(response.body) == len(expected)
    assert response.body == expected
    assert connection.request("GET", "/hello").body == b"hello, world"


# --------------------------------------------------------------------------- not TLS


@pytest.mark.parametrize(
    "first_bytes",
    [
        b"GET /hello HTTP/1.1\r\nHost: test\r\n\r\n",
        bytes(range(256)),
        # A handshake record whose length is far over the 16 KiB a record may have.
        b"\x16\x03\x01\xff\xffhello",
        # Application data before any handshake.
        b"\x17\x03\x03\x00\x05hello",
    ],
    ids=["plain-http", "garbage", "oversized-record", "data-before-handshake"],
)
def test_bytes_that_are_not_tls_end_the_connection(server, connect, tls_connect, first_bytes):
    connection = connect(server)
    connection.send(first_bytes, allow_reset=True)
    # Ends within IO_TIMEOUT (a hang raises TimeoutError); a reset counts as the end.
    answer = connection.read_until_close()
    assert connection.eof
    assert answer == b"" or answer.startswith(b"\x15\x03"), (
        f"expected nothing or a TLS alert record, got {answer[:100]!r}"
    )
    # The server goes on serving TLS clients.
    assert tls_connect(server).request("GET", "/hello").body == b"hello, world"


# --------------------------------------------------------------------------- client certificates


@pytest.fixture(scope="module")
def client_cert_required(serve, tls):
    return serve(
        "raw_asgi:app", *tls.server_args("--ssl-cert-reqs", "2", "--ssl-ca-certs", str(tls.ca_pem))
    )


@pytest.fixture(scope="module")
def client_cert_optional(serve, tls):
    return serve(
        "raw_asgi:app", *tls.server_args("--ssl-cert-reqs", "1", "--ssl-ca-certs", str(tls.ca_pem))
    )


def test_required_client_certificate_refuses_a_client_without_one(
    client_cert_required, tls, tls_connect
):
    assert_tls_request_refused(tls_connect, client_cert_required, tls.client_context())
    # Refusing one client does not stop the server: a client with a certificate is served.
    context = tls.client_context()
    tls.client.configure_cert(context)
    assert tls_connect(client_cert_required, context).request("GET", "/hello").status == 200


def test_required_client_certificate_refuses_one_from_another_ca(
    client_cert_required, tls, tls_connect
):
    context = tls.client_context()
    trustme.CA().issue_cert("client@example.org").configure_cert(context)
    assert_tls_request_refused(tls_connect, client_cert_required, context)


def test_required_client_certificate_from_the_ca_is_served(client_cert_required, tls, tls_connect):
    context = tls.client_context()
    tls.client.configure_cert(context)
    connection = tls_connect(client_cert_required, context)
    response = connection.request("GET", "/hello")
    assert (response.status, response.body) == (200, b"hello, world")
    assert connection.request("POST", "/echo", body=b"again").body == b"again"


@pytest.mark.parametrize("with_cert", [False, True], ids=["without-cert", "with-cert"])
def test_optional_client_certificate_serves_clients_with_and_without_one(
    client_cert_optional, tls, tls_connect, with_cert
):
    context = tls.client_context()
    if with_cert:
        tls.client.configure_cert(context)
    response = tls_connect(client_cert_optional, context).request("GET", "/hello")
    assert (response.status, response.body) == (200, b"hello, world")


# --------------------------------------------------------------------------- versions


@pytest.mark.parametrize(
    ("server_options", "client_maximum", "negotiated"),
    [
        ((), None, "TLSv1.3"),
        ((), ssl.TLSVersion.TLSv1_2, "TLSv1.2"),
        (("--ssl-version", str(int(ssl.PROTOCOL_TLSv1_2))), None, "TLSv1.2"),
    ],
    ids=["default", "default-client-tls12", "ssl-version-5"],
)
def test_negotiated_tls_version(
    serve, tls, tls_connect, server_options, client_maximum, negotiated
):
    server = serve("raw_asgi:app", *tls.server_args(*server_options))
    context = tls.client_context()
    if client_maximum is not None:
        context.maximum_version = client_maximum
    connection = tls_connect(server, context)
    assert connection.sock.version() == negotiated
    assert connection.request("POST", "/echo", body=b"over " + negotiated.encode()).status == 200


def test_ssl_version_5_refuses_a_tls13_only_client(serve, tls, connect):
    server = serve("raw_asgi:app", *tls.server_args("--ssl-version", "5"))
    context = tls.client_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    connection = connect(server)
    with pytest.raises(ssl.SSLError):
        context.wrap_socket(connection.sock, server_hostname="127.0.0.1")


# --------------------------------------------------------------------------- closing


def _clean_close(connection) -> None:
    """Read to the end of the stream of a socket wrapped with ``suppress_ragged_eofs=False``:
    b"" there is the peer's close_notify; a TCP FIN without one raises SSLEOFError."""
    try:
        rest = connection.read_until_close()
    except ssl.SSLEOFError as exc:
        pytest.fail(f"the server closed without a TLS close_notify (ragged EOF: {exc})")
    assert rest == b""


@pytest.mark.parametrize(
    ("request_data", "status"),
    [
        (b"GET /hello HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n", 200),
        (b"GET /hello HTTP/1.0\r\n\r\n", 200),
        (b"GET /hello HTTP/1.1\r\nHost: test\r\nnot a header line\r\n\r\n", 400),
    ],
    ids=["connection-close", "http-1.0", "bad-request"],
)
def test_server_closing_after_a_response_sends_close_notify(
    server, tls_connect, request_data, status
):
    connection = tls_connect(server, suppress_ragged_eofs=False)
    connection.send(request_data)
    assert connection.read_response().status == status
    _clean_close(connection)


def test_idle_keep_alive_timeout_ends_with_close_notify(serve, tls, tls_connect):
    server = serve("raw_asgi:app", *tls.server_args("--timeout-keep-alive", "1"))
    connection = tls_connect(server, suppress_ragged_eofs=False)
    assert connection.request("GET", "/hello").status == 200
    _clean_close(connection)


@pytest.mark.ferroloop_only(reason="--timeout-header is a ferroloop option")
def test_header_timeout_after_the_handshake_ends_with_close_notify(serve, tls, tls_connect):
    server = serve("raw_asgi:app", *tls.server_args("--timeout-header", "1"))
    connection = tls_connect(server, suppress_ragged_eofs=False)
    _clean_close(connection)


def test_graceful_shutdown_closes_an_idle_connection_with_close_notify(
    spawn_server, tls, tls_connect
):
    server = spawn_server("raw_asgi:app", *tls.server_args())
    connection = tls_connect(server, suppress_ragged_eofs=False)
    assert connection.request("GET", "/hello").status == 200
    server.proc.send_signal(signal.SIGTERM)
    _clean_close(connection)
    # uvicorn waits for the client's close_notify in turn; a client closes once it read EOF.
    connection.close()
    server.assert_exits_cleanly()


def test_client_close_notify_is_answered_with_close_notify(server, tls_connect):
    connection = tls_connect(server)
    assert connection.request("GET", "/hello").status == 200
    # unwrap() sends close_notify and returns once the server's close_notify came back; the
    # server closing without one fails it (SSLEOFError).
    connection.sock = connection.sock.unwrap()
    assert connection.sock.recv(1) == b""


# --------------------------------------------------------------------------- WebSocket


@pytest.fixture(scope="module")
def ws_server(serve, tls):
    return serve("ws_app:app", *tls.server_args())


# The wss clients here are websockets' asyncio client, never its sync client: the sync client
# reads on a thread of its own while the caller writes, on one OpenSSL object, and OpenSSL 3.0
# loses a record written while that thread handles the server's TLS 1.3 session tickets (the
# upgrade request never reaches the socket: see repro_wss_stall.py). The asyncio client drives
# its TLS object from one thread, through memory BIOs.


def test_websocket_over_wss_echoes_messages(ws_server, tls):
    url = f"wss://127.0.0.1:{ws_server.port}/echo"
    big = random.Random(11).randbytes(512 * 1024)

    async def echoes() -> tuple[str | bytes, str | bytes]:
        async with ws_connect(url, ssl=tls.client_context(), open_timeout=IO_TIMEOUT) as ws:
            await ws.send("hello over wss")
            text = await asyncio.wait_for(ws.recv(), IO_TIMEOUT)
            await ws.send(big)
            return text, await asyncio.wait_for(ws.recv(), IO_TIMEOUT)

    text, binary = asyncio.run(echoes())
    assert text == "hello over wss"
    assert binary == big


def test_websocket_over_wss_sees_scheme_wss(ws_server, tls):
    url = f"wss://127.0.0.1:{ws_server.port}/scope"

    async def first_message() -> str | bytes:
        async with ws_connect(url, ssl=tls.client_context(), open_timeout=IO_TIMEOUT) as ws:
            return await asyncio.wait_for(ws.recv(), IO_TIMEOUT)

    scope = json.loads(asyncio.run(first_message()))
    assert scope["type"] == "websocket"
    assert scope["scheme"] == "wss"


class BatchingTlsClient:
    """A TLS client whose ciphertext the test sends in batches of its choosing: Python's ``ssl``
    over memory BIOs on a plain socket, so which records leave in which ``send()`` is the
    test's decision, not the TLS library's."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        self.sock = sock
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname="127.0.0.1")
        self.plaintext = bytearray()

    def handshake_keeping_last_flight(self) -> None:
        """Runs the handshake until the client's side is done; its last flight (under TLS 1.3
        its Finished) stays unsent, in ``outgoing``."""
        while True:
            try:
                self.tls.do_handshake()
                return
            except ssl.SSLWantReadError:
                self.sock.sendall(self.outgoing.read())
                self._receive()

    def _receive(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.incoming.write(data)

    def read_until(self, done) -> bytes:
        """Decrypted bytes from the server until ``done(plaintext)`` holds (a stalled server
        fails the test: the socket's timeout, or its close, ends the wait)."""
        while not done(self.plaintext):
            try:
                chunk = self.tls.read(65536)
            except ssl.SSLWantReadError:
                self._receive()
                continue
            if not chunk:
                raise ConnectionError("the server closed the TLS session")
            self.plaintext += chunk
        return bytes(self.plaintext)


def upgrade_request(path: str) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


def first_text_frame(data: bytes) -> bytes | None:
    """The payload of the unmasked text frame after the 101 head in ``data``; None while it has
    not all arrived."""
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    frame = data[head_end + 4 :]
    if len(frame) < 2:
        return None
    assert frame[0] == 0x81, f"a final text frame: {frame[:2]!r}"
    size, start = frame[1], 2
    if size == 126:
        if len(frame) < 4:
            return None
        size, start = struct.unpack("!H", frame[2:4])[0], 4
    payload = frame[start : start + size]
    return payload if len(payload) == size else None


@pytest.mark.parametrize("batching", ["one-send", "finished-then-request", "byte-by-byte"])
def test_wss_upgrade_sent_with_the_tls13_client_finished_is_answered(
    ws_server, tls, connect, batching
):
    # The client's Finished and its upgrade request, sent before the client has read the
    # server's session tickets: in one send (one segment; the server's read that completes the
    # handshake also holds the request and leaves the socket empty), in two sends, or one byte
    # per send (records completed across many reads).
    context = tls.client_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    connection = connect(ws_server)
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client = BatchingTlsClient(connection.sock, context)
    client.handshake_keeping_last_flight()
    finished = client.outgoing.read()
    client.tls.write(upgrade_request("/scope"))
    request = client.outgoing.read()
    if batching == "one-send":
        connection.sock.sendall(finished + request)
    elif batching == "finished-then-request":
        connection.sock.sendall(finished)
        connection.sock.sendall(request)
    else:
        for byte in finished + request:
            connection.sock.sendall(bytes([byte]))
    data = client.read_until(lambda data: first_text_frame(data) is not None)
    assert data.startswith(b"HTTP/1.1 101 "), data[:200]
    scope = json.loads(first_text_frame(data))
    assert scope["type"] == "websocket"
    assert scope["scheme"] == "wss"


# --------------------------------------------------------------------------- idle clients


@pytest.mark.ferroloop_only(reason="--timeout-header is a ferroloop option")
@pytest.mark.parametrize(
    "stage",
    ["nothing-sent", "half-a-client-hello", "handshake-done"],
)
def test_idle_tls_client_is_disconnected_after_timeout_header(
    serve, tls, connect, tls_connect, stage
):
    server = serve("raw_asgi:app", *tls.server_args("--timeout-header", "1"))
    if stage == "handshake-done":
        connection = tls_connect(server)
    else:
        connection = connect(server)
        if stage == "half-a-client-hello":
            # A record header announcing 512 bytes of handshake, and 4 of them.
            connection.send(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc")
    # The end of the stream must come within IO_TIMEOUT (else TimeoutError fails the test).
    assert connection.closed_by_peer()


# --------------------------------------------------------------------------- startup


def test_encrypted_key_with_its_password_serves(serve, tls, tls_connect):
    server = serve("raw_asgi:app", *tls.encrypted_key_args(KEY_PASSWORD))
    assert tls_connect(server).request("GET", "/hello").body == b"hello, world"


def test_default_cipher_list_named_explicitly_is_accepted(serve, tls, tls_connect):
    server = serve("raw_asgi:app", *tls.server_args("--ssl-ciphers", "TLSv1"))
    assert tls_connect(server).request("GET", "/hello").body == b"hello, world"


def test_wrong_key_password_stops_the_server_before_it_listens(spawn_server, tls):
    server = spawn_server("raw_asgi:app", *tls.encrypted_key_args("wrong"), wait=False)
    code = server.wait_exit()
    assert code != 0, server.describe()
    assert server.try_connect() is None


def _startup_failure_cases(tls: TlsFiles, tmp: Path) -> dict[str, tuple[tuple[str, ...], str]]:
    """name -> (server options, text the error must contain)."""
    not_pem = tmp / "not-pem.txt"
    not_pem.write_text("this is not PEM\n")
    other_key = tmp / "other-key.pem"
    trustme.CA().issue_cert("127.0.0.1").private_key_pem.write_to_path(str(other_key))
    cert, key, enc = str(tls.cert_pem), str(tls.key_pem), str(tls.encrypted_key_pem)
    missing = str(tmp / "missing.pem")
    client_auth = ("--ssl-cert-reqs", "2")
    return {
        "wrong-password": (
            ("--ssl-certfile", cert, "--ssl-keyfile", enc, "--ssl-keyfile-password", "wrong"),
            "password",
        ),
        "no-password": (("--ssl-certfile", cert, "--ssl-keyfile", enc), "--ssl-keyfile-password"),
        "missing-certfile": (("--ssl-certfile", missing, "--ssl-keyfile", key), missing),
        "missing-keyfile": (("--ssl-certfile", cert, "--ssl-keyfile", missing), missing),
        "missing-ca-certs": (
            ("--ssl-certfile", cert, "--ssl-keyfile", key, *client_auth, "--ssl-ca-certs", missing),
            missing,
        ),
        "certfile-not-pem": (("--ssl-certfile", str(not_pem), "--ssl-keyfile", key), "certificate"),
        "keyfile-not-a-key": (("--ssl-certfile", cert, "--ssl-keyfile", str(not_pem)), "key"),
        "key-of-another-certificate": (
            ("--ssl-certfile", cert, "--ssl-keyfile", str(other_key)),
            "key",
        ),
        "ca-certs-not-pem": (
            (
                "--ssl-certfile",
                cert,
                "--ssl-keyfile",
                key,
                *client_auth,
                "--ssl-ca-certs",
                str(not_pem),
            ),
            "CA",
        ),
    }


@pytest.mark.ferroloop_only(
    reason="uvicorn lets ssl.SSLContext.load_cert_chain's exception escape: a traceback and "
    "exit status 1"
)
@pytest.mark.parametrize(
    "case",
    [
        "wrong-password",
        "no-password",
        "missing-certfile",
        "missing-keyfile",
        "missing-ca-certs",
        "certfile-not-pem",
        "keyfile-not-a-key",
        "key-of-another-certificate",
        "ca-certs-not-pem",
    ],
)
def test_unusable_tls_material_exits_3_before_the_app_starts(spawn_server, tls, tmp_path, case):
    options, expected_text = _startup_failure_cases(tls, tmp_path)[case]
    markers = tmp_path / "markers"
    markers.mkdir()
    server = spawn_server(
        "raw_asgi:app", *options, env={"FERROLOOP_TEST_MARKER_DIR": str(markers)}, wait=False
    )
    code = server.wait_exit()
    stderr = server.stderr_text()
    assert code == 3, server.describe()
    assert expected_text in stderr, server.describe()
    assert "Traceback" not in stderr, server.describe()
    # The TLS files are checked before the app's lifespan startup runs, as the app is loaded.
    assert not (markers / "startup").exists(), server.describe()
    assert server.try_connect() is None


@pytest.mark.ferroloop_only(
    reason="uvicorn loads the certificate in each worker, which fails with a traceback"
)
def test_unusable_tls_material_with_workers_stops_the_parent_once(spawn_server, tls, tmp_path):
    options, expected_text = _startup_failure_cases(tls, tmp_path)["certfile-not-pem"]
    server = spawn_server("raw_asgi:app", *options, "--workers", "2", wait=False)
    code = server.wait_exit()
    stderr = server.stderr_text()
    assert code == 3, server.describe()
    assert stderr.count("Error loading the TLS certificate or key") == 1, server.describe()
    assert expected_text in stderr and "Started worker process" not in stderr, server.describe()


@pytest.mark.ferroloop_only(
    reason="uvicorn hands these to Python's ssl module as they are (and without a certfile "
    "serves plain HTTP)"
)
@pytest.mark.parametrize(
    ("options", "expected_text"),
    [
        (("{tls}", "--ssl-ciphers", "ECDHE+AESGCM"), "ssl_ciphers"),
        (("{tls}", "--ssl-version", str(int(ssl.PROTOCOL_TLSv1))), "ssl_version"),
        (("{tls}", "--ssl-cert-reqs", "2"), "ssl_ca_certs"),
        (("{tls}", "--ssl-cert-reqs", "7"), "ssl_cert_reqs"),
        (("--ssl-keyfile", "{key}"), "ssl_certfile"),
    ],
    ids=["ciphers", "tls-1.0", "cert-reqs-without-ca", "cert-reqs-out-of-range", "key-only"],
)
def test_unsupported_tls_options_are_usage_errors(spawn_server, tls, options, expected_text):
    """Exit status 2 and the reason on stderr, as argparse does for a bad option."""
    args: list[str] = []
    for option in options:
        if option == "{tls}":
            args += tls.server_args()
        else:
            args.append(option.replace("{key}", str(tls.key_pem)))
    server = spawn_server("raw_asgi:app", *args, wait=False)
    code = server.wait_exit()
    assert code == 2, server.describe()
    assert expected_text in server.stderr_text(), server.describe()
    assert server.try_connect() is None
