"""WebSockets (RFC 6455) through the server: the handshake, ASGI's websocket messages, closing,
errors and limits, driven by the websockets library's client and by raw sockets.

With ``FERROLOOP_TEST_SERVER=uvicorn`` the same tests run against uvicorn (its default,
websockets-based implementation); the few where ferroloop deliberately differs are marked.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import struct
import zlib

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

APP = "ws_app:app"
# Upper bound of one wait here (the server conftest's IO_TIMEOUT); loopback needs far less.
IO_TIMEOUT = 10.0
KEY = base64.b64encode(os.urandom(16)).decode()


@pytest.fixture(scope="module")
def server(serve):
    return serve(APP)


def ws_url(server, path: str) -> str:
    return f"ws://127.0.0.1:{server.port}{path}"


def last_record(server) -> dict:
    return httpx.get(f"{server.url}/last", timeout=IO_TIMEOUT).json()


def wait_record(server, wait_until, key: str) -> dict:
    wait_until(lambda: key in last_record(server), f"the app to record {key!r}")
    return last_record(server)


def upgrade_request(path: str = "/echo", **overrides: str | None) -> bytes:
    fields = {
        "Host": "127.0.0.1",
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": KEY,
        "Sec-WebSocket-Version": "13",
    }
    for name, value in overrides.items():
        name = name.replace("_", "-")
        if value is None:
            fields.pop(name, None)
        else:
            fields[name] = value
    lines = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
    return f"GET {path} HTTP/1.1\r\n{lines}\r\n".encode()


def client_frame(opcode: int, payload: bytes, *, fin: bool = True, mask: bool = True) -> bytes:
    """One frame as a client sends it (masked unless told otherwise)."""
    first = (0x80 if fin else 0) | opcode
    length = len(payload)
    if length < 126:
        head = bytes([first, (0x80 if mask else 0) | length])
    elif length < 65536:
        head = bytes([first, (0x80 if mask else 0) | 126]) + struct.pack("!H", length)
    else:
        head = bytes([first, (0x80 if mask else 0) | 127]) + struct.pack("!Q", length)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def read_frame(conn) -> tuple[int, bytes]:
    """One unmasked server frame: (opcode, payload)."""
    first, payload = read_frame_bits(conn)
    return first & 0x0F, payload


def read_frame_bits(conn) -> tuple[int, bytes]:
    """One unmasked server frame: (its first byte: FIN, RSV bits, opcode; payload)."""
    first, second = conn.read_exact(2)
    assert second & 0x80 == 0, "server frames are never masked"
    length = second & 0x7F
    if length == 126:
        (length,) = struct.unpack("!H", conn.read_exact(2))
    elif length == 127:
        (length,) = struct.unpack("!Q", conn.read_exact(8))
    return first, conn.read_exact(length) if length else b""


def open_raw(connect, server, path: str = "/echo"):
    conn = connect(server)
    conn.send(upgrade_request(path))
    head = conn.read_head()
    assert head.status == 101, head
    return conn


def close_code(payload: bytes) -> int:
    return struct.unpack("!H", payload[:2])[0]


# --------------------------------------------------------------------------- messages


def test_text_and_binary_messages_are_echoed(server):
    with ws_connect(ws_url(server, "/echo"), open_timeout=IO_TIMEOUT) as ws:
        ws.send("hello")
        assert ws.recv(timeout=IO_TIMEOUT) == "hello"
        ws.send("grüße, 世界 🎉")
        assert ws.recv(timeout=IO_TIMEOUT) == "grüße, 世界 🎉"
        ws.send(b"\x00\x01binary\xff")
        assert ws.recv(timeout=IO_TIMEOUT) == b"\x00\x01binary\xff"
        ws.send(b"")
        assert ws.recv(timeout=IO_TIMEOUT) == b""


def test_large_and_fragmented_messages_arrive_whole(server):
    big = os.urandom(4 * 1024 * 1024)
    with ws_connect(ws_url(server, "/echo"), max_size=None, open_timeout=IO_TIMEOUT) as ws:
        ws.send(big)
        assert ws.recv(timeout=IO_TIMEOUT) == big
        # A message sent as several frames (continuations), a multibyte character split
        # across two of them.
        ws.send(iter(["frag", "ment", "ed é"[:3], "ed é"[3:]]))
        assert ws.recv(timeout=IO_TIMEOUT) == "fragmented é"
        ws.send(iter([b"a" * 70000, b"b" * 10]))
        assert ws.recv(timeout=IO_TIMEOUT) == b"a" * 70000 + b"b" * 10


def test_client_ping_is_answered_with_its_payload(server):
    with ws_connect(ws_url(server, "/echo"), open_timeout=IO_TIMEOUT) as ws:
        pong = ws.ping(b"are you there")
        assert pong.wait(IO_TIMEOUT)
        ws.send("still echoing")
        assert ws.recv(timeout=IO_TIMEOUT) == "still echoing"


def test_control_frames_between_fragments_and_pong_echo_raw(server, connect):
    conn = open_raw(connect, server)
    conn.send(client_frame(0x1, b"ab", fin=False))
    conn.send(client_frame(0x9, b"p1"))
    conn.send(client_frame(0x0, b"cd"))
    assert read_frame(conn) == (0xA, b"p1")
    assert read_frame(conn) == (0x1, b"abcd")
    conn.send(client_frame(0x8, struct.pack("!H", 1000)))
    opcode, payload = read_frame(conn)
    assert opcode == 0x8
    assert close_code(payload) == 1000
    assert conn.read_until_close() == b""


def test_many_large_messages_to_a_slow_reader_arrive_intact(server):
    count = 200  # 12.5 MiB: the server's send() has to wait for the socket to drain
    with ws_connect(ws_url(server, "/bulk"), max_size=None, open_timeout=IO_TIMEOUT) as ws:
        ws.send(str(count))
        for index in range(count):
            message = ws.recv(timeout=IO_TIMEOUT)
            assert message == bytes([index % 256]) * 65536, index
        assert ws.recv(timeout=IO_TIMEOUT) == "done"


def test_many_messages_sent_before_reading_any_reply_are_all_echoed_in_order(server):
    # Far more than --ws-max-queue (32): reading pauses and resumes many times.
    count = 3000
    with ws_connect(ws_url(server, "/echo"), open_timeout=IO_TIMEOUT) as ws:
        for index in range(count):
            ws.send(f"message {index} " + "x" * (index % 700))
        for index in range(count):
            assert ws.recv(timeout=IO_TIMEOUT) == f"message {index} " + "x" * (index % 700)


@pytest.mark.ferroloop_only(reason="uvicorn (h11) never echoes frames sent with the request")
def test_frames_sent_right_behind_the_upgrade_request_are_read_after_accept(server, connect):
    conn = connect(server)
    frames = b"".join(client_frame(0x1, b"early %d" % i) for i in range(3))
    conn.send(upgrade_request("/echo") + frames)
    assert conn.read_head().status == 101
    for i in range(3):
        assert read_frame(conn) == (0x1, b"early %d" % i)


# --------------------------------------------------------------------------- the handshake


def test_scope_of_a_websocket(server):
    url = ws_url(server, "/scope?x=1&y=%20")
    with ws_connect(url, subprotocols=["chat", "super"], open_timeout=IO_TIMEOUT) as ws:
        assert ws.subprotocol == "chat"
        scope = json.loads(ws.recv(timeout=IO_TIMEOUT))
    assert scope["type"] == "websocket"
    assert scope["scheme"] == "ws"
    assert scope["http_version"] == "1.1"
    assert scope["asgi"]["version"] == "3.0"
    assert scope["path"] == "/scope"
    assert scope["raw_path"] == "/scope"
    assert scope["query_string"] == "x=1&y=%20"
    assert scope["root_path"] == ""
    assert scope["subprotocols"] == ["chat", "super"]
    assert scope["server"] == ["127.0.0.1", server.port]
    assert scope["client"][0] == "127.0.0.1"
    assert "method" not in scope
    assert "websocket.http.response" in scope["extensions"]
    names = [name.lower() for name, _ in scope["headers"]]
    assert "sec-websocket-key" in names and "upgrade" in names


def test_forwarded_proto_makes_a_wss_scope_behind_a_trusted_proxy(server):
    headers = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "10.1.2.3"}
    url = ws_url(server, "/scope")
    with ws_connect(url, additional_headers=headers, open_timeout=IO_TIMEOUT) as ws:
        scope = json.loads(ws.recv(timeout=IO_TIMEOUT))
    assert scope["scheme"] == "wss"
    assert scope["client"][0] == "10.1.2.3"


def test_handshake_outcomes_are_logged_as_uvicorn_logs_them(server):
    with ws_connect(ws_url(server, "/headers?log=1"), open_timeout=IO_TIMEOUT) as ws:
        ws.send("x")
        ws.recv(timeout=IO_TIMEOUT)
    for path in ("/reject?log=2", "/deny?log=3"):
        with pytest.raises(InvalidStatus):
            ws_connect(ws_url(server, path), open_timeout=IO_TIMEOUT)
    server.wait_for_output('"WebSocket /headers?log=1" [accepted]')
    server.wait_for_output('"WebSocket /reject?log=2" 403')
    output = server.wait_for_output('"WebSocket /deny?log=3" 401')
    assert "127.0.0.1:" in output.split('"WebSocket /headers?log=1"')[0].splitlines()[-1]


def test_accept_headers_and_no_subprotocol(server):
    with ws_connect(ws_url(server, "/headers"), open_timeout=IO_TIMEOUT) as ws:
        assert ws.response.headers["x-ws"] == "yes"
        assert ws.subprotocol is None
        ws.send("x")
        assert ws.recv(timeout=IO_TIMEOUT) == "x"


def test_accept_key_is_rfc6455s(server, connect):
    conn = connect(server)
    conn.send(upgrade_request("/echo", Sec_WebSocket_Key="dGhlIHNhbXBsZSBub25jZQ=="))
    head = conn.read_head()
    assert head.status == 101
    assert head.header("sec-websocket-accept") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    assert head.header("upgrade").lower() == "websocket"
    assert "upgrade" in head.header("connection").lower()


def test_close_before_accept_is_a_403(server):
    with pytest.raises(InvalidStatus) as info:
        ws_connect(ws_url(server, "/reject"), open_timeout=IO_TIMEOUT)
    assert info.value.response.status_code == 403


def test_http_response_denial(server):
    with pytest.raises(InvalidStatus) as info:
        ws_connect(ws_url(server, "/deny"), open_timeout=IO_TIMEOUT)
    response = info.value.response
    assert response.status_code == 401
    assert response.headers["x-denied"] == "1"
    assert response.body == b"go away"


@pytest.mark.parametrize("path", ["/noaccept", "/raise-before"])
def test_app_ending_before_the_handshake_is_a_500(server, path):
    with pytest.raises(InvalidStatus) as info:
        ws_connect(ws_url(server, path), open_timeout=IO_TIMEOUT)
    assert info.value.response.status_code == 500


def test_upgrade_without_key_is_a_400(server, connect):
    conn = connect(server)
    conn.send(upgrade_request("/echo", Sec_WebSocket_Key=None))
    response = conn.read_response()
    assert response.status == 400
    assert b"Sec-WebSocket-Key" in response.body


@pytest.mark.parametrize("key", ["short", base64.b64encode(b"x" * 15).decode(), "!" * 24])
def test_upgrade_with_a_malformed_key_is_a_400(server, connect, key):
    conn = connect(server)
    conn.send(upgrade_request("/echo", Sec_WebSocket_Key=key))
    assert conn.read_response().status == 400


@pytest.mark.ferroloop_only(reason="uvicorn answers 400 (RFC 6455 §4.4 asks for 426 naming 13)")
def test_upgrade_in_another_version_is_a_426_naming_13(server, connect):
    conn = connect(server)
    conn.send(upgrade_request("/echo", Sec_WebSocket_Version="8"))
    response = conn.read_response()
    assert response.status == 426
    assert response.header("sec-websocket-version") == "13"


@pytest.mark.ferroloop_only(reason="uvicorn answers 405 (RFC 9110 §7.8: Upgrade may be ignored)")
def test_upgrade_that_is_not_get_is_plain_http(server, connect):
    conn = connect(server)
    request = upgrade_request("/plain").replace(b"GET ", b"POST ", 1)
    conn.send(request.replace(b"\r\n\r\n", b"\r\nContent-Length: 0\r\n\r\n"))
    response = conn.read_response("POST")
    assert response.status == 200
    assert json.loads(response.body)["type"] == "http"


def test_ws_none_serves_upgrades_as_http(spawn_server, connect):
    server = spawn_server(APP, "--ws", "none")
    conn = connect(server)
    conn.send(upgrade_request("/plain"))
    response = conn.read_response()
    assert response.status == 200
    assert json.loads(response.body) == {"type": "http", "upgrade": "websocket"}


# --------------------------------------------------------------------------- closing


def test_app_close_code_and_reason_reach_the_client(server, wait_until):
    with (
        ws_connect(ws_url(server, "/close-code"), open_timeout=IO_TIMEOUT) as ws,
        pytest.raises(ConnectionClosed) as info,
    ):
        ws.recv(timeout=IO_TIMEOUT)
    assert info.value.rcvd.code == 4001
    assert info.value.rcvd.reason == "bye"
    after = wait_record(server, wait_until, "after_close")["after_close"]
    assert after["type"] == "websocket.disconnect"
    assert after["code"] == 4001


def test_client_close_code_and_reason_reach_the_app(server, wait_until):
    with ws_connect(ws_url(server, "/wait"), open_timeout=IO_TIMEOUT) as ws:
        ws.close(4002, "done here")
        assert ws.protocol.close_rcvd is not None and ws.protocol.close_rcvd.code == 4002
    disconnect = wait_record(server, wait_until, "disconnect")["disconnect"]
    assert disconnect["type"] == "websocket.disconnect"
    assert disconnect["code"] == 4002
    assert disconnect["reason"] == "done here"


def test_close_frame_without_code_is_1005_for_the_app(server, connect, wait_until):
    conn = open_raw(connect, server, "/wait")
    conn.send(client_frame(0x8, b""))
    opcode, payload = read_frame(conn)
    assert (opcode, payload) == (0x8, b"")
    disconnect = wait_record(server, wait_until, "disconnect")["disconnect"]
    assert disconnect["code"] == 1005


@pytest.mark.ferroloop_only(reason="uvicorn reports 1005; RFC 6455 §7.1.5 says 1006")
def test_connection_dropped_without_close_is_1006_for_the_app(server, connect, wait_until):
    conn = open_raw(connect, server, "/wait")
    conn.close()
    disconnect = wait_record(server, wait_until, "disconnect")["disconnect"]
    assert disconnect["code"] == 1006


def test_send_after_the_client_left_raises_an_oserror(server, wait_until):
    with ws_connect(ws_url(server, "/send-after-close"), open_timeout=IO_TIMEOUT) as ws:
        ws.close()
    record = wait_record(server, wait_until, "error")
    assert record["error"] == "ClientDisconnected"
    assert record["is_oserror"] is True


@pytest.mark.ferroloop_only(reason="uvicorn drops the TCP connection without a close frame")
@pytest.mark.parametrize(("path", "code"), [("/return-after", 1000), ("/raise-after", 1011)])
def test_app_ending_after_accept_sends_a_close_frame(server, path, code):
    with (
        ws_connect(ws_url(server, path), open_timeout=IO_TIMEOUT) as ws,
        pytest.raises(ConnectionClosed) as info,
    ):
        ws.recv(timeout=IO_TIMEOUT)
    assert info.value.rcvd is not None and info.value.rcvd.code == code
    if code == 1011:
        server.wait_for_output("raised after accepting")


# --------------------------------------------------------------------------- protocol errors


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (client_frame(0x1, b"unmasked", mask=False), 1002),
        (client_frame(0x3, b"reserved opcode"), 1002),
        (client_frame(0x0, b"continuation of nothing"), 1002),
        (client_frame(0x9, b"x" * 126), 1002),
        (client_frame(0x1, b"\xff\xfe not utf-8"), 1007),
    ],
    ids=["unmasked", "reserved-opcode", "lone-continuation", "long-ping", "bad-utf8"],
)
def test_protocol_errors_close_with_their_code(server, connect, frame, code, wait_until):
    conn = open_raw(connect, server, "/wait")
    conn.send(frame)
    opcode, payload = read_frame(conn)
    assert opcode == 0x8
    assert close_code(payload) == code
    assert conn.read_until_close() == b""
    disconnect = wait_record(server, wait_until, "disconnect")["disconnect"]
    assert disconnect["code"] == code


def test_message_over_ws_max_size_closes_with_1009(spawn_server):
    server = spawn_server(APP, "--ws-max-size", "1024")
    with ws_connect(ws_url(server, "/echo"), open_timeout=IO_TIMEOUT) as ws:
        ws.send(b"x" * 1024)
        assert ws.recv(timeout=IO_TIMEOUT) == b"x" * 1024
        ws.send(b"x" * 1025)
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=IO_TIMEOUT)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1009


# --------------------------------------------------------------------------- keepalive, shutdown


def test_keepalive_pings_and_a_missing_pong_closes_with_1011(spawn_server, connect):
    server = spawn_server(
        APP, "--ws-ping-interval", "0.2", "--ws-ping-timeout", "0.2", "--timeout-keep-alive", "1"
    )
    conn = open_raw(connect, server, "/wait")
    opcode, ping = read_frame(conn)
    assert opcode == 0x9
    # Answered: the connection stays open and another ping comes.
    conn.send(client_frame(0xA, ping))
    opcode, _ = read_frame(conn)
    assert opcode == 0x9
    # Not answered: the server gives up with 1011.
    opcode, payload = read_frame(conn)
    while opcode == 0x9:
        opcode, payload = read_frame(conn)
    assert opcode == 0x8
    assert close_code(payload) == 1011


def test_shutdown_closes_open_websockets_with_1012(spawn_server):
    server = spawn_server(APP)
    with ws_connect(ws_url(server, "/echo"), open_timeout=IO_TIMEOUT) as ws:
        ws.send("before")
        assert ws.recv(timeout=IO_TIMEOUT) == "before"
        server.proc.send_signal(signal.SIGTERM)
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=IO_TIMEOUT)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1012
    server.assert_exits_cleanly()


# --------------------------------------------------------------------------- permessage-deflate

TAIL = b"\x00\x00\xff\xff"


def deflate(data: bytes, compressor=None) -> bytes:
    """A message's payload as a permessage-deflate client sends it (RFC 7692 §7.2.1)."""
    compressor = compressor or zlib.compressobj(wbits=-15)
    payload = compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)
    assert payload.endswith(TAIL)
    return payload[: -len(TAIL)]


