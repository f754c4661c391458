"""``ferroloop.Loop.call_soon`` and the other hot methods: the descriptors of
``crates/py/src/cached_method.rs``.

Each is a type object (so that CPython's specialised call instruction calls it directly) that
must otherwise read and behave as the method it stands for: these cases are ferroloop's own;
``tests/loop/test_call_soon.py`` and ``tests/loop/test_calling_shapes.py`` run the behaviour both
loops share.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys

import ferroloop
import pytest
from ferroloop import _native


@pytest.fixture
def loop():
    loop = ferroloop.new_event_loop()
    yield loop
    loop.close()


# name -> (signature, doc)
CACHED = {
    "call_soon": (
        "(callback, *args, context=None)",
        "Arrange for callback(*args) to be called soon.",
    ),
    "call_later": (
        "(delay, callback, *args, context=None)",
        "Call callback(*args) after delay seconds.",
    ),
    "call_at": ("(when, callback, *args, context=None)", "Call callback(*args) at loop time when."),
    "create_future": ("()", "Create a Future object attached to the loop."),
    "create_task": (
        "(coro, *, name=None, context=None, **kwargs)",
        "Schedule a coroutine object as a Task.",
    ),
    "time": ("()", "The loop's clock: seconds, monotonic."),
}


def descriptor(name="call_soon"):
    return ferroloop.Loop.__dict__[name]


@pytest.mark.cpython_loan("cached_call_soon")
@pytest.mark.parametrize("name", list(CACHED))
def test_reads_as_the_method(name):
    signature, doc = CACHED[name]
    method = getattr(ferroloop.Loop, name)
    assert method is descriptor(name)
    assert repr(method) == f"<method '{name}' of 'ferroloop._native.LoopCore' objects>"
    assert method.__name__ == name
    assert method.__qualname__ == f"Loop.{name}"
    assert method.__doc__ == doc
    assert method.__objclass__ is _native.LoopCore
    assert str(inspect.signature(method)) == signature
    # What differs from a plain method descriptor (docs/usage.md).
    assert isinstance(method, type)
    assert not inspect.ismethoddescriptor(method)


@pytest.mark.cpython_loan("cached_call_soon")
@pytest.mark.parametrize("name", list(CACHED))
def test_binds_once_per_loop(loop, name):
    first = getattr(loop, name)
    assert getattr(loop, name) is first
    assert first.__self__ is loop
    assert descriptor(name).__get__(loop, type(loop)) is first
    assert descriptor(name).__get__(None, type(loop)) is descriptor(name)
    assert functools.partial(getattr(loop, name)).func is first
    other = ferroloop.new_event_loop()
    try:
        assert getattr(other, name) is not first
        assert getattr(other, name).__self__ is other
    finally:
        other.close()
    # A closed loop keeps none: each fetch binds anew.
    other_bound = getattr(other, name)
    assert getattr(other, name) is not other_bound


def test_unbound_calls_check_self_and_arguments(loop):
    got = []
    handle = ferroloop.Loop.call_soon(loop, got.append, 1, context=contextvars.copy_context())
    other = loop.call_soon(print)
    other.cancel()
    assert type(handle) is type(other)
    with pytest.raises(TypeError, match="doesn't apply to a 'int' object"):
        ferroloop.Loop.call_soon(1, print)
    with pytest.raises(TypeError, match="needs an argument"):
        ferroloop.Loop.call_soon()
    with pytest.raises(TypeError):
        ferroloop.Loop.call_soon(loop, print, nope=1)
    # Through tp_call (a dict of keywords) as through vectorcall.
    ferroloop.Loop.call_soon(*(loop, got.append, 2), **{"context": None})
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert got == [1, 2]


def test_unbound_calls_of_the_other_methods_check_self_and_arguments(loop):
    assert isinstance(ferroloop.Loop.time(loop), float)
    fut = ferroloop.Loop.create_future(loop)
    assert fut.get_loop() is loop
    timer = ferroloop.Loop.call_later(loop, 10, print)
    assert ferroloop.Loop.call_at(loop, timer.when(), print).when() == timer.when()
    for name in ("time", "create_future"):
        with pytest.raises(TypeError, match="doesn't apply to a 'int' object"):
            getattr(ferroloop.Loop, name)(1)
        with pytest.raises(TypeError, match="takes no arguments"):
            getattr(ferroloop.Loop, name)(loop, 1)
        with pytest.raises(TypeError, match="takes no keyword arguments"):
            getattr(ferroloop.Loop, name)(loop, x=1)
    with pytest.raises(TypeError, match="doesn't apply to a 'int' object"):
        ferroloop.Loop.call_later(1, 1, print)
    loop.call_soon(loop.stop)
    loop.run_forever()
    fut.cancel()


@pytest.mark.cpython_loan("cached_call_soon")
def test_cannot_be_made_subclassed_or_changed():
    call_soon = descriptor()
    with pytest.raises(TypeError):
        call_soon()
    with pytest.raises(TypeError):
        type(call_soon)("call_soon", (), {})
    with pytest.raises(TypeError):
        type.__new__(type(call_soon), "call_soon", (), {})
    with pytest.raises(TypeError):

        class Sub(call_soon):  # type: ignore[misc, valid-type]
            pass

    with pytest.raises(TypeError):
        call_soon.__doc__ = "changed"
    with pytest.raises(RuntimeError, match="once"):
        _native._install_fast_methods(ferroloop.Loop)
    assert type(descriptor("time")) is type(call_soon)


def test_python_call_sites_run_callbacks_in_order(loop):
    # The call specialises after a few runs of the same instruction (3.11-3.13): every run,
    # before and after, must queue in order.
    got = []

    def schedule(i):
        loop.call_soon(got.append, i)

    for i in range(200):
        schedule(i)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert got == list(range(200))


def test_an_instance_attribute_shadows_it(loop):
    calls = []

    def patched(callback, *args, context=None):
        calls.append(callback)
        return ferroloop.Loop.call_soon(loop, callback, *args, context=context)

    loop.call_soon = patched
    try:
        fut = loop.create_future()
        fut.add_done_callback(lambda f: None)
        fut.set_result(1)  # the C Future looks call_soon up on the loop
        loop.call_soon(loop.stop)
        loop.run_forever()
    finally:
        del loop.call_soon
    assert len(calls) == 2
    assert loop.call_soon.__self__ is loop


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="CPython's refcounts")
def test_the_c_future_lookups_leave_the_cached_method_balanced(loop):
    bound = loop.call_soon
    before = sys.getrefcount(bound)
    futures = [loop.create_future() for _ in range(10)]
    for fut in futures:
        fut.add_done_callback(lambda f: None)
        fut.set_result(None)
    # Each C Future's `PyObject_GetAttr(loop, "call_soon")` goes through the descriptor's
    # `__get__`, which hands out a new reference to the one cached bound method; the Future
    # drops it after the call. A reference too many or too few per lookup shows here.
    assert sys.getrefcount(bound) == before
    loop.call_soon(loop.stop)
    loop.run_forever()
