"""The one measurement every leak test takes: RSS and the number of gc-tracked objects."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable

import pytest

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _memory_sample() -> tuple[int, int]:
    gc.collect()
    with open("/proc/self/statm") as statm:
        rss = int(statm.read().split()[1]) * PAGE_SIZE
    return rss, len(gc.get_objects())


@pytest.fixture
def memory_sample() -> Callable[[], tuple[int, int]]:
    """``memory_sample()``: collect garbage, then return (RSS in bytes, gc-tracked objects)."""
    return _memory_sample
