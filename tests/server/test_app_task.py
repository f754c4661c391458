"""How the server drives the app: each request in its own task with its own context, also when
requests arrive pipelined or many connections are ready at once.

ferroloop starts every app task in a fresh copy of the server's context, so nothing one request
sets is seen by the next one on its connection. Its app tasks are ``ferroloop.Task``s unless
``--app-task asyncio`` asks for asyncio's Task (uvicorn's).
"""

from __future__ import annotations

import json
import os

import pytest


@pytest.fixture(scope="module")
def server(serve):
    return serve("raw_asgi:app")


def _task_info(response):
    assert response.status == 200, response
    return json.loads(response.body)


TASK_TYPES = {"_asyncio.Task", "ferroloop._native.Task"}


def _check_fresh_task(info, value):
    first, after = info["first"], info["after"]
    assert first["task_type"] in TASK_TYPES
    assert first["done"] is False
    assert first["in_all_tasks"] is True
    assert first["coro_running"] is True
    assert first["var"] == "unset"  # nothing leaks from an earlier request's context
    assert after == {"same_task": True, "var": value}
    return first["name"]


def test_each_request_runs_in_its_own_task_and_context(server, connect):
    connection = connect(server)
    for value in ("a", "b", "c"):
        info = _task_info(connection.request("GET", f"/task-info?value={value}"))
        _check_fresh_task(info, value)


@pytest.mark.single_process(
    reason="request tasks are numbered per process; consecutive requests may reach "
    "different workers"
)
@pytest.mark.ferroloop_only(reason="the name ferroloop gives its request tasks")
def test_request_tasks_are_named_and_numbered(server, connect):
    connection = connect(server)
    names = [
        _check_fresh_task(_task_info(connection.request("GET", "/task-info?value=n")), "n")
        for _ in range(3)
    ]
    prefix = "ferroloop-request-"
    assert all(name.startswith(prefix) for name in names), names
    numbers = [int(name[len(prefix) :]) for name in names]
    assert numbers == sorted(numbers) and len(set(numbers)) == 3, names


@pytest.mark.ferroloop_only(
    reason="uvicorn starts a pipelined request's task from inside the previous request's task, "
    "so it inherits that request's context variables; ferroloop gives every request a fresh "
    "copy of the server's context"
)
def test_pipelined_requests_each_get_a_fresh_task_and_context(server, connect, request_bytes):
    connection = connect(server)
    values = [f"p{i}" for i in range(8)]
    connection.send(b"".join(request_bytes("GET", f"/task-info?value={v}") for v in values))
    for value in values:
        _check_fresh_task(_task_info(connection.read_response()), value)


def test_many_connections_ready_at_once(server, connect, request_bytes):
    connections = [connect(server) for _ in range(64)]
    for i, connection in enumerate(connections):
        connection.send(request_bytes("GET", f"/task-info?value=c{i}"))
    for i, connection in enumerate(connections):
        _check_fresh_task(_task_info(connection.read_response()), f"c{i}")


@pytest.mark.ferroloop_only(reason="the --app-task option")
@pytest.mark.parametrize(
    ("args", "task_type"),
    [
        pytest.param((), "ferroloop._native.Task", marks=pytest.mark.cpython_loan("task_layout")),
        (("--app-task", "asyncio"), "_asyncio.Task"),
    ],
)
def test_app_task_option_picks_the_task_type(serve, connect, args, task_type):
    connection = connect(serve("raw_asgi:app", *args))
    for value in ("x", "y"):
        info = _task_info(connection.request("GET", f"/task-info?value={value}"))
        _check_fresh_task(info, value)
        assert info["first"]["task_type"] == task_type


@pytest.mark.ferroloop_only(
    reason="how ferroloop orders the work of many ready requests; uvicorn creates every "
    "request's task as its bytes are parsed"
)
@pytest.mark.skipif(
    bool(os.environ.get("PYTHONASYNCIODEBUG")),
    reason="in debug mode the server starts each app during the read (docs/server.md)",
)
@pytest.mark.cpython_loan("task_layout")
def test_a_burst_of_ready_requests_does_not_wake_the_collector(
    spawn_server, connect, request_bytes, tmp_path, wait_until
):
    """400 requests found ready in one loop iteration are each started just before their app
    runs, so a request that finishes at once frees its scope, task and coroutine before the next
    one is built. If all 400 were built first, several thousand new container objects would be
    alive together and the collector's young generation (threshold 700) would run several times.
    """
    server = spawn_server("raw_asgi:app", env={"FERROLOOP_TEST_MARKER_DIR": str(tmp_path)})
    connections = [connect(server) for _ in range(400)]
    for connection in connections:  # every connection accepted and idle
        assert connection.request("GET", "/hello").status == 200
    control = connect(server)
    before = _task_info(control.request("GET", "/gc-counts"))

    release = tmp_path / "release"
    blocker = connect(server)
    blocker.send(request_bytes("GET", f"/block?release={release}"))
    wait_until((tmp_path / "blocking").exists, "the app that blocks the loop")
    for connection in connections:
        connection.send(request_bytes("GET", "/hello"))
    release.write_text("go")
    assert blocker.read_response().body == b"unblocked"
    for connection in connections:
        assert connection.read_response().body == b"hello, world"

    after = _task_info(control.request("GET", "/gc-counts"))
    assert after[0] - before[0] <= 1, (before, after)


def test_requests_see_the_context_the_server_started_in(server, connect):
    response = connect(server).request("GET", "/server-var")
    assert (response.status, response.body) == (200, b"set-at-import")


def test_reset_contextvars_runs_requests_in_an_empty_context(serve, connect):
    server = serve("raw_asgi:app", "--reset-contextvars")
    connection = connect(server)
    response = connection.request("GET", "/server-var")
    assert (response.status, response.body) == (200, b"unset")
    # Still one fresh context per request: nothing one request sets reaches the next.
    for value in ("a", "b"):
        _check_fresh_task(_task_info(connection.request("GET", f"/task-info?value={value}")), value)
