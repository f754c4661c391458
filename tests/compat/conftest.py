"""Fixtures for the compatibility tests: real asyncio libraries, unchanged, on both loops.

The ``loop``/``run`` fixtures of tests/conftest.py do the rest: each test runs once on asyncio's
loop and once on ferroloop, every await is bounded by ``run``'s timeout, and a call of the
loop's exception handler that the test did not expect fails it.

TLS material is made at test time with ``trustme``: one throwaway CA per session and a
certificate for ``localhost`` and ``127.0.0.1`` signed by it. ``serve_app`` serves an
``aiohttp.web`` application on the loop under test, for aiohttp's own client and for others.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiohttp import web


@pytest.fixture(scope="session")
def certificate_authority() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_server(certificate_authority: trustme.CA) -> ssl.SSLContext:
    """A server context presenting a certificate for localhost and 127.0.0.1."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    certificate_authority.issue_cert("localhost", "127.0.0.1").configure_cert(context)
    return context


@pytest.fixture
def tls_client(certificate_authority: trustme.CA) -> ssl.SSLContext:
    """A client context that trusts the session's CA (and checks the host name)."""
    context = ssl.create_default_context()
    certificate_authority.configure_trust(context)
    return context


ServeApp = Callable[..., Coroutine[Any, Any, str]]

# A handler left waiting at the end of a test gets this long to finish at cleanup.
SHUTDOWN_TIMEOUT = 1.0


@pytest.fixture
def serve_app(loop) -> Iterator[ServeApp]:
    """``await serve_app(app, ssl_context=None, unix_path=None, **runner_kwargs)`` -> base URL.

    Serves ``app`` on 127.0.0.1 (an ephemeral port) or on a Unix socket; every runner is
    cleaned up at teardown.
    """
    runners: list[web.AppRunner] = []

    async def serve(
        app: web.Application,
        *,
        ssl_context: ssl.SSLContext | None = None,
        unix_path: Path | None = None,
        **runner_kwargs: Any,
    ) -> str:
        runner = web.AppRunner(app, shutdown_timeout=SHUTDOWN_TIMEOUT, **runner_kwargs)
        await runner.setup()
        runners.append(runner)
        if unix_path is not None:
            await web.UnixSite(runner, str(unix_path)).start()
            return "http://localhost"
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
        host, port = runner.addresses[0][:2]
        return f"{'https' if ssl_context else 'http'}://{host}:{port}"

    yield serve

    async def cleanup() -> None:
        async with asyncio.timeout(10):
            for runner in runners:
                await runner.cleanup()

    loop.run_until_complete(cleanup())
