"""Errors in the app: 500 if no response started (traceback in the log), else the connection
is closed so the client sees an incomplete response; an app that never responds gets a 500.
A body that disagrees with the content-length the app declared is an app error too: a longer
one would be read as the start of the next response, a shorter one would leave the client
waiting."""

from __future__ import annotations

import uuid

import pytest

# uvicorn marks the response started before h11 checks the head in http.response.start, so an
# invalid head there ends with the connection closed and no response, as ferroloop's did when
# it checked the head only when writing it, with the first body part.
UVICORN_CLOSES = "uvicorn closes the connection without a response (h11 checks the head late)"


@pytest.fixture(scope="module")
def server(serve):
    return serve("raw_asgi:app")


def test_exception_before_the_response_gives_500_and_a_logged_traceback(server, connect):
    key = uuid.uuid4().hex
    response = connect(server).request("GET", f"/raise-before-start?key={key}")
    assert response.status == 500
    assert response.complete
    output = server.wait_for_output(f"deliberate failure before the response started {key}")
    assert "Traceback (most recent call last)" in output
    assert "raise_before_start" in output  # the app's frame is in the traceback


def test_exception_after_the_response_started_closes_the_connection(server, connect):
    connection = connect(server)
    response = connection.request("GET", "/raise-after-start")
    assert response.status == 200
    assert not response.complete
    assert response.body == b"0123456789"
    assert connection.eof


def test_exception_mid_chunked_response_leaves_it_unterminated(server, connect):
    connection = connect(server)
    response = connection.request("GET", "/raise-after-start-chunked")
    assert response.status == 200
    assert response.framing == "chunked"
    assert not response.complete, "the terminating zero-size chunk must not be sent"
    assert response.body == b"0123456789"
    assert connection.eof


def test_app_returning_without_a_response_gives_500(server, connect):
    response = connect(server).request("GET", "/no-response")
    assert response.status == 500
    assert response.complete


def test_app_returning_mid_response_closes_the_connection(server, connect):
    connection = connect(server)
    response = connection.request("GET", "/incomplete-response")
    assert response.status == 200
    assert not response.complete
    assert connection.eof


@pytest.mark.ferroloop_only(reason="uvicorn logs the CancelledError as an app exception")
def test_cancelled_app_task_gives_500_without_a_logged_exception(server, connect):
    key = uuid.uuid4().hex
    response = connect(server).request("GET", f"/cancel-self?key={key}")
    assert (response.status, response.complete) == (500, True)
    # A later failure's log line shows that the output is flushed past this request.
    marker = uuid.uuid4().hex
    connect(server).request("GET", f"/raise-before-start?key={marker}")
    output = server.wait_for_output(f"deliberate failure before the response started {marker}")
    assert key[::-1] not in output  # no traceback of the CancelledError


def test_server_keeps_serving_after_app_errors(server, connect):
    for target in ("/raise-before-start?key=again", "/raise-after-start", "/no-response"):
        connect(server).request("GET", target)
    assert connect(server).request("GET", "/hello").body == b"hello, world"


def declared_length_result(server, connect, key: str) -> str:
    return connect(server).request("GET", f"/result?key={key}").body.decode()


def test_body_matching_its_declared_length_in_parts_keeps_the_connection(server, connect):
    key = uuid.uuid4().hex
    connection = connect(server)
    response = connection.request("GET", f"/declared-length?declare=10&parts=01234,56789&key={key}")
    assert (response.status, response.body, response.complete) == (200, b"0123456789", True)
    assert connection.request("GET", "/hello").body == b"hello, world"
    assert declared_length_result(server, connect, key) == '"no error"'