def compressed_frame(opcode: int, payload: bytes) -> bytes:
    """A client frame with RSV1 set (its payload already compressed)."""
    frame = bytearray(client_frame(opcode, payload))
    frame[0] |= 0x40
    return bytes(frame)


def open_deflate(connect, server, offer: str, path: str = "/echo"):
    """A raw WebSocket that offered ``offer``; returns it and the answer's extensions header."""
    conn = connect(server)
    conn.send(upgrade_request(path, Sec_WebSocket_Extensions=offer))
    head = conn.read_head()
    assert head.status == 101, head
    return conn, head.header("sec-websocket-extensions")


def test_permessage_deflate_is_negotiated_with_the_websockets_client(server):
    text = "compressible " * 20000
    blob = os.urandom(100_000)
    with ws_connect(ws_url(server, "/echo"), max_size=None, open_timeout=IO_TIMEOUT) as ws:
        answer = ws.response.headers.get("Sec-WebSocket-Extensions", "")
        assert answer.startswith("permessage-deflate"), answer
        assert [type(e).__name__ for e in ws.protocol.extensions] == ["PerMessageDeflate"]
        for message in (text, blob, "", b"", "grüße 🎉", text):
            ws.send(message)
            assert ws.recv(timeout=IO_TIMEOUT) == message


