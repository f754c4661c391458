"""Lifespan: --lifespan on|off|auto, startup/shutdown, state, and a failing startup."""

from __future__ import annotations

import json

import pytest


def marker_env(tmp_path):
    return {"FERROLOOP_TEST_MARKER_DIR": str(tmp_path)}


def test_startup_and_shutdown_run_with_lifespan_on(spawn_server, connect, tmp_path):
    server = spawn_server("raw_asgi:app", "--lifespan", "on", env=marker_env(tmp_path))
    response = connect(server).request("GET", "/scope")
    assert response.status == 200
    # No request is served before startup completed.
    assert (tmp_path / "startup").exists()
    assert json.loads(response.body)["state"]["token"] == "lifespan-state-ok"
    assert not (tmp_path / "shutdown").exists()
    assert server.check_stopped_cleanly() is None
    assert (tmp_path / "shutdown").exists()


def test_lifespan_off_never_calls_the_app_with_a_lifespan_scope(spawn_server, connect, tmp_path):
    server = spawn_server("raw_asgi:app", "--lifespan", "off", env=marker_env(tmp_path))
    response = connect(server).request("GET", "/scope")
    assert response.status == 200
    assert "token" not in json.loads(response.body).get("state", {})
    assert server.check_stopped_cleanly() is None
    assert not (tmp_path / "startup").exists()
    assert not (tmp_path / "shutdown").exists()


def test_lifespan_auto_serves_an_app_without_lifespan_support(spawn_server, connect):
    server = spawn_server("raw_asgi:no_lifespan_app")
    assert connect(server).request("GET", "/hello").body == b"hello, world"


def test_lifespan_auto_runs_startup_of_an_app_that_supports_it(spawn_server, connect, tmp_path):
    server = spawn_server("raw_asgi:app", env=marker_env(tmp_path))
    assert connect(server).request("GET", "/hello").status == 200
    assert (tmp_path / "startup").exists()


@pytest.mark.parametrize("app_ref", ["raw_asgi:failing_startup_app", "raw_asgi:no_lifespan_app"])
def test_failed_startup_with_lifespan_on_exits_nonzero(spawn_server, app_ref):
    server = spawn_server(app_ref, "--lifespan", "on", wait=False)
    code = server.wait_exit(15)
    assert code != 0, server.describe()
    assert server.try_connect() is None
