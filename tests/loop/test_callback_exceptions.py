"""Exceptions raised by callbacks reach the exception handler; the loop keeps running.

KeyboardInterrupt and SystemExit are not swallowed: they propagate out of run_forever.
"""

from __future__ import annotations

import asyncio
import gc
import socket
from asyncio import format_helpers

import pytest


def explode():
    raise ZeroDivisionError("callback failed")


def test_exception_in_call_soon_callback_reaches_the_handler(loop, exception_handler_calls):
    loop.call_soon(explode)
    loop.call_soon(loop.stop)
    loop.run_forever()
    (context,) = exception_handler_calls.consume()
    assert {"message", "exception", "handle"} <= context.keys()
    assert isinstance(context["exception"], ZeroDivisionError)
    assert context["message"].startswith("Exception in callback explode()")
    assert "explode" in repr(context["handle"])


def test_exception_context_has_the_same_keys_as_asyncio(loop, exception_handler_calls):
    loop.call_soon(explode)
    loop.call_soon(loop.stop)
    loop.run_forever()
    (context,) = exception_handler_calls.consume()
    assert set(context) == {"message", "exception", "handle"}


def test_exception_message_is_exactly_asyncios(loop, exception_handler_calls):
    loop.call_soon(explode)
    loop.call_soon(loop.stop)
    loop.run_forever()
    (context,) = exception_handler_calls.consume()
    source = format_helpers._format_callback_source(explode, ())
    assert context["message"] == f"Exception in callback {source}"


def test_exception_context_handle_is_the_scheduled_handle(loop, exception_handler_calls):
    handle = loop.call_soon(explode)
    loop.call_soon(loop.stop)
    loop.run_forever()
    (context,) = exception_handler_calls.consume()
    assert context["handle"] is handle


def test_exception_in_timer_callback_reaches_the_handler(loop, exception_handler_calls):
    timer = loop.call_later(0, explode)
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    (context,) = exception_handler_calls.consume()
    assert isinstance(context["exception"], ZeroDivisionError)
    assert context["handle"] is timer
    assert context["message"].startswith("Exception in callback explode()")


def test_exception_message_formats_the_callback_arguments(loop, exception_handler_calls, call_args):
    def fail_with(value, other):
        raise ValueError(value)

    loop.call_soon(fail_with, 1, "two")
    loop.call_soon(loop.stop)
    loop.run_forever()
    (context,) = exception_handler_calls.consume()
    assert "fail_with" + call_args("(1, 'two')") in context["message"]


def test_loop_keeps_running_after_a_callback_exception(loop, exception_handler_calls):
    order = []
    loop.call_soon(explode)
    loop.call_soon(order.append, "after")
    loop.call_later(0, explode)
    loop.call_later(0.01, order.append, "timer-after")
    loop.call_later(0.02, loop.stop)
    loop.run_forever()
    assert order == ["after", "timer-after"]
    assert len(exception_handler_calls.consume()) == 2


def test_exception_in_threadsafe_callback_reaches_the_handler(loop, exception_handler_calls):
    loop.call_soon_threadsafe(explode)
    loop.call_soon(loop.stop)
    loop.run_forever()
    (context,) = exception_handler_calls.consume()
    assert isinstance(context["exception"], ZeroDivisionError)


@pytest.mark.parametrize("exception", [KeyboardInterrupt, SystemExit])
def test_base_exception_in_callback_propagates_out_of_run_forever(loop, exception):
    def interrupt():
        raise exception()

    loop.call_soon(interrupt)
    with pytest.raises(exception):
        loop.run_forever()
    assert not loop.is_running()


@pytest.mark.parametrize("exception", [KeyboardInterrupt, SystemExit])
def test_base_exception_in_timer_propagates_out_of_run_forever(loop, exception):
    def interrupt():
        raise exception()

    loop.call_later(0, interrupt)
    with pytest.raises(exception):
        loop.run_forever()
    assert not loop.is_running()


def test_keyboard_interrupt_from_the_exception_handler_propagates(loop):
    def interrupting_handler(loop, context):
        raise KeyboardInterrupt

    loop.set_exception_handler(interrupting_handler)
    loop.call_soon(explode)
    with pytest.raises(KeyboardInterrupt):
        loop.run_forever()
    assert not loop.is_running()


@pytest.mark.parametrize("exception", [KeyboardInterrupt, SystemExit])
def test_base_exception_in_reader_propagates_out_of_run_forever(loop, exception):
    left, right = socket.socketpair()
    with left, right:

        def interrupt():
            raise exception()

        loop.add_reader(left, interrupt)
        right.send(b"x")
        try:
            with pytest.raises(exception):
                loop.run_forever()
        finally:
            loop.remove_reader(left)


def test_loop_is_reusable_after_keyboard_interrupt(loop):
    def interrupt():
        raise KeyboardInterrupt

    order = []
    loop.call_soon(interrupt)
    loop.call_soon(order.append, "after-interrupt")
    with pytest.raises(KeyboardInterrupt):
        loop.run_forever()
    with pytest.raises(RuntimeError, match="no running event loop"):
        asyncio.get_running_loop()
    loop.call_soon(loop.stop)
    loop.run_forever()
    # The callback queued behind the interrupted one was not lost.
    assert order == ["after-interrupt"]


def test_keyboard_interrupt_in_coroutine_propagates_out_of_run_until_complete(loop):
    async def main():
        await asyncio.sleep(0)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        loop.run_until_complete(main())


def test_unretrieved_task_exception_is_reported_when_collected(loop, exception_handler_calls):
    async def fail():
        raise ValueError("never retrieved")

    task = loop.create_task(fail())
    loop.run_until_complete(asyncio.sleep(0.01))
    assert task.done()
    del task
    gc.collect()
    (context,) = exception_handler_calls.consume()
    assert context["message"] == "Task exception was never retrieved"
    assert isinstance(context["exception"], ValueError)
    assert "future" in context