def test_no_compression_for_a_client_that_does_not_offer_it(server):
    with ws_connect(ws_url(server, "/echo"), compression=None, open_timeout=IO_TIMEOUT) as ws:
        assert "Sec-WebSocket-Extensions" not in ws.response.headers
        ws.send("plain " * 1000)
        assert ws.recv(timeout=IO_TIMEOUT) == "plain " * 1000


def test_ws_per_message_deflate_false_turns_compression_off(spawn_server):
    server = spawn_server(APP, "--ws-per-message-deflate", "false")
    with ws_connect(ws_url(server, "/echo"), open_timeout=IO_TIMEOUT) as ws:
        assert "Sec-WebSocket-Extensions" not in ws.response.headers
        ws.send("x" * 5000)
        assert ws.recv(timeout=IO_TIMEOUT) == "x" * 5000


@pytest.mark.ferroloop_only(reason="uvicorn answers the parameter as it keeps its own defaults")
def test_compressed_frames_both_ways_with_context_takeover_raw(server, connect):
    conn, answer = open_deflate(connect, server, "permessage-deflate; client_max_window_bits")
    assert answer == "permessage-deflate"
    client = zlib.compressobj(wbits=-15)
    reader = zlib.decompressobj(wbits=-15)
    sizes = []
    for index in range(3):
        message = b"the same words again and again %d " % index * 50
        conn.send(compressed_frame(0x2, deflate(message, client)))
        first, payload = read_frame_bits(conn)
        assert first == 0x80 | 0x40 | 0x2, "FIN, RSV1 (compressed), binary"
        assert reader.decompress(payload + TAIL) == message
        sizes.append(len(payload))
    # The server keeps its context: later messages refer back to earlier ones.
    assert sizes[1] < sizes[0]
    # An uncompressed message on a compressed connection is fine too (RFC 7692 §6).
    conn.send(client_frame(0x1, "plain é".encode()))
    first, payload = read_frame_bits(conn)
    assert first & 0x0F == 0x1
    text = reader.decompress(payload + TAIL) if first & 0x40 else payload
    assert text == "plain é".encode()


