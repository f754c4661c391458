"""Fairness between ready callbacks and everything else: while callbacks keep the ready queue
busy forever, I/O, due timers and work from other threads are still seen.

asyncio polls for I/O on every iteration; ferroloop skips the poll while ready work is pending
and polls again once its poll budget is spent (`ferroloop_core::poll_budget`). These tests
assert the behaviour both must share, whatever the budget: the storm stops only when the event
under test has been seen, and "forever" is a cap of STORM_CAP iterations that no loop which polls
at all would reach first (ferroloop runs it in well under a second, asyncio never gets near it).
"""

from __future__ import annotations

import asyncio
import threading

STORM_CAP = 2_000_000
CHAINS = 10


def _storm(loop, seen):
    """Starts CHAINS callbacks that re-schedule themselves until `seen` is non-empty (or the cap
    is reached: then the loop stops and the test fails). Returns the iteration counter."""
    count = [0]

    def chain(first):
        if seen:
            return
        if first:
            count[0] += 1
            if count[0] >= STORM_CAP:
                loop.stop()
                return
        loop.call_soon(chain, first)

    for i in range(CHAINS):
        loop.call_soon(chain, i == 0)
    return count


def test_reader_is_seen_while_callbacks_reschedule_themselves_forever(loop, unix_pair):
    reader, writer = unix_pair
    seen = []

    def on_readable():
        seen.append(reader.recv(16))
        loop.stop()

    loop.add_reader(reader, on_readable)
    count = _storm(loop, seen)

    def send_mid_storm():
        # Data arrives after the run began: the loop must poll again, not only at its start.
        if count[0] < 100:
            loop.call_soon(send_mid_storm)
        else:
            writer.send(b"ping")

    loop.call_soon(send_mid_storm)
    try:
        loop.run_forever()
    finally:
        loop.remove_reader(reader)
    assert seen == [b"ping"], f"reader not called in {count[0]} storm iterations"


def test_sock_recv_completes_while_tasks_yield_forever(loop, unix_pair):
    reader, writer = unix_pair
    stop = asyncio.Event()

    async def spinner():
        while not stop.is_set():
            await asyncio.sleep(0)

    sender = threading.Timer(0.01, writer.send, args=(b"pong",))

    async def main():
        spinners = [asyncio.ensure_future(spinner()) for _ in range(CHAINS)]
        await asyncio.sleep(0)
        sender.start()
        try:
            return await asyncio.wait_for(loop.sock_recv(reader, 16), 30)
        finally:
            stop.set()
            await asyncio.gather(*spinners)

    try:
        assert loop.run_until_complete(main()) == b"pong"
    finally:
        sender.join()


def test_timer_due_fires_while_callbacks_reschedule_themselves_forever(loop):
    seen = []
    loop.call_later(0.005, lambda: (seen.append("timer"), loop.stop()))
    count = _storm(loop, seen)
    loop.run_forever()
    assert seen == ["timer"], f"timer not fired in {count[0]} storm iterations"


def test_call_soon_threadsafe_is_seen_while_callbacks_reschedule_themselves_forever(loop):
    seen = []
    started = threading.Event()

    def from_thread():
        seen.append("threadsafe")
        loop.stop()

    def producer():
        started.wait(30)
        loop.call_soon_threadsafe(from_thread)

    thread = threading.Thread(target=producer)
    thread.start()
    count = _storm(loop, seen)
    loop.call_soon(started.set)
    try:
        loop.run_forever()
    finally:
        started.set()
        thread.join()
    assert seen == ["threadsafe"], f"not seen in {count[0]} storm iterations"


def test_one_iteration_run_sees_io_already_ready_right_after_a_busy_run(loop, unix_pair):
    # `call_soon(stop); run_forever()` runs one iteration, which polls for I/O first, also when
    # the previous run ended an instant ago with callbacks still queued.
    reader, writer = unix_pair
    seen = []
    loop.add_reader(reader, lambda: seen.append(reader.recv(16)))
    try:
        _storm(loop, seen)  # keeps the queue busy through the first run, which stops at once
        loop.call_soon(loop.stop)
        loop.run_forever()
        assert seen == []
        writer.send(b"x")
        loop.call_soon(loop.stop)
        loop.run_forever()
        assert seen == [b"x"]
    finally:
        seen.append("done")  # ends the storm
        loop.call_soon(loop.stop)
        loop.run_forever()
        loop.remove_reader(reader)


def test_io_callback_runs_after_the_callbacks_that_were_ready_before_it(loop, unix_pair):
    # asyncio's order: the callbacks ready at the start of an iteration, then the I/O handles
    # that iteration's poll found.
    reader, writer = unix_pair
    order = []
    writer.send(b"x")

    def on_readable():
        order.append("reader")
        reader.recv(16)
        loop.remove_reader(reader)
        loop.stop()

    loop.add_reader(reader, on_readable)
    for i in range(3):
        loop.call_soon(order.append, i)
    loop.run_forever()
    assert order == [0, 1, 2, "reader"]
