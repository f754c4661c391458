"""The probe's load: upload clients and one small-request client, each its own process.

`upload KIND PORT SECONDS`: posts a ~25 MB JSON body (built once) in a closed loop on one
keep-alive connection; prints the number of completed uploads as JSON.
`ping PORT SECONDS`: GET /ping in a closed loop on one keep-alive connection; prints every
latency (seconds) as JSON.
Every loop is bounded by its deadline (and a socket timeout).
"""

from __future__ import annotations

import json
import socket
import sys
import time

HOST = "127.0.0.1"
TARGET = 25 * 1024 * 1024


def body(kind: str) -> bytes:
    if kind in ("text", "sink"):
        return json.dumps({"text": "a" * (TARGET - 12)}).encode()
    n = TARGET // 14  # '"abcdefghij", ' is 14 bytes: about 1.87M strings
    return json.dumps({"items": ["abcdefghij"] * n}).encode()


def read_response(sock: socket.socket, buf: bytearray) -> bytearray:
    """Reads one Content-Length response; returns what followed it."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    end = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:end]).lower()
    at = head.index(b"content-length:") + 15
    length = int(head[at : head.index(b"\r\n", at)])
    while len(buf) < end + length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    if not bytes(buf[:12]).startswith(b"HTTP/1.1 200"):
        raise RuntimeError(bytes(buf[: end + length]).decode(errors="replace"))
    return buf[end + length :]


def connect(port: int) -> socket.socket:
    sock = socket.create_connection((HOST, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(30)
    return sock


def upload(kind: str, port: int, seconds: float) -> None:
    payload = body(kind)
    head = (
        f"POST /upload/{kind} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    sock = connect(port)
    buf = bytearray()
    done = 0
    times = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        sock.sendall(head)
        sock.sendall(payload)
        buf = read_response(sock, buf)
        times.append(time.monotonic() - t0)
        done += 1
    sock.close()
    print(json.dumps({"uploads": done, "times": times}))


def ping(port: int, seconds: float) -> None:
    req = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
    sock = connect(port)
    buf = bytearray()
    lat = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        sock.sendall(req)
        buf = read_response(sock, buf)
        lat.append(time.perf_counter() - t0)
    sock.close()
    print(json.dumps({"latencies": lat}))


if __name__ == "__main__":
    if sys.argv[1] == "upload":
        upload(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    else:
        ping(int(sys.argv[2]), float(sys.argv[3]))
