"""The Rust wake path (``LoopRemote``): a Rust thread with no GIL hands closures to the loop.

This is ferroloop-only API (the server will use it), so there is no asyncio oracle here: the
tests check that every closure arrives, in order, on the loop thread, including while the loop
sleeps in epoll with no timers (only the eventfd can wake it then).
"""

from __future__ import annotations

import threading
import time

import ferroloop


def test_rust_thread_wakes_a_sleeping_loop_and_every_task_arrives_in_order():
    loop = ferroloop.new_event_loop()
    got: list[int] = []
    threads: set[int] = set()
    n = 2000

    def on_task(i: int, pushed_at: float) -> None:
        got.append(i)
        threads.add(threading.get_ident())
        assert pushed_at <= loop.time()
        if len(got) == n:
            loop.stop()

    # No timers and an empty ready queue: the loop blocks in epoll until the Rust producer
    # writes the eventfd. A 50 us gap between pushes makes it sleep between most of them.
    loop._spawn_rust_producer(on_task, n, 50)
    try:
        loop.run_forever()
    finally:
        loop.close()
    assert got == list(range(n))
    assert threads == {threading.get_ident()}


def test_rust_task_errors_reach_the_exception_handler():
    loop = ferroloop.new_event_loop()
    contexts: list[dict] = []
    loop.set_exception_handler(lambda _loop, ctx: contexts.append(ctx))

    def on_task(i: int, pushed_at: float) -> None:
        if i == 0:
            raise ValueError("boom")
        loop.stop()

    loop._spawn_rust_producer(on_task, 2, 0)
    try:
        loop.run_forever()
    finally:
        loop.close()
    assert len(contexts) == 1
    assert isinstance(contexts[0]["exception"], ValueError)
    assert "Rust" in contexts[0]["message"]


def test_rust_task_taken_in_by_a_call_soon_runs_before_the_loop_sleeps():
    """``call_soon`` moves what other threads queued into the loop first (asyncio's one FIFO);
    a Rust task moved that way must run in the next iteration, not wait for another wake-up
    (it once waited forever: the loop slept with it set aside, as the WSGI pool's hand-overs
    showed under load)."""
    loop = ferroloop.new_event_loop()
    ran = loop.create_future()
    pushed = threading.Event()

    def on_task(i: int, pushed_at: float) -> None:
        ran.set_result(i)

    def push_then_call_soon() -> None:
        loop._spawn_rust_producer(on_task, 1, 0)
        # The producer thread pushes at once; wait for the push to be queued (blocking the loop
        # thread on purpose), then let a call_soon take it in.
        pushed.wait(0.5)
        loop.call_soon(lambda: None)

    def watch() -> None:
        # Sees the push through the injector's pending flag, before any drain.
        while not loop._injector_pending():
            time.sleep(0.001)
        pushed.set()

    threading.Thread(target=watch, daemon=True).start()
    loop.call_soon(push_then_call_soon)
    timeout = loop.call_later(5, lambda: ran.done() or ran.set_exception(TimeoutError()))
    try:
        assert loop.run_until_complete(ran) == 0
    finally:
        timeout.cancel()
        loop.close()
