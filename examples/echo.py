"""An echo server and 64 concurrent clients, all on one ferroloop loop.

The server accepts with ``loop.sock_accept`` and echoes with ``sock_recv``/``sock_sendall``;
each client sends 200 messages and checks every reply. Run it with ``make run``.
"""

from __future__ import annotations

import asyncio
import socket
import time

import ferroloop

CLIENTS = 64
MESSAGES = 200
PAYLOAD = b"x" * 1024


async def serve_one(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
    with conn:
        while data := await loop.sock_recv(conn, 65536):
            await loop.sock_sendall(conn, data)


async def server(loop: asyncio.AbstractEventLoop, listener: socket.socket) -> None:
    tasks = set()
    while True:
        conn, _ = await loop.sock_accept(listener)
        task = asyncio.create_task(serve_one(loop, conn))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def client(loop: asyncio.AbstractEventLoop, address: tuple[str, int]) -> int:
    with socket.socket() as sock:
        sock.setblocking(False)
        await loop.sock_connect(sock, address)
        for _ in range(MESSAGES):
            await loop.sock_sendall(sock, PAYLOAD)
            got = 0
            while got < len(PAYLOAD):
                chunk = await loop.sock_recv(sock, 65536)
                if not chunk:
                    raise ConnectionError("server closed the connection")
                got += len(chunk)
    return MESSAGES


async def main() -> None:
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    address = listener.getsockname()
    print(f"ferroloop {ferroloop.__version__}: echo server on {address[0]}:{address[1]}")
    srv = asyncio.create_task(server(loop, listener))
    start = time.perf_counter()
    done = await asyncio.gather(*(client(loop, address) for _ in range(CLIENTS)))
    elapsed = time.perf_counter() - start
    srv.cancel()
    listener.close()
    total = sum(done)
    print(f"{CLIENTS} clients echoed {total} messages of {len(PAYLOAD)} bytes in {elapsed:.2f} s")
    print(f"loop: {type(loop).__module__}.{type(loop).__qualname__}")


if __name__ == "__main__":
    ferroloop.run(main())
