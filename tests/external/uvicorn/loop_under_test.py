"""pytest plugin: run uvicorn's test suite on the loop under test, and prove it did.

Loaded into uvicorn's own pytest run by ``run.py`` as ``-p loop_under_test`` (this directory
on ``PYTHONPATH``), with ``--loop-under-test=asyncio`` for the reference run or
``--loop-under-test=ferroloop``. It changes nothing in uvicorn's files. It:

1. overrides uvicorn's ``anyio_backend`` fixture (``tests/conftest.py`` returns ``"asyncio"``)
   with ``("asyncio", {"loop_factory": factory})``, so anyio's pytest plugin runs every
   ``@pytest.mark.anyio`` test and its async fixtures in an ``asyncio.Runner`` whose loop
   comes from ``factory``. The reference run passes a factory too (asyncio's
   ``SelectorEventLoop``), so the two runs take the same path through anyio and
   ``asyncio.Runner`` and differ only in the loop class. A conftest fixture cannot be
   overridden by a plugin fixture (the closer definition wins), so the override swaps the
   fixture's function during its setup, the way anyio's own plugin wraps async fixtures;
2. installs an event-loop policy whose loops are the loop under test, for the synchronous
   tests that call ``asyncio.new_event_loop()`` themselves (``test_lifespan.py``);
3. records, per test, the type of every loop the factory and the policy created, and the
   type of ``asyncio.get_running_loop()`` seen by the body of each async test (the test
   function is wrapped for the call), and attaches that to the test's report
   (``user_properties``, which pytest-xdist carries to the controller);
4. in the controller, writes every test's outcome and loops to ``--loop-report`` (JSON), and
   fails the session if no test body ran on the loop under test, or if any anyio test body
   ran on another loop: then the harness, not the loop, is broken.

Loops that uvicorn itself builds from its ``--loop`` setting (``asyncio_loop_factory`` returns
``asyncio.SelectorEventLoop`` by name) stay asyncio's in both runs; in a ferroloop run the
plugin records every asyncio selector loop built during a test as ``other``, so the report
says which tests ran part of their code off the loop under test.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import signal
from collections.abc import Callable, Coroutine, Generator
from pathlib import Path
from typing import Any

import pytest

# A run started in the background by a non-interactive shell inherits SIGINT ignored, and Python
# leaves it ignored (in this process and in the servers uvicorn's tests spawn): its SIGINT tests
# would then hang, on both loops. They assume Python's usual KeyboardInterrupt handler.
signal.signal(signal.SIGINT, signal.default_int_handler)


PROPERTY = "loop_under_test"
ANYIO_FIXTURE = "anyio_backend"

# Types of the loops created since the current test started, in order.
_created: list[str] = []
# Type of the running loop seen by the current test's body (async tests only).
_body_loop: list[str] = []
# Types of asyncio selector loops created since the current test started in a ferroloop run:
# loops that uvicorn or the test built from asyncio's classes directly, not under test.
_other: list[str] = []


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _type_name(loop: object) -> str:
    return _class_name(type(loop))


def _counting(factory: Callable[[], asyncio.AbstractEventLoop]) -> Callable[[], Any]:
    def new_loop() -> asyncio.AbstractEventLoop:
        loop = factory()
        _created.append(_type_name(loop))
        return loop

    return new_loop


def _loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "ferroloop":
        import ferroloop

        return ferroloop.new_event_loop
    return asyncio.SelectorEventLoop


def _expected_type(name: str) -> str:
    if name == "ferroloop":
        import ferroloop

        return _class_name(ferroloop.Loop)
    return _class_name(asyncio.SelectorEventLoop)


def _watch_selector_loops() -> None:
    """Records every asyncio selector loop built, whoever builds it (ferroloop runs only)."""
    base = asyncio.selector_events.BaseSelectorEventLoop
    init = base.__init__

    @functools.wraps(init)
    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        _other.append(_type_name(self))
        init(self, *args, **kwargs)

    base.__init__ = recording_init  # type: ignore[method-assign]


def _counting_policy(factory: Callable[[], asyncio.AbstractEventLoop]) -> Any:
    new_loop = _counting(factory)

    class CountingPolicy(asyncio.DefaultEventLoopPolicy):
        """asyncio's default policy, handing out (and counting) loops under test."""

        def new_event_loop(self) -> asyncio.AbstractEventLoop:
            return new_loop()

    return CountingPolicy()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("loop_under_test")
    group.addoption(
        "--loop-under-test",
        choices=("asyncio", "ferroloop"),
        default="ferroloop",
        help="the event loop every anyio test (and asyncio.new_event_loop()) runs on",
    )
    group.addoption(
        "--loop-report",
        default=None,
        help="write each test's outcome and the loops it ran on to this JSON file",
    )


