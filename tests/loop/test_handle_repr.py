"""Handle and TimerHandle reprs: the same shape as asyncio's.

asyncio formats a handle as ``<Handle [cancelled] callback(args) at file:line>`` and a
timer as ``<TimerHandle [cancelled] when=<float> callback(args) at file:line>``; a
cancelled handle drops its callback outside debug mode (``<Handle cancelled>``).
"""

from __future__ import annotations

import functools
import re


def greet(name, punctuation="!"):
    return name + punctuation


def test_handle_repr_names_the_callback_and_its_arguments(loop, call_args):
    handle = loop.call_soon(greet, "world")
    text = repr(handle)
    handle.cancel()
    assert text.startswith("<Handle ")
    assert text.endswith(">")
    assert "greet" + call_args("('world')") in text


def test_handle_repr_points_at_the_callback_source(loop):
    handle = loop.call_soon(greet, "world")
    text = repr(handle)
    handle.cancel()
    assert re.search(r" at .*test_handle_repr\.py:\d+>$", text), text


def test_timer_handle_repr_shows_when_before_the_callback(loop, call_args):
    timer = loop.call_at(1234.5, greet, "x")
    text = repr(timer)
    timer.cancel()
    assert text.startswith("<TimerHandle when=1234.5 greet" + call_args("('x')")), text


def test_cancelled_handle_repr(loop):
    handle = loop.call_soon(greet, "world")
    handle.cancel()
    assert repr(handle) == "<Handle cancelled>"


def test_cancelled_timer_handle_repr(loop):
    timer = loop.call_at(1234.5, greet, "x")
    timer.cancel()
    assert repr(timer) == "<TimerHandle cancelled when=1234.5>"


def test_handle_repr_of_a_partial(loop, call_args):
    handle = loop.call_soon(functools.partial(greet, "partial"), "?")
    text = repr(handle)
    handle.cancel()
    assert text.startswith("<Handle ")
    assert "greet" in text
    assert call_args("('partial')") in text


def test_handle_repr_of_a_bound_method(loop, call_args):
    items = []
    handle = loop.call_soon(items.append, 1)
    text = repr(handle)
    handle.cancel()
    assert "list.append" + call_args("(1)") in text


def test_handle_repr_of_a_lambda(loop):
    handle = loop.call_soon(lambda: None)
    text = repr(handle)
    handle.cancel()
    assert "<lambda>" in text


def test_debug_handle_repr_says_where_it_was_created(loop):
    loop.set_debug(True)
    handle = loop.call_soon(greet, "debug")
    text = repr(handle)
    handle.cancel()
    assert re.search(r"created at .*test_handle_repr\.py:\d+>$", text), text


def test_debug_cancelled_handle_repr_keeps_the_callback(loop):
    loop.set_debug(True)
    handle = loop.call_soon(greet, "debug")
    handle.cancel()
    text = repr(handle)
    assert text.startswith("<Handle cancelled greet('debug')"), text
