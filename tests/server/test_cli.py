"""Command-line options that change how the app is found and served, and the access log."""

from __future__ import annotations

import uuid

import httpx
import pytest


def test_asgi2_class_app_is_detected_and_wrapped(serve, connect):
    server = serve("asgi2_app:App")
    response = connect(server).request("POST", "/some/path", body=b"ignored")
    assert (response.status, response.body) == (200, b"asgi2 POST /some/path")


def test_factory_option_calls_the_factory(serve, connect):
    server = serve("raw_asgi:create_app", "--factory")
    connection = connect(server)
    assert connection.request("GET", "/factory").body == b"made by the factory"
    assert connection.request("GET", "/hello").body == b"hello, world"


def test_unix_domain_socket(spawn_server, connect, tmp_path):
    path = str(tmp_path / "server.sock")
    server = spawn_server("raw_asgi:app", "--uds", path)
    connection = connect(server)
    response = connection.request("POST", "/echo", body=b"over a unix socket")
    assert (response.status, response.body) == (200, b"over a unix socket")
    assert connection.request("GET", "/hello").body == b"hello, world"


def test_unix_domain_socket_through_httpx(spawn_server, tmp_path):
    path = str(tmp_path / "server.sock")
    server = spawn_server("raw_asgi:app", "--uds", path)
    with httpx.Client(transport=httpx.HTTPTransport(uds=path), timeout=10) as client:
        response = client.get("http://localhost/hello")
    assert response.text == "hello, world"
    assert server.proc.poll() is None


def test_access_log_line_per_request_by_default(serve, connect):
    server = serve("raw_asgi:app")
    path = f"/scope/access-log-{uuid.uuid4().hex}"
    assert connect(server).request("GET", path).status == 200
    output = server.wait_for_output(path)
    line = next(line for line in output.splitlines() if path in line)
    assert "GET" in line
    assert "200" in line.split(path, 1)[1]


def _access_log_line(server, connect, headers: list[tuple[str, str]]) -> str:
    path = f"/scope/access-log-{uuid.uuid4().hex}"
    assert connect(server).request("GET", path, headers=headers).status == 200
    output = server.wait_for_output(path)
    return next(line for line in output.splitlines() if path in line)


def test_access_log_names_the_client_from_trusted_proxy_headers(serve, connect):
    # The test client connects from 127.0.0.1, which --forwarded-allow-ips trusts by default:
    # the log names the client that X-Forwarded-For names (port 0: the header gives none), as
    # scope["client"] does, not the proxy that connected.
    server = serve("raw_asgi:app")
    line = _access_log_line(server, connect, [("X-Forwarded-For", "203.0.113.7")])
    assert " 203.0.113.7:0 - " in line
    assert "127.0.0.1" not in line


def test_access_log_names_the_peer_without_proxy_headers(serve, connect):
    server = serve("raw_asgi:app", "--no-proxy-headers")
    line = _access_log_line(server, connect, [("X-Forwarded-For", "203.0.113.7")])
    assert "203.0.113.7" not in line
    assert " 127.0.0.1:" in line


def test_access_log_names_the_peer_of_an_untrusted_proxy(serve, connect):
    server = serve("raw_asgi:app", "--forwarded-allow-ips", "192.0.2.1")
    line = _access_log_line(server, connect, [("X-Forwarded-For", "203.0.113.7")])
    assert "203.0.113.7" not in line
    assert " 127.0.0.1:" in line


def test_no_access_log_option(serve, connect):
    server = serve("raw_asgi:app", "--no-access-log")
    path = f"/scope/access-log-{uuid.uuid4().hex}"
    assert connect(server).request("GET", path).status == 200
    # A later request that logs (its traceback) shows the output is flushed up to here.
    key = uuid.uuid4().hex
    assert connect(server).request("GET", f"/raise-before-start?key={key}").status == 500
    output = server.wait_for_output(key)
    assert path not in output


@pytest.mark.parametrize("client", ["http.client", "httpx"])
def test_independent_clients_get_the_same_answers(serve, client):
    server = serve("raw_asgi:app")
    if client == "httpx":
        with httpx.Client(base_url=server.url, timeout=10) as http:
            responses = [http.post("/echo", content=b"posted"), http.get("/chunked-response")]
            bodies = [r.content for r in responses]
    else:
        import http.client

        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            connection.request("POST", "/echo", body=b"posted")
            bodies = [connection.getresponse().read()]
            connection.request("GET", "/chunked-response")
            bodies.append(connection.getresponse().read())
        finally:
            connection.close()
    assert bodies == [b"posted", b"part 0\npart 1\npart 2\n"]


