"""``ferroloop.task_factory``: run a loop's tasks as ``ferroloop.Task``.

``loop.set_task_factory(ferroloop.task_factory)`` makes ``loop.create_task`` (and so
``asyncio.gather``, ``TaskGroup``...) build native tasks. See docs/usage.md for what differs
from asyncio's Task.
"""

from __future__ import annotations

from typing import Any

from ._native import Task


def task_factory(loop: Any, coro: Any, **kwargs: Any) -> Task:
    """A task factory for ``loop.set_task_factory``: ``ferroloop.Task(coro, loop=loop, ...)``."""
    return Task(coro, loop=loop, **kwargs)
