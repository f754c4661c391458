"""The loop's hot methods called the ways libraries write the call, on both loops.

``loop.call_soon(cb)`` at the call site, a bound method kept in a local, ``functools.partial``,
``getattr``, and the C ``Future``'s own lookups reach ferroloop's methods by different paths
(``crates/py/src/cached_method.rs``): each must keep asyncio's semantics (FIFO order across the
forms, ``context=``, timer order, the loop a future or task belongs to).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time

import pytest

FORMS = ("site", "local", "partial", "getattr")

var = contextvars.ContextVar("var", default="unset")


# `loop.<name>(...)` written out, for the "site" form.
SITE = {
    "call_soon": lambda loop: lambda *a, **k: loop.call_soon(*a, **k),
    "call_later": lambda loop: lambda *a, **k: loop.call_later(*a, **k),
    "call_at": lambda loop: lambda *a, **k: loop.call_at(*a, **k),
    "create_future": lambda loop: lambda *a, **k: loop.create_future(*a, **k),
    "create_task": lambda loop: lambda *a, **k: loop.create_task(*a, **k),
    "time": lambda loop: lambda *a, **k: loop.time(*a, **k),
}


def _caller(loop: asyncio.AbstractEventLoop, name: str, form: str):
    """A function calling ``loop.<name>(*args, **kwargs)`` in the given form."""
    if form == "site":
        return SITE[name](loop)
    if form == "local":
        method = getattr(loop, name)
        return lambda *args, **kwargs: method(*args, **kwargs)
    if form == "partial":
        return functools.partial(getattr(loop, name))
    return lambda *args, **kwargs: getattr(loop, name)(*args, **kwargs)


def test_call_soon_in_every_form_keeps_one_fifo(loop):
    got = []
    cs = loop.call_soon
    schedule = functools.partial(loop.call_soon, got.append)
    fut = loop.create_future()
    for i in range(0, 60, 6):
        loop.call_soon(got.append, i)
        cs(got.append, i + 1)
        schedule(i + 2)
        getattr(loop, "call_soon")(got.append, i + 3)  # noqa: B009 (the form under test)
        fut.get_loop().call_soon(got.append, i + 4)
        f = loop.create_future()
        f.add_done_callback(lambda _f, i=i: got.append(i + 5))  # the C Future's lookup
        f.set_result(None)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert got == list(range(60))


@pytest.mark.parametrize("form", FORMS)
def test_call_soon_context_in_every_form(loop, form):
    call_soon = _caller(loop, "call_soon", form)
    ctx = contextvars.copy_context()
    ctx.run(var.set, "given")
    seen = []
    call_soon(lambda: seen.append(var.get()), context=ctx)
    var.set("current")
    try:
        call_soon(lambda: seen.append(var.get()))
    finally:
        var.set("unset")
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert seen == ["given", "current"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", ["call_later", "call_at"])
def test_timers_in_every_form_fire_in_deadline_order(loop, name, form):
    schedule = _caller(loop, name, form)
    base = 0.0 if name == "call_later" else loop.time()
    ctx = contextvars.copy_context()
    ctx.run(var.set, "timer")
    got = []
    # Gaps of tens of ms: a delay counts from its own call_later, and a loaded machine may
    # take a while between the calls.
    schedule(base + 0.05, lambda: got.append(var.get()), context=ctx)
    handles = [schedule(base + delay, got.append, delay) for delay in (0.1, 0.01, 0.02)]
    assert handles[1].when() < handles[2].when() < handles[0].when()
    cancelled = schedule(base + 0.015, got.append, "cancelled")
    cancelled.cancel()
    loop.call_later(0.15, loop.stop)
    loop.run_forever()
    assert got == [0.01, 0.02, "timer", 0.1]


@pytest.mark.parametrize("form", FORMS)
def test_create_future_in_every_form(loop, form):
    create_future = _caller(loop, "create_future", form)
    futures = [create_future() for _ in range(3)]
    assert len({id(f) for f in futures}) == 3
    for fut in futures:
        assert fut.get_loop() is loop
        assert not fut.done()
    loop.call_soon(futures[1].set_result, "one")
    assert loop.run_until_complete(futures[1]) == "one"
    for fut in futures:
        fut.cancel()


@pytest.mark.parametrize("form", FORMS)
def test_create_task_in_every_form(loop, form):
    create_task = _caller(loop, "create_task", form)
    ctx = contextvars.copy_context()
    ctx.run(var.set, "task")

    async def read(tag):
        await asyncio.sleep(0)
        return tag, var.get()

    async def main():
        first = create_task(read("a"))
        second = create_task(read("b"), name="named", context=ctx)
        assert second.get_name() == "named"
        assert first.get_loop() is loop
        return await asyncio.gather(first, second)

    assert loop.run_until_complete(main()) == [("a", "unset"), ("b", "task")]


@pytest.mark.parametrize("form", FORMS)
def test_time_in_every_form(loop, form):
    now = _caller(loop, "time", form)
    readings = [now() for _ in range(100)]
    assert all(isinstance(t, float) for t in readings)
    assert readings == sorted(readings)
    # The loop's clock is the monotonic clock (asyncio's loop reads time.monotonic()).
    assert abs(now() - time.monotonic()) < 0.5


@pytest.mark.parametrize("name", ["call_soon", "call_later", "call_at", "create_task", "time"])
def test_bad_arguments_raise_in_every_form(loop, name):
    for form in FORMS:
        method = _caller(loop, name, form)
        with pytest.raises(TypeError):
            method(nope=1)
    with pytest.raises(TypeError):
        loop.create_future(1)