@pytest.mark.parametrize("parts", ["toolong", "0123,456789"], ids=["one-part", "second-part"])
def test_body_longer_than_its_declared_length_is_refused(server, connect, parts):
    key = uuid.uuid4().hex
    connection = connect(server)
    connection.send(
        f"GET /declared-length?declare=4&parts={parts}&key={key} HTTP/1.1\r\nHost: t\r\n\r\n"
        "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n".encode()
    )
    head_and_rest = connection.read_until_close()
    # At most the declared 4 bytes of body, then the connection ends: no byte past the declared
    # length can be mistaken for the answer to the pipelined request.
    assert b"hello, world" not in head_and_rest
    body = head_and_rest.partition(b"\r\n\r\n")[2]
    assert len(body) <= 4, head_and_rest
    # send() raised (ferroloop: "longer than Content-Length"; h11: "Too much data for declared
    # Content-Length").
    assert "Content-Length" in declared_length_result(server, connect, key)


def test_body_shorter_than_its_declared_length_closes_the_connection(server, connect):
    key = uuid.uuid4().hex
    connection = connect(server)
    response = connection.request("GET", f"/declared-length?declare=10&parts=short&key={key}")
    assert response.status == 200
    assert not response.complete
    assert response.body == b"short"
    assert connection.eof
    assert "Content-Length" in declared_length_result(server, connect, key)


@pytest.mark.parametrize(
    "shape", ["list-of-tuples", "tuple-of-tuples", "list-of-lists", "generator", "list-subclass"]
)
def test_response_headers_in_any_iterable_of_pairs_are_sent(server, connect, shape):
    response = connect(server).request("GET", f"/header-shapes?shape={shape}")
    assert (response.status, response.body) == (200, b"ok")
    assert response.header("x-shape") == shape


@pytest.mark.parametrize(
    "shape",
    # ("str-value": ASGI header values are bytes; uvicorn with h11 encodes a str value.)
    ["three-item-tuple", "one-item-list", "str-value"],
)
@pytest.mark.ferroloop_only(reason=UVICORN_CLOSES)
def test_malformed_response_header_is_an_app_error(server, connect, shape):
    # The headers are checked at http.response.start, before the response has started, so
    # the server can still answer 500.
    response = connect(server).request("GET", f"/header-shapes?shape={shape}")
    assert (response.status, response.complete) == (500, True)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        pytest.param("x-bad-{key}", "a%00b", id="nul-in-value"),
        pytest.param("x-bad-{key}", "a%0D%0AInjected:%201", id="crlf-in-value"),
        pytest.param("x-bad-{key}", "a%0Ab", id="lf-in-value"),
        pytest.param("x-bad-{key}%00", "v", id="nul-in-name"),
        pytest.param("x-bad-{key} x", "v", id="space-in-name"),
    ],
)
@pytest.mark.ferroloop_only(reason=UVICORN_CLOSES)
def test_invalid_response_header_gives_500_and_a_logged_error(server, connect, name, value):
    # The app's http.response.start carries a header that cannot be written: its send() raises
    # there, while no response has started, so the client gets a 500 (not a closed connection
    # after a head that never went out) and the error is logged with the app's traceback.
    key = uuid.uuid4().hex
    # The name's "-" is sent as %2D, so the key's needle below is in the app's error (which
    # names the decoded header) and not in the access log line (which shows the raw query).
    name = name.format(key=key).replace("-", "%2D").replace(" ", "%20")
    response = connect(server).request("GET", f"/with-header?name={name}&value={value}")
    assert (response.status, response.complete) == (500, True)
    assert all(key not in field for field in response.headers)
    output = server.wait_for_output(f"x-bad-{key}")
    assert "Traceback (most recent call last)" in output
    assert "with_header" in output  # the app's frame is in the traceback


@pytest.mark.parametrize("code", [99, 1000])
@pytest.mark.ferroloop_only(reason=UVICORN_CLOSES)
def test_status_outside_100_to_999_gives_500(server, connect, code):
    key = uuid.uuid4().hex
    response = connect(server).request("GET", f"/with-status?code={code}&key={key}")
    assert (response.status, response.complete) == (500, True)
    assert str(code) in connect(server).request("GET", f"/result?key={key}").body.decode()
