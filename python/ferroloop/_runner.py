"""``ferroloop.run``, the event-loop policy and ``install``."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from ._loop import Loop, new_event_loop

T = TypeVar("T")


class EventLoopPolicy(asyncio.DefaultEventLoopPolicy):
    """An asyncio policy whose loops are ferroloop loops."""

    def _loop_factory(self) -> Loop:  # type: ignore[override]
        return new_event_loop()

    def new_event_loop(self) -> Loop:
        return new_event_loop()


def install() -> None:
    """Makes ferroloop the default loop for ``asyncio.new_event_loop()`` and ``asyncio.run``."""
    asyncio.set_event_loop_policy(EventLoopPolicy())


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Like ``asyncio.run``, on a new ferroloop loop that is closed afterwards.

    Ctrl-C cancels ``main`` and raises ``KeyboardInterrupt`` once it has finished, exactly as
    ``asyncio.run`` does (the same ``asyncio.Runner`` drives both).
    """
    if asyncio.events._get_running_loop() is not None:
        raise RuntimeError("ferroloop.run() cannot be called from a running event loop")
    with asyncio.Runner(debug=debug, loop_factory=new_event_loop) as runner:
        return runner.run(main)
