"""anyio on its asyncio backend, run by the loop under test.

anyio reaches the loop in its own ways: its TCP listener accepts with ``loop.sock_accept`` on a
raw socket, its Unix streams wait with ``loop.add_reader``/``add_writer`` and call the socket
directly, TLS runs ``ssl.MemoryBIO`` over a TCP stream, threads come back through
``call_soon_threadsafe``, and cancel scopes cancel tasks blocked in any of these.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import ferroloop
import pytest
from anyio.abc import ByteStream, Listener, SocketAttribute
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.tls import TLSAttribute, TLSListener

PAYLOAD = random.Random(11).randbytes(1024 * 1024)


async def upper_echo(stream: ByteStream) -> None:
    """Echo every chunk upper-cased until the peer's EOF, then close."""
    async with stream:
        async for chunk in stream:
            await stream.send(chunk.upper())


@asynccontextmanager
async def serving(listener: Listener[Any]) -> AsyncIterator[None]:
    """Serve ``upper_echo`` on ``listener`` for the duration of the block, then close it."""
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, upper_echo)
        yield
        tg.cancel_scope.cancel()


async def exchange(stream: ByteStream, payload: bytes) -> bytes:
    """Send ``payload`` while receiving as many bytes back (both directions at once)."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(stream.send, payload)
        received = await BufferedByteReceiveStream(stream).receive_exactly(len(payload))
    return received


async def send_all_then_read_to_eof(stream: ByteStream, payload: bytes) -> bytes:
    """Send ``payload``, half-close, and read everything the peer sends until its EOF."""
    chunks: list[bytes] = []

    async def read_to_eof() -> None:
        async for chunk in stream:
            chunks.append(chunk)

    async with anyio.create_task_group() as tg:
        tg.start_soon(read_to_eof)
        await stream.send(payload)
        await stream.send_eof()
    return b"".join(chunks)


def test_tcp_listener_and_connect_tcp(run) -> None:
    async def main() -> tuple[bytes, Any]:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(SocketAttribute.local_port)
        async with serving(listener), await anyio.connect_tcp("127.0.0.1", port) as stream:
            remote_port = stream.extra(SocketAttribute.remote_port)
            return await send_all_then_read_to_eof(stream, PAYLOAD), remote_port == port

    assert run(main()) == (PAYLOAD.upper(), True)


def test_unix_listener_and_connect_unix(run, tmp_path: Path) -> None:
    path = tmp_path / "anyio.sock"

    async def main() -> bytes:
        listener = await anyio.create_unix_listener(path)
        async with serving(listener), await anyio.connect_unix(path) as stream:
            return await send_all_then_read_to_eof(stream, PAYLOAD)

    assert run(main()) == PAYLOAD.upper()


def test_tls_streams(run, tls_server: ssl.SSLContext, tls_client: ssl.SSLContext) -> None:
    async def main() -> tuple[bytes, Any, Any]:
        tcp = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = tcp.extra(SocketAttribute.local_port)
        async with serving(TLSListener(tcp, tls_server)):
            stream = await anyio.connect_tcp(
                "127.0.0.1", port, ssl_context=tls_client, tls_hostname="localhost"
            )
            async with stream:
                echoed = await exchange(stream, PAYLOAD)
                certificate = stream.extra(TLSAttribute.peer_certificate)
                subject = dict(item[0] for item in certificate["subject"])
                return echoed, subject, stream.extra(TLSAttribute.tls_version)

    echoed, subject, version = run(main())
    assert echoed == PAYLOAD.upper()
    assert "organizationName" in subject
    assert version.startswith("TLSv1.")


def test_tls_handshake_refuses_an_untrusted_certificate(run, tls_server: ssl.SSLContext) -> None:
    async def main() -> None:
        tcp = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = tcp.extra(SocketAttribute.local_port)
        async with serving(TLSListener(tcp, tls_server)):
            with pytest.raises(ssl.SSLCertVerificationError):
                await anyio.connect_tcp("127.0.0.1", port, tls=True, tls_hostname="localhost")

    run(main())


REVERSE_STDIN = (
    "import sys; data = sys.stdin.buffer.read(); sys.stdout.buffer.write(data[::-1]); "
    "sys.stderr.write('%d bytes' % len(data)); sys.exit(7)"
)


def test_open_process_pipes(run) -> None:
    async def main() -> tuple[bytes, bytes, int | None]:
        async with await anyio.open_process([sys.executable, "-c", REVERSE_STDIN]) as process:
            assert process.stdin is not None
            assert process.stdout is not None
            assert process.stderr is not None
            async with anyio.create_task_group() as tg:
                out: list[bytes] = []
                err: list[bytes] = []

                async def collect(stream: Any, into: list[bytes]) -> None:
                    async for chunk in stream:
                        into.append(chunk)

                tg.start_soon(collect, process.stdout, out)
                tg.start_soon(collect, process.stderr, err)
                await process.stdin.send(PAYLOAD)
                await process.stdin.aclose()
            return b"".join(out), b"".join(err), await process.wait()

    assert run(main()) == (PAYLOAD[::-1], b"%d bytes" % len(PAYLOAD), 7)


def test_run_process(run) -> None:
    async def main() -> tuple[Any, Any, Any, int]:
        done = await anyio.run_process(
            [sys.executable, "-c", REVERSE_STDIN], input=b"abc", check=False
        )
        with pytest.raises(subprocess.CalledProcessError) as failed:
            await anyio.run_process([sys.executable, "-c", REVERSE_STDIN], input=b"xyz")
        return done.stdout, done.stderr, done.returncode, failed.value.returncode

    assert run(main()) == (b"cba", b"3 bytes", 7, 7)


def test_terminate_a_process_blocked_on_stdin(run) -> None:
    async def main() -> tuple[bytes, int]:
        command = [sys.executable, "-c", "print('ready', flush=True); input()"]
        async with await anyio.open_process(command) as process:
            assert process.stdout is not None
            ready = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 100)
            process.terminate()
            return ready, await process.wait()

    assert run(main()) == (b"ready", -signal.SIGTERM)


def test_write_to_a_process_that_exited_raises_broken_resource(run) -> None:
    async def main() -> int:
        async with await anyio.open_process([sys.executable, "-c", "pass"]) as process:
            assert process.stdin is not None
            returncode = await process.wait()
            with pytest.raises(anyio.BrokenResourceError):
                for _ in range(64):  # more than a pipe buffer holds
                    await process.stdin.send(b"x" * 65536)
            return returncode

    assert run(main()) == 0


def test_cancel_scope_cancels_a_receive_and_the_stream_stays_usable(run) -> None:
    async def main() -> tuple[bool, bytes]:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(SocketAttribute.local_port)
        async with serving(listener), await anyio.connect_tcp("127.0.0.1", port) as stream:
            with anyio.move_on_after(0.05) as scope:
                await stream.receive()  # nothing was sent: nothing comes back
            # The cancelled receive consumed nothing: the next exchange is whole.
            return scope.cancelled_caught, await exchange(stream, b"after the cancel")

    assert run(main()) == (True, b"AFTER THE CANCEL")


def test_failing_task_cancels_siblings_blocked_in_io(run, tmp_path: Path) -> None:
    cancelled: list[str] = []

    async def cancellable(name: str, blocking: Awaitable[Any]) -> None:
        try:
            await blocking
        except anyio.get_cancelled_exc_class():
            cancelled.append(name)
            raise

    async def fail() -> None:
        await anyio.sleep(0.05)
        raise LookupError("boom")

    async def main() -> bytes:
        unix = await anyio.create_unix_listener(tmp_path / "blocked.sock")
        tcp = (await anyio.create_tcp_listener(local_host="127.0.0.1")).listeners[0]
        async with unix, tcp:
            client = await anyio.connect_unix(tmp_path / "blocked.sock")
            async with client, await unix.accept() as server_side:
                with pytest.raises(ExceptionGroup) as group:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(cancellable, "receive", client.receive())
                        tg.start_soon(cancellable, "unix accept", unix.accept())
                        tg.start_soon(cancellable, "tcp accept", tcp.accept())
                        tg.start_soon(fail)
                assert [type(exc) for exc in group.value.exceptions] == [LookupError]
                # The cancelled receive left the stream usable.
                await server_side.send(b"still connected")
                return await BufferedByteReceiveStream(client).receive_exactly(15)

    assert run(main()) == b"still connected"
    assert sorted(cancelled) == ["receive", "tcp accept", "unix accept"]


def test_to_thread_and_back(run) -> None:
    async def on_loop(value: int) -> tuple[int, int]:
        return value * 2, threading.get_ident()

    def in_thread() -> tuple[int, int, int]:
        doubled, loop_thread = anyio.from_thread.run(on_loop, 21)
        return doubled, loop_thread, threading.get_ident()

    async def main() -> tuple[int, bool, bool]:
        doubled, loop_thread, worker = await anyio.to_thread.run_sync(in_thread)
        results = await gather_threads(10)
        return doubled, loop_thread == threading.get_ident() != worker, results == list(range(10))

    async def gather_threads(count: int) -> list[int]:
        results: list[int] = [-1] * count

        async def one(n: int) -> None:
            results[n] = await anyio.to_thread.run_sync(lambda: n)

        async with anyio.create_task_group() as tg:
            for n in range(count):
                tg.start_soon(one, n)
        return results

    assert run(main()) == (42, True, True)


def test_sleep_never_returns_early_and_wakes_in_order(run) -> None:
    """Measured on the loop's clock and on time.monotonic, no sleep ends before its delay."""
    delays = [0.06, 0.0, 0.03, 0.09, 0.01]

    async def main() -> tuple[list[float], list[float]]:
        order: list[float] = []
        shortfalls: list[float] = []

        async def sleeper(delay: float) -> None:
            loop_start, wall_start = anyio.current_time(), time.monotonic()
            await anyio.sleep(delay)
            shortfalls.append(delay - (anyio.current_time() - loop_start))
            shortfalls.append(delay - (time.monotonic() - wall_start))
            order.append(delay)

        async with anyio.create_task_group() as tg:
            for delay in delays:
                tg.start_soon(sleeper, delay)
        return order, shortfalls

    order, shortfalls = run(main())
    assert order == sorted(delays)
    # asyncio itself runs a timer due within its clock resolution (1 ns here); a microsecond
    # is far below any rounding of a timeout to the poller's milliseconds.
    assert max(shortfalls) <= 1e-6, shortfalls


