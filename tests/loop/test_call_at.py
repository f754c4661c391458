"""call_at and TimerHandle.when(): absolute deadlines on the loop's clock."""

from __future__ import annotations

import contextvars

import pytest

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


def test_call_at_handle_when_is_the_given_deadline(loop):
    when = loop.time() + 10
    handle = loop.call_at(when, print)
    try:
        assert handle.when() == when
    finally:
        handle.cancel()


def test_call_later_handle_when_is_now_plus_delay(loop):
    before = loop.time()
    handle = loop.call_later(10, print)
    after = loop.time()
    try:
        assert before + 10 <= handle.when() <= after + 10
    finally:
        handle.cancel()


def test_call_at_fires_no_earlier_than_the_deadline(loop):
    fired_at = []
    when = loop.time() + 0.05
    loop.call_at(when, lambda: fired_at.append(loop.time()))
    loop.call_at(when, loop.stop)
    loop.run_forever()
    assert fired_at
    assert fired_at[0] >= when


def test_call_at_in_the_past_fires_promptly(loop):
    fired = []
    loop.call_at(loop.time() - 100, fired.append, "past")
    loop.call_at(loop.time() - 100, loop.stop)
    loop.run_forever()
    assert fired == ["past"]


def test_call_at_and_call_later_share_one_timeline(loop):
    order = []
    now = loop.time()
    handles = {
        "later-0.03": loop.call_later(0.03, order.append, "later-0.03"),
        "at-0.01": loop.call_at(now + 0.01, order.append, "at-0.01"),
        "at-0.02": loop.call_at(now + 0.02, order.append, "at-0.02"),
        "later-0.005": loop.call_later(0.005, order.append, "later-0.005"),
    }
    loop.call_at(max(handle.when() for handle in handles.values()) + 0.01, loop.stop)
    loop.run_forever()
    # Usually later-0.005, at-0.01, at-0.02, later-0.03; the order of the deadlines, which a
    # stall of the test between two calls can change (seen on a loaded machine, asyncio's loop).
    assert order == sorted(handles, key=lambda label: handles[label].when())
    assert handles["later-0.005"].when() < handles["later-0.03"].when()


def test_call_at_passes_arguments_and_context(loop):
    context = contextvars.copy_context()
    context.run(request_id.set, "at-context")
    seen = []
    loop.call_at(
        loop.time(), lambda *args: seen.append((args, request_id.get())), 1, 2, context=context
    )
    loop.call_at(loop.time() + 0.01, loop.stop)
    loop.run_forever()
    assert seen == [((1, 2), "at-context")]


def test_call_at_accepts_integer_deadline(loop):
    fired = []
    loop.call_at(int(loop.time()) - 1, fired.append, "int")
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    assert fired == ["int"]


@pytest.mark.parametrize("when", [5, 2**70, True])
def test_integer_deadline_is_handed_back_as_given(loop, when):
    # asyncio keeps call_at's `when` as it was given: when() and the repr say 5, not 5.0.
    timer = loop.call_at(when, print)
    assert (type(timer.when()), timer.when()) == (type(when), when)
    timer.cancel()
    assert repr(timer).endswith(f" when={when}>")


def test_call_at_rejects_none_deadline(loop):
    with pytest.raises(TypeError, match="when cannot be None"):
        loop.call_at(None, print)
