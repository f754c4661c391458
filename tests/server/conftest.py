"""Fixtures for the end-to-end server tests: a server in a subprocess, raw HTTP/1.1 connections.

The server under test is ``python -m ferroloop APP --host 127.0.0.1 --port N --app-dir
tests/server/apps [options...]``. With ``FERROLOOP_TEST_SERVER=uvicorn`` the same tests run
against uvicorn as an oracle: ``python -m uvicorn --loop asyncio --http h11`` with the same
arguments. h11 is the oracle's parser because it is the reference Python implementation of
RFC 9112 and agrees with ferroloop's specification on more cases than httptools does;
``FERROLOOP_TEST_SERVER=uvicorn-httptools`` picks ``--http httptools`` for comparison (it
fails three tests: it rejects a quoted chunk extension, sends a chunked response to an
HTTP/1.0 client, and accepts a 1 MB header section).

    FERROLOOP_TEST_SERVER=uvicorn .venv/bin/python -m pytest -q -p no:cacheprovider tests/server

A test of behaviour that ferroloop specifies and uvicorn does not have (ferroloop-only options,
stricter framing, the ``server: ferroloop`` header...) is marked ``@pytest.mark.ferroloop_only``
with the reason; it is skipped under the oracle, and only there.

``FERROLOOP_TEST_WORKERS=2`` runs every server that would be one process with ``--workers 2``
instead, behind the dispatching front, to check that the front changes nothing a client sees.
Consecutive requests may then reach different workers, so what a test app records for a later
request lives in a directory the workers share (``apps/shared_state.py``). A test of a fact of
one process that several workers do not share (a per-process limit, a log line, an rlimit) is
marked ``@pytest.mark.single_process`` with the reason, and skipped in that run.

    FERROLOOP_TEST_WORKERS=2 .venv/bin/python -m pytest -q -p no:cacheprovider tests/server

Fixtures:

* ``serve(app_ref, *args, env=None)`` (module scope): one server process per distinct
  (app, args, env) in a test module, shared by its tests so the suite stays fast.
* ``spawn_server(app_ref, *args, env=None, wait=True)`` (function scope): a fresh process the
  test may stop or signal itself; stopped (if still running) at the end of the test.
* ``connect(server, rcvbuf=None, sndbuf=None)``: a ``RawConnection`` (socket with a timeout and
  a full HTTP/1.1 response reader) to a server; closed at the end of the test.
* ``drain_under_load(port, stop, ...)``: keep-alive and new-connection clients load a server,
  ``stop()`` signals it, and every request's outcome is checked against the graceful-drain
  contract (docs/server.md, "Graceful shutdown").

Every socket read has a timeout (``IO_TIMEOUT``), so a server that never answers fails the
test instead of hanging it. Tests assert behaviour (bytes, statuses, exit codes), never timing:
the timeouts here only bound how long a test waits for something that must happen.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

APPS_DIR = Path(__file__).resolve().parent / "apps"

SERVER_KIND = os.environ.get("FERROLOOP_TEST_SERVER", "ferroloop")
_ORACLE_HTTP = {"uvicorn": "h11", "uvicorn-httptools": "httptools"}
if SERVER_KIND != "ferroloop" and SERVER_KIND not in _ORACLE_HTTP:
    raise pytest.UsageError(
        f"FERROLOOP_TEST_SERVER={SERVER_KIND!r}: expected 'ferroloop' (default), 'uvicorn' "
        "(uvicorn --loop asyncio --http h11) or 'uvicorn-httptools'"
    )
IS_ORACLE = SERVER_KIND != "ferroloop"
# FERROLOOP_TEST_WORKERS=N: see the module docstring and server_command.
TEST_WORKERS = os.environ.get("FERROLOOP_TEST_WORKERS", "") if not IS_ORACLE else ""

# How long the server may take to accept connections after it was started.
STARTUP_TIMEOUT = 15.0
# How long a stopped server may take to exit after SIGTERM before it is killed.
STOP_TIMEOUT = 10.0
# Upper bound of one socket read or write in a test; far above what loopback needs.
IO_TIMEOUT = 10.0

# Exit statuses of a server that shut down cleanly after SIGTERM. uvicorn re-raises the
# captured signal once its shutdown is complete, so it dies "by" SIGTERM; ferroloop is
# specified to exit 0.
CLEAN_EXIT_CODES = frozenset({0, -signal.SIGTERM}) if IS_ORACLE else frozenset({0})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "ferroloop_only(reason): behaviour ferroloop specifies and uvicorn does not have; "
        "skipped when FERROLOOP_TEST_SERVER names the uvicorn oracle",
    )
    config.addinivalue_line(
        "markers",
        "single_process(reason): checks a fact of one server process (its counters, limits, "
        "log lines, rlimits) that several workers do not share; skipped when "
        "FERROLOOP_TEST_WORKERS runs the servers with --workers",
    )


def _marker_reason(marker: pytest.Mark) -> str:
    return marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("ferroloop_only")
        if IS_ORACLE and marker is not None:
            reason = _marker_reason(marker)
            item.add_marker(pytest.mark.skip(reason=f"ferroloop only: {reason}"))
        marker = item.get_closest_marker("single_process")
        if TEST_WORKERS and marker is not None:
            reason = _marker_reason(marker)
            item.add_marker(pytest.mark.skip(reason=f"single process only: {reason}"))


# --------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_command(app_ref: str, args: tuple[str, ...], port: int | None) -> list[str]:
    """The command line of the server under test (ferroloop, or the uvicorn oracle)."""
    if SERVER_KIND == "ferroloop":
        command = [sys.executable, "-m", "ferroloop", app_ref]
    else:
        http = _ORACLE_HTTP[SERVER_KIND]
        command = [sys.executable, "-m", "uvicorn", "--loop", "asyncio", "--http", http, app_ref]
    if port is not None:
        command += ["--host", "127.0.0.1", "--port", str(port)]
    extra = []
    # FERROLOOP_TEST_WORKERS=2: every server that runs as one process runs with that many
    # workers instead (behind the front), to check that the front changes nothing a client sees.
    single = not {"--workers", "--reload", "--fd"} & set(args)
    if TEST_WORKERS and single:
        extra = ["--workers", TEST_WORKERS]
    return [*command, "--app-dir", str(APPS_DIR), *args, *extra]


class Server:
    """A server process started by the fixtures; its output goes to files in ``log_dir``."""

    def __init__(
        self, app_ref: str, args: tuple[str, ...], env: dict[str, str] | None, log_dir: Path
    ) -> None:
        self.app_ref = app_ref
        self.args = args
        self.uds: str | None = None
        if "--uds" in args:
            self.uds = args[args.index("--uds") + 1]
            self.port: int | None = None
        else:
            self.port = free_port()
        self.host = "127.0.0.1"
        self._exit_handled = False
        self.url = f"http://127.0.0.1:{self.port}" if self.port is not None else "http://localhost"
        self.command = server_command(app_ref, args, self.port)
        log_dir.mkdir(parents=True, exist_ok=True)
        self._stdout_path = log_dir / "stdout.log"
        self._stderr_path = log_dir / "stderr.log"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        full_env.pop("WEB_CONCURRENCY", None)
        if "--workers" in self.command:
            # What the test apps record for a later request, which may go to another worker
            # (tests/server/apps/shared_state.py).
            full_env.setdefault("FERROLOOP_TEST_SHARED_DIR", str(log_dir / "shared"))
        with open(self._stdout_path, "wb") as stdout, open(self._stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=full_env,
                cwd=log_dir,
            )

    # -- output

    def stderr_text(self) -> str:
        return self._stderr_path.read_text(errors="replace")

    def stdout_text(self) -> str:
        return self._stdout_path.read_text(errors="replace")

    def output_text(self) -> str:
        """stdout and stderr (the access log may go to either)."""
        return self.stdout_text() + self.stderr_text()

    def describe(self) -> str:
        return (
            f"server command: {' '.join(self.command)}\n"
            f"exit status: {self.proc.poll()}\n"
            f"--- stderr ---\n{self.stderr_text()}\n--- stdout ---\n{self.stdout_text()}"
        )

    def wait_for_output(self, needle: str, timeout: float = IO_TIMEOUT) -> str:
        """Wait until ``needle`` appears in the server's stdout or stderr; return all output."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.output_text()
            if needle in text:
                return text
            if time.monotonic() > deadline:
                pytest.fail(f"{needle!r} never appeared in the server's output\n{self.describe()}")
            time.sleep(0.02)

    def wait_for_shutdown_start(self) -> str:
        """Wait until the server logged that its graceful shutdown began; return all output.
        One process logs "Shutting down". Behind the front (``--workers``) the parent logs
        "Waiting for the front process" once it has told the front to drain; the workers log
        "Shutting down" only after the front has drained."""
        behind_front = "--workers" in self.command and "kernel" not in self.command
        return self.wait_for_output(
            "Waiting for the front process" if behind_front else "Shutting down"
        )

    # -- lifecycle

    def address(self) -> tuple[int, object]:
        """(family, sockaddr) to connect to."""
        if self.uds is not None:
            return socket.AF_UNIX, self.uds
        return socket.AF_INET, (self.host, self.port)

    def try_connect(self) -> socket.socket | None:
        family, sockaddr = self.address()
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(1.0)
        try:
            sock.connect(sockaddr)
        except OSError:
            sock.close()
            return None
        return sock

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"the server exited before accepting connections\n{self.describe()}")
            sock = self.try_connect()
            if sock is not None:
                sock.close()
                return
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(
                    f"the server did not accept connections within {timeout:.0f} s\n"
                    f"{self.describe()}"
                )
            time.sleep(0.02)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM, wait (SIGKILL after ``timeout``); return the exit status (negative: signal)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(
                    f"the server did not exit within {timeout:.0f} s of SIGTERM (killed)\n"
                    f"{self.describe()}"
                )
        return self.proc.returncode

    def wait_exit(self, timeout: float = STOP_TIMEOUT) -> int:
        """Wait (without signalling) for the process to exit; its status is then the test's
        business, not the teardown's."""
        self._exit_handled = True
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the server did not exit within {timeout:.0f} s\n{self.describe()}")

    def assert_exits_cleanly(self, timeout: float = STOP_TIMEOUT) -> None:
        code = self.wait_exit(timeout)
        assert code in CLEAN_EXIT_CODES, f"exit status {code}\n{self.describe()}"

    def check_stopped_cleanly(self) -> str | None:
        """Stop the server; describe the problem if it did not exit cleanly, else None."""
        if self._exit_handled:
            return None
        try:
            code = self.stop()
        except pytest.fail.Exception as failure:
            return str(failure)
        if code not in CLEAN_EXIT_CODES:
            return f"the server exited with status {code} after SIGTERM\n{self.describe()}"
        return None