def test_fail_after_raises_timeout(run) -> None:
    async def main() -> None:
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.02):
                await anyio.sleep_forever()

    run(main())


def test_fd_count_is_flat_after_streams_and_processes(run, tmp_path: Path) -> None:
    """The streams, listeners and processes above leave no descriptor open behind them."""

    async def cycle() -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(SocketAttribute.local_port)
        async with serving(listener), await anyio.connect_tcp("127.0.0.1", port) as stream:
            await exchange(stream, b"x")
        await anyio.run_process([sys.executable, "-c", "pass"])

    run(cycle())
    before = len(os.listdir("/proc/self/fd"))
    run(cycle())
    assert len(os.listdir("/proc/self/fd")) == before


def test_signal_receiver(run) -> None:
    """anyio hands signals to ``loop.add_signal_handler`` and takes them back on exit."""

    async def main() -> list[signal.Signals]:
        received: list[signal.Signals] = []
        with anyio.open_signal_receiver(signal.SIGUSR1, signal.SIGUSR2) as signals:
            os.kill(os.getpid(), signal.SIGUSR2)
            os.kill(os.getpid(), signal.SIGUSR1)
            async for signum in signals:
                received.append(signum)
                if len(received) == 2:
                    break
        return sorted(received)

    assert run(main()) == [signal.SIGUSR1, signal.SIGUSR2]


