"""The lifespan protocol with fake apps, on ferroloop's loop and on asyncio's."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import ferroloop
import pytest
from ferroloop.server.lifespan import Lifespan


@pytest.fixture(params=["ferroloop", "asyncio"])
def run(request):
    if request.param == "ferroloop":
        return ferroloop.run
    return asyncio.run


@pytest.fixture(autouse=True)
def _info_logs(caplog):
    caplog.set_level(logging.INFO, logger="ferroloop.error")


def run_both(run, lifespan: Lifespan) -> None:
    async def main():
        await lifespan.startup()
        if not lifespan.should_exit:
            await lifespan.shutdown()

    run(main())


async def complete_app(scope, receive, send):
    assert scope["type"] == "lifespan"
    message = await receive()
    assert message["type"] == "lifespan.startup"
    scope["state"]["db"] = "connected"
    await send({"type": "lifespan.startup.complete"})
    message = await receive()
    assert message["type"] == "lifespan.shutdown"
    await send({"type": "lifespan.shutdown.complete"})


def test_startup_and_shutdown_complete(run, caplog):
    lifespan = Lifespan(complete_app, "auto")
    run_both(run, lifespan)
    assert not lifespan.should_exit
    assert lifespan.state == {"db": "connected"}
    for text in (
        "Waiting for application startup.",
        "Application startup complete.",
        "Waiting for application shutdown.",
        "Application shutdown complete.",
    ):
        assert text in caplog.text


def test_scope_has_asgi_version_and_state(run):
    scopes = []

    async def app(scope, receive, send):
        scopes.append(scope)
        await receive()
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await send({"type": "lifespan.shutdown.complete"})

    lifespan = Lifespan(app, "on", asgi_version="2.0")
    run_both(run, lifespan)
    assert scopes[0]["asgi"] == {"version": "2.0", "spec_version": "2.0"}
    assert scopes[0]["state"] is lifespan.state


def test_off_never_calls_the_app(run):
    async def app(scope, receive, send):
        raise AssertionError("called")

    lifespan = Lifespan(app, "off")
    run_both(run, lifespan)
    assert not lifespan.should_exit


def test_auto_app_raising_before_receive_is_unsupported(run, caplog):
    async def http_only(scope, receive, send):
        assert scope["type"] == "http"

    lifespan = Lifespan(http_only, "auto")
    run_both(run, lifespan)
    assert not lifespan.should_exit
    assert "ASGI 'lifespan' protocol appears unsupported." in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "Waiting for application shutdown." not in caplog.text


def test_auto_app_raising_after_receive_logs_the_traceback_and_starts(run, caplog):
    async def broken(scope, receive, send):
        await receive()
        raise ValueError("database unreachable")

    lifespan = Lifespan(broken, "auto")
    run_both(run, lifespan)
    assert not lifespan.should_exit
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and "Exception in 'lifespan' protocol" in errors[0].getMessage()
    assert "database unreachable" in caplog.text


def test_on_app_raising_aborts_startup(run, caplog):
    async def http_only(scope, receive, send):
        assert scope["type"] == "http"

    lifespan = Lifespan(http_only, "on")
    run_both(run, lifespan)
    assert lifespan.should_exit
    assert "Application startup failed. Exiting." in caplog.text
    assert "Exception in 'lifespan' protocol" in caplog.text


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_startup_failed_aborts_in_every_mode(run, caplog, mode):
    async def app(scope, receive, send):
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no config file"})

    lifespan = Lifespan(app, mode)
    run_both(run, lifespan)
    assert lifespan.should_exit
    assert "no config file" in caplog.text
    assert "Application startup failed. Exiting." in caplog.text


def test_shutdown_failed_is_reported(run, caplog):
    async def app(scope, receive, send):
        await receive()
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await send({"type": "lifespan.shutdown.failed", "message": "flush failed"})

    lifespan = Lifespan(app, "auto")
    run_both(run, lifespan)
    assert lifespan.should_exit
    assert "flush failed" in caplog.text
    assert "Application shutdown failed. Exiting." in caplog.text


def test_out_of_order_message_raises_in_the_app(run, caplog):
    errors = []

    async def app(scope, receive, send):
        await receive()
        try:
            await send({"type": "lifespan.shutdown.complete"})
        except RuntimeError as exc:
            errors.append(str(exc))
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await send({"type": "lifespan.shutdown.complete"})

    lifespan = Lifespan(app, "on")
    run_both(run, lifespan)
    assert not lifespan.should_exit
    assert errors and "before startup" in errors[0]


def test_app_returning_without_answering_does_not_hang(run, caplog):
    async def app(scope, receive, send):
        await receive()

    lifespan = Lifespan(app, "on")
    run_both(run, lifespan)
    assert lifespan.should_exit


def test_starlette_lifespan_state(run):
    starlette = pytest.importorskip("starlette.applications")

    @contextlib.asynccontextmanager
    async def lifespan_context(app):
        yield {"answer": 42}

    app = starlette.Starlette(lifespan=lifespan_context)
    lifespan = Lifespan(app, "on")
    run_both(run, lifespan)
    assert not lifespan.should_exit
    assert lifespan.state == {"answer": 42}


def test_bad_mode_is_rejected():
    with pytest.raises(ValueError, match="lifespan must be"):
        Lifespan(complete_app, "sometimes")  # type: ignore[arg-type]
