"""Run one module of CPython's ``test.test_asyncio`` on one loop and stream the outcomes.

The orchestrator, ``run_cpython_asyncio.py``, starts one worker process per module (and
starts it again, minus the tests already done, after a hang or a crash). A worker:

1. makes the loop under test asyncio's default: ``asyncio.set_event_loop_policy(policy)``
   *and* ``asyncio.DefaultEventLoopPolicy = type(policy)``, because every module's
   ``tearDownModule`` (and ``test_runners``' ``tearDown``) calls
   ``asyncio.set_event_loop_policy(None)``, after which asyncio lazily builds a fresh
   ``asyncio.DefaultEventLoopPolicy()``; with the patch that is the loop under test again;
2. counts every loop the policy (and, for the per-loop classes, their loop factory) hands
   out, and fails loudly on a loop of the wrong type, so the report can prove which tests
   really ran on the loop under test; with ``--tasks native`` it also installs
   ``ferroloop.task_factory`` on each of those loops, so the tasks the tests create
   (``create_task``, ``TaskGroup``, ``wait_for``...) are ferroloop.Task;
3. runs the module's selected tests with unittest and writes one JSON line per event to
   ``--results``: ``plan`` (the test ids), ``start``, ``result``, and ``done``;
4. arms a faulthandler watchdog around each test: a test that outlives ``--test-timeout``
   gets every thread's stack dumped to stderr and the process ends with exit code 1. The
   orchestrator sees a ``start`` without a ``result`` and books that test as a timeout.

It only imports the standard library at the top, so the orchestrator can import
``MODULES`` from it cheaply.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import importlib
import json
import signal
import sys
import time
import traceback
import unittest
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any
from unittest import mock

LOOPS = ("ferroloop", "uvloop", "asyncio")
# The Task class of the tasks that the loops under test create: the loop's default
# (asyncio's), or ferroloop.Task through ferroloop.task_factory.
TASKS = ("asyncio", "native")
# Cap on the traceback text kept per test: enough for the frames that matter.
DETAIL_CHARS = 4000
# Written to stderr as each test starts.
START_MARKER = "\n### cpython_asyncio_worker: start "


@dataclass(frozen=True)
class PerLoop:
    """A TestCase built for the loop under test, the way the module builds its own per-loop
    classes (``EPollEventLoopTests``, ``SelectorStartServerTests``): named after the loop
    (``Ferroloop`` + ``name``), derived from the module's classes ``bases``, with the method
    ``factory`` (``create_event_loop``, or ``new_loop`` in the functional tests) returning a
    loop under test. ``test_utils.TestCase`` is added unless a base is a TestCase already.
    ``adapt``, if given, is applied to each loop before the test gets it.
    """

    name: str
    bases: tuple[str, ...]
    factory: str = "create_event_loop"
    adapt: Callable[[Any], Any] | None = None
    # For classes whose setUp calls asyncio.SelectorEventLoop() itself: the loop under test
    # takes that name while setUp runs.
    patch_selector_loop: bool = False


@dataclass(frozen=True)
class PerTask:
    """A TestCase that runs one of the module's suites written per Task class with
    ``ferroloop.Task``, the way the module builds its own (``CTask_CFuture_Tests``,
    ``CCurrentLoopTests``): named ``name``, derived from the module's classes ``bases``, with
    the class attribute ``Task`` set to ferroloop.Task and ``Future`` to asyncio's C Future
    (``future="c"``) or pure-Python one (``"py"``); ``new_task``, if set, also builds
    ferroloop.Task (``BaseCurrentLoopTests`` asks for that method instead of the attribute;
    on 3.13 it also takes ``current_task``, asyncio's public one here).
    ``test_utils.TestCase`` is added unless a base is a TestCase already. ``subclassed``
    applies the module's ``add_subclass_tests``: the tests then run on subclasses of both.
    Built only for the ferroloop run: they test ferroloop's Task, not the loop.
    """

    name: str
    bases: tuple[str, ...]
    future: str = "c"
    new_task: bool = False
    subclassed: bool = False


@dataclass(frozen=True)
class Selection:
    """Which tests of one ``test.test_asyncio`` module run on the loop under test.

    ``classes`` names TestCase classes of the module that take their loop from the policy
    (``None``: every class the module defines); ``tests`` names single tests
    (``Class.test_name``) of classes that otherwise build asyncio's loops or mocks;
    ``per_loop`` lists the classes built for the loop under test (``PerLoop``), ``per_task``
    those built for ferroloop.Task (``PerTask``). ``exclude``
    drops single tests (``Class.test_name``, the class as the test id names it) of those that
    test asyncio's implementation rather than the loop (each listed in EXCEPTIONS.md).
    """

    classes: tuple[str, ...] | None = None
    tests: tuple[str, ...] = ()
    per_loop: tuple[PerLoop, ...] = ()
    per_task: tuple[PerTask, ...] = ()
    exclude: tuple[str, ...] = ()


def track_shutdown_asyncgens(loop: Any) -> Any:
    """What ``test_runners.BaseTest.new_loop`` adds to its mocked loop, on a real one.

    Its ``tearDown`` asserts ``loop.shutdown_ag_run``: that ``asyncio.run``/``Runner`` called
    ``shutdown_asyncgens()``. The mock replaces the method; here the loop's own one still runs.
    """
    shutdown_asyncgens = loop.shutdown_asyncgens
    loop.shutdown_ag_run = False

    async def tracked() -> None:
        loop.shutdown_ag_run = True
        await shutdown_asyncgens()

    loop.shutdown_asyncgens = tracked
    return loop


# test_events' loop tests: 3.14 dropped the Unix mixin, which set up a child watcher.
EVENTS_MIXIN = "EventLoopTestsMixin" if sys.version_info >= (3, 14) else "UnixEventLoopTestsMixin"

# Modules whose tests reach the loop through the policy are run whole. Of the others, the
# classes (or single tests) that take the policy's loop are named, and the classes that the
# module builds per selector, or that build asyncio.SelectorEventLoop() in setUp, run as
# PerLoop classes on the loop under test. Slowest first, so they do not start last.
#
# Left out, because they never run the loop under test or test asyncio's implementation
# rather than a loop's behaviour (EXCEPTIONS.md lists them with the reasons): test_futures
# and test_pep492 (test_utils.TestLoop or a mocked asyncio.BaseEventLoop), test_selector_events,
# test_proactor_events and test_windows_* (asyncio's own loops), test_transports and
# test_protocols (abstract classes), and in the modules below, the classes that run on
# TestLoop or mocks or patch asyncio's private helpers.
MODULES: dict[str, Selection] = {
    "test_tasks": Selection(
        # CPython's Task tests, once more with ferroloop.Task as the Task class (the module
        # runs them with _CTask and _PyTask). SetMethodsTest is left out: it calls
        # Future.set_result(task, ...) on the task, which only works on a Future subclass.
        per_task=(
            PerTask("NativeTask_CFuture_Tests", ("BaseTaskTests",)),
            PerTask("NativeTask_PyFuture_Tests", ("BaseTaskTests",), future="py"),
            PerTask("NativeCurrentLoopTests", ("BaseCurrentLoopTests",), new_task=True),
        ),
    ),
    "test_subprocess": Selection(
        # Every child watcher, each on a loop under test; MultiLoopChildWatcher is skipped
        # by CPython itself, SubprocessTransportTests runs on TestLoop.
        classes=(
            "SubprocessThreadedWatcherTests",
            "SubprocessSafeWatcherTests",
            "SubprocessFastWatcherTests",
            "SubprocessPidfdWatcherTests",
            "GenericWatcherTests",
        )
    ),
    "test_ssl": Selection(),
    "test_taskgroups": Selection(),
    "test_sslproto": Selection(
        classes=("SslProtoHandshakeTests",),
        per_loop=(PerLoop("StartTLSTests", ("SelectorStartTLSTests",), "new_loop"),),
    ),
    "test_events": Selection(
        classes=(
            "HandleTests",
            "TimerTests",
            "PolicyTests",
            "TestPyGetEventLoop",
            "TestCGetEventLoop",
            "TestServer",
            "TestAbstractServer",
        ),
        tests=("AbstractEventLoopTests.test_not_implemented_async",),
        per_loop=(PerLoop("EventLoopTests", (EVENTS_MIXIN, "SubprocessTestsMixin")),),
    ),
    "test_sendfile": Selection(
        classes=(), per_loop=(PerLoop("SendfileTests", ("SendfileTestsBase",)),)
    ),
    "test_waitfor": Selection(),
    "test_locks": Selection(),
    "test_sock_lowlevel": Selection(
        classes=(), per_loop=(PerLoop("SockTests", ("BaseSockTestsMixin",)),)
    ),
    "test_streams": Selection(),
    "test_base_events": Selection(
        classes=("RunningLoopTests",),
        tests=(
            "BaseEventLoopTests.test_create_task_error_closes_coro",
            "BaseEventLoopTests.test_create_named_task_with_default_factory",
            "BaseEventLoopTests.test_create_named_task_with_custom_factory",
        ),
    ),
    "test_queues": Selection(),
    "test_timeouts": Selection(),
    "test_runners": Selection(
        classes=(),
        per_loop=(
            PerLoop("RunTests", ("RunTests",), "new_loop", track_shutdown_asyncgens),
            PerLoop("RunnerTests", ("RunnerTests",), "new_loop", track_shutdown_asyncgens),
        ),
    ),
    "test_server": Selection(
        classes=(),
        per_loop=(PerLoop("StartServerTests", ("SelectorStartServerTests",), "new_loop"),),
    ),
    "test_unix_events": Selection(
        classes=("SelectorEventLoopUnixSockSendfileTests", "PolicyTests", "TestFunctional"),
        per_loop=(
            PerLoop(
                "UnixSocketTests", ("SelectorEventLoopUnixSocketTests",), patch_selector_loop=True
            ),
        ),
        exclude=(
            # Patches asyncio.unix_events.socket, which only asyncio's create_unix_server reads.
            "{loop}UnixSocketTests.test_create_unix_server_bind_error",
            # Patches asyncio.unix_events.os, which only asyncio's _sock_sendfile_native reads.
            "SelectorEventLoopUnixSockSendfileTests.test_sock_sendfile_not_available",
            # Call asyncio's private helper _sock_sendfile_native_impl directly.
            "SelectorEventLoopUnixSockSendfileTests.test_sock_sendfile_blocking_error",
            "SelectorEventLoopUnixSockSendfileTests.test_sock_sendfile_cancel1",
            "SelectorEventLoopUnixSockSendfileTests.test_sock_sendfile_cancel2",
            "SelectorEventLoopUnixSockSendfileTests.test_sock_sendfile_exception",
            "SelectorEventLoopUnixSockSendfileTests.test_sock_sendfile_os_error_first_call",
            "SelectorEventLoopUnixSockSendfileTests.test_sock_sendfile_os_error_next_call",
        ),
    ),
    "test_buffered_proto": Selection(
        classes=(),
        per_loop=(PerLoop("BufferedProtocolTests", ("BaseTestBufferedProtocol",), "new_loop"),),
    ),
    "test_context": Selection(),
    "test_futures2": Selection(),
    "test_threads": Selection(),
}
if sys.version_info >= (3, 12):
    # Eager task factories (new in 3.12): every class takes its loop from the policy.
    MODULES["test_eager_task_factory"] = Selection()


class LoopCounter:
    """Counts the loops handed to the tests and rejects loops of another type; installs
    ``task_factory`` on each, if given."""

    def __init__(self, loop_type: type, task_factory: Callable[..., Any] | None = None) -> None:
        self.loop_type = loop_type
        self.task_factory = task_factory
        self.created = 0

    def note(self, loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
        if not isinstance(loop, self.loop_type):
            raise AssertionError(
                f"the policy under test returned {type(loop).__module__}."
                f"{type(loop).__qualname__}, not {self.loop_type.__qualname__}"
            )
        self.created += 1
        if self.task_factory is not None:
            loop.set_task_factory(self.task_factory)
        return loop


def install_event_loop_class(make_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    """3.13+: make ``asyncio.EventLoop`` build the loop under test, for test_taskgroups, whose
    classes say ``loop_factory = asyncio.EventLoop`` (read when the module is imported, after
    this). A class, not the function itself, which would become a method of the test case.
    Only for that module: test_runners checks that ``asyncio.EventLoop`` is asyncio's own."""
    asyncio.EventLoop = type(  # type: ignore[misc]
        "EventLoop", (), {"__new__": lambda cls: make_loop()}
    )


# Tests that are not run on ferroloop, each with its reason (they are reported as skipped, and
# listed in that version's tests/py3xx/EXCEPTIONS.md): the failure would hang the module.
NOT_RUN_ON_FERROLOOP: dict[str, str] = {}
if sys.version_info >= (3, 14):
    _THREADSAFE = (
        "3.14's call_soon_threadsafe returns an asyncio.events._ThreadSafeHandle, whose cancel() "
        "and cancelled() from another thread wait for a callback already running; ferroloop's "
        "native Handle is not that class (the test's assertion fails in its thread, which then "
        "never stops the loop: a hang)"
    )
    for _name in (
        "test_call_soon_threadsafe_handle_block_check_cancelled",
        "test_call_soon_threadsafe_handle_block_cancellation",
        "test_call_soon_threadsafe_handle_cancel_same_thread",
        "test_call_soon_threadsafe_handle_cancel_other_thread",
    ):
        NOT_RUN_ON_FERROLOOP[f"test_events.FerroloopEventLoopTests.{_name}"] = _THREADSAFE
    _PY_RUNNING_LOOP = (
        "the test swaps asyncio's running-loop functions and asyncio.Task for their Python "
        "versions; ferroloop's create_task still makes its native Task, which enters through "
        "the C _asyncio._enter_task, and 3.14's checks the running loop the C functions keep, "
        "which the Python _set_running_loop does not set (RuntimeError in every step; the "
        "test then waits 30 s)"
    )
    for _name in (
        "test_get_event_loop_new_process",
        "test_get_event_loop_returns_running_loop",
        "test_get_event_loop_returns_running_loop2",
        "test_get_running_loop_already_running",
    ):
        NOT_RUN_ON_FERROLOOP[f"test_events.TestPyGetEventLoop.{_name}"] = _PY_RUNNING_LOOP


def mark_not_run(tests: list[unittest.TestCase]) -> None:
    """Turns the tests of ``NOT_RUN_ON_FERROLOOP`` into skips with their reason."""
    for test in tests:
        for suffix, reason in NOT_RUN_ON_FERROLOOP.items():
            if test.id().endswith(suffix):
                method = getattr(test, test._testMethodName)
                setattr(test, test._testMethodName, unittest.skip(reason)(method))


def default_policy_class() -> type[asyncio.AbstractEventLoopPolicy]:
    """asyncio's default policy class, without 3.14's deprecation warning for the name."""
    if sys.version_info >= (3, 14):
        return asyncio.unix_events._DefaultEventLoopPolicy  # type: ignore[attr-defined,no-any-return]
    return asyncio.DefaultEventLoopPolicy


def install_loop(
    name: str, tasks: str = "asyncio"
) -> tuple[LoopCounter, Callable[[], asyncio.AbstractEventLoop]]:
    """Make ``name`` asyncio's default loop, its tasks of ``tasks``; return the counter and a
    loop factory."""
    task_factory = None
    if tasks == "native":
        import ferroloop

        task_factory = ferroloop.task_factory
    if name == "ferroloop":
        import ferroloop

        counter = LoopCounter(ferroloop.Loop, task_factory)
        base_policy: type[asyncio.AbstractEventLoopPolicy] = ferroloop.EventLoopPolicy

        def policy_loop(policy: Any) -> asyncio.AbstractEventLoop:
            return super(CountingPolicy, policy).new_event_loop()

        def direct_loop() -> asyncio.AbstractEventLoop:
            return counter.note(ferroloop.new_event_loop())

    elif name == "uvloop":
        import uvloop

        counter = LoopCounter(uvloop.Loop, task_factory)
        # uvloop's own policy lacks the child-watcher methods the Unix tests call.
        base_policy = default_policy_class()

        def policy_loop(policy: Any) -> asyncio.AbstractEventLoop:
            return uvloop.new_event_loop()

        def direct_loop() -> asyncio.AbstractEventLoop:
            return counter.note(uvloop.new_event_loop())

    else:
        # Bound now: per-loop classes may patch the name asyncio.SelectorEventLoop.
        selector_loop = asyncio.SelectorEventLoop
        counter = LoopCounter(selector_loop, task_factory)
        base_policy = default_policy_class()

        def policy_loop(policy: Any) -> asyncio.AbstractEventLoop:
            return super(CountingPolicy, policy).new_event_loop()

        def direct_loop() -> asyncio.AbstractEventLoop:
            return counter.note(selector_loop())

    class CountingPolicy(base_policy):  # type: ignore[valid-type,misc]
        def new_event_loop(self) -> asyncio.AbstractEventLoop:
            return counter.note(policy_loop(self))

    CountingPolicy.__qualname__ = f"{name}.CountingPolicy"
    if sys.version_info >= (3, 14):
        # Not asyncio.DefaultEventLoopPolicy: a test checks that reading it warns.
        # 3.14 deprecates the public policy names; after a test's
        # asyncio.events._set_event_loop_policy(None) the policy is rebuilt from the private one.
        asyncio.unix_events._DefaultEventLoopPolicy = CountingPolicy  # type: ignore[attr-defined]
        asyncio.events._set_event_loop_policy(CountingPolicy())  # type: ignore[attr-defined]
    else:
        asyncio.DefaultEventLoopPolicy = CountingPolicy  # type: ignore[misc]
        asyncio.set_event_loop_policy(CountingPolicy())
    return counter, direct_loop


def adapt_close_loop(test_utils: Any) -> None:
    """Let ``test_utils.TestCase.close_loop`` close loops without ``_default_executor``.

    CPython's helper reads the private ``loop._default_executor`` to decide whether to
    call ``shutdown_default_executor()``; uvloop (and a native loop generally) keeps the
    executor private. For such loops the replacement calls the public coroutine always,
    then does what the original does.
    """
    from test import support

    original = test_utils.TestCase.close_loop

    def close_loop(loop: asyncio.AbstractEventLoop) -> None:
        if hasattr(loop, "_default_executor"):
            original(loop)
            return
        if not loop.is_closed():
            loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        # The rest is the original's: wait (boundedly) for subprocess watcher threads.
        policy = support.maybe_get_event_loop_policy()
        if policy is None:
            return
        try:
            watcher = policy.get_child_watcher()
        except NotImplementedError:
            return
        if isinstance(watcher, asyncio.ThreadedChildWatcher):
            for thread in list(watcher._threads.values()):
                thread.join(timeout=support.SHORT_TIMEOUT)
                if thread.is_alive():
                    raise RuntimeError(f"thread {thread} still alive: subprocess still running")

    test_utils.TestCase.close_loop = staticmethod(close_loop)


def build_suite(
    module_name: str, selection: Selection, loop_name: str, make_loop: Callable[[], Any]
) -> unittest.TestSuite:
    module = importlib.import_module(f"test.test_asyncio.{module_name}")
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    if selection.classes is None:
        suite.addTests(loader.loadTestsFromModule(module))
    else:
        for class_name in selection.classes:
            if hasattr(module, class_name):  # some classes are platform-conditional
                suite.addTests(loader.loadTestsFromTestCase(getattr(module, class_name)))
    for name in selection.tests:
        suite.addTest(loader.loadTestsFromName(name, module))
    for per_loop in selection.per_loop:
        suite.addTests(
            loader.loadTestsFromTestCase(per_loop_class(module, per_loop, loop_name, make_loop))
        )
    if loop_name == "ferroloop":
        for per_task in selection.per_task:
            suite.addTests(loader.loadTestsFromTestCase(per_task_class(module, per_task)))
    prefix = loop_name.capitalize()
    excluded = {f"{module.__name__}.{name.format(loop=prefix)}" for name in selection.exclude}
    unknown = excluded - {test.id() for test in iter_tests(suite)}
    if unknown:
        raise LookupError(f"excluded tests that the suite does not have: {sorted(unknown)}")
    return unittest.TestSuite(test for test in iter_tests(suite) if test.id() not in excluded)


def per_loop_class(
    module: Any, per_loop: PerLoop, loop_name: str, make_loop: Callable[[], Any]
) -> type[unittest.TestCase]:
    from test.test_asyncio import utils as test_utils

    bases = tuple(getattr(module, base) for base in per_loop.bases)
    if not any(issubclass(base, unittest.TestCase) for base in bases):
        bases += (test_utils.TestCase,)
    adapt = per_loop.adapt or (lambda loop: loop)
    class_name = loop_name.capitalize() + per_loop.name
    namespace: dict[str, Any] = {"__module__": module.__name__, "__qualname__": class_name}
    if per_loop.patch_selector_loop:
        base_setup = bases[0].setUp

        def setUp(self: Any) -> None:
            with mock.patch("asyncio.SelectorEventLoop", lambda: adapt(make_loop())):
                base_setup(self)

        namespace["setUp"] = setUp
    else:
        namespace[per_loop.factory] = lambda self: adapt(make_loop())
    return type(class_name, bases, namespace)


def per_task_class(module: Any, per_task: PerTask) -> type[unittest.TestCase]:
    from asyncio import futures

    import ferroloop
    from test.test_asyncio import utils as test_utils

    bases = tuple(getattr(module, base) for base in per_task.bases)
    if not any(issubclass(base, unittest.TestCase) for base in bases):
        bases += (test_utils.TestCase,)
    future = {"c": futures._CFuture, "py": futures._PyFuture}[per_task.future]
    namespace: dict[str, Any] = {
        "__module__": module.__name__,
        "__qualname__": per_task.name,
        "Task": ferroloop.Task,
        "Future": future,
    }
    if per_task.new_task:
        namespace["new_task"] = lambda self, coro: ferroloop.Task(coro, loop=self.loop)
    if per_task.new_task or sys.version_info >= (3, 14):
        # 3.13's BaseCurrentLoopTests and 3.14's BaseTaskTests take the current_task
        # function to test (the C one, asyncio's default), 3.14's the all_tasks one too.
        namespace["current_task"] = staticmethod(asyncio.current_task)
    if sys.version_info >= (3, 14):
        namespace["all_tasks"] = staticmethod(asyncio.all_tasks)
    test_class = type(per_task.name, bases, namespace)
    return module.add_subclass_tests(test_class) if per_task.subclassed else test_class


def iter_tests(suite: unittest.TestSuite) -> Iterator[unittest.TestCase]:
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from iter_tests(item)
        else:
            yield item


class StreamingResult(unittest.TestResult):
    """Writes one JSON line per test and guards each test with a watchdog."""

    def __init__(self, out: IO[str], counter: LoopCounter, test_timeout: float) -> None:
        super().__init__()
        self.out = out
        self.counter = counter
        self.test_timeout = test_timeout
        self.current: dict[str, Any] | None = None

    def emit(self, record: dict[str, Any]) -> None:
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        self.current = {
            "id": test.id(),
            "outcome": "passed",
            "detail": "",
            "loops_before": self.counter.created,
            "started": time.monotonic(),
        }
        self.emit({"event": "start", "id": test.id()})
        # The orchestrator keeps the stderr after the last marker as a hung test's output.
        sys.stderr.write(f"{START_MARKER}{test.id()}\n")
        sys.stderr.flush()
        faulthandler.dump_traceback_later(self.test_timeout, exit=True)

    def stopTest(self, test: unittest.TestCase) -> None:
        faulthandler.cancel_dump_traceback_later()
        super().stopTest(test)
        current, self.current = self.current, None
        if current is None:
            return
        self.emit(
            {
                "event": "result",
                "id": current["id"],
                "outcome": current["outcome"],
                "detail": current["detail"],
                "loops": self.counter.created - current["loops_before"],
                "duration": round(time.monotonic() - current["started"], 3),
            }
        )

    def _book(self, test: Any, outcome: str, detail: str) -> None:
        detail = detail[-DETAIL_CHARS:]
        if self.current is not None and self.current["id"] == test.id():
            # Keep the first failure (a subtest, say) unless a later one is worse.
            if self.current["outcome"] in ("passed", "skipped") or outcome == "error":
                self.current["outcome"] = outcome
                self.current["detail"] = detail
            return
        # setUpClass/tearDownModule errors and class-level skips come without startTest.
        self.emit(
            {
                "event": "result",
                "id": test.id(),
                "outcome": outcome,
                "detail": detail,
                "loops": 0,
                "duration": 0.0,
            }
        )

    def addError(self, test: Any, err: Any) -> None:
        super().addError(test, err)
        self._book(test, "error", self._exc_info_to_string(err, test))

    def addFailure(self, test: Any, err: Any) -> None:
        super().addFailure(test, err)
        self._book(test, "failed", self._exc_info_to_string(err, test))

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            outcome = "failed" if issubclass(err[0], test.failureException) else "error"
            text = f"subtest {subtest._subDescription()}\n{self._exc_info_to_string(err, test)}"
            self._book(test, outcome, text)

    def addSkip(self, test: Any, reason: str) -> None:
        super().addSkip(test, reason)
        self._book(test, "skipped", reason)

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._book(test, "passed", "expected failure")

    def addUnexpectedSuccess(self, test: Any) -> None:
        super().addUnexpectedSuccess(test)
        self._book(test, "failed", "unexpected success of an expectedFailure test")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=LOOPS, required=True)
    parser.add_argument("--module", choices=sorted(MODULES), required=True)
    parser.add_argument("--tasks", choices=TASKS, default="asyncio")
    parser.add_argument("--results", required=True, help="JSON-lines file to append to")
    parser.add_argument("--skip", help="JSON file: list of test ids already done")
    parser.add_argument("--test-timeout", type=float, required=True)
    args = parser.parse_args(argv)
    faulthandler.enable()  # a crash in native code still shows the Python stacks
    # A process started in the background by a non-interactive shell (`cmd &`, as a CI script
    # may do) inherits SIGINT ignored, and Python then leaves it ignored: asyncio.Runner
    # installs no SIGINT handler and test_runners' interrupt tests wait for ever (on asyncio's
    # own loop too). The tests assume Python's usual KeyboardInterrupt handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    with open(args.results, "a", encoding="utf-8") as out:
        try:
            counter, make_loop = install_loop(args.loop, args.tasks)
            taskgroups = args.module == "test_taskgroups" and args.loop != "asyncio"
            if taskgroups and hasattr(asyncio, "EventLoop"):
                install_event_loop_class(make_loop)
            from test.test_asyncio import utils as test_utils

            adapt_close_loop(test_utils)
            suite = build_suite(args.module, MODULES[args.module], args.loop, make_loop)
        except BaseException:
            out.write(json.dumps({"event": "setup-error", "detail": traceback.format_exc()}))
            out.write("\n")
            raise
        skip: set[str] = set()
        if args.skip:
            with open(args.skip, encoding="utf-8") as f:
                skip = set(json.load(f))
        tests = [test for test in iter_tests(suite) if test.id() not in skip]
        if args.loop == "ferroloop":
            mark_not_run(tests)
        result = StreamingResult(out, counter, args.test_timeout)
        result.emit({"event": "plan", "ids": [test.id() for test in tests]})
        unittest.TestSuite(tests).run(result)
        result.emit({"event": "done", "loops": counter.created})
    return 0


if __name__ == "__main__":
    sys.exit(main())
