"""ferroloop: an asyncio event loop with a Rust core.

import ferroloop
ferroloop.run(main())                       # like asyncio.run
asyncio.run(main(), loop_factory=ferroloop.new_event_loop)   # Python 3.12+
ferroloop.install()                         # make it asyncio's default loop
"""

from __future__ import annotations

from ._loop import Loop, new_event_loop
from ._native import Handle, TimerHandle, __version__
from ._runner import EventLoopPolicy, install, run

__all__ = [
    "EventLoopPolicy",
    "Handle",
    "Loop",
    "TimerHandle",
    "__version__",
    "install",
    "new_event_loop",
    "run",
]