def test_udp_sockets(run) -> None:
    async def main() -> tuple[Any, Any]:
        async with (
            await anyio.create_udp_socket(local_host="127.0.0.1") as server,
            await anyio.create_connected_udp_socket(
                "127.0.0.1", server.extra(SocketAttribute.local_port)
            ) as client,
        ):
            await client.send(b"ping")
            data, address = await server.receive()
            await server.sendto(data.upper(), *address)
            return await client.receive(), address[1] == client.extra(SocketAttribute.local_port)

    assert run(main()) == (b"PING", True)


def test_unix_datagram_sockets(run, tmp_path: Path) -> None:
    server_path = tmp_path / "server.dgram"
    client_path = tmp_path / "client.dgram"

    async def main() -> tuple[bytes, bytes]:
        async with (
            await anyio.create_unix_datagram_socket(local_path=server_path) as server,
            await anyio.create_connected_unix_datagram_socket(
                server_path, local_path=client_path
            ) as client,
        ):
            await client.send(b"datagram")
            data, sender = await server.receive()
            await server.sendto(data[::-1], sender)
            return await client.receive(), str(sender).encode()

    assert run(main()) == (b"margatad", str(client_path).encode())


def test_connect_tcp_to_localhost_falls_back_across_addresses(run) -> None:
    """'localhost' resolves to ::1 and 127.0.0.1; only the latter listens (happy eyeballs)."""

    async def main() -> Any:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(SocketAttribute.local_port)
        async with serving(listener), await anyio.connect_tcp("localhost", port) as stream:
            return await exchange(stream, b"via localhost"), stream.extra(
                SocketAttribute.remote_address
            )[0]

    assert run(main()) == (b"VIA LOCALHOST", "127.0.0.1")