class ServerFactory:
    """Starts servers; with ``cache`` one per distinct (app, args, env) is reused."""

    def __init__(self, log_root: Path, cache: bool) -> None:
        self._log_root = log_root
        self._cache = cache
        self._servers: dict[object, Server] = {}
        self._started: list[Server] = []

    def __call__(
        self, app_ref: str, *args: str, env: dict[str, str] | None = None, wait: bool = True
    ) -> Server:
        key = (app_ref, args, tuple(sorted((env or {}).items())))
        if self._cache and key in self._servers:
            server = self._servers[key]
            if server.proc.poll() is None:
                return server
        log_dir = self._log_root / f"server-{len(self._started)}"
        server = Server(app_ref, args, env, log_dir)
        self._started.append(server)
        if self._cache:
            self._servers[key] = server
        if wait:
            try:
                server.wait_ready()
            except pytest.fail.Exception:
                # Reported once, here; teardown must not report the dead process again.
                self._started.remove(server)
                raise
        return server

    def stop_all(self) -> None:
        problems = [p for s in self._started if (p := s.check_stopped_cleanly()) is not None]
        self._started.clear()
        self._servers.clear()
        if problems:
            pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    """``serve(app_ref, *args, env=None)``: a running server shared by the module's tests."""
    factory = ServerFactory(tmp_path_factory.mktemp("servers"), cache=True)
    yield factory
    factory.stop_all()


