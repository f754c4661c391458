"""Rust worker threads complete the futures coroutines await (examples/wake_ext, built on
ferroloop-embed): through ferroloop's C API on a ferroloop loop, through
``call_soon_threadsafe`` on asyncio's. Each case runs on both loops.

``wake_ext.live_jobs()`` counts the job closures the example handed to the loop and that were
neither run nor dropped yet: 0 at the end means none leaked and none ran twice.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import pytest

wake_ext = pytest.importorskip(
    "wake_ext", reason="examples/wake_ext is not built (make build-examples)"
)


def wait_for_jobs(timeout: float = 5.0) -> int:
    """live_jobs() once it reaches 0, or after `timeout`."""
    deadline = time.monotonic() + timeout
    while wake_ext.live_jobs() and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    return wake_ext.live_jobs()


def test_remote_uses_the_c_api_only_on_ferroloop(loop: Any, loop_name: str) -> None:
    assert wake_ext.Waker(loop).native == (loop_name == "ferroloop")


@pytest.mark.parametrize("force_fallback", [False, True], ids=["for_loop", "forced_fallback"])
def test_many_threads_complete_every_future_with_its_value_or_exception(
    loop: Any, run, force_fallback: bool
) -> None:
    n, threads = 20_000, 64

    async def main() -> list[Any]:
        waker = wake_ext.Waker(asyncio.get_running_loop(), force_fallback=force_fallback)
        futures = [loop.create_future() for _ in range(n)]
        waker.complete(futures, threads, fail_every=997)
        results = await asyncio.gather(*futures, return_exceptions=True)
        waker.join()
        assert waker.refused == 0
        return results

    results = run(main())
    for i, r in enumerate(results):
        if i % 997 == 0:
            assert isinstance(r, ValueError) and str(r) == f"job {i} failed"
        else:
            assert r == 2 * i
    assert wait_for_jobs() == 0


def test_exception_raised_by_a_native_callback_reaches_the_exception_handler(
    loop: Any, run, exception_handler_calls
) -> None:
    async def main() -> list[dict[str, Any]]:
        waker = wake_ext.Waker(asyncio.get_running_loop())
        waker.raise_on_loop("boom from a worker")
        waker.join()
        for _ in range(500):
            if calls := exception_handler_calls.consume():
                return calls
            await asyncio.sleep(0.002)
        return []

    calls = run(main())
    assert len(calls) == 1
    exc = calls[0]["exception"]
    assert isinstance(exc, RuntimeError) and str(exc) == "boom from a worker"
    assert wait_for_jobs() == 0


def test_cancelled_future_drops_the_value_and_the_rest_complete(loop: Any, run) -> None:
    async def main() -> list[Any]:
        waker = wake_ext.Waker(asyncio.get_running_loop())
        futures = [loop.create_future() for _ in range(3)]
        futures[1].cancel()
        waker.complete(futures, 1)
        waker.join()
        await asyncio.wait([futures[0], futures[2]])
        return [futures[0].result(), futures[1].cancelled(), futures[2].result()]

    assert run(main()) == [0, True, 4]
    assert wait_for_jobs() == 0


def test_completion_after_the_loop_closed_is_refused(loop_factory) -> None:
    loop = loop_factory()
    futures = [loop.create_future() for _ in range(20)]
    waker = wake_ext.Waker(loop)
    # The threads start completing 20 ms from now; the loop closes before that.
    waker.complete(futures, 4, delay_us=20_000)
    loop.close()
    waker.join()
    assert waker.refused == len(futures)
    assert not any(f.done() for f in futures)
    if waker.native:
        assert loop._remote_futures_pending() == 0
        with pytest.raises(RuntimeError, match="closed"):
            wake_ext.Waker(loop)
    del futures, loop
    assert wait_for_jobs() == 0


def test_completion_racing_close_runs_once_or_is_refused(loop_factory) -> None:
    n = 4_000
    loop = loop_factory()
    futures = [loop.create_future() for _ in range(n)]
    waker = wake_ext.Waker(loop)
    native = waker.native
    waker.complete(futures, 8, delay_us=20)
    loop.run_until_complete(asyncio.sleep(0.01))
    loop.close()
    waker.join()
    done = sum(f.done() for f in futures)
    if native:
        # Exactly once: a completion the loop accepted ran (in an iteration or inside
        # close()); any other was refused.
        assert done + waker.refused == n
        assert wake_ext.live_jobs() == 0
    else:
        # asyncio can accept a call_soon_threadsafe just as close() clears its queue: that
        # callback never runs, and is freed with the loop.
        assert done + waker.refused <= n
    del futures, loop
    assert wait_for_jobs() == 0


def test_uvloop_takes_the_fallback_and_every_future_completes() -> None:
    """uvloop is not a ferroloop loop: the wrapper uses its call_soon_threadsafe (skipped
    where uvloop is not installed; `make bench` and `make bench-wake` install it)."""
    uvloop = pytest.importorskip("uvloop")
    loop = uvloop.new_event_loop()
    try:
        waker = wake_ext.Waker(loop)
        assert not waker.native
        futures = [loop.create_future() for _ in range(2_000)]
        waker.complete(futures, 16)
        results = loop.run_until_complete(asyncio.gather(*futures))
        waker.join()
        assert results == [2 * i for i in range(2_000)]
    finally:
        loop.close()
    assert wait_for_jobs() == 0
