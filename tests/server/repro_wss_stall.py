"""Manual reproduction (not collected by pytest) of a client-side race that looked like a server
stall: websockets' sync client over wss sometimes gets no handshake response.

    cd tests/server && python repro_wss_stall.py SECONDS [--tls] [--uvicorn] [--client asyncio]

Serves ``apps/ws_app.py`` (``--timeout-header 2`` on ferroloop) and opens WebSocket connections
to ``/scope`` for SECONDS, with websockets' sync client (``--client sync``, the default) or its
asyncio client (``--client asyncio``), printing each that failed. For a connection still
without a response after a second, ``ss`` is asked how many bytes each end's socket sent and
received; after 4 s the client's socket is shut down, so a server without a header timeout
(uvicorn) cannot hang the script.

The cause (2026-11-28, websockets 17.4, CPython 3.11.7, OpenSSL 3.0.19) is in the client: the
sync client reads on a thread of its own (``recv_events``) while the caller's thread writes the
upgrade request, both on one ``ssl.SSLSocket``, i.e. one OpenSSL ``SSL`` object, which OpenSSL
does not support (CPython's ``ssl`` does not serialise the two calls). Right after
the handshake the server's two TLS 1.3 NewSessionTicket messages arrive; for each, the reader
thread's ``SSL_read`` runs OpenSSL's handshake state machine, which pushes a buffering BIO onto
the connection's write side and pops and frees it when done (seen with gdb: ``BIO_push`` and
``BIO_pop`` called from ``SSL_read_ex`` on the reader thread, once per ticket). A request record
written in between goes into that buffer and is freed with it, while ``SSL_write`` reports
success: the likely mechanism (inferred, not stepped through), and what the evidence shows.
Evidence: in five stalled connections traced with ``SSLContext._msg_callback``, the request
record was sealed while the reader thread was reading the tickets. In every stalled
connection, ``ss`` shows the client socket had sent 597 bytes, exactly ClientHello (517),
ChangeCipherSpec (6) and Finished (74), the server socket had received those 597, and both
queues were empty: the request never reached the kernel. The server then closes after
``--timeout-header`` and the client reports "did not receive a valid HTTP response".

Counts with two busy-loop processes loading both cores:

- ferroloop, ``--client sync``: 47 failures in 16,298 connections in 180 s, every one with
  the 597-byte signature above (9 in 4,717 in 40 s, 10 in 9,806 in 90 s in other runs).
- ferroloop, ``--client asyncio`` (one thread drives the TLS object, through memory BIOs): 0
  in 37,644 connections in 180 s.
- ``--uvicorn`` (OpenSSL, which sends two tickets the same way), ``--client sync``: 8 in 4,799
  in 60 s, the same signature (uvicorn's socket received 597 bytes); uvicorn has no header
  timeout, so the script's 4 s shutdown ends them.
- ferroloop, the sync client limited to TLS 1.2 (no tickets after the handshake; a variant of
  this script): 0 in 13,364 in 60 s.
- Plain ``ssl`` without websockets, a thread in ``recv()`` while another sends a GET right
  after the handshake: 4 requests never answered in about 40 connections, then ``SSL_write``
  failed with "[SSL] internal error"; the same client on one thread: 0 in 34,698.

The test suite's wss tests use the asyncio client for this reason; the byte patterns the server
must handle (the client's Finished and its first request in one segment, or before the
tickets were read) are tested deterministically in ``test_https.py``
(``test_wss_upgrade_sent_with_the_tls13_client_finished_is_answered``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import trustme
from websockets.asyncio.client import connect as async_connect
from websockets.sync.client import connect as sync_connect

APPS = Path(__file__).with_name("apps")
TIMEOUT = 5.0


class Watch:
    """The attempt in progress: its socket's fd and port (the TLS socket takes the fd over, so
    the plain socket object cannot be asked), when it started, what ``ss`` saw of it."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.port = 0
        self.started = 0.0
        self.seen: str | None = None
        self.lock = threading.Lock()

    def begin(self, sock: socket.socket | None) -> None:
        with self.lock:
            self.fd = sock.fileno() if sock else None
            self.port = sock.getsockname()[1] if sock else 0
            self.started, self.seen = time.monotonic(), None

    def end(self) -> str | None:
        with self.lock:
            self.fd = None
            return self.seen

    def run(self) -> None:
        while True:
            time.sleep(0.1)
            with self.lock:
                if self.fd is None:
                    continue
                spent = time.monotonic() - self.started
                if spent > 1.0 and self.seen is None:
                    self.seen = socket_counts(self.port)
                if spent > TIMEOUT - 1:
                    # The attempt is still blocked on this fd, so it is still this connection's.
                    borrowed = socket.socket(fileno=self.fd)
                    with contextlib.suppress(OSError):
                        borrowed.shutdown(socket.SHUT_RDWR)
                    borrowed.detach()
                    self.fd = None


