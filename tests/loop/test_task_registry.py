"""asyncio's task registry with ferroloop's native ``add`` (``crates/py/src/task_registry.rs``).

Importing ferroloop puts a native ``add`` on the ``WeakSet`` every C Task registers in. The
registry is process-wide, so the loop tests below run on both loops; the equivalence tests compare
a ``WeakSet`` given the native ``add`` with a plain one, operation by operation.
"""

from __future__ import annotations

import _asyncio
import asyncio
import gc
import os
import random
import subprocess
import sys
import weakref

import pytest
from ferroloop import _task_registry
from ferroloop._native import TaskRegistry, _install_task_registry

REGISTRY_NAME = _task_registry._REGISTRY_NAMES.get(sys.version_info[:2])
needs_registry = pytest.mark.skipif(
    REGISTRY_NAME is None,
    reason="this Python registers tasks without a WeakSet (3.14: a per-thread list), and its "
    "WeakSet has other internals, which the native add refuses",
)


class Item:
    """A weakly referenceable stand-in for a task."""


def native_weakset() -> weakref.WeakSet:
    ws: weakref.WeakSet = weakref.WeakSet()
    _install_task_registry(ws)
    return ws


@needs_registry
@pytest.mark.cpython_loan("task_registry")
def test_installed_on_import() -> None:
    registry = getattr(_asyncio, REGISTRY_NAME)
    add = vars(registry)["add"]
    assert isinstance(add.__self__, TaskRegistry)
    assert _task_registry.install() is True  # idempotent: already in place


@needs_registry
@pytest.mark.cpython_loan("task_registry")
def test_opt_out_environment_variable() -> None:
    code = f"import _asyncio, ferroloop, sys; sys.exit('add' in vars(_asyncio.{REGISTRY_NAME}))"
    env = dict(os.environ, FERROLOOP_NATIVE_TASK_REGISTRY="0")
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
    env["FERROLOOP_NATIVE_TASK_REGISTRY"] = "1"
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 1


def test_install_refuses_other_objects() -> None:
    class MyWeakSet(weakref.WeakSet):
        pass

    for bad in (set(), MyWeakSet(), object()):
        with pytest.raises(TypeError, match=r"exactly a weakref\.WeakSet"):
            _install_task_registry(bad)


@needs_registry
def test_add_len_iter_and_death_match_weakset() -> None:
    native, plain = native_weakset(), weakref.WeakSet()
    items = [Item() for _ in range(50)]
    for item in items:
        native.add(item)
        plain.add(item)
    native.add(items[0])  # a second add of the same item keeps one entry
    plain.add(items[0])
    assert len(native) == len(plain) == 50
    assert set(native) == set(plain) == set(items)
    del items[::2]
    gc.collect()
    assert len(native) == len(plain) == 25
    assert len(native.data) == len(plain.data) == 25
    assert set(native) == set(items)
    assert items[0] in native and Item() not in native


@needs_registry
def test_deaths_during_iteration_are_deferred_like_weakset() -> None:
    native, plain = native_weakset(), weakref.WeakSet()
    items = [Item() for _ in range(10)]
    for item in items:
        native.add(item)
        plain.add(item)
    del item
    it_native, it_plain = iter(native), iter(plain)
    held = {next(it_native), next(it_plain)}  # both sets are now being iterated
    victims = [i for i in items if i not in held][:1]
    items = [i for i in items if i not in victims]
    del victims
    gc.collect()
    # The dead entry waits in _pending_removals; len() already leaves it out.
    assert len(native._pending_removals) == len(plain._pending_removals) == 1
    assert len(native.data) == len(plain.data) == 10
    assert len(native) == len(plain) == 9
    # An add while removals are pending commits them first, as WeakSet.add does.
    extra = Item()
    native.add(extra)
    plain.add(extra)
    assert native._pending_removals == plain._pending_removals == []
    assert len(native.data) == len(plain.data) == 10
    list(it_native)
    list(it_plain)
    assert not native._iterating and not plain._iterating
    assert len(native) == len(plain) == 10


@needs_registry
def test_random_operations_match_weakset() -> None:
    # Adding or discarding while an iteration is in progress makes it fail with "Set changed
    # size during iteration" (WeakSet's own behaviour), so iterations only see deaths.
    rng = random.Random(1234)
    native, plain = native_weakset(), weakref.WeakSet()
    alive: list[Item] = []
    for _ in range(200):
        for _ in range(rng.randrange(20)):
            op = rng.random()
            if op < 0.5:
                alive.append(Item())
                native.add(alive[-1])
                plain.add(alive[-1])
            elif op < 0.8 and alive:
                alive.pop(rng.randrange(len(alive)))
            elif alive:
                victim = rng.choice(alive)
                native.discard(victim)
                plain.discard(victim)
                del victim
            assert len(native) == len(plain)
            assert len(native.data) == len(plain.data)
        iterators = [(iter(native), iter(plain)) for _ in range(rng.randrange(3))]
        held = [next(it, None) for pair in iterators for it in pair]
        for _ in range(rng.randrange(10)):
            if alive:
                alive.pop(rng.randrange(len(alive)))
            assert len(native) == len(plain)
            assert len(native._pending_removals) == len(plain._pending_removals)
        for pair in iterators:
            for it in pair:
                list(it)
        del held, iterators
        assert native._pending_removals == plain._pending_removals == []
        assert set(native) == set(plain) <= set(alive)


@needs_registry
def test_registry_freed_with_its_set() -> None:
    ws = native_weakset()
    item = Item()
    ws.add(item)
    ref = weakref.ref(ws)
    del ws
    gc.collect()
    assert ref() is None  # the cycle through the native add is collectable
    del item  # the weak reference's callback finds the set gone and does nothing
    gc.collect()


@needs_registry
def test_bound_add_keeps_its_set_alive_like_weakset() -> None:
    for ws in (native_weakset(), weakref.WeakSet()):
        add = ws.add
        ref = weakref.ref(ws)
        del ws
        gc.collect()
        item = Item()
        add(item)
        assert item in ref()


def test_add_of_an_unreferenceable_object_raises_like_weakset() -> None:
    with pytest.raises(TypeError):
        native_weakset().add(1)
    with pytest.raises(TypeError):
        weakref.WeakSet().add(1)


def test_all_tasks_sees_pending_tasks_forgets_dead_ones(
    loop: asyncio.AbstractEventLoop,
) -> None:
    async def main() -> tuple[int, int, int]:
        event = asyncio.Event()
        tasks = [asyncio.ensure_future(event.wait()) for _ in range(20)]
        await asyncio.sleep(0)
        seen = len(asyncio.all_tasks() & set(tasks))
        event.set()
        for task in tasks:
            await task
        refs = [weakref.ref(t) for t in tasks]
        del tasks, task
        await asyncio.sleep(0)  # the last wake-up's references go with the next iteration
        gc.collect()
        freed = sum(r() is None for r in refs)
        return seen, freed, len(asyncio.all_tasks())

    seen, freed, remaining = loop.run_until_complete(main())
    assert seen == 20
    assert freed == 20
    assert remaining == 1  # main itself


@needs_registry
def test_registry_shrinks_when_tasks_die(loop: asyncio.AbstractEventLoop) -> None:
    registry = getattr(_asyncio, REGISTRY_NAME)

    async def child() -> None:
        await asyncio.sleep(0)

    async def main() -> None:
        for _ in range(5):
            await asyncio.gather(*[child() for _ in range(200)])

    gc.collect()
    before = len(registry.data)
    loop.run_until_complete(main())
    gc.collect()
    assert len(registry.data) <= before + 1