@pytest.mark.ferroloop_only(reason="checks the exact negotiated parameters ferroloop answers")
def test_server_no_context_takeover_makes_every_message_standalone_raw(server, connect):
    offer = "x-unknown-extension, permessage-deflate; server_no_context_takeover"
    conn, answer = open_deflate(connect, server, offer)
    assert answer == "permessage-deflate; server_no_context_takeover"
    message = b"standalone message " * 40
    payloads = []
    for _ in range(2):
        conn.send(compressed_frame(0x2, deflate(message)))
        first, payload = read_frame_bits(conn)
        assert first & 0x40
        # A fresh inflater for each message: no back-reference to an earlier one.
        assert zlib.decompressobj(wbits=-15).decompress(payload + TAIL) == message
        payloads.append(payload)
    assert payloads[0] == payloads[1]


@pytest.mark.ferroloop_only(reason="checks the exact negotiated parameters ferroloop answers")
def test_an_offer_with_an_unknown_parameter_is_declined_raw(server, connect):
    conn, answer = open_deflate(connect, server, "permessage-deflate; colour=blue")
    assert answer is None
    conn.send(client_frame(0x1, b"uncompressed"))
    assert read_frame_bits(conn) == (0x81, b"uncompressed")


@pytest.mark.parametrize(
    ("offer", "frame", "code"),
    [
        (None, compressed_frame(0x1, deflate(b"not negotiated")), 1002),
        ("permessage-deflate", compressed_frame(0x1, b"\xff\xff\xff not deflate"), 1002),
        ("permessage-deflate", compressed_frame(0x1, deflate(b"\xff\xfe not utf-8")), 1007),
        (
            "permessage-deflate",
            client_frame(0x1, b"a", fin=False) + compressed_frame(0x0, deflate(b"b")),
            1002,
        ),
    ],
    ids=["rsv1-without-deflate", "corrupt-deflate", "bad-utf8-inside", "rsv1-on-continuation"],
)
def test_compression_errors_close_with_their_code(server, connect, offer, frame, code):
    if offer is None:
        conn = open_raw(connect, server, "/wait")
    else:
        conn, answer = open_deflate(connect, server, offer, "/wait")
        assert answer is not None
    conn.send(frame)
    opcode, payload = read_frame(conn)
    assert opcode == 0x8
    assert close_code(payload) == code
    assert conn.read_until_close() == b""


