"""asyncio's task registry with a native ``add``: see ``crates/py/src/task_registry.rs``.

Every C ``Task`` adds itself to a ``weakref.WeakSet`` when it is created (``_asyncio._all_tasks``
on CPython 3.11, ``_asyncio._scheduled_tasks`` on 3.12 and 3.13); ``asyncio.all_tasks()``
iterates that set. ``WeakSet.add`` and the removal callback it gives each weak reference are
Python code, about 3,300 instructions per task. ``install`` puts a native ``add`` that does the
same work on the set instance, which the C code's method lookup finds first. The set, its
contents and ``all_tasks()`` are unchanged, and so is every other loop's behaviour (the registry is
process-wide: tasks of asyncio's own loop register through the native ``add`` too).

It is installed when ``ferroloop`` is imported, on CPython 3.11 to 3.13 only (3.14 registers
tasks in a per-thread linked list instead), unless ``FERROLOOP_NATIVE_TASK_REGISTRY=0`` or
``FERROLOOP_PORTABLE=1`` is set in the environment. It is the ``task_registry`` loan of
``crates/py/src/cpython_loans.rs``.
"""

from __future__ import annotations

import os
import sys
import weakref

from ._native import TaskRegistry, _install_task_registry

_REGISTRY_NAMES = {(3, 11): "_all_tasks", (3, 12): "_scheduled_tasks", (3, 13): "_scheduled_tasks"}


def install() -> bool:
    """Install the native ``add``; returns whether it is in place."""
    if os.environ.get("FERROLOOP_NATIVE_TASK_REGISTRY", "1") == "0":
        return False
    if os.environ.get("FERROLOOP_PORTABLE") == "1":  # every CPython loan's fallback forced
        return False
    name = _REGISTRY_NAMES.get(sys.version_info[:2])
    if name is None:
        return False
    try:
        import _asyncio
    except ImportError:  # an interpreter without the C accelerator: Python tasks
        return False
    registry = getattr(_asyncio, name, None)
    if type(registry) is not weakref.WeakSet:
        return False
    current = vars(registry).get("add")
    if current is None:
        _install_task_registry(registry)
        return True
    return isinstance(getattr(current, "__self__", None), TaskRegistry)