class LoopUnderTest:
    """The plugin's state for one pytest process (the controller or one xdist worker)."""

    def __init__(self, config: pytest.Config) -> None:
        self.name: str = config.getoption("--loop-under-test")
        self.expected = _expected_type(self.name)
        self.factory = _counting(_loop_factory(self.name))
        self.report_path: str | None = config.getoption("--loop-report")
        self.is_worker = hasattr(config, "workerinput")
        self.tests: dict[str, dict[str, Any]] = {}

    # -- 1. the anyio_backend override ---------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Generator[None, Any, Any]:
        if fixturedef.argname != ANYIO_FIXTURE:
            return (yield)
        original = fixturedef.func
        factory = self.factory

        @functools.wraps(original)
        def backend(**kwargs: Any) -> Any:
            value = original(**kwargs)
            if value != "asyncio":
                raise pytest.UsageError(
                    f"uvicorn's anyio_backend fixture returned {value!r}, not 'asyncio': "
                    "loop_under_test.py does not know how to put it on the loop under test"
                )
            return ("asyncio", {"loop_factory": factory})

        fixturedef.func = backend
        try:
            return (yield)
        finally:
            fixturedef.func = original

    # -- 3. per-test records ---------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, Any, Any]:
        for records in (_created, _body_loop, _other):
            records.clear()
        try:
            return (yield)
        finally:
            for records in (_created, _body_loop, _other):
                records.clear()

    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Generator[None, Any, Any]:
        original = pyfuncitem.obj
        if not (inspect.iscoroutinefunction(original) and ANYIO_FIXTURE in pyfuncitem.funcargs):
            return (yield)

        @functools.wraps(original)
        async def body(*args: Any, **kwargs: Any) -> Any:
            _body_loop.append(_type_name(asyncio.get_running_loop()))
            coro: Coroutine[Any, Any, Any] = original(*args, **kwargs)
            return await coro

        pyfuncitem.obj = body
        try:
            return (yield)
        finally:
            pyfuncitem.obj = original

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.when == "teardown":
            record = {"created": list(_created), "body": list(_body_loop), "other": list(_other)}
            report.user_properties.append((PROPERTY, record))
        return report

    # -- 4. the controller's report --------------------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.is_worker:
            return
        entry = self.tests.setdefault(
            report.nodeid, {"outcome": None, "duration": 0.0, "longrepr": ""}
        )
        entry["duration"] = round(entry["duration"] + report.duration, 3)
        outcome = _outcome(report)
        if outcome is not None and _rank(outcome) >= _rank(entry["outcome"]):
            entry["outcome"] = outcome
            if report.longrepr is not None and outcome != "passed":
                entry["longrepr"] = _longrepr_text(report)
        for key, value in report.user_properties:
            if key == PROPERTY:
                entry["created"] = value["created"]
                entry["body"] = value["body"]
                if value["other"]:
                    entry["other"] = value["other"]

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.is_worker:
            return
        on_loop = [
            nodeid
            for nodeid, entry in self.tests.items()
            if self.expected in entry.get("body", ()) or self.expected in entry.get("created", ())
        ]
        astray = {
            nodeid: entry["body"]
            for nodeid, entry in self.tests.items()
            if any(body != self.expected for body in entry.get("body", ()))
        }
        summary = {
            "loop": self.name,
            "expected_loop_type": self.expected,
            "tests": len(self.tests),
            "tests_on_loop": len(on_loop),
            "async_tests_on_loop": sum(
                1 for entry in self.tests.values() if self.expected in entry.get("body", ())
            ),
            "loops_created": sum(
                entry.get("created", []).count(self.expected) for entry in self.tests.values()
            ),
            "astray": astray,
            "tests_with_other_loops": sum(1 for entry in self.tests.values() if "other" in entry),
        }
        problems = []
        if self.tests and not on_loop:
            problems.append(f"no test ran on {self.expected}: the loop override did not apply")
        if astray:
            problems.append(
                f"{len(astray)} anyio test(s) ran on another loop than {self.expected}, "
                f"e.g. {next(iter(astray.items()))}"
            )
        summary["problems"] = problems
        if self.report_path:
            Path(self.report_path).write_text(
                json.dumps({"summary": summary, "tests": self.tests}, indent=1, sort_keys=True),
                encoding="utf-8",
            )
        terminal = session.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.write_line(
                f"loop_under_test: {summary['tests_on_loop']} of {summary['tests']} tests ran on "
                f"{self.expected} ({summary['async_tests_on_loop']} async test bodies, "
                f"{summary['loops_created']} loops created)"
            )
            if self.name != "asyncio":
                terminal.write_line(
                    f"loop_under_test: {summary['tests_with_other_loops']} tests also built an "
                    "asyncio selector loop (uvicorn's own --loop asyncio/auto, or the test's own)"
                )
            for problem in problems:
                terminal.write_line(f"loop_under_test: ERROR: {problem}", red=True)
        if problems:
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR


# Outcome of a test from its three reports: the worst one wins.
_RANKS = {None: 0, "skipped": 1, "passed": 2, "xfailed": 3, "xpassed": 4, "failed": 5, "error": 6}


def _rank(outcome: str | None) -> int:
    return _RANKS[outcome]


def _outcome(report: pytest.TestReport) -> str | None:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.when == "call":
        return report.outcome
    if report.failed:
        return "error"
    if report.skipped:
        return "skipped"
    return None


def _longrepr_text(report: pytest.TestReport) -> str:
    text = report.longreprtext
    # Enough to recognise the failure; the full log is in the run's output file.
    return text if len(text) <= 6000 else text[:2000] + "\n[...]\n" + text[-4000:]


def pytest_configure(config: pytest.Config) -> None:
    # uvicorn's benchmarks are marked for pytest-codspeed, which the suite does not need.
    config.addinivalue_line("markers", "benchmark: uvicorn benchmark (plain test here)")
    plugin = LoopUnderTest(config)
    config.pluginmanager.register(plugin, "loop_under_test_state")
    asyncio.set_event_loop_policy(_counting_policy(_loop_factory(plugin.name)))
    if plugin.name != "asyncio":
        _watch_selector_loops()