@pytest.fixture
def spawn_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    """``spawn_server(app_ref, *args, env=None, wait=True)``: a fresh server for this test."""
    factory = ServerFactory(tmp_path_factory.mktemp("servers"), cache=False)
    yield factory
    factory.stop_all()


# --------------------------------------------------------------------------- raw HTTP/1.1


@dataclass
class Response:
    """One HTTP/1.x response as read off the wire."""

    http_version: str
    status: int
    reason: str
    headers: list[tuple[str, str]]  # (lowercased name, value) in wire order
    body: bytes = b""
    framing: str = "none"  # "content-length", "chunked", "close" or "none"
    trailers: list[tuple[str, str]] = field(default_factory=list)
    complete: bool = True  # False: the connection ended before the framing said the body did

    def header(self, name: str) -> str | None:
        values = self.header_values(name)
        return ", ".join(values) if values else None

    def header_values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key == name.lower()]


class RawConnection:
    """A blocking socket with a timeout and an HTTP/1.1 response reader (RFC 9112 section 6)."""

    def __init__(self, sock: socket.socket, timeout: float = IO_TIMEOUT) -> None:
        self.sock = sock
        self.sock.settimeout(timeout)
        self._buffer = bytearray()
        self.eof = False

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes, allow_reset: bool = False) -> None:
        """sendall; with ``allow_reset``, a server that stops reading and closes (as it may
        when it rejects the request) is not an error: its response is read afterwards."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            if not allow_reset:
                raise

    def _fill(self) -> bool:
        """Read more bytes into the buffer; False at end of stream (EOF or reset)."""
        if self.eof:
            return False
        try:
            chunk = self.sock.recv(262144)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        self._buffer += chunk
        return True

    def read_line(self) -> bytes | None:
        """One line without its CRLF, or None if the stream ended first."""
        while (end := self._buffer.find(b"\n")) < 0:
            if not self._fill():
                return None
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return line.removesuffix(b"\r")

    def read_exact(self, size: int) -> bytes:
        """``size`` bytes, or fewer if the stream ended first."""
        while len(self._buffer) < size and self._fill():
            pass
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def read_some(self) -> bytes:
        """Whatever is buffered, or the next bytes to arrive; b"" at end of stream."""
        if not self._buffer:
            self._fill()
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    def read_until_close(self) -> bytes:
        while self._fill():
            pass
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    def read_head(self) -> Response:
        """The status line and header fields of the next response."""
        status_line = self.read_line()
        if status_line is None:
            raise ConnectionError("the server closed the connection instead of responding")
        version, _, rest = status_line.decode("latin-1").partition(" ")
        status, _, reason = rest.partition(" ")
        assert version in ("HTTP/1.1", "HTTP/1.0"), f"bad status line {status_line!r}"
        headers = self._read_fields()
        if headers is None:
            raise ConnectionError(f"the connection ended inside the head after {status_line!r}")
        return Response(version.removeprefix("HTTP/"), int(status), reason, headers)

    def _read_fields(self) -> list[tuple[str, str]] | None:
        fields: list[tuple[str, str]] = []
        while True:
            line = self.read_line()
            if line is None:
                return None
            if not line:
                return fields
            name, colon, value = line.decode("latin-1").partition(":")
            assert colon and name == name.strip(), f"bad header line {line!r}"
            fields.append((name.lower(), value.strip(" \t")))

    def read_response(self, method: str = "GET") -> Response:
        """The next complete response (a 1xx is returned on its own; call again for the final
        one). ``complete`` is False if the stream ended before the body's framing said so."""
        return self.read_body(self.read_head(), method)

    def read_body(self, response: Response, method: str = "GET") -> Response:
        """Reads the body of ``response`` (whose head ``read_head`` returned) by its framing."""
        te = response.header("transfer-encoding")
        cl = response.header("content-length")
        if method == "HEAD" or response.status < 200 or response.status in (204, 304):
            response.framing = "none"
        elif te is not None:
            assert te.lower() == "chunked", f"unexpected transfer-encoding {te!r}"
            response.framing = "chunked"
            self._read_chunked(response)
        elif cl is not None:
            response.framing = "content-length"
            response.body = self.read_exact(int(cl))
            response.complete = len(response.body) == int(cl)
        else:
            response.framing = "close"
            response.body = self.read_until_close()
        return response

    def _read_chunked(self, response: Response) -> None:
        body = bytearray()
        while True:
            size_line = self.read_line()
            if size_line is None:
                break
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                trailers = self._read_fields()
                if trailers is None:
                    break
                response.trailers = trailers
                response.body = bytes(body)
                return
            data = self.read_exact(size)
            body += data
            if len(data) < size or self.read_line() is None:
                break
        response.body = bytes(body)
        response.complete = False

    def request(
        self,
        method: str = "GET",
        target: str = "/",
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
    ) -> Response:
        """Send one HTTP/1.1 request (Host and, if there is a body, Content-Length added)."""
        self.send(format_request(method, target, headers, body))
        return self.read_response(method)

    def closed_by_peer(self) -> bool:
        """Wait for the server to end the stream; True at EOF/reset (data before it is
        discarded). Raises TimeoutError (socket.timeout) if it stays open past IO_TIMEOUT."""
        self.read_until_close()
        return self.eof


