"""``ferroloop.run``, the event-loop policy and ``install``."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from ._loop import Loop, new_event_loop

T = TypeVar("T")

if sys.version_info >= (3, 14):
    # Policies are deprecated in 3.14 (removed in 3.16): the public names warn when read, so
    # the policy is built on, and installed through, the names asyncio itself uses.
    from asyncio.events import _set_event_loop_policy as _set_policy
    from asyncio.unix_events import _DefaultEventLoopPolicy as _DefaultPolicy
else:
    from asyncio import DefaultEventLoopPolicy as _DefaultPolicy
    from asyncio import set_event_loop_policy as _set_policy


class EventLoopPolicy(_DefaultPolicy):  # type: ignore[misc,valid-type]
    """An asyncio policy whose loops are ferroloop loops."""

    def _loop_factory(self) -> Loop:  # type: ignore[override]
        return new_event_loop()

    def new_event_loop(self) -> Loop:
        return new_event_loop()


def install() -> None:
    """Makes ferroloop the default loop for ``asyncio.new_event_loop()`` and ``asyncio.run``.

    Works where asyncio has event-loop policies (until 3.16), without asyncio's 3.14
    deprecation warning; ``asyncio.run(main(), loop_factory=ferroloop.new_event_loop)`` or
    ``ferroloop.run(main())`` need no policy."""
    _set_policy(EventLoopPolicy())


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Like ``asyncio.run``, on a new ferroloop loop that is closed afterwards.

    Ctrl-C cancels ``main`` and raises ``KeyboardInterrupt`` once it has finished, exactly as
    ``asyncio.run`` does (the same ``asyncio.Runner`` drives both).
    """
    if asyncio.events._get_running_loop() is not None:
        raise RuntimeError("ferroloop.run() cannot be called from a running event loop")
    with asyncio.Runner(debug=debug, loop_factory=new_event_loop) as runner:
        return runner.run(main)
