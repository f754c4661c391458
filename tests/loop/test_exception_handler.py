"""set/get_exception_handler, call_exception_handler, default_exception_handler."""

from __future__ import annotations

import logging

import pytest


def test_fresh_loop_has_no_custom_exception_handler(loop_factory):
    fresh = loop_factory()
    try:
        assert fresh.get_exception_handler() is None
    finally:
        fresh.close()


def test_get_exception_handler_returns_what_was_set(loop):
    def handler(loop, context):
        pass

    loop.set_exception_handler(handler)
    assert loop.get_exception_handler() is handler
    loop.set_exception_handler(None)
    assert loop.get_exception_handler() is None


def test_set_exception_handler_rejects_non_callable(loop):
    with pytest.raises(TypeError, match="A callable object or None is expected"):
        loop.set_exception_handler("not callable")


def test_call_exception_handler_passes_loop_and_context(loop):
    received = []
    loop.set_exception_handler(lambda *args: received.append(args))
    context = {"message": "custom", "extra": 1}
    loop.call_exception_handler(context)
    (args,) = received
    assert args[0] is loop
    assert args[1] == context


def test_custom_handler_receives_callback_errors(loop):
    received = []
    loop.set_exception_handler(lambda loop, context: received.append(context))

    def fail():
        raise KeyError("x")

    loop.call_soon(fail)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert [type(context["exception"]) for context in received] == [KeyError]


def test_default_exception_handler_logs_message_and_traceback(loop, caplog):
    try:
        raise ValueError("logged error")
    except ValueError as exc:
        error = exc
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.default_exception_handler({"message": "Something broke", "exception": error})
    (record,) = [r for r in caplog.records if r.name == "asyncio"]
    assert record.levelno == logging.ERROR
    assert record.getMessage().startswith("Something broke")
    assert record.exc_info is not None
    assert record.exc_info[1] is error


def test_default_exception_handler_logs_extra_context_keys(loop, caplog):
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.default_exception_handler({"message": "With extras", "custom_key": "custom-value"})
    (record,) = [r for r in caplog.records if r.name == "asyncio"]
    assert "custom_key: 'custom-value'" in record.getMessage()


def test_default_exception_handler_without_message(loop, caplog):
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.default_exception_handler({})
    (record,) = [r for r in caplog.records if r.name == "asyncio"]
    assert record.getMessage().startswith("Unhandled exception in event loop")


def test_call_exception_handler_without_custom_handler_logs(loop, caplog):
    loop.set_exception_handler(None)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.call_exception_handler({"message": "to the default handler"})
    (record,) = [r for r in caplog.records if r.name == "asyncio"]
    assert record.getMessage().startswith("to the default handler")


def test_callback_error_without_custom_handler_is_logged(loop, caplog):
    loop.set_exception_handler(None)

    def fail():
        raise RuntimeError("logged by default handler")

    loop.call_soon(fail)
    loop.call_soon(loop.stop)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.run_forever()
    (record,) = [r for r in caplog.records if r.name == "asyncio"]
    assert record.getMessage().startswith("Exception in callback")
    assert "fail()" in record.getMessage()
    assert isinstance(record.exc_info[1], RuntimeError)


def test_failing_custom_handler_is_logged_and_the_loop_continues(loop, caplog):
    def broken_handler(loop, context):
        raise LookupError("handler itself failed")

    loop.set_exception_handler(broken_handler)

    def fail():
        raise ValueError("original")

    order = []
    loop.call_soon(fail)
    loop.call_soon(order.append, "still running")
    loop.call_soon(loop.stop)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.run_forever()
    assert order == ["still running"]
    messages = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert any("Unhandled error in exception handler" in message for message in messages)


def test_failing_custom_handler_called_directly_is_logged(loop, caplog):
    def broken_handler(loop, context):
        raise LookupError("handler itself failed")

    loop.set_exception_handler(broken_handler)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.call_exception_handler({"message": "direct"})
    messages = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert any("Unhandled error in exception handler" in message for message in messages)


def test_subclass_can_override_default_exception_handler(loop_factory):
    fresh = loop_factory()
    seen = []
    try:
        cls = type(fresh)
        subclass = type(
            "Sub", (cls,), {"default_exception_handler": lambda self, c: seen.append(c)}
        )
    finally:
        fresh.close()
    sub = subclass()
    try:
        sub.call_exception_handler({"message": "to the override"})
    finally:
        sub.close()
    assert seen == [{"message": "to the override"}]
