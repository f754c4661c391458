"""Server.serve() against a fake HttpServer: binding, start-up, the tick, graceful shutdown."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import socket
import stat

import ferroloop
import pytest
from ferroloop.server.config import STARTUP_FAILURE, Config
from ferroloop.server.server import Server, native_http_server_class
from ferroloop.server.sockets import create_sockets, describe_listeners


@pytest.fixture(autouse=True)
def _info_logs(caplog):
    caplog.set_level(logging.INFO, logger="ferroloop")


state_seen = {}


async def lifespan_app(scope, receive, send):
    if scope["type"] != "lifespan":
        return
    await receive()
    scope["state"]["ready"] = True
    await send({"type": "lifespan.startup.complete"})
    await receive()
    state_seen["shutdown"] = True
    await send({"type": "lifespan.shutdown.complete"})


def make_server(fake, **kwargs) -> Server:
    kwargs.setdefault("port", 0)
    kwargs.setdefault("log_config", None)
    kwargs.setdefault("lifespan", "on")
    server = Server(Config(lifespan_app, **kwargs))
    server.http_server_class = fake
    return server


def drive(server: Server, during=None, sockets=None) -> None:
    """Runs serve() on ferroloop; once started, awaits ``during(server)`` (default: nothing),
    then asks for exit unless ``during`` already did."""

    async def main():
        task = asyncio.ensure_future(server.serve(sockets=sockets))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if during is not None and not task.done():
            await during(server)
        server.should_exit = True
        await task

    ferroloop.run(main())


def test_serve_starts_one_http_server_per_socket_and_shuts_down_in_order(fake_http_server, caplog):
    state_seen.clear()
    handlers_before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = make_server(fake_http_server, root_path="/x", access_log=False)
    drive(server)
    (srv,) = fake_http_server.instances
    assert isinstance(srv.loop, ferroloop.Loop)
    assert srv.app is server.config.loaded_app
    assert srv.options["state"] == {"ready": True}
    assert srv.options["root_path"] == "/x"
    assert srv.options["access_log"] is None  # access log off: the native side skips the call
    assert callable(srv.options["log_error"])
    assert srv.calls == ["start", "close", "shutdown", "abort"]
    assert srv.sock.fileno() == -1  # the listening socket was closed
    assert state_seen == {"shutdown": True}
    text = caplog.text
    assert "Started server process" in text
    assert "ferroloop running on http://127.0.0.1:" in text
    assert text.index("Application startup complete.") < text.index("ferroloop running on")
    assert "Shutting down" in text and "Finished server process" in text
    assert {sig: signal.getsignal(sig) for sig in handlers_before} == handlers_before


def test_access_log_callback_is_passed_when_logging(fake_http_server):
    logging.getLogger("ferroloop.access").setLevel(logging.INFO)
    server = make_server(fake_http_server, access_log=True)
    drive(server)
    assert callable(fake_http_server.instances[0].options["access_log"])


def test_limit_max_requests_stops_the_server(fake_http_server, caplog):
    server = make_server(fake_http_server, limit_max_requests=10)

    async def main():
        task = asyncio.ensure_future(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        fake_http_server.instances[0].requests = 10
        await asyncio.wait_for(task, 5)

    ferroloop.run(main())
    assert "Maximum request limit of 10 exceeded. Terminating process." in caplog.text
    assert fake_http_server.instances[0].calls == ["start", "close", "shutdown", "abort"]


def test_busy_connections_are_awaited(fake_http_server, caplog):
    server = make_server(fake_http_server)

    async def during(server):
        srv = fake_http_server.instances[0]
        srv.connections, srv.busy_for = 2, 3

    drive(server, during)
    assert "Waiting for connections to close. (CTRL+C to force quit)" in caplog.text
    assert "graceful shutdown exceeded" not in caplog.text
    assert state_seen.get("shutdown")


def test_background_tasks_are_awaited_after_connections(fake_http_server, caplog):
    server = make_server(fake_http_server)

    async def during(server):
        srv = fake_http_server.instances[0]
        srv.tasks, srv.busy_for = 1, 2  # no connection left, one app task still running

    drive(server, during)
    assert "Waiting for background tasks to complete. (CTRL+C to force quit)" in caplog.text
    assert "Waiting for connections to close" not in caplog.text
    assert "graceful shutdown exceeded" not in caplog.text


def test_graceful_shutdown_timeout_aborts(fake_http_server, caplog):
    server = make_server(fake_http_server, timeout_graceful_shutdown=0.3)

    async def during(server):
        srv = fake_http_server.instances[0]
        srv.connections, srv.busy_for = 1, None  # never finishes by itself

    drive(server, during)
    assert "Closing 1 connection(s): graceful shutdown exceeded" in caplog.text
    assert fake_http_server.instances[0].calls[-1] == "abort"


def test_force_exit_skips_waiting_and_lifespan_shutdown(fake_http_server, caplog):
    state_seen.clear()
    server = make_server(fake_http_server)

    async def during(server):
        srv = fake_http_server.instances[0]
        srv.connections, srv.busy_for = 1, None
        # What two SIGINTs do (handle_exit itself would re-raise them when serve() ends).
        server.should_exit = server.force_exit = True

    drive(server, during)
    assert server.force_exit
    assert fake_http_server.instances[0].calls == ["start", "close", "shutdown", "abort"]
    assert "shutdown" not in state_seen
    assert "Waiting for application shutdown." not in caplog.text


def test_signal_rules():
    server = Server(Config("m:app", log_config=None))
    server.handle_exit(signal.SIGTERM)
    assert server.should_exit and not server.force_exit
    server.handle_exit(signal.SIGTERM)
    assert not server.force_exit  # a repeated SIGTERM does not force
    server.handle_exit(signal.SIGINT)
    assert server.force_exit


def test_lifespan_failure_exits_3_without_serving(fake_http_server, caplog):
    async def failing(scope, receive, send):
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "nope"})

    server = Server(Config(failing, port=0, log_config=None))
    server.http_server_class = fake_http_server
    with pytest.raises(SystemExit) as info:
        ferroloop.run(server.serve())
    assert info.value.code == STARTUP_FAILURE
    assert fake_http_server.instances == []
    assert not server.started


@pytest.mark.parametrize("blocking", [False, True])
def test_given_sockets_are_used_non_blocking_and_not_announced(fake_http_server, caplog, blocking):
    """A blocking listener is made non-blocking (as asyncio's ``create_server(sock=...)`` does):
    the native accept would otherwise block the whole loop in ``accept()``."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(blocking)
    server = make_server(fake_http_server)
    drive(server, sockets=[sock])
    assert fake_http_server.instances[0].sock is sock
    assert not sock.getblocking()
    assert sock.fileno() == -1
    assert "ferroloop running on" not in caplog.text


def test_port_in_use_exits_3(fake_http_server, caplog):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        server = make_server(fake_http_server, port=holder.getsockname()[1])
        with pytest.raises(SystemExit) as info:
            ferroloop.run(server.serve())
        assert info.value.code == STARTUP_FAILURE
        assert "Address already in use" in caplog.text
    finally:
        holder.close()


def test_unix_socket_is_created_world_writable_and_removed(fake_http_server, tmp_path, caplog):
    path = str(tmp_path / "s.sock")
    seen_mode = []

    async def during(server):
        seen_mode.append(stat.S_IMODE(os.stat(path).st_mode))

    drive(make_server(fake_http_server, uds=path), during)
    assert seen_mode == [0o666]
    assert not os.path.exists(path)
    assert f"ferroloop running on unix socket {path}" in caplog.text


def test_stale_unix_socket_is_replaced_and_a_live_one_refused(tmp_path):
    path = str(tmp_path / "s.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()  # the file stays: a stale socket
    config = Config("m:app", uds=path, log_config=None)
    (sock,) = create_sockets(config)
    try:
        with pytest.raises(OSError, match="in use"):
            create_sockets(config)  # a live server answers on it
    finally:
        sock.close()
    regular = tmp_path / "file"
    regular.write_text("")
    with pytest.raises(OSError, match="not a socket"):
        create_sockets(Config("m:app", uds=str(regular), log_config=None))


def test_fd_socket(fake_http_server):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    config = Config("m:app", fd=listener.fileno(), log_config=None)
    (sock,) = create_sockets(config)
    try:
        assert sock.family == socket.AF_INET
        assert sock.getsockname() == listener.getsockname()
        assert sock.fileno() != listener.fileno()
        message, args = describe_listeners(config, [sock])
        assert "running on socket" in message and args == [sock.getsockname()]
    finally:
        sock.close()
        listener.close()


def test_describe_ipv6_and_any_host():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        port = sock.getsockname()[1]
        _, args = describe_listeners(Config("m:app", host="::1", port=0, log_config=None), [sock])
        assert args == ["http", "[::1]", port]
        _, args = describe_listeners(Config("m:app", host="", port=80, log_config=None), [sock])
        assert args == ["http", "0.0.0.0", 80]
    finally:
        sock.close()


def test_reuse_port_option(tmp_path):
    config = Config("m:app", port=0, reuse_port=True, log_config=None)
    (sock,) = create_sockets(config)
    try:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
        assert sock.getblocking() is False and sock.get_inheritable()
    finally:
        sock.close()


def test_serve_refuses_a_non_ferroloop_loop(fake_http_server):
    server = make_server(fake_http_server)
    with pytest.raises(RuntimeError, match="runs on a ferroloop loop"):
        asyncio.run(server.serve())


def test_native_class_or_a_clear_error():
    from ferroloop import _native

    if hasattr(_native, "HttpServer"):
        assert native_http_server_class() is _native.HttpServer
    else:
        with pytest.raises(RuntimeError, match="no native HTTP server"):
            native_http_server_class()


def test_callback_notify_is_awaited_at_start_and_every_timeout_notify(fake_http_server):
    calls = []

    async def notify():
        calls.append(asyncio.get_running_loop().time())
        await asyncio.sleep(0)

    server = make_server(fake_http_server, callback_notify=notify, timeout_notify=0.25)

    async def during(server):
        deadline = asyncio.get_running_loop().time() + 10
        while len(calls) < 3 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)

    drive(server, during)
    assert len(calls) >= 3
    gaps = [later - earlier for earlier, later in itertools.pairwise(calls)]
    # Never sooner than timeout_notify (the tick is 0.1 s, so at most that much later); the
    # tolerance is for the clock read inside the callback, after the server's own.
    assert all(gap >= 0.24 for gap in gaps), gaps


def test_callback_notify_that_raises_stops_the_server_with_its_error(fake_http_server):
    async def notify():
        raise RuntimeError("process manager gone")

    server = make_server(fake_http_server, callback_notify=notify)
    with pytest.raises(RuntimeError, match="process manager gone"):
        drive(server)
    (srv,) = fake_http_server.instances
    assert "abort" in srv.calls  # the listeners and connections were still cleaned up


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout_notify": 0}, "timeout_notify must be more than zero"),
        ({"timeout_notify": -1}, "timeout_notify must be more than zero"),
        ({"callback_notify": "not callable"}, "callback_notify must be callable"),
    ],
)
def test_bad_notify_options_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Config(lifespan_app, **kwargs)