def socket_counts(port: int) -> str:
    """Both ends of the connection from client port ``port``, as ``ss`` sees them."""
    out = subprocess.run(
        ["ss", "-tni", "state", "all", f"( sport = :{port} or dport = :{port} )"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    ends = []
    for head, info in zip(out.splitlines()[1::2], out.splitlines()[2::2], strict=False):
        fields = head.split()
        sent = re.search(r"bytes_sent:(\d+)", info)
        received = re.search(r"bytes_received:(\d+)", info)
        ends.append(
            f"{fields[3]} recv-q {fields[1]} send-q {fields[2]} "
            f"sent {sent.group(1) if sent else 0} received {received.group(1) if received else 0}"
        )
    return "; ".join(ends) or "not found"


def main() -> None:
    seconds = float(sys.argv[1])
    tls = "--tls" in sys.argv
    uvicorn = "--uvicorn" in sys.argv
    client = sys.argv[sys.argv.index("--client") + 1] if "--client" in sys.argv else "sync"
    if client not in ("sync", "asyncio"):
        sys.exit("--client is 'sync' or 'asyncio'")
    work = Path(tempfile.mkdtemp())
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(work / "cert.pem")
    ca.cert_pem.write_to_path(work / "ca.pem")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ["-m", "uvicorn", "--loop", "asyncio"] if uvicorn else ["-m", "ferroloop"]
    if not uvicorn:
        server += ["--timeout-header", "2"]
    if tls:
        server += [
            "--ssl-certfile",
            str(work / "cert.pem"),
            "--ssl-keyfile",
            str(work / "cert.pem"),
        ]
    command = [sys.executable, *server, "ws_app:app", "--host", "127.0.0.1", "--port", str(port)]
    with open(work / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [*command, "--app-dir", str(APPS)], stdout=log, stderr=subprocess.STDOUT
        )
    time.sleep(1.5)
    context = ssl.create_default_context(cafile=str(work / "ca.pem")) if tls else None
    url = f"{'wss' if tls else 'ws'}://127.0.0.1:{port}/scope"
    extra = {"ssl": context} if tls else {}
    watch = Watch()
    threading.Thread(target=watch.run, daemon=True).start()

    async def async_once() -> None:
        async with async_connect(url, open_timeout=TIMEOUT, compression=None, **extra) as ws:
            json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))

    end, count, failed = time.monotonic() + seconds, 0, 0
    try:
        while time.monotonic() < end:
            count += 1
            started = time.monotonic()
            try:
                if client == "sync":
                    with socket.create_connection(("127.0.0.1", port)) as sock:
                        watch.begin(sock)
                        with sync_connect(
                            url, sock=sock, open_timeout=TIMEOUT, compression=None, **extra
                        ) as ws:
                            json.loads(ws.recv(timeout=TIMEOUT))
                else:
                    watch.begin(None)
                    asyncio.run(async_once())
                watch.end()
            except Exception as e:  # every failure is reported
                seen = watch.end()
                failed += 1
                spent = time.monotonic() - started
                cause = f" (cause: {e.__cause__!r})" if e.__cause__ else ""
                print(
                    f"connection {count}: {type(e).__name__}: {e}{cause} ({spent:.2f} s)",
                    flush=True,
                )
                if seen:
                    print(f"    after 1 s: {seen}", flush=True)
    finally:
        proc.terminate()
        proc.wait()
    print(f"{count} connections, {failed} failed; server log in {work}", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    os.chdir(APPS.parent)
    main()
