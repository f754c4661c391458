"""Memory stays flat over many futures completed by Rust worker threads (examples/wake_ext):
ferroloop's C API on a ferroloop loop, ``call_soon_threadsafe`` on asyncio's.

Each chunk (a million completions in all on ferroloop) registers ``PER_CHUNK`` futures,
completes them from 4 threads (one in 101 with an exception) and awaits them all; RSS and
gc-tracked objects are sampled after each chunk and may not grow from the second chunk (pools
warm) to the last. A future, value or job closure kept per completion would add tens of
thousands of objects or megabytes per chunk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

wake_ext = pytest.importorskip(
    "wake_ext", reason="examples/wake_ext is not built (make build-examples)"
)

# A million completions on ferroloop (0.3 s per 200k on the 2-core CI machine); 200k on
# asyncio's loop, whose call_soon_threadsafe fallback takes the GIL per completion (11 s).
CHUNKS = {"ferroloop": 40, "asyncio": 8}
PER_CHUNK = 25_000
MAX_RSS_GROWTH = 8 * 1024 * 1024
MAX_OBJECT_GROWTH = 500


def test_completions_from_native_threads_keep_memory_flat(
    loop: Any, loop_name: str, run, memory_sample: Callable[[], tuple[int, int]]
) -> None:
    async def main() -> list[tuple[int, int]]:
        waker = wake_ext.Waker(asyncio.get_running_loop())
        samples = []
        for _ in range(CHUNKS[loop_name]):
            futures = [loop.create_future() for _ in range(PER_CHUNK)]
            waker.complete(futures, 4, fail_every=101)
            results = await asyncio.gather(*futures, return_exceptions=True)
            waker.join()
            assert results[1] == 2 and isinstance(results[0], ValueError)
            del futures, results
            samples.append(memory_sample())
        assert waker.refused == 0
        return samples

    samples = run(main(), timeout=120)
    assert wake_ext.live_jobs() == 0
    if hasattr(loop, "_remote_futures_pending"):
        assert loop._remote_futures_pending() == 0
    (rss_start, objects_start), (rss_end, objects_end) = samples[1], samples[-1]
    assert rss_end - rss_start < MAX_RSS_GROWTH, samples
    assert objects_end - objects_start < MAX_OBJECT_GROWTH, samples
