"""The large-upload clients of benchmarks/isolation: CONNS connections posting one body in a loop.

    python large_client.py PORT PATH BODY_FILE EXPECT_COUNT CONNS END_NS [RATE [tls]]

Each connection is a thread with a raw socket (HTTP/1.1 keep-alive): it sends `POST PATH` with
`Content-Type: application/json`, `Content-Length` and the body read once from BODY_FILE, reads
the response (status line, headers, Content-Length body), checks it is a 200 with
`{"count": EXPECT_COUNT, "pid": PID}`, and sends the next one at once: a closed loop per
connection, as a client uploading files one after another. With RATE (uploads per second over
all connections, above 0) each connection paces itself at RATE/CONNS instead: its next upload
starts at its scheduled time, or at once when the previous answer came later (no backlog).
With `tls` every connection speaks TLS (certificate not verified), the body encrypted by
OpenSSL in `sendall`, which also runs without the GIL.
The body's bytes are the same object for every send, and `sendall` copies them to the kernel
without holding the GIL, so the client costs little CPU besides the kernel's copy. END_NS is a
CLOCK_MONOTONIC time (`time.monotonic_ns()`): every socket operation's timeout runs out then,
so the process ends within a moment of it even if the server stops answering. The runner
counts the uploads answered in its measured window.

Prints one line: `RESULT {"done": [[sent_ns, answered_ns], ...], "errors": N, "first_error":
"...", "in_flight": N, "pids": [PID, ...], "cpu_s": S}` (every answered upload, warm-up
included; in_flight: uploads still unanswered at END_NS; pids: the worker process that answered
each connection's last upload).
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import sys
import threading
import time

LOCK = threading.Lock()  # guards the shared `out` dict


class Wrong(Exception):
    """The server's answer was not the expected 200."""


def read_response(sock: socket.socket, end_ns: int) -> tuple[bytes, bytes]:
    """(head, body) of one response; socket.timeout at END_NS."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        sock.settimeout(max(0.001, (end_ns - time.monotonic_ns()) / 1e9))
        chunk = sock.recv(65536)
        if not chunk:
            raise Wrong("connection closed before the response")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if length is None:
        raise Wrong(f"response without Content-Length: {head[:200]!r}")
    while len(body) < length:
        sock.settimeout(max(0.001, (end_ns - time.monotonic_ns()) / 1e9))
        chunk = sock.recv(65536)
        if not chunk:
            raise Wrong("connection closed in the response body")
        body += chunk
    return head, body


def upload_loop(
    conn: int,
    port: int,
    head: bytes,
    body: bytes,
    expect: int,
    end_ns: int,
    out: dict,
    period_ns: int = 0,
    tls: ssl.SSLContext | None = None,
) -> None:
    sock = None
    next_ns = time.monotonic_ns() + conn * period_ns // max(1, len(out["pids"]))
    while time.monotonic_ns() < end_ns:
        if period_ns:
            wait_ns = min(next_ns, end_ns) - time.monotonic_ns()
            if wait_ns > 0:
                time.sleep(wait_ns / 1e9)
            if time.monotonic_ns() >= end_ns:
                break
            next_ns = max(next_ns, time.monotonic_ns()) + period_ns
        sent_ns = time.monotonic_ns()
        try:
            if sock is None:
                sock = socket.create_connection(
                    ("127.0.0.1", port), timeout=max(0.001, (end_ns - sent_ns) / 1e9)
                )
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if tls is not None:
                    sock = tls.wrap_socket(sock)
            sock.settimeout(max(0.001, (end_ns - time.monotonic_ns()) / 1e9))
            sock.sendall(head)
            sock.sendall(body)
            status, answer = read_response(sock, end_ns)
            reply = json.loads(answer) if status.startswith(b"HTTP/1.1 200") else {}
            if reply.get("count") != expect:
                first_line = status.partition(b"\r")[0]
                raise Wrong(f"{first_line!r} {answer[:200]!r}")
            with LOCK:
                out["done"].append((sent_ns, time.monotonic_ns()))
                out["pids"][conn] = reply.get("pid")
        except (OSError, Wrong, ValueError) as exc:
            if isinstance(exc, TimeoutError) and time.monotonic_ns() >= end_ns:
                with LOCK:
                    out["in_flight"] += 1
                break
            with LOCK:
                out["errors"] += 1
                out["first_error"] = out["first_error"] or f"{type(exc).__name__}: {exc}"
            if sock is not None:
                sock.close()
            sock = None
            time.sleep(0.01)  # a refused or reset connection: do not spin
    if sock is not None:
        sock.close()


def main(argv: list[str]) -> int:
    port, path, body_file, count, conns, end_ns, *rest = argv
    rate = float(rest[0]) if rest else 0.0
    tls = None
    if rest[1:] == ["tls"]:
        tls = ssl.create_default_context()
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    elif rest[1:]:
        raise SystemExit(f"unknown argument {rest[1]!r} (only `tls`)")
    with open(body_file, "rb") as f:
        body = f.read()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    conns = int(conns)
    out = {"done": [], "errors": 0, "first_error": "", "in_flight": 0, "pids": [None] * conns}
    period_ns = int(conns / rate * 1e9) if rate > 0 else 0
    threads = [
        threading.Thread(
            target=upload_loop,
            args=(i, int(port), head, body, int(count), int(end_ns), out, period_ns, tls),
            daemon=True,
        )
        for i in range(conns)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    usage = os.times()
    out["cpu_s"] = round(usage.user + usage.system, 3)
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
