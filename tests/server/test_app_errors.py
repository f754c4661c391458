"""Errors in the app: 500 if no response started (traceback in the log), else the connection
is closed so the client sees an incomplete response; an app that never responds gets a 500."""

from __future__ import annotations

import uuid

import pytest


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


def test_server_keeps_serving_after_app_errors(server, connect):
    for target in ("/raise-before-start?key=again", "/raise-after-start", "/no-response"):
        connect(server).request("GET", target)
    assert connect(server).request("GET", "/hello").body == b"hello, world"