def test_connect_refused(run, refused_address: tuple[str, int], tmp_path: Path) -> None:
    host, port = refused_address

    async def main() -> tuple[str, Any]:
        with pytest.raises(OSError) as tcp:
            await anyio.connect_tcp(host, port)
        with pytest.raises(FileNotFoundError):
            await anyio.connect_unix(tmp_path / "nobody.sock")
        return str(tcp.value), type(tcp.value.__cause__)

    assert run(main()) == ("All connection attempts failed", ConnectionRefusedError)


def test_getaddrinfo_and_getnameinfo(run) -> None:
    async def main() -> tuple[Any, Any]:
        infos = await anyio.getaddrinfo("127.0.0.1", 80, type=socket.SOCK_STREAM)
        name = await anyio.getnameinfo(("127.0.0.1", 80), socket.NI_NUMERICHOST)
        return [info[4] for info in infos], name

    assert run(main()) == ([("127.0.0.1", 80)], ("127.0.0.1", "http"))


def test_wait_readable_on_a_raw_socket(run) -> None:
    async def main() -> bytes:
        left, right = socket.socketpair()
        with left, right:
            left.setblocking(False)
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.wait_readable, left)
                await anyio.sleep(0)
                right.send(b"ready")
            return left.recv(100)

    assert run(main()) == b"ready"


def test_send_and_receive_file_descriptors(run, tmp_path: Path) -> None:
    path = tmp_path / "fds.sock"
    shared = tmp_path / "shared.txt"
    shared.write_bytes(b"read through a passed descriptor")

    async def main() -> tuple[bytes, bytes]:
        async with await anyio.create_unix_listener(path) as listener:
            client = await anyio.connect_unix(path)
            async with client, await listener.accept() as server_side:
                with shared.open("rb") as file:
                    await client.send_fds(b"here", [file])
                message, fds = await server_side.receive_fds(4, 1)
                with os.fdopen(fds[0], "rb") as received:
                    return message, received.read()

    assert run(main()) == (b"here", shared.read_bytes())


def _square(n: int) -> tuple[int, int]:
    return n * n, os.getpid()


def test_to_process_run_sync(run) -> None:
    async def main() -> tuple[int, bool]:
        square, pid = await anyio.to_process.run_sync(_square, 12)
        return square, pid != os.getpid()

    async def end_like_asyncio_run() -> list[str]:
        # asyncio.run cancels the tasks left when its main coroutine returns; anyio's worker
        # pool waits for exactly that to shut its processes down.
        left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        return [task.get_name() for task in left]

    assert run(main()) == (144, True)
    assert run(end_like_asyncio_run()) == ["AnyIO process pool shutdown task"]


LOOP_CLASSES = {"asyncio": asyncio.SelectorEventLoop, "ferroloop": ferroloop.Loop}


def recording_factory(loop_factory: Any, contexts: list[dict[str, Any]]) -> Any:
    """``loop_factory`` whose loops record their exception-handler calls into ``contexts``."""

    def factory() -> asyncio.AbstractEventLoop:
        new_loop = loop_factory()
        new_loop.set_exception_handler(lambda _, context: contexts.append(context))
        return new_loop

    return factory


async def loop_and_echo() -> tuple[asyncio.AbstractEventLoop, bytes, str]:
    """The running loop, a TCP exchange through anyio and a worker thread's name."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(SocketAttribute.local_port)
    async with serving(listener), await anyio.connect_tcp("127.0.0.1", port) as stream:
        echoed = await exchange(stream, b"run")
    thread = await anyio.to_thread.run_sync(lambda: threading.current_thread().name)
    return asyncio.get_running_loop(), echoed, thread


def test_anyio_run_with_the_loop_factory(loop_factory, loop_name: str) -> None:
    """``anyio.run`` builds its own loop (asyncio.Runner) from ``loop_factory``."""
    contexts: list[dict[str, Any]] = []
    options = {"loop_factory": recording_factory(loop_factory, contexts)}
    used, echoed, thread = anyio.run(loop_and_echo, backend="asyncio", backend_options=options)
    assert type(used) is LOOP_CLASSES[loop_name]
    assert used.is_closed()
    assert (echoed, thread) == (b"RUN", "AnyIO worker thread")
    assert contexts == []


def test_blocking_portal_runs_the_loop_in_another_thread(loop_factory, loop_name: str) -> None:
    contexts: list[dict[str, Any]] = []
    options = {"loop_factory": recording_factory(loop_factory, contexts)}
    with anyio.from_thread.start_blocking_portal(backend_options=options) as portal:
        used, echoed, _ = portal.call(loop_and_echo)
        loop_thread = portal.call(threading.get_ident)
    assert type(used) is LOOP_CLASSES[loop_name]
    assert echoed == b"RUN"
    assert loop_thread != threading.get_ident()
    assert contexts == []
