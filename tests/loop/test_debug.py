"""Debug mode: get/set_debug, slow-callback warnings, thread and argument checks."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from asyncio import tasks
from typing import Any

import pytest


def test_default_debug_matches_asyncio(loop_factory):
    reference = asyncio.new_event_loop()
    fresh = loop_factory()
    try:
        assert fresh.get_debug() == reference.get_debug()
    finally:
        fresh.close()
        reference.close()


def test_set_debug_round_trips(loop):
    loop.set_debug(True)
    assert loop.get_debug() is True
    loop.set_debug(False)
    assert loop.get_debug() is False


@pytest.mark.parametrize(
    ("enabled", "expected"), [(1, True), ("yes", True), (0, False), (None, False)]
)
def test_set_debug_takes_any_object_by_its_truth(loop, enabled, expected):
    # asyncio stores what set_debug is given (set_debug(1), set_debug(os.environ.get(...)))
    # and tests its truth later.
    loop.set_debug(enabled)
    assert bool(loop.get_debug()) is expected
    assert bool(loop.create_future()._source_traceback) is expected


def test_futures_ask_get_debug_whether_to_record_a_traceback(loop):
    # The C Future's __init__ calls loop.get_debug() (native on ferroloop).
    assert loop.create_future()._source_traceback is None
    loop.set_debug(True)
    assert loop.create_future()._source_traceback


def test_get_debug_overridden_by_a_subclass_is_the_one_futures_ask(loop_factory):
    probe = loop_factory()
    cls = type(probe)
    probe.close()

    class AlwaysDebug(cls):  # type: ignore[misc, valid-type]
        def get_debug(self) -> bool:
            return True

    sub = AlwaysDebug()
    try:
        assert sub.create_future()._source_traceback
    finally:
        sub.close()


def test_slow_callback_duration_defaults_to_a_tenth_of_a_second(loop):
    assert loop.slow_callback_duration == 0.1


def test_slow_callback_is_logged_in_debug_mode(loop, caplog):
    loop.set_debug(True)
    loop.slow_callback_duration = 0.01

    def slow_callback():
        time.sleep(0.05)

    loop.call_soon(slow_callback)
    loop.call_soon(loop.stop)
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        loop.run_forever()
    messages = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    slow = [message for message in messages if message.startswith("Executing <Handle")]
    assert len(slow) == 1, messages
    assert "slow_callback()" in slow[0]
    assert " took " in slow[0]
    assert slow[0].endswith(" seconds")


def test_slow_timer_callback_is_logged_in_debug_mode(loop, caplog):
    loop.set_debug(True)
    loop.slow_callback_duration = 0.01

    def slow_timer():
        time.sleep(0.05)

    loop.call_later(0, slow_timer)
    loop.call_later(0.01, loop.stop)
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        loop.run_forever()
    messages = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert any(
        message.startswith("Executing <TimerHandle") and "slow_timer()" in message
        for message in messages
    ), messages


def test_slow_task_step_is_logged_as_the_task(loop, caplog):
    loop.set_debug(True)
    loop.slow_callback_duration = 0.01

    async def slow_coroutine():
        time.sleep(0.05)

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        loop.run_until_complete(loop.create_task(slow_coroutine(), name="slow-task"))
    messages = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert any(
        message.startswith("Executing <Task") and "slow-task" in message for message in messages
    ), messages


def test_slow_callback_is_not_logged_outside_debug_mode(loop, caplog):
    loop.slow_callback_duration = 0.01
    loop.call_soon(time.sleep, 0.05)
    loop.call_soon(loop.stop)
    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        loop.run_forever()
    assert not [r for r in caplog.records if "Executing" in r.getMessage()]


def test_fast_callback_is_not_logged_in_debug_mode(loop, caplog):
    loop.set_debug(True)
    loop.slow_callback_duration = 10
    loop.call_soon(lambda: None)
    loop.call_soon(loop.stop)
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        loop.run_forever()
    assert not [r for r in caplog.records if "Executing" in r.getMessage()]


@pytest.mark.parametrize("method", ["call_soon", "call_later", "call_at"])
def test_scheduling_from_a_wrong_thread_in_debug_mode_raises(loop, method):
    loop.set_debug(True)
    errors = []

    def schedule_from_thread():
        schedule = getattr(loop, method)
        args = () if method == "call_soon" else (loop.time() if method == "call_at" else 0,)
        try:
            schedule(*args, print)
        except RuntimeError as exc:
            errors.append(str(exc))

    async def main():
        thread = threading.Thread(target=schedule_from_thread)
        thread.start()
        await loop.run_in_executor(None, thread.join)

    loop.run_until_complete(main())
    assert len(errors) == 1
    assert (
        "Non-thread-safe operation invoked on an event loop other than the current one"
        in (errors[0])
    )


def test_call_soon_from_another_thread_is_not_checked_while_the_loop_is_stopped(loop):
    # asyncio's thread check applies to a running loop only.
    loop.set_debug(True)
    errors = []

    def schedule():
        try:
            loop.call_soon(print).cancel()
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=schedule)
    thread.start()
    thread.join()
    assert errors == []


@pytest.mark.parametrize("environment", [{"PYTHONASYNCIODEBUG": "1"}, {"PYTHONDEVMODE": "1"}])
def test_default_debug_follows_the_environment(loop_name, environment):
    make_loop = {
        "asyncio": "import asyncio; loop = asyncio.new_event_loop()",
        "ferroloop": "import ferroloop; loop = ferroloop.new_event_loop()",
    }[loop_name]
    code = f"{make_loop}; print(loop.get_debug()); loop.close()"
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert result.stdout.strip() == "True"


def test_call_soon_threadsafe_from_a_wrong_thread_in_debug_mode_works(loop):
    loop.set_debug(True)
    fired = []

    async def main():
        done = loop.create_future()
        thread = threading.Thread(
            target=loop.call_soon_threadsafe, args=(done.set_result, "threadsafe")
        )
        thread.start()
        fired.append(await done)
        await loop.run_in_executor(None, thread.join)

    loop.run_until_complete(main())
    assert fired == ["threadsafe"]


@pytest.mark.parametrize("method", ["call_soon", "call_soon_threadsafe", "call_later", "call_at"])
def test_debug_mode_rejects_non_callable(loop, method):
    loop.set_debug(True)
    schedule = getattr(loop, method)
    args = (0,) if method == "call_later" else (loop.time(),) if method == "call_at" else ()
    # asyncio's call_later delegates to call_at and names that method in the message.
    name = "call_(later|at)" if method == "call_later" else method
    with pytest.raises(TypeError, match=f"a callable object was expected by {name}"):
        schedule(*args, 42)


@pytest.mark.parametrize("method", ["add_reader", "add_writer"])
def test_debug_mode_does_not_check_the_callback_of_add_reader_or_add_writer(
    loop, method, exception_handler_calls
):
    # asyncio's add_reader/add_writer build their Handle without a callable check, in debug
    # mode too: the TypeError reaches the exception handler when the fd is ready.
    loop.set_debug(True)
    left, right = socket.socketpair()
    with left, right:
        right.send(b"x")
        getattr(loop, method)(left, 42)
        loop.call_soon(loop.stop)
        loop.run_forever()
        getattr(loop, method.replace("add", "remove"))(left)
    (context,) = exception_handler_calls.consume()
    assert isinstance(context["exception"], TypeError)
    assert "source_traceback" in context


@pytest.mark.parametrize("method", ["call_soon", "call_soon_threadsafe", "call_later", "call_at"])
def test_debug_mode_rejects_coroutine_function(loop, method):
    async def coroutine_function():
        pass

    loop.set_debug(True)
    schedule = getattr(loop, method)
    args = (0,) if method == "call_later" else (loop.time(),) if method == "call_at" else ()
    name = "call_(later|at)" if method == "call_later" else method
    with pytest.raises(TypeError, match=f"coroutines cannot be used with {name}"):
        schedule(*args, coroutine_function)


def test_debug_mode_rejects_coroutine_object(loop):
    async def coroutine_function():
        pass

    loop.set_debug(True)
    coroutine = coroutine_function()
    try:
        with pytest.raises(TypeError, match="coroutines cannot be used with call_soon"):
            loop.call_soon(coroutine)
    finally:
        coroutine.close()


def test_debug_callback_error_context_has_source_traceback(loop, exception_handler_calls):
    loop.set_debug(True)

    def fail():
        raise ValueError("debug")

    loop.call_soon(fail)
    loop.call_soon(loop.stop)
    loop.run_forever()
    (context,) = exception_handler_calls.consume()
    assert {"message", "exception", "handle", "source_traceback"} <= context.keys()
    frame = context["source_traceback"][-1]
    assert frame.filename == __file__


def test_coroutine_origin_tracking_follows_debug_mode_while_running(loop):
    loop.set_debug(True)
    depths = []
    loop.call_soon(lambda: depths.append(sys.get_coroutine_origin_tracking_depth()))
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert depths[0] > 0
    assert sys.get_coroutine_origin_tracking_depth() == 0


def test_set_debug_while_running_takes_effect(loop):
    handles = []

    def enable():
        loop.set_debug(True)
        loop.call_soon(lambda: handles.append(loop.call_soon(print)))
        loop.call_later(0.01, loop.stop)

    loop.call_soon(enable)
    loop.run_forever()
    assert loop.get_debug()
    # Handles made after set_debug(True) record where they were created.
    assert "created at " in repr(handles[0])
    handles[0].cancel()


@pytest.mark.parametrize("task_class", [asyncio.Task, tasks._PyTask], ids=["c-task", "py-task"])
def test_failed_task_is_freed_once_its_step_has_run_in_debug_mode(
    loop, exception_handler_calls, task_class
):
    # A task's traceback links the frames that ran its step (f_back); none of them may still
    # hold the step's handle, or the task lives on in a reference cycle (CPython 3.13's
    # test_futures2 test_task_exc_handler_correct_context, test_taskgroups' refcycle tests).
    # Freed, the task reports its unretrieved exception; the collector is off, so only a
    # plain decref can free it.
    loop.set_debug(True)

    async def fail() -> None:
        raise ZeroDivisionError

    async def main() -> list[dict[str, Any]]:
        task_class(fail())
        await asyncio.sleep(0)
        return exception_handler_calls.consume()

    gc.disable()
    try:
        (context,) = loop.run_until_complete(main())
    finally:
        gc.enable()
    assert context["message"] == "Task exception was never retrieved"