def _trace_lines(output: str, marker: str) -> list[str]:
    """The trace lines of the one app call whose scope names ``marker``."""
    started = next(
        line for line in output.splitlines() if "Started scope=" in line and marker in line
    )
    number = started.split(" ASGI [", 1)[1].split("]", 1)[0]
    return [line for line in output.splitlines() if f" ASGI [{number}] " in line]


def test_trace_log_level_logs_every_asgi_message(serve, connect):
    server = serve("raw_asgi:app", "--log-level", "trace")
    marker = uuid.uuid4().hex
    response = connect(server).request("POST", f"/echo?{marker}", body=b"hello")
    assert (response.status, response.body) == (200, b"hello")
    output = server.wait_for_output(f"{marker}', 'headers': '<...>'")
    server.wait_for_output("Completed")
    lines = _trace_lines(output + server.output_text(), marker)
    assert lines[0].startswith("TRACE:") and "127.0.0.1:" in lines[0]
    assert "'type': 'http'" in lines[0] and "'headers': '<...>'" in lines[0]
    kinds = [line.split(" ASGI [", 1)[1].split("] ", 1)[1][:8] for line in lines]
    assert kinds[0] == "Started " and kinds[-1] == "Complete"
    rest = "\n".join(lines)
    # Contents are never logged, only their size.
    assert "Receive {'type': 'http.request', 'body': '<5 bytes>'" in rest
    assert "Send {'type': 'http.response.start', 'status': 200, 'headers': '<...>'" in rest
    assert "Send {'type': 'http.response.body', 'body': '<5 bytes>'" in rest
    assert "hello" not in rest


def test_trace_log_level_logs_an_apps_exception(serve, connect):
    server = serve("raw_asgi:app", "--log-level", "trace")
    assert connect(server).request("GET", "/raise-before-start").status == 500
    assert "Raised exception" in server.wait_for_output("Raised exception")


def test_no_asgi_messages_are_logged_below_trace_level(serve, connect):
    server = serve("raw_asgi:app", "--log-level", "debug")
    path = f"/scope/{uuid.uuid4().hex}"
    assert connect(server).request("GET", path).status == 200
    output = server.wait_for_output(path)  # the access log line
    assert " ASGI [" not in output


def test_trace_log_level_logs_connections_made_and_lost(serve, connect):
    server = serve("raw_asgi:app", "--log-level", "trace")
    connection = connect(server)
    assert connection.request("GET", "/scope/one").status == 200
    assert connection.request("GET", "/scope/two").status == 200
    port = connection.sock.getsockname()[1]
    made = f"127.0.0.1:{port} - HTTP connection made"
    lost = f"127.0.0.1:{port} - HTTP connection lost"
    assert lost not in server.wait_for_output(made), "logged as lost while still open"
    connection.close()
    text = server.wait_for_output(lost)
    # One of each for the connection, whatever requests it carried; made comes first.
    assert text.count(made) == 1 and text.count(lost) == 1
    assert text.index(made) < text.index(lost)
    assert any(line.startswith("TRACE:") and made in line for line in text.splitlines())


def test_connections_are_not_logged_below_trace_level(serve, connect):
    server = serve("raw_asgi:app", "--log-level", "debug")
    connection = connect(server)
    path = f"/scope/{uuid.uuid4().hex}"
    assert connection.request("GET", path).status == 200
    connection.close()
    assert "HTTP connection" not in server.wait_for_output(path)  # the access log line


def test_trace_connection_lines_on_a_unix_socket_have_no_client_prefix(
    spawn_server, connect, tmp_path
):
    server = spawn_server(
        "raw_asgi:app", "--uds", str(tmp_path / "server.sock"), "--log-level", "trace"
    )
    connection = connect(server)
    assert connection.request("GET", "/hello").body == b"hello, world"
    connection.close()
    text = server.wait_for_output("HTTP connection lost")
    lines = [line for line in text.splitlines() if "HTTP connection" in line]
    # The harness's readiness probe is a connection too, whose lines may interleave with these.
    messages = {line.split(None, 1)[1] for line in lines}
    assert messages == {"HTTP connection made", "HTTP connection lost"}
    assert all(line.startswith("TRACE:") for line in lines)