def format_request(
    method: str = "GET",
    target: str = "/",
    headers: list[tuple[str, str]] | None = None,
    body: bytes = b"",
    version: str = "HTTP/1.1",
) -> bytes:
    headers = list(headers or [])
    names = {name.lower() for name, _ in headers}
    if "host" not in names:
        headers.insert(0, ("Host", "test"))
    if body and "content-length" not in names and "transfer-encoding" not in names:
        headers.append(("Content-Length", str(len(body))))
    head = f"{method} {target} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
    return head.encode("latin-1") + b"\r\n" + body


@pytest.fixture
def connect() -> Iterator[Callable[..., RawConnection]]:
    """``connect(server, rcvbuf=None, sndbuf=None)``: a RawConnection, closed at teardown."""
    connections: list[RawConnection] = []

    def connect(
        server: Server, rcvbuf: int | None = None, sndbuf: int | None = None
    ) -> RawConnection:
        family, sockaddr = server.address()
        sock = socket.socket(family, socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if sndbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        sock.settimeout(IO_TIMEOUT)
        sock.connect(sockaddr)
        connection = RawConnection(sock)
        connections.append(connection)
        return connection

    yield connect
    for connection in connections:
        with contextlib.suppress(OSError):
            connection.close()


@pytest.fixture
def http_request(connect: Callable[..., RawConnection]) -> Callable[..., Response]:
    """``http_request(server, method, target, headers=None, body=b"")`` on a new connection."""

    def http_request(
        server: Server,
        method: str = "GET",
        target: str = "/",
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
    ) -> Response:
        connection = connect(server)
        try:
            return connection.request(method, target, headers, body)
        finally:
            connection.close()

    return http_request


@pytest.fixture
def request_bytes() -> Callable[..., bytes]:
    """``request_bytes(method, target, headers=None, body=b"", version="HTTP/1.1")``."""
    return format_request


def poll(check: Callable[[], object], what: str, timeout: float = IO_TIMEOUT) -> object:
    """Call ``check`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def wait_until() -> Callable[..., object]:
    """``wait_until(check, what, timeout=IO_TIMEOUT)``: poll ``check`` until truthy."""
    return poll


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (reaped or a zombie)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


@pytest.fixture
def is_gone() -> Callable[[int], bool]:
    """``is_gone(pid)``: the process has exited (reaped or a zombie)."""
    return process_gone


# --------------------------------------------------------------------------- graceful drain


# A response the client receives later than this after the stop signal was sent was written
# after the server got the signal (its handler runs at the next loop iteration).
SIGNAL_SLACK = 0.15


@dataclass
class Outcome:
    """One request of ``drain_under_load``'s clients, as the client saw it."""

    keep_alive: bool  # the client reuses its connection (else: a new connection per request)
    fresh: bool  # the request opened a new connection
    sent: float  # time.monotonic() when the request (its connect included) began
    done: float
    result: str  # "ok" (a complete response), "refused" (connect refused), or "lost: <error>"
    connection: str | None = None  # the response's Connection header

    def describe(self, stopped: float) -> str:
        kind = "keep-alive" if self.keep_alive else "new-connection"
        where = "new connection" if self.fresh else "reused connection"
        return (
            f"{kind} client, {where}: sent at {self.sent - stopped:+.3f} s, "
            f"{self.result} at {self.done - stopped:+.3f} s (connection: {self.connection})"
        )


def run_drain_load(
    port: int,
    stop: Callable[[], None],
    keep_alive: int = 25,
    new_connection: int = 25,
    app_seconds: float = 0.5,
    load_seconds: float = 1.0,
) -> tuple[float, list[Outcome]]:
    """Clients call ``/sleep?s=app_seconds`` on 127.0.0.1:``port`` in a loop, each starting at
    a random point of the first ``app_seconds``: ``keep_alive`` of them reuse their connection
    (a new one after a ``Connection: close`` response or an error), ``new_connection`` of them
    open one per request. After ``load_seconds``, ``stop()`` (a signal to the server); each
    client goes on until a connect is refused. Returns the time of ``stop()`` and every
    request's outcome. ``http.client`` is the client: it never retries, so a request the
    server drops shows as lost."""
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    give_up = time.monotonic() + load_seconds + 3 * app_seconds + STOP_TIMEOUT

    def client(reuse: bool) -> None:
        time.sleep(random.random() * app_seconds)
        connection: http.client.HTTPConnection | None = None
        while time.monotonic() < give_up:
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=IO_TIMEOUT)
            fresh = connection.sock is None
            sent = time.monotonic()
            header = None
            try:
                connection.request("GET", f"/sleep?s={app_seconds}")
                response = connection.getresponse()
                response.read()
                result, header = "ok", response.getheader("connection")
            except ConnectionRefusedError:
                result = "refused"
            except (OSError, http.client.HTTPException) as exc:
                result = f"lost: {type(exc).__name__}: {exc}"
            with lock:
                outcomes.append(Outcome(reuse, fresh, sent, time.monotonic(), result, header))
            if result == "refused":
                return
            if result != "ok" or not reuse:
                connection.close()
                connection = None

    threads = [
        threading.Thread(target=client, args=(i < keep_alive,), daemon=True)
        for i in range(keep_alive + new_connection)
    ]
    for thread in threads:
        thread.start()
    time.sleep(load_seconds)
    stopped = time.monotonic()
    stop()
    for thread in threads:
        thread.join(max(0.0, give_up - time.monotonic()) + 1)
    assert not any(t.is_alive() for t in threads), "a client never saw its connect refused"
    return stopped, sorted(outcomes, key=lambda o: o.sent)


