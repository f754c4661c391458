"""add_signal_handler / remove_signal_handler."""

from __future__ import annotations

import os
import signal
import threading

import pytest


def send_sigusr1():
    # If no handler were installed, SIGUSR1 would kill the whole test run; fail instead.
    assert signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL, "no SIGUSR1 handler installed"
    os.kill(os.getpid(), signal.SIGUSR1)


def test_signal_handler_runs_with_its_arguments(loop):
    received = []

    def on_signal(*args):
        received.append(args)
        loop.stop()

    loop.add_signal_handler(signal.SIGUSR1, on_signal, "usr1", 1)
    loop.call_soon(send_sigusr1)
    loop.run_forever()
    assert received == [("usr1", 1)]
    assert loop.remove_signal_handler(signal.SIGUSR1)


def test_signal_handler_runs_in_the_loop_thread_while_running(loop):
    seen = []

    def on_signal():
        seen.append((threading.current_thread() is threading.main_thread(), loop.is_running()))
        loop.stop()

    loop.add_signal_handler(signal.SIGUSR1, on_signal)
    loop.call_soon(send_sigusr1)
    loop.run_forever()
    assert seen == [(True, True)]


def test_signal_wakes_a_loop_blocked_in_poll(loop):
    fired = []

    def on_signal():
        fired.append("signal")
        loop.stop()

    far_timer = loop.call_later(3600, loop.stop)
    loop.add_signal_handler(signal.SIGUSR1, on_signal)
    sender = threading.Timer(0.05, send_sigusr1)
    sender.start()
    try:
        loop.run_forever()
    finally:
        sender.join()
        far_timer.cancel()
    assert fired == ["signal"]


def test_signal_received_before_run_is_handled_on_the_next_run(loop):
    fired = []
    loop.add_signal_handler(signal.SIGUSR1, fired.append, "handled")
    send_sigusr1()
    loop.call_later(0.05, loop.stop)
    loop.run_forever()
    assert fired == ["handled"]


def test_add_signal_handler_replaces_the_previous_handler(loop):
    fired = []

    def second():
        fired.append("second")
        loop.stop()

    loop.add_signal_handler(signal.SIGUSR1, fired.append, "first")
    loop.add_signal_handler(signal.SIGUSR1, second)
    loop.call_soon(send_sigusr1)
    loop.run_forever()
    assert fired == ["second"]


def test_remove_signal_handler_returns_whether_one_was_registered(loop):
    assert loop.remove_signal_handler(signal.SIGUSR1) is False
    loop.add_signal_handler(signal.SIGUSR1, print)
    assert loop.remove_signal_handler(signal.SIGUSR1) is True
    assert loop.remove_signal_handler(signal.SIGUSR1) is False


def test_remove_signal_handler_restores_the_default_disposition(loop):
    loop.add_signal_handler(signal.SIGUSR1, print)
    loop.remove_signal_handler(signal.SIGUSR1)
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_remove_sigint_handler_restores_keyboard_interrupt(loop):
    loop.add_signal_handler(signal.SIGINT, print)
    try:
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_close_removes_signal_handlers(loop):
    loop.add_signal_handler(signal.SIGUSR1, print)
    loop.close()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_signal_handler_exception_goes_to_the_exception_handler(loop, exception_handler_calls):
    def failing():
        loop.stop()
        raise ValueError("in signal handler")

    loop.add_signal_handler(signal.SIGUSR1, failing)
    loop.call_soon(send_sigusr1)
    loop.run_forever()
    (context,) = exception_handler_calls.consume()
    assert isinstance(context["exception"], ValueError)
    assert {"message", "exception", "handle"} <= context.keys()


def test_add_signal_handler_rejects_an_invalid_signal_number(loop):
    with pytest.raises(ValueError, match="invalid signal number"):
        loop.add_signal_handler(signal.NSIG + 1, print)


def test_add_signal_handler_rejects_a_non_integer_signal(loop):
    with pytest.raises(TypeError, match="sig must be an int"):
        loop.add_signal_handler("SIGUSR1", print)


def test_remove_signal_handler_rejects_an_invalid_signal_number(loop):
    with pytest.raises(ValueError, match="invalid signal number"):
        loop.remove_signal_handler(signal.NSIG + 1)


def test_add_signal_handler_for_sigkill_raises(loop):
    with pytest.raises(RuntimeError, match="cannot be caught"):
        loop.add_signal_handler(signal.SIGKILL, print)


def test_add_signal_handler_rejects_coroutine_function(loop):
    async def coroutine_function():
        pass

    with pytest.raises(TypeError, match="coroutines cannot be used with add_signal_handler"):
        loop.add_signal_handler(signal.SIGUSR1, coroutine_function)


def test_add_signal_handler_after_close_raises(loop):
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.add_signal_handler(signal.SIGUSR1, print)


def test_add_signal_handler_outside_the_main_thread_raises(loop_factory):
    errors = []

    def run():
        thread_loop = loop_factory()
        try:
            thread_loop.add_signal_handler(signal.SIGUSR1, print)
        except RuntimeError as exc:
            errors.append(exc)
        finally:
            thread_loop.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert len(errors) == 1
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_two_signals_each_run_their_handler(loop):
    fired = []

    def on_usr2():
        fired.append("usr2")
        loop.stop()

    loop.add_signal_handler(signal.SIGUSR1, fired.append, "usr1")
    loop.add_signal_handler(signal.SIGUSR2, on_usr2)

    def send_both():
        send_sigusr1()
        os.kill(os.getpid(), signal.SIGUSR2)

    loop.call_soon(send_both)
    loop.run_forever()
    assert sorted(fired) == ["usr1", "usr2"]


def test_sigint_during_poll_raises_keyboard_interrupt_out_of_run_forever(loop):
    # No handler registered: SIGINT keeps Python's default_int_handler, and a loop sleeping
    # in poll must surface the KeyboardInterrupt instead of sleeping on.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    far_timer = loop.call_later(3600, loop.stop)
    sender = threading.Timer(0.05, os.kill, args=(os.getpid(), signal.SIGINT))
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_forever()
    finally:
        sender.join()
        far_timer.cancel()
    assert not loop.is_running()
