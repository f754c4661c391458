"""The gunicorn worker class: ``gunicorn -k ferroloop.workers.FerroloopWorker``.

gunicorn runs as a real master process over the test apps; requests go through real sockets.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gunicorn")

pytestmark = pytest.mark.ferroloop_only(reason="gunicorn's worker class is ferroloop's own")

APPS = Path(__file__).parent / "apps"
WORKER = "ferroloop.workers.FerroloopWorker"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(tmp_path: Path, port: int, *args: str) -> list[str]:
    """gunicorn with ferroloop's worker over the test apps, on 127.0.0.1:``port``."""
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "-k",
        WORKER,
        "-b",
        f"127.0.0.1:{port}",
        "--chdir",
        str(APPS),
        "--control-socket",
        str(tmp_path / "gunicorn.ctl"),
        *args,
        "raw_asgi:app",
    ]


class Gunicorn:
    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.port = _free_port()
        self.log = tmp_path / "gunicorn.log"
        command = _command(tmp_path, self.port, *args)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.get("/hello")
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"gunicorn did not start:\n{self.output()}")
                time.sleep(0.1)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, bytes, http.client.HTTPResponse]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read(), response
        finally:
            connection.close()

    def worker_pid(self) -> int:
        status, body, _ = self.get("/pid")
        assert status == 200
        info = json.loads(body)
        assert info["ppid"] == self.proc.pid, "served by a process gunicorn's master did not fork"
        return info["pid"]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"gunicorn did not stop on SIGTERM:\n{self.output()}")


@pytest.fixture
def gunicorn(tmp_path):
    started = []

    def start(*args: str) -> Gunicorn:
        started.append(Gunicorn(tmp_path, *args))
        return started[-1]

    yield start
    for g in started:
        g.stop()


def test_the_worker_serves_the_app_with_the_ferroloop_server(gunicorn):
    g = gunicorn("-w", "2")
    status, body, response = g.get("/hello")
    assert (status, body) == (200, b"hello, world")
    assert response.getheader("server") == "ferroloop"
    pids = {g.worker_pid() for _ in range(20)}
    assert g.proc.pid not in pids
    assert "Application startup complete" in g.output()  # lifespan ran, logged through gunicorn
    assert g.stop() == 0


def test_the_heartbeat_keeps_a_worker_alive_past_gunicorns_timeout(gunicorn):
    # gunicorn kills a worker that does not touch its heartbeat file for --timeout seconds.
    g = gunicorn("--timeout", "2")
    pid = g.worker_pid()
    time.sleep(5)
    assert g.worker_pid() == pid, f"the worker was replaced:\n{g.output()}"
    assert "WORKER TIMEOUT" not in g.output()


def test_a_stopped_worker_misses_its_heartbeat_and_is_replaced(gunicorn):
    # gunicorn only times out a worker that has touched its heartbeat file at least once (the
    # file starts with a wall-clock time that its monotonic check never exceeds), so this
    # fails if the worker never notifies, and the test above if it stops notifying.
    g = gunicorn("--timeout", "2")
    pid = g.worker_pid()
    time.sleep(1.5)  # past the first heartbeat (at start-up, then every second)
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 20
        while "WORKER TIMEOUT" not in g.output():
            assert time.monotonic() < deadline, (
                f"the stopped worker was not timed out:\n{g.output()}"
            )
            time.sleep(0.1)
    finally:
        os.kill(pid, signal.SIGCONT)  # gunicorn's SIGABRT, then SIGKILL, end it
    deadline = time.monotonic() + 20
    while True:
        try:
            if g.worker_pid() != pid:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, f"no new worker:\n{g.output()}"
        time.sleep(0.1)


def test_max_requests_replaces_the_worker(gunicorn):
    g = gunicorn("--max-requests", "5")
    first = g.worker_pid()
    deadline = time.monotonic() + 20
    while g.worker_pid() == first:
        assert time.monotonic() < deadline, f"the worker was never replaced:\n{g.output()}"
    assert "Maximum request limit of 5 exceeded" in g.output()


def test_sigterm_lets_an_in_flight_request_finish(gunicorn, tmp_path):
    g = gunicorn("--graceful-timeout", "20")
    release = tmp_path / "release"
    busy = socket.create_connection(("127.0.0.1", g.port), timeout=10)
    busy.sendall(f"GET /slow?release={release} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    received = b""
    while b"started" not in received:
        received += busy.recv(4096)
    g.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert g.proc.poll() is None, "stopped before the in-flight request finished"
    release.touch()
    while not received.endswith(b"0\r\n\r\n"):
        chunk = busy.recv(4096)
        assert chunk, f"the response was cut short:\n{received!r}"
        received += chunk
    assert b"finished" in received
    busy.close()
    assert g.proc.wait(timeout=20) == 0


def test_sigterm_under_load_loses_no_request(gunicorn, drain_under_load):
    # The drain contract of docs/server.md in each worker: gunicorn's master closes its copy of
    # the listening socket before it signals the workers, and each worker closes its own.
    g = gunicorn("-w", "2", "--graceful-timeout", "5")
    drain_under_load(g.port, lambda: g.proc.send_signal(signal.SIGTERM))
    assert g.proc.wait(timeout=20) == 0


def _tls_files(tmp_path: Path) -> tuple[Any, Path, Path]:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    cert.private_key_pem.write_to_path(str(keyfile))
    return ca, certfile, keyfile


def test_gunicorns_tls_settings_serve_https(tmp_path):
    ca, certfile, keyfile = _tls_files(tmp_path)
    port = _free_port()
    command = _command(tmp_path, port, "--certfile", str(certfile), "--keyfile", str(keyfile))
    log = tmp_path / "gunicorn.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    try:
        deadline = time.monotonic() + 20
        while True:
            connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
            try:
                connection.request("GET", "/hello")
                response = connection.getresponse()
                body = response.read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"gunicorn did not serve https:\n{log.read_text()}")
                time.sleep(0.1)
            finally:
                connection.close()
        assert (response.status, body) == (200, b"hello, world")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def test_a_tls_setting_the_server_cannot_honour_is_a_boot_error(tmp_path):
    _, certfile, keyfile = _tls_files(tmp_path)
    command = _command(
        tmp_path,
        _free_port(),
        "--certfile",
        str(certfile),
        "--keyfile",
        str(keyfile),
        "--ciphers",
        "ECDHE+AESGCM",
    )
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, env=os.environ)
    assert result.returncode != 0
    assert "ssl_ciphers='ECDHE+AESGCM' is not supported" in result.stdout + result.stderr
