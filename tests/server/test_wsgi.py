"""WSGI (PEP 3333) through ``--interface wsgi``: the environ, wsgi.input, response framing,
errors, close(), the thread pool, keep-alive and pipelining, and a Flask app.

Under the uvicorn oracle the same apps run through uvicorn's own WSGI middleware. It differs
from PEP 3333 in places (no write callable, close() never called, the head sent at the first
start_response, SERVER_PORT an int); the tests of those places are ferroloop_only.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import select
import signal
import uuid
from pathlib import Path

import httpx
import pytest

APPS_DIR = Path(__file__).resolve().parent / "apps"
WSGI = ("wsgi_app:app", "--interface", "wsgi")
# Long enough that a request on another connection is answered well within it on loopback;
# the tests check the order of events, never the duration.
SLEEP_SECONDS = "3"

ferroloop_only = pytest.mark.ferroloop_only


@pytest.fixture(scope="module")
def server(serve):
    return serve(*WSGI)


@pytest.fixture(scope="module")
def root_path_server(serve):
    return serve(*WSGI, "--root-path", "/api")


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"


def send_body(connection, target: str, body: bytes, framing: str):
    """POST ``body`` framed by Content-Length or (in three chunks) Transfer-Encoding."""
    if framing == "chunked":
        third = len(body) // 3
        parts = [body[:third], body[third : 2 * third], body[2 * third :]]
        return connection.request(
            "POST",
            target,
            headers=[("Transfer-Encoding", "chunked")],
            body=chunked(*[part for part in parts if part]),
        )
    return connection.request(
        "POST", target, headers=[("Content-Length", str(len(body)))], body=body
    )


def environ_of(connection, target="/environ", method="GET", headers=None, body=b""):
    response = connection.request(method, target, headers=headers, body=body)
    assert response.status == 200, response
    return json.loads(response.body)


# --------------------------------------------------------------------------- the environ


def test_hello_world(server, connect):
    response = connect(server).request("GET", "/")
    assert response.status == 200
    assert response.header("content-type") == "text/plain"
    assert response.body == b"Hello, world!"


def test_environ_basics(server, connect):
    connection = connect(server)
    environ = environ_of(
        connection,
        "/environ?a=1&b=%20x",
        method="POST",
        headers=[("Content-Type", "text/plain; charset=utf-8")],
        body=b"hello",
    )
    assert environ["REQUEST_METHOD"] == "POST"
    assert environ["SCRIPT_NAME"] == ""
    assert environ["PATH_INFO"] == "/environ"
    assert environ["QUERY_STRING"] == "a=1&b=%20x"  # raw: not percent-decoded
    assert environ["SERVER_NAME"] == "127.0.0.1"
    assert str(environ["SERVER_PORT"]) == str(server.port)
    assert environ["SERVER_PROTOCOL"] == "HTTP/1.1"
    assert environ["REMOTE_ADDR"] == "127.0.0.1"
    assert environ["HTTP_HOST"] == "test"
    # Content-Type and Content-Length have keys of their own, without the HTTP_ prefix.
    assert environ["CONTENT_TYPE"] == "text/plain; charset=utf-8"
    assert environ["CONTENT_LENGTH"] == "5"
    assert "HTTP_CONTENT_TYPE" not in environ
    assert "HTTP_CONTENT_LENGTH" not in environ
    assert environ["wsgi.version"] == [1, 0]
    assert environ["wsgi.url_scheme"] == "http"
    assert environ["wsgi.multithread"] is True
    assert environ["wsgi.run_once"] is False
    # The app never read the body: the server must have drained it, or this request would be
    # parsed from its bytes.
    assert connection.request("GET", "/").body == b"Hello, world!"


def test_server_protocol_of_an_http_1_0_request(server, connect, request_bytes):
    connection = connect(server)
    connection.send(request_bytes("GET", "/environ", version="HTTP/1.0"))
    response = connection.read_response()
    assert response.status == 200
    assert json.loads(response.body)["SERVER_PROTOCOL"] == "HTTP/1.0"


@ferroloop_only(
    reason="uvicorn's WSGI middleware makes SERVER_PORT an int and sets no REMOTE_PORT; "
    "PEP 3333 wants native strings"
)
def test_server_and_remote_ports_are_strings(server, connect):
    connection = connect(server)
    environ = environ_of(connection)
    assert environ["SERVER_PORT"] == str(server.port)
    assert environ["REMOTE_PORT"] == str(connection.sock.getsockname()[1])


@ferroloop_only(reason="uvicorn's WSGI middleware does not set wsgi.input_terminated")
def test_wsgi_input_terminated_is_true(server, connect):
    assert environ_of(connect(server))["wsgi.input_terminated"] is True


def test_root_path_is_script_name_and_not_in_path_info(root_path_server, connect):
    environ = environ_of(connect(root_path_server), "/environ?x=1")
    assert environ["SCRIPT_NAME"] == "/api"
    assert environ["PATH_INFO"] == "/environ"
    assert environ["QUERY_STRING"] == "x=1"


@pytest.mark.parametrize(
    ("target", "path_info"),
    [
        # UTF-8 bytes of "café", each byte one character: PEP 3333's "bytes as unicode".
        ("/unicode-path/caf%C3%A9", b"/unicode-path/caf\xc3\xa9"),
        ("/unicode-path/a%20b", b"/unicode-path/a b"),
    ],
)
def test_path_info_is_percent_decoded_as_latin_1(server, connect, target, path_info):
    response = connect(server).request("GET", target)
    assert response.status == 200
    assert response.body == path_info


def test_repeated_headers_are_joined_with_commas(server, connect):
    headers = json.loads(
        connect(server)
        .request(
            "GET",
            "/headers",
            headers=[("X-Multi", "a"), ("X-Custom-Thing", "1"), ("X-Multi", "b")],
        )
        .body
    )
    assert headers["HTTP_X_MULTI"] == "a,b"
    assert headers["HTTP_X_CUSTOM_THING"] == "1"


@ferroloop_only(
    reason="h11 accepts '_' in field names and uvicorn maps X_Forwarded_For onto "
    "HTTP_X_FORWARDED_FOR; ferroloop drops such fields, as gunicorn and nginx do"
)
def test_header_names_with_underscores_cannot_spoof_dashed_ones(server, connect):
    connection = connect(server)
    spoofed = json.loads(
        connection.request(
            "GET",
            "/headers",
            headers=[("X-Forwarded-For", "10.0.0.1"), ("X_Forwarded_For", "spoof")],
        ).body
    )
    assert spoofed["HTTP_X_FORWARDED_FOR"] == "10.0.0.1"
    alone = json.loads(
        connection.request("GET", "/headers", headers=[("X_Forwarded_For", "spoof")]).body
    )
    assert "HTTP_X_FORWARDED_FOR" not in alone


@pytest.mark.parametrize("trusted", [True, False], ids=["proxy-headers", "no-proxy-headers"])
def test_proxy_headers_of_a_trusted_peer_set_remote_addr_and_scheme(serve, connect, trusted):
    options = ("--forwarded-allow-ips", "127.0.0.1") if trusted else ("--no-proxy-headers",)
    server = serve(*WSGI, *options)
    environ = environ_of(
        connect(server),
        headers=[("X-Forwarded-For", "203.0.113.7, 10.0.0.1"), ("X-Forwarded-Proto", "https")],
    )
    if trusted:
        # The client is the rightmost address not trusted (10.0.0.1 is not in the list).
        assert environ["REMOTE_ADDR"] == "10.0.0.1"
        assert environ["wsgi.url_scheme"] == "https"
    else:
        assert environ["REMOTE_ADDR"] == "127.0.0.1"
        assert environ["wsgi.url_scheme"] == "http"


@ferroloop_only(
    reason="uvicorn's WSGI middleware sets SERVER_PORT to None for a Unix socket; "
    "PEP 3333 wants a str"
)
def test_environ_of_a_unix_socket_peer_has_no_remote_address(spawn_server, connect, tmp_path):
    path = str(tmp_path / "server.sock")
    environ = environ_of(connect(spawn_server(*WSGI, "--uds", path)))
    assert "REMOTE_ADDR" not in environ
    assert "REMOTE_PORT" not in environ
    assert environ["SERVER_NAME"] == path
    assert environ["SERVER_PORT"] == "0"


# --------------------------------------------------------------------------- wsgi.input


@pytest.mark.parametrize("size", [1, 1000, 1 << 20])
def test_content_length_body_is_echoed(server, connect, size):
    body = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    connection = connect(server)
    response = send_body(connection, "/echo", body, "content-length")
    assert response.status == 200
    assert response.header("content-length") == str(size)
    assert response.body == body
    assert connection.request("GET", "/").body == b"Hello, world!"


def test_chunked_request_body_is_echoed(server, connect):
    parts = [b"hello", b", ", b"chunked " * 10_000, b"world"]
    connection = connect(server)
    response = connection.request(
        "POST", "/echo", headers=[("Transfer-Encoding", "chunked")], body=chunked(*parts)
    )
    assert response.status == 200
    assert response.body == b"".join(parts)
    assert connection.request("GET", "/").body == b"Hello, world!"


def test_get_without_body_reads_empty_bytes(server, connect):
    response = connect(server).request("GET", "/echo")
    assert response.status == 200
    assert response.header("content-length") == "0"
    assert response.body == b""


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
@pytest.mark.parametrize("n", [1, 7, 65536])
def test_read_n_in_a_loop_returns_the_whole_body(server, connect, n, framing):
    body = bytes(range(256)) * 80  # 20 KiB
    response = send_body(connect(server), f"/echo-read-n?n={n}", body, framing)
    assert response.status == 200
    assert response.body == body


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
@pytest.mark.parametrize("route", ["/lines", "/lines-iter", "/readlines"])
def test_lines_of_the_body(server, connect, route, framing):
    long_line = "x" * 100_000 + "\n"  # longer than any buffer a reader would use
    lines = ["first\n", "second\r\n", "\n", long_line, "caf\xe9\n", "last without newline"]
    body = "".join(lines).encode("latin-1")
    response = send_body(connect(server), route, body, framing)
    assert response.status == 200
    assert json.loads(response.body) == lines


# --------------------------------------------------------------------------- responses


def test_generator_response_is_chunked(server, connect):
    connection = connect(server)
    response = connection.request("GET", "/stream?n=5")
    assert response.status == 200
    assert response.framing == "chunked"
    assert response.header("content-length") is None
    assert response.body == b"".join(b"chunk %d\n" % index for index in range(5))
    assert connection.request("GET", "/").body == b"Hello, world!"


def test_generator_response_through_http_client(server):
    client = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        client.request("GET", "/stream?n=200")
        response = client.getresponse()
        assert response.status == 200
        assert response.read() == b"".join(b"chunk %d\n" % index for index in range(200))
        client.request("GET", "/")
        assert client.getresponse().read() == b"Hello, world!"
    finally:
        client.close()


@ferroloop_only(reason="uvicorn's WSGI middleware's start_response returns None, not write")
def test_write_callable_output_comes_before_the_returned_body(server, connect):
    response = connect(server).request("GET", "/write")
    assert response.status == 200
    assert response.body == b"written-returned"


@ferroloop_only(
    reason="uvicorn does not add Content-Length to a WSGI response; h11 chunks it instead"
)
def test_list_response_without_length_gets_content_length(server, connect):
    connection = connect(server)
    response = connection.request("GET", "/no-cl")
    assert response.status == 200
    assert response.framing == "content-length"
    assert response.header("content-length") == "13"
    assert response.body == b"Hello, world!"
    assert connection.request("GET", "/").body == b"Hello, world!"


def test_app_set_transfer_encoding_gets_no_content_length(server, connect):
    connection = connect(server)
    response = connection.request("GET", "/te-chunked")
    assert response.status == 200
    assert response.header("content-length") is None
    assert response.framing == "chunked"
    assert response.body == b"Hello, world!"
    assert connection.request("GET", "/").body == b"Hello, world!"


@pytest.mark.parametrize("code", [204, 304])
def test_bodiless_status_has_no_body_and_no_length(server, connect, request_bytes, code):
    connection = connect(server)
    # A GET pipelined behind: stray body or framing bytes would break its response.
    connection.send(request_bytes("GET", f"/status?code={code}") + request_bytes("GET", "/"))
    response = connection.read_response()
    assert response.status == code
    assert response.header("x-status") == str(code)
    assert response.header("content-length") is None
    assert response.header("transfer-encoding") is None
    after = connection.read_response()
    assert (after.status, after.body) == (200, b"Hello, world!")


@pytest.mark.parametrize("target", ["/", "/stream?n=3"])
def test_head_response_has_headers_but_no_body(server, connect, request_bytes, target):
    connection = connect(server)
    connection.send(request_bytes("HEAD", target) + request_bytes("GET", "/"))
    head = connection.read_response("HEAD")
    assert head.status == 200
    assert head.header("content-type") == "text/plain"
    if target == "/":
        assert head.header("content-length") == "13"
    get = connection.read_response()
    assert (get.status, get.body) == (200, b"Hello, world!")


# --------------------------------------------------------------------------- errors, close()


def test_exception_before_start_response_gives_500_and_a_logged_traceback(server, connect):
    key = uuid.uuid4().hex
    response = connect(server).request("GET", f"/error-before?key={key}")
    assert response.status == 500
    assert response.complete
    output = server.wait_for_output(f"deliberate failure before start_response {key}")
    assert "Traceback (most recent call last)" in output


@ferroloop_only(reason="uvicorn logs 'Exception in ASGI application' (its middleware is ASGI)")
def test_exception_is_logged_as_a_wsgi_application_error(spawn_server, connect):
    server = spawn_server(*WSGI)
    key = uuid.uuid4().hex
    assert connect(server).request("GET", f"/error-before?key={key}").status == 500
    output = server.wait_for_output(f"deliberate failure before start_response {key}")
    assert "Exception in WSGI application" in output


def test_exception_mid_stream_leaves_the_chunked_body_unterminated(server, connect):
    connection = connect(server)
    response = connection.request("GET", "/error-mid-stream")
    assert response.status == 200
    assert response.framing == "chunked"
    assert not response.complete, "the terminating zero-size chunk must not be sent"
    assert response.body == b"first chunk\n"
    assert connection.eof
    assert connect(server).request("GET", "/").body == b"Hello, world!"


@ferroloop_only(
    reason="uvicorn's WSGI middleware sends the head at the first start_response, so the 200 "
    "goes out and exc_info is only re-raised after the body"
)
def test_start_response_with_exc_info_replaces_unsent_headers(server, connect):
    response = connect(server).request("GET", "/exc-info")
    assert response.status == 500
    assert response.body == b"replaced by the error page"


@ferroloop_only(reason="uvicorn's WSGI middleware closes the connection without a response")
def test_invalid_response_header_gives_500_and_a_logged_error(server, connect):
    # start_response refuses a header the server could not write (here a NUL in the value):
    # the app's call raises before anything was sent, so the client gets a 500.
    key = uuid.uuid4().hex
    response = connect(server).request("GET", f"/bad-header?key={key}")
    assert (response.status, response.complete) == (500, True)
    assert response.body != b"never sent"
    output = server.wait_for_output(f"X-Bad-{key}")
    assert "Traceback (most recent call last)" in output


def test_missing_start_response_gives_500(server, connect):
    response = connect(server).request("GET", "/no-start-response")
    assert response.status == 500
    assert response.complete
    assert response.body != b"x"


@ferroloop_only(reason="uvicorn's WSGI middleware never calls close() on the app's iterable")
def test_close_is_called_on_the_response_iterable(server, connect, wait_until):
    connection = connect(server)
    before = int(connection.request("GET", "/close-count").body)
    response = connection.request("GET", "/close-tracking")
    assert response.body == b"tracked"

    def closed():
        return int(connection.request("GET", "/close-count").body) == before + 1

    wait_until(closed, "close() on the /close-tracking response")


def test_client_disconnect_mid_upload_does_not_break_the_server(server, connect, request_bytes):
    connection = connect(server)
    connection.send(request_bytes("POST", "/echo", [("Content-Length", "1000000")]) + b"a" * 1000)
    connection.close()
    assert server.proc.poll() is None
    assert connect(server).request("GET", "/").body == b"Hello, world!"


# --------------------------------------------------------------------------- threads


@pytest.mark.parametrize(
    "threads",
    [
        pytest.param((), id="default-threads"),
        pytest.param(
            ("--wsgi-threads", "4"),
            id="4-threads",
            marks=ferroloop_only(reason="uvicorn has no --wsgi-threads (its pool is 10)"),
        ),
    ],
)
def test_sleeping_request_does_not_block_another_connection(serve, connect, threads):
    server = serve(*WSGI, *threads)
    key = uuid.uuid4().hex
    sleeper = connect(server)
    sleeper.send(f"GET /sleep?s={SLEEP_SECONDS}&key={key} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    server.wait_for_output(f"sleep started {key}")
    assert connect(server).request("GET", "/").body == b"Hello, world!"
    readable, _, _ = select.select([sleeper.sock], [], [], 0)
    assert not readable, "the sleeping request was answered before the one behind it"
    assert sleeper.read_response().body == b"slept"


@pytest.mark.single_process(
    reason="--wsgi-threads bounds each worker's pool; five requests may spread over two workers"
)
@ferroloop_only(reason="uvicorn has no --wsgi-threads option")
def test_wsgi_threads_bounds_concurrent_app_calls(spawn_server, connect):
    server = spawn_server(*WSGI, "--wsgi-threads", "4")
    sleepers = []
    keys = [uuid.uuid4().hex for _ in range(4)]
    for key in keys:
        sleeper = connect(server)
        sleeper.send(f"GET /sleep?s=2&key={key} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
        sleepers.append(sleeper)
    for key in keys:
        server.wait_for_output(f"sleep started {key}")
    # All four threads are asleep: the fifth call can start only once one of them is done.
    probe = connect(server).request("GET", "/sleep?s=0&key=probe")
    assert probe.body == b"slept"
    output = server.stderr_text()
    probe_start = output.index("sleep started probe")
    finishes = [output.find(f"sleep finished {key}") for key in keys]
    assert any(0 <= finish < probe_start for finish in finishes), output
    for sleeper in sleepers:
        assert sleeper.read_response().body == b"slept"


# --------------------------------------------------------------------------- connections


def test_several_requests_on_one_keep_alive_connection(server, connect):
    connection = connect(server)
    for index in range(20):
        body = b"request %d" % index
        assert send_body(connection, "/echo", body, "content-length").body == body
        assert connection.request("GET", "/stream?n=2").body == b"chunk 0\nchunk 1\n"
        assert connection.request("GET", "/").body == b"Hello, world!"


def test_pipelined_requests_are_answered_in_order(server, connect, request_bytes):
    bodies = [b"one", b"two" * 1000, b"", b"four"]
    connection = connect(server)
    connection.send(
        b"".join(
            request_bytes("POST", "/echo", [("Content-Length", str(len(body)))], body)
            + request_bytes("GET", f"/stream?n={index}")
            for index, body in enumerate(bodies)
        )
    )
    for index, body in enumerate(bodies):
        echo = connection.read_response()
        assert (echo.status, echo.body) == (200, body)
        stream = connection.read_response()
        assert stream.body == b"".join(b"chunk %d\n" % i for i in range(index))


def test_expect_100_continue_is_answered_before_the_body_is_sent(server, connect, request_bytes):
    connection = connect(server)
    connection.send(
        request_bytes("POST", "/echo", [("Content-Length", "5"), ("Expect", "100-continue")])
    )
    interim = connection.read_response("POST")
    assert interim.status == 100
    connection.send(b"hello")
    final = connection.read_response("POST")
    assert (final.status, final.body) == (200, b"hello")


# --------------------------------------------------------------------------- Flask


@pytest.fixture(scope="module")
def flask_client(serve):
    server = serve("flask_app:app", "--interface", "wsgi")
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def test_flask_json_echo(flask_client):
    payload = {"b": [1, 2, 3], "a": {"nested": True}, "text": "caf\u00e9"}
    response = flask_client.post("/json", json=payload)
    assert response.status_code == 200
    assert response.json() == {"received": payload, "keys": ["a", "b", "text"]}


def test_flask_url_for_includes_the_root_path(serve):
    server = serve("flask_app:app", "--interface", "wsgi", "--root-path", "/api")
    response = httpx.get(f"{server.url}/urls", timeout=10)
    assert response.status_code == 200
    assert response.json() == {
        "json": "/api/json",
        "file": "/api/file",
        "script_root": "/api",
        "path": "/urls",
    }


# --------------------------------------------------------------------------- both frameworks

FRAMEWORK_APPS = {"flask": "flask_app:app", "django": "django_app:application"}


@pytest.fixture(scope="module", params=sorted(FRAMEWORK_APPS))
def framework(request, serve):
    """(name, httpx client) of the Flask app and of the Django app."""
    server = serve(FRAMEWORK_APPS[request.param], "--interface", "wsgi")
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield request.param, client


def test_framework_streaming_response(framework):
    # Flask's generator reads the request inside the stream (stream_with_context).
    _, client = framework
    with client.stream("GET", "/stream", params={"count": 30}) as response:
        assert response.status_code == 200
        assert response.headers["transfer-encoding"] == "chunked"
        body = b"".join(response.iter_bytes())
    assert body == b"".join(b"line %d of /stream\n" % index for index in range(30))


def test_framework_unknown_route_is_404(framework):
    _, client = framework
    assert client.get("/nowhere").status_code == 404


def test_framework_file_response(framework):
    # Flask's send_file and Django's FileResponse both go through wsgi.file_wrapper.
    name, client = framework
    response = client.get("/file")
    assert response.status_code == 200
    assert response.content == (APPS_DIR / f"{name}_app.py").read_bytes()
    assert response.headers["content-type"].startswith("text/x-python")


def test_the_readme_wsgi_example_serves(serve, connect):
    examples = APPS_DIR.parents[2] / "examples"
    server = serve("wsgi_demo:app", "--interface", "wsgi", "--app-dir", str(examples))
    connection = connect(server)
    assert connection.request("GET", "/").body == b"Hello from a WSGI app on ferroloop\n"
    echo = connection.request("POST", "/echo", headers=[("Content-Length", "5")], body=b"hello")
    assert echo.body == b"hello"


# --------------------------------------------------------------------------- flow and shutdown


@ferroloop_only(reason="uvicorn's WSGI middleware has no flow control: it queues the whole body")
@pytest.mark.single_process(
    reason="the app's count of produced blocks is per worker, and the probe's connection "
    "may be kept by another worker than the reader's"
)
def test_generator_is_held_back_while_the_client_does_not_read(serve, connect):
    """A client that stops reading stops the app: the pool thread waits for credit instead of
    queueing the whole response in memory."""
    server = serve(*WSGI, "--wsgi-threads", "2")
    blocks, size = 400, 65536  # 25 MiB
    reader = connect(server, rcvbuf=65536)
    reader.send(f"GET /big?blocks={blocks}&size={size} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    head = reader.read_head()
    assert head.status == 200
    probe = connect(server)
    # Wait until the app stops producing (the kernel's socket buffers are full), then check
    # it is far from done. Without flow control it would have produced all 400 blocks at once.
    previous = -1
    for _ in range(200):
        produced = int(probe.request("GET", "/produced").body)
        if produced == previous:
            break
        previous = produced
        select.select([], [], [], 0.1)
    assert produced * size < 16 * 1024 * 1024, produced
    # Reading resumes the app, and the whole body arrives.
    response = reader.read_body(head)
    assert response.complete
    assert response.body == b"b" * (blocks * size)
    assert int(probe.request("GET", "/produced").body) == blocks


def test_sigterm_lets_an_in_flight_wsgi_request_finish_then_exits(spawn_server, connect, tmp_path):
    server = spawn_server(*WSGI, "--timeout-graceful-shutdown", "30")
    release = tmp_path / "release"
    busy = connect(server)
    busy.send(f"GET /slow?release={release} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    assert busy.read_head().status == 200
    assert busy.read_line() is not None  # the first chunk's size line: the app is running
    server.proc.send_signal(signal.SIGTERM)
    # The in-flight request holds the process up until it completes.
    assert server.proc.poll() is None
    release.touch()
    rest = busy.read_until_close()
    assert b"finished\n" in rest
    assert rest.endswith(b"0\r\n\r\n"), rest
    server.assert_exits_cleanly()


# --------------------------------------------------------------------------- Django


@pytest.fixture(scope="module")
def django_client(serve):
    server = serve("django_app:application", "--interface", "wsgi")
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def test_django_json_echo(django_client):
    payload = {"items": [1, 2, 3], "text": "caf\u00e9"}
    response = django_client.post("/json", json=payload)
    assert response.status_code == 200
    assert response.json() == {"method": "POST", "received": payload}


def test_django_urlencoded_form(django_client):
    response = django_client.post("/form", data={"name": "ferro loop", "n": "3"})
    assert response.status_code == 200
    assert response.json() == {"fields": {"name": "ferro loop", "n": "3"}}


def test_django_multipart_upload(django_client):
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value
    response = django_client.post(
        "/upload", files={"file": ("blob.bin", data)}, data={"note": "hello"}
    )
    assert response.status_code == 200
    assert response.json() == {
        "name": "blob.bin",
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "note": "hello",
    }


@ferroloop_only(
    reason="Django's Set-Cookie values start with a space (cookie.output(header='')), which "
    "the oracle's h11 refuses as an illegal header value (uvicorn then drops the connection)"
)
def test_django_cookies_both_ways(django_client):
    response = django_client.get("/cookies", headers={"Cookie": "a=1; b=two"})
    assert response.status_code == 200
    assert response.json() == {"a": "1", "b": "two"}
    assert "served=yes" in response.headers["set-cookie"]


def test_django_request_and_reverse_under_a_root_path(serve):
    server = serve("django_app:application", "--interface", "wsgi", "--root-path", "/api")
    response = httpx.get(f"{server.url}/about", timeout=10)
    assert response.status_code == 200
    assert response.json() == {
        "remote_addr": "127.0.0.1",
        "scheme": "http",
        "host": f"127.0.0.1:{server.port}",
        "path": "/api/about",
        "path_info": "/about",
        "echo_url": "/api/json",
    }


# --------------------------------------------------------------------------- declared length


@pytest.mark.parametrize("parts", ["toolong", "0123,456789"], ids=["one-block", "second-block"])
def test_body_longer_than_its_content_length_closes_the_connection(server, connect, parts):
    connection = connect(server)
    connection.send(
        f"GET /declared?declare=4&parts={parts} HTTP/1.1\r\nHost: t\r\n\r\n"
        "GET / HTTP/1.1\r\nHost: t\r\n\r\n".encode()
    )
    head_and_rest = connection.read_until_close()
    # At most the declared 4 bytes, then the connection ends: no byte past the declared length
    # can be taken for the answer to the pipelined request.
    assert b"Hello, world!" not in head_and_rest
    assert len(head_and_rest.partition(b"\r\n\r\n")[2]) <= 4, head_and_rest


def test_body_shorter_than_its_content_length_closes_the_connection(server, connect):
    connection = connect(server)
    response = connection.request("GET", "/declared?declare=10&parts=short")
    assert response.status == 200
    assert not response.complete
    assert response.body == b"short"
    assert connection.eof


# --------------------------------------------------------------------------- wsgi.file_wrapper

APP_SOURCE = (APPS_DIR / "wsgi_app.py").read_bytes()


@pytest.mark.parametrize("offset", [0, 1000])
@pytest.mark.parametrize("declare", [False, True], ids=["no-length", "app-length"])
def test_file_wrapper_sends_the_rest_of_the_file(server, connect, offset, declare):
    query = f"/file-wrapper?offset={offset}" + ("&declare=1" if declare else "")
    connection = connect(server)
    closes = int(connection.request("GET", "/file-closes").body)
    response = connection.request("GET", query)
    assert response.status == 200
    assert response.body == APP_SOURCE[offset:]
    # PEP 3333: the wrapper's close() closes the file, however the body was sent.
    assert int(connection.request("GET", "/file-closes").body) == closes + 1


@ferroloop_only(reason="uvicorn chunk-frames a response whose app set no Content-Length")
def test_file_wrapper_response_has_the_files_length(server, connect):
    response = connect(server).request("GET", "/file-wrapper?offset=10")
    assert response.header("content-length") == str(len(APP_SOURCE) - 10)
    assert response.body == APP_SOURCE[10:]


def test_file_wrapper_of_an_in_memory_file_is_iterated(server, connect):
    response = connect(server).request("GET", "/file-wrapper?kind=bytesio&offset=5")
    assert response.status == 200
    assert response.body == APP_SOURCE[5:]


def test_file_wrapper_head_request_sends_no_body(server, connect):
    connection = connect(server)
    response = connection.request("HEAD", "/file-wrapper?declare=1")
    assert response.status == 200
    assert response.body == b""
    assert response.header("content-length") == str(len(APP_SOURCE))
    assert connection.request("GET", "/").body == b"Hello, world!"  # still in step
