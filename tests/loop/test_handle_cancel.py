"""Handle.cancel() / cancelled(): before firing, after firing, from other callbacks."""

from __future__ import annotations

import threading


def test_new_handles_are_not_cancelled(loop):
    soon = loop.call_soon(print)
    timer = loop.call_later(10, print)
    assert not soon.cancelled()
    assert not timer.cancelled()
    soon.cancel()
    timer.cancel()


def test_cancelled_timer_does_not_fire(loop):
    fired = []
    timer = loop.call_later(0.01, fired.append, "cancelled")
    timer.cancel()
    assert timer.cancelled()
    loop.call_later(0.02, loop.stop)
    loop.run_forever()
    assert fired == []


def test_cancel_is_idempotent(loop):
    soon = loop.call_soon(print)
    timer = loop.call_later(10, print)
    for _ in range(3):
        soon.cancel()
        timer.cancel()
    assert soon.cancelled()
    assert timer.cancelled()


def test_cancel_after_firing_marks_handle_cancelled(loop):
    fired = []
    soon = loop.call_soon(fired.append, "soon")
    timer = loop.call_later(0, fired.append, "timer")
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    assert fired == ["soon", "timer"]
    assert not soon.cancelled()
    assert not timer.cancelled()
    soon.cancel()
    timer.cancel()
    assert soon.cancelled()
    assert timer.cancelled()
    # Cancelling a handle that already ran has no other effect.
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert fired == ["soon", "timer"]


def test_timer_cancelled_by_earlier_timer_does_not_fire(loop):
    fired = []
    now = loop.time()
    victim = loop.call_at(now + 0.02, fired.append, "victim")
    loop.call_at(now + 0.01, victim.cancel)
    loop.call_at(now + 0.03, loop.stop)
    loop.run_forever()
    assert fired == []
    assert victim.cancelled()


def test_timer_cancelled_by_a_timer_due_at_the_same_time_does_not_fire(loop):
    # Both timers become due in the same iteration; the first cancels the second
    # after it was already moved to the ready queue.
    fired = []
    when = loop.time() + 0.01
    handles = []
    loop.call_at(when, lambda: handles[0].cancel())
    handles.append(loop.call_at(when, fired.append, "victim"))
    loop.call_at(when + 0.01, loop.stop)
    loop.run_forever()
    assert fired == []


def test_timer_cancelled_by_call_soon_callback_does_not_fire(loop):
    fired = []
    timer = loop.call_later(0.01, fired.append, "timer")
    loop.call_soon(timer.cancel)
    loop.call_later(0.02, loop.stop)
    loop.run_forever()
    assert fired == []


def test_cancelling_many_timers_leaves_the_others_firing(loop):
    fired = []
    now = loop.time()
    handles = [loop.call_at(now + (i % 10) / 1000, fired.append, i) for i in range(200)]
    for handle in handles[::2]:
        handle.cancel()
    loop.call_at(now + 0.02, loop.stop)
    loop.run_forever()
    assert sorted(fired) == list(range(1, 200, 2))


def test_cancelling_the_only_timer_lets_the_loop_stop_early(loop):
    # A far-away cancelled timer must not keep run_until_complete waiting.
    far = loop.call_later(3600, print)
    far.cancel()

    async def main():
        return "done"

    assert loop.run_until_complete(main()) == "done"


def test_cancelled_timer_when_is_unchanged(loop):
    when = loop.time() + 10
    timer = loop.call_at(when, print)
    timer.cancel()
    assert timer.when() == when


def test_handle_cancel_from_another_thread_before_run(loop):
    fired = []
    timer = loop.call_later(0.01, fired.append, "timer")
    thread = threading.Thread(target=timer.cancel)
    thread.start()
    thread.join()
    loop.call_later(0.02, loop.stop)
    loop.run_forever()
    assert fired == []


def test_cancelling_a_timer_after_the_loop_closed_is_harmless(loop):
    timer = loop.call_later(10, print)
    soon = loop.call_soon(print)
    loop.close()
    timer.cancel()
    soon.cancel()
    assert timer.cancelled()
    assert soon.cancelled()


def test_callback_cancelling_its_own_handle(loop):
    handles = []
    fired = []

    def cancel_self():
        fired.append("ran")
        handles[0].cancel()

    handles.append(loop.call_soon(cancel_self))
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert fired == ["ran"]
    assert handles[0].cancelled()


def test_timer_cancelling_itself_and_a_sibling(loop):
    fired = []
    handles = {}
    now = loop.time()

    def first():
        fired.append("first")
        handles["first"].cancel()
        handles["second"].cancel()

    handles["first"] = loop.call_at(now + 0.01, first)
    handles["second"] = loop.call_at(now + 0.02, fired.append, "second")
    loop.call_at(now + 0.03, loop.stop)
    loop.run_forever()
    assert fired == ["first"]