def test_decompression_bomb_closes_with_1009_without_inflating_it(spawn_server, connect):
    server = spawn_server(APP, "--ws-max-size", "65536")
    conn, answer = open_deflate(connect, server, "permessage-deflate", "/wait")
    assert answer is not None
    bomb = deflate(bytes(32 * 1024 * 1024))  # 32 MiB of zeros: about 32 KiB compressed
    assert len(bomb) < 65536
    conn.send(compressed_frame(0x2, bomb))
    opcode, payload = read_frame(conn)
    assert opcode == 0x8
    assert close_code(payload) == 1009
    assert conn.read_until_close() == b""


# --------------------------------------------------------------------------- frameworks


def test_fastapi_websocket_endpoint(serve):
    server = serve("fastapi_app:app")
    with ws_connect(ws_url(server, "/ws/items?prefix=got"), open_timeout=IO_TIMEOUT) as ws:
        ws.send(json.dumps({"name": "widget"}))
        assert json.loads(ws.recv(timeout=IO_TIMEOUT)) == {"got": "widget"}
        ws.send(json.dumps({"name": "gadget"}))
        assert json.loads(ws.recv(timeout=IO_TIMEOUT)) == {"got": "gadget"}


def test_starlette_websocket_endpoint(serve):
    server = serve("starlette_app:app")
    with ws_connect(ws_url(server, "/ws"), open_timeout=IO_TIMEOUT) as ws:
        ws.send("ping")
        assert ws.recv(timeout=IO_TIMEOUT) == "pong: ping"
        ws.send(b"\x01\x02")
        assert ws.recv(timeout=IO_TIMEOUT) == b"\x02\x01"