def assert_drained(stopped: float, outcomes: list[Outcome], clients: int) -> None:
    """The graceful-drain contract, as ``drain_under_load``'s clients saw it."""
    report = "\n".join(o.describe(stopped) for o in outcomes)
    lost = [o for o in outcomes if o.result not in ("ok", "refused")]
    assert not lost, f"{len(lost)} request(s) lost:\n" + "\n".join(
        o.describe(stopped) for o in lost
    )
    refused = [o for o in outcomes if o.result == "refused"]
    assert len(refused) == clients, f"every client ends refused\n{report}"
    # Once a connect was refused the socket is closed for good: no later connection served.
    first_refusal = min(o.sent for o in refused)
    late = [o for o in outcomes if o.result == "ok" and o.fresh and o.sent > first_refusal]
    assert not late, "a connection made after one was refused was served:\n" + "\n".join(
        o.describe(stopped) for o in late
    )
    after = [o for o in outcomes if o.result == "ok" and o.done > stopped + SIGNAL_SLACK]
    keeping = [o for o in after if (o.connection or "").lower() != "close"]
    assert not keeping, "responses after the stop signal without Connection: close:\n" + (
        "\n".join(o.describe(stopped) for o in keeping)
    )
    in_flight = [o for o in outcomes if o.result == "ok" and o.sent < stopped < o.done]
    assert len(in_flight) >= clients // 2, f"too few requests in flight at the signal\n{report}"


@pytest.fixture
def drain_under_load() -> Callable[..., list[Outcome]]:
    """``drain_under_load(port, stop, keep_alive=25, new_connection=25, app_seconds=0.5,
    load_seconds=1.0)``: runs ``run_drain_load`` and asserts the graceful-drain contract
    (``assert_drained``); returns the outcomes."""

    def drain(port: int, stop: Callable[[], None], **options: float) -> list[Outcome]:
        stopped, outcomes = run_drain_load(port, stop, **options)  # type: ignore[arg-type]
        clients = int(options.get("keep_alive", 25)) + int(options.get("new_connection", 25))
        assert_drained(stopped, outcomes, clients)
        return outcomes

    return drain
