"""close / is_closed, closing while running, and using a closed loop."""

from __future__ import annotations

import threading

import pytest


def test_close_marks_the_loop_closed(loop):
    loop.close()
    assert loop.is_closed()
    assert not loop.is_running()


def test_close_twice_is_harmless(loop):
    loop.close()
    loop.close()
    assert loop.is_closed()


def test_close_while_running_raises(loop):
    errors = []

    def close_inside():
        try:
            loop.close()
        except RuntimeError as exc:
            errors.append(str(exc))
        loop.stop()

    loop.call_soon(close_inside)
    loop.run_forever()
    assert errors == ["Cannot close a running event loop"]
    assert not loop.is_closed()


def test_close_drops_pending_callbacks_without_running_them(loop):
    fired = []
    loop.call_soon(fired.append, "soon")
    loop.call_later(0, fired.append, "timer")
    loop.close()
    assert fired == []


def test_call_soon_after_close_raises(loop):
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_soon(print)


def test_call_later_after_close_raises(loop):
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_later(0, print)


def test_call_at_after_close_raises(loop):
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_at(loop.time(), print)


def test_call_soon_threadsafe_after_close_raises(loop):
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_soon_threadsafe(print)


def test_call_soon_threadsafe_from_another_thread_after_close_raises(loop):
    loop.close()
    errors = []

    def call():
        try:
            loop.call_soon_threadsafe(print)
        except RuntimeError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert errors == ["Event loop is closed"]


def test_run_forever_after_close_raises(loop):
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.run_forever()


def test_run_until_complete_after_close_raises(loop):
    async def main():
        pass

    loop.close()
    coroutine = main()
    try:
        with pytest.raises(RuntimeError, match="Event loop is closed"):
            loop.run_until_complete(coroutine)
    finally:
        coroutine.close()


def test_create_task_after_close_raises(loop):
    async def main():
        pass

    loop.close()
    coroutine = main()
    try:
        with pytest.raises(RuntimeError, match="Event loop is closed"):
            loop.create_task(coroutine)
    finally:
        coroutine.close()


def test_run_in_executor_after_close_raises(loop):
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.run_in_executor(None, print)


def test_close_shuts_down_the_default_executor(loop):
    async def main():
        return await loop.run_in_executor(None, threading.get_ident)

    worker_id = loop.run_until_complete(main())
    (worker,) = [thread for thread in threading.enumerate() if thread.ident == worker_id]
    loop.close()
    # close() shuts the default executor down (without waiting): its worker exits.
    worker.join(timeout=30)
    assert not worker.is_alive()


def test_time_still_works_after_close(loop):
    loop.close()
    assert isinstance(loop.time(), float)
