"""Shared fixtures: asyncio's own loop is the oracle, ferroloop must behave the same.

Every test that takes the ``loop`` (or ``loop_factory``) fixture runs twice: once on
``asyncio.new_event_loop()`` and once on ``ferroloop.new_event_loop()`` (uvloop's
``_testbase.py`` does the same with ``UVTestCase`` / ``AIOTestCase``).

The ``loop`` fixture installs an exception handler that records every call. A test
fails if the handler was called and the test did not consume the calls through the
``exception_handler_calls`` fixture, so a callback that blows up silently inside the
loop cannot make a test pass by accident.

A divergence of ferroloop from asyncio is marked on the test with
``@pytest.mark.ferroloop_xfail(reason=..., raises=...)``: it becomes a strict xfail for
the ferroloop parameter only (``raises`` pins the expected failure), and keeps running
(and must pass) on asyncio. ``@pytest.mark.native_task_xfail(reason=..., raises=...,
loop=None)`` does the same for the ferroloop.Task parameter of the native Task tests
(``task_kind``, tests/loop/conftest.py), on both loops or only on the one named by ``loop``.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

LoopFactory = Callable[[], asyncio.AbstractEventLoop]

# A process started in the background by a non-interactive shell (`make test &`) inherits SIGINT
# ignored, Python leaves it ignored, and so do the servers and workers the tests spawn (an
# ignored signal stays ignored across exec): Ctrl-C and SIGINT-shutdown tests would then hang.
# The tests assume Python's usual KeyboardInterrupt handler; a handled signal is reset to the
# default in children, so they get theirs too.
signal.signal(signal.SIGINT, signal.default_int_handler)

# Upper bound for one test's coroutine under ``run``; far above what any test needs on loopback.
RUN_TIMEOUT = 10.0


def _new_ferroloop() -> asyncio.AbstractEventLoop:
    import ferroloop

    return ferroloop.new_event_loop()


LOOP_FACTORIES: dict[str, LoopFactory] = {
    "asyncio": asyncio.new_event_loop,
    "ferroloop": _new_ferroloop,
}


class ExceptionHandlerCalls:
    """An exception handler that records the context of every call."""

    def __init__(self) -> None:
        self._contexts: list[dict[str, Any]] = []

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self._contexts.append(context)

    def consume(self) -> list[dict[str, Any]]:
        """Return the contexts recorded so far and forget them (they are expected)."""
        contexts, self._contexts = self._contexts, []
        return contexts

    def unexpected(self) -> str | None:
        """Describe the calls nobody consumed, or None if there are none."""
        if not self._contexts:
            return None
        lines = [f"{len(self._contexts)} unexpected call(s) of the loop's exception handler:"]
        lines += [f"  {context!r}" for context in self._contexts]
        return "\n".join(lines)


_CALLS_KEY = pytest.StashKey[ExceptionHandlerCalls]()

# Signals a loop may take over through add_signal_handler; close() must give them back.
_WATCHED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def _signal_state() -> dict[object, object]:
    state: dict[object, object] = {sig: signal.getsignal(sig) for sig in _WATCHED_SIGNALS}
    wakeup_fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup_fd)
    state["wakeup_fd"] = wakeup_fd
    return state


def _restore_signal_state(state: dict[object, object]) -> None:
    for sig in _WATCHED_SIGNALS:
        signal.signal(sig, state[sig])
    signal.set_wakeup_fd(state["wakeup_fd"])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "ferroloop_xfail(reason, raises=None): a known divergence of ferroloop from asyncio; "
        "strict xfail on the ferroloop parameter only",
    )
    config.addinivalue_line(
        "markers",
        "cpython_loan(name): tests the fast path of a CPython loan (crates/py/src/"
        "cpython_loans.rs); skipped, with the reason, where that loan is not used "
        "(FERROLOOP_PORTABLE=1, or its check failed on this Python)",
    )
    config.addinivalue_line(
        "markers",
        "native_task_xfail(reason, raises=None, loop=None): a known divergence of ferroloop.Task "
        "from asyncio's Task; strict xfail on the ferroloop.Task parameter only (and only on "
        "the loop named by loop, if given)",
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    # The loop fixture runs a full gc.collect() at every teardown. Moving the objects
    # of pytest and of the imported test modules to the permanent generation keeps
    # that collection cheap (milliseconds instead of a tenth of a second).
    gc.collect()
    gc.freeze()


def _strict_xfail(marker: pytest.Mark, what: str) -> pytest.MarkDecorator:
    reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
    return pytest.mark.xfail(
        strict=True, reason=f"{what} divergence: {reason}", raises=marker.kwargs.get("raises")
    )


def loan_status(name: str) -> str:
    """What ferroloop decided for the CPython loan ``name`` at import ("used", "forced",
    "not needed" or "fallback: <why>"); ``task_registry`` is decided on the Python side."""
    from ferroloop import _native

    if name == "task_registry":
        from ferroloop import _task_registry

        return "used" if _task_registry.install() else "not installed"
    return _native.CPYTHON_LOANS.get(name, "unknown loan")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for marker in item.iter_markers("cpython_loan"):
            name = marker.args[0]
            status = loan_status(name)
            if status != "used":
                item.add_marker(
                    pytest.mark.skip(reason=f"the fast path of the CPython loan {name}: {status}")
                )
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            continue
        params = callspec.params
        if params.get("task_kind") == "ferroloop.Task" and loan_status("task_layout") != "used":
            # ferroloop.Task is asyncio.Task itself here: the asyncio.Task parameter runs it.
            status = loan_status("task_layout")
            item.add_marker(pytest.mark.skip(reason=f"ferroloop.Task is asyncio.Task: {status}"))
            continue
        marker = item.get_closest_marker("ferroloop_xfail")
        if marker is not None and params.get("loop_factory") == "ferroloop":
            item.add_marker(_strict_xfail(marker, "ferroloop"))
        marker = item.get_closest_marker("native_task_xfail")
        if marker is not None and params.get("task_kind") == "ferroloop.Task":
            only_on = marker.kwargs.get("loop")
            if only_on is None or params.get("loop_factory") == only_on:
                item.add_marker(_strict_xfail(marker, "ferroloop.Task"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    # Fail the test itself (not its teardown) when the handler was called while it ran.
    result = yield
    calls = item.stash.get(_CALLS_KEY, None)
    if calls is not None and (message := calls.unexpected()) is not None:
        calls.consume()
        pytest.fail(message, pytrace=False)
    return result


@pytest.fixture(params=list(LOOP_FACTORIES))
def loop_factory(request: pytest.FixtureRequest) -> LoopFactory:
    """A function that creates a new event loop: asyncio's, then ferroloop's."""
    return LOOP_FACTORIES[request.param]


@pytest.fixture
def loop_name(request: pytest.FixtureRequest, loop_factory: LoopFactory) -> str:
    """The id of the current loop parameter: 'asyncio' or 'ferroloop'."""
    return request.node.callspec.params["loop_factory"]


@pytest.fixture
def exception_handler_calls(request: pytest.FixtureRequest) -> ExceptionHandlerCalls:
    """The recorder installed as the exception handler of ``loop``."""
    request.getfixturevalue("loop")
    return request.node.stash[_CALLS_KEY]


@pytest.fixture
def loop(request: pytest.FixtureRequest, loop_factory: LoopFactory) -> Iterator[Any]:
    """A fresh loop with a recording exception handler; closed (cleanly) at teardown."""
    calls = ExceptionHandlerCalls()
    request.node.stash[_CALLS_KEY] = calls
    signals_before = _signal_state()
    new_loop = loop_factory()
    new_loop.set_exception_handler(calls)
    try:
        yield new_loop
    finally:
        assert not new_loop.is_running(), "the test left the loop running"
        if not new_loop.is_closed():
            new_loop.run_until_complete(new_loop.shutdown_asyncgens())
            new_loop.run_until_complete(new_loop.shutdown_default_executor())
            new_loop.close()
        assert new_loop.is_closed()
        # Pending tasks and futures with unretrieved exceptions report to the
        # exception handler when they are collected; make that happen now.
        gc.collect()
    signals_after = _signal_state()
    if signals_after != signals_before:
        # Put things back so that one broken test cannot break the ones after it.
        _restore_signal_state(signals_before)
        pytest.fail(
            f"closing the loop left signal state behind: {signals_before} -> {signals_after}",
            pytrace=False,
        )
    message = calls.unexpected()
    calls.consume()
    if message is not None:
        pytest.fail(message, pytrace=False)


@pytest.fixture
def run(loop) -> Callable[..., Any]:
    """``run(coroutine)``: run it on ``loop`` to completion, at most RUN_TIMEOUT seconds."""

    def run(coroutine: Coroutine[Any, Any, Any], timeout: float = RUN_TIMEOUT) -> Any:
        async def bounded() -> Any:
            async with asyncio.timeout(timeout):
                return await coroutine

        return loop.run_until_complete(bounded())

    return run


@pytest.fixture
def refused_address() -> tuple[str, int]:
    """A 127.0.0.1 address nobody listens on (a port bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()
