"""The loop's hot methods called the ways libraries write the call: nanoseconds per call.

A loop that is fast only through `loop.call_soon(cb)` written at the call site is fast in its own
benchmarks and slower in the code users run. Each hot method (`call_soon`, `call_later`,
`call_at`, `create_future`, `create_task`, `time`) is called N times in a row from a callback on
the running loop, in each of these forms:

- `site`: `loop.call_soon(cb)`, the form the interpreter specialises best;
- `local`: a bound method kept in a local (`cs = loop.call_soon` ... `cs(cb)`), as asyncio's
  streams, aiohttp and the benchmarks' own chains do;
- `partial`: `functools.partial(loop.call_soon, cb)` made once, then called;
- `getattr`: `getattr(loop, "call_soon")(cb)`, an attribute fetched per call, as C code
  (`PyObject_CallMethod`) and generic wrappers do;

and, for `call_soon`, the two ways the C `Future` reaches it:

- `get_loop`: `fut.get_loop().call_soon(cb)`;
- `done_callback`: a future made, given a done callback and resolved, so that `_asyncio.Future`
  looks `loop.call_soon` up and calls it with `context=` (this one also counts `create_future`).

What is timed is the whole cost the user pays: the calls, then the loop running what they
scheduled (the callbacks, the timers, the tasks) until the last one has run. The callback and
the task's coroutine are the same trivial Python functions on every loop.

    python benchmarks/loop/calling.py LOOP SHAPE N     (one shape in its own process; SHAPE
                                                        as in SHAPES, e.g. call_soon.local)
    python benchmarks/loop/calling.py LOOP --callgrind N [SHAPE ...]
        (under `valgrind --tool=callgrind --instr-atstart=no`, as `shape_instructions.py --calling`
        runs it: every shape, or those named, at N and 2N calls, each count dumped by name)
"""

from __future__ import annotations

import asyncio
import functools
import gc
import sys
from pathlib import Path
from time import perf_counter

sys.path.insert(0, str(Path(__file__).resolve().parent))
import callgrind_marks
import loops
from metric import Metric

# method -> (arguments bound by `partial`, arguments made fresh for every call)
OPS = {
    "call_soon": ("cb", ""),
    "call_later": ("0.0, cb", ""),
    "call_at": ("when, cb", ""),
    "create_future": ("", ""),
    "create_task": ("", "coro()"),
    "time": ("", ""),
}
FORMS = ("site", "local", "partial", "getattr")
# form -> (set-up before the loop, the call made in it)
TEMPLATES = {
    "site": ("pass", "loop.{op}({args})"),
    "local": ("f = loop.{op}", "f({args})"),
    "partial": ("f = partial(loop.{op}{bound})", "f({fresh})"),
    "getattr": ("pass", "getattr(loop, {op!r})({args})"),
    "get_loop": ("fut = loop.create_future()", "fut.get_loop().call_soon(cb)"),
    "done_callback": (
        "pass",
        "fut = loop.create_future(); fut.add_done_callback(cb); fut.set_result(None)",
    ),
}
SHAPES = (
    *(f"{op}.{form}" for op in OPS for form in FORMS),
    "call_soon.get_loop",
    "call_soon.done_callback",
)
# Methods whose calls leave work for the loop (a callback, a timer or a task per call).
SCHEDULES = {"call_soon", "call_later", "call_at", "create_task"}

METRICS = (Metric("ns_per_call", "hot method per calling shape", "ns", False),)
CASES = {shape: ({"shape": shape, "n": 200_000}, {"shape": shape, "n": 40_000}) for shape in SHAPES}


def _source(shape: str) -> str:
    op, form = shape.split(".")
    bound, fresh = OPS[op]
    args = ", ".join(a for a in (bound, fresh) if a)
    setup, call = TEMPLATES[form]
    fmt = {"op": op, "args": args, "bound": f", {bound}" if bound else "", "fresh": fresh}
    return (
        "def body(loop, n, cb, coro, when):\n"
        f"    {setup.format(**fmt)}\n"
        "    for _ in range(n):\n"
        f"        {call.format(**fmt)}\n"
    )


def _compile(shape: str):
    namespace = {"partial": functools.partial}
    exec(_source(shape), namespace)  # the benchmark's own templates
    return namespace["body"]


def time_shape(loop: asyncio.AbstractEventLoop, shape: str, n: int) -> float:
    """Seconds for N calls in `shape` and the work they leave, on `loop` (not running)."""
    body = _compile(shape)
    op = shape.split(".")[0]
    pending = n if op in SCHEDULES or shape.endswith("done_callback") else 0
    done = loop.create_future()
    ran = 0

    def cb(*_args: object) -> None:
        nonlocal ran
        ran += 1
        if ran == pending:
            done.set_result(None)

    async def coro() -> None:
        cb()

    def start() -> None:
        body(loop, n, cb, coro, loop.time())
        if not pending:
            done.set_result(None)

    t0 = perf_counter()
    loop.call_soon(start)
    loop.run_until_complete(done)
    elapsed = perf_counter() - t0
    if ran != pending:
        raise RuntimeError(f"{shape}: {ran} of {pending} scheduled callbacks ran")
    return elapsed


def run(loop: asyncio.AbstractEventLoop, params: dict) -> dict:
    shape, n = params["shape"], params["n"]
    time_shape(loop, shape, max(n // 10, 1000))  # warm-up: specialisation, allocator, free lists
    elapsed = time_shape(loop, shape, n)
    return {"metrics": {"ns_per_call": elapsed / n * 1e9}}


def count(name: str, n: int, shapes: list[str]) -> None:
    """Each shape at N and 2N calls on one loop, each count dumped as "SHAPE CALLS" (start-up and
    warm-up not counted). The cyclic collector is off while counting: when it runs, and what it
    then traverses (every task still pending), depends on what the process allocated before,
    which made the same shape's count vary by thousands of instructions per call from run to
    run; the times of `run()` include it."""
    marks = callgrind_marks.load()
    if marks is None:
        raise SystemExit("callgrind counts need cc and valgrind's headers (valgrind/callgrind.h)")
    loop = loops.factory(name)()
    asyncio.set_event_loop(loop)
    try:
        marks.start()
        gc.disable()
        for shape in shapes:
            time_shape(loop, shape, 1000)  # warm-up: specialisation, allocator, free lists
            for calls in (n, 2 * n):
                gc.collect()
                marks.zero()
                time_shape(loop, shape, calls)
                marks.dump(f"{shape} {calls}")
    finally:
        gc.enable()
        asyncio.set_event_loop(None)
        loop.close()


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[1] == "--callgrind":
        unknown = set(argv[3:]) - set(SHAPES)
        if unknown:
            raise SystemExit(f"unknown shapes {sorted(unknown)}; choose from {', '.join(SHAPES)}")
        count(argv[0], int(argv[2]), argv[3:] or list(SHAPES))
        return 0
    if len(argv) != 3 or argv[1] not in SHAPES:
        print(__doc__, file=sys.stderr)
        print(f"shapes: {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    name, shape, n = argv[0], argv[1], int(argv[2])
    loop = loops.factory(name)()
    asyncio.set_event_loop(loop)
    try:
        time_shape(loop, shape, 1000)  # the same warm-up at N and 2N: it cancels out
        elapsed = time_shape(loop, shape, n)
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    print(f"shape={shape} loop={name} n={n} seconds={elapsed:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
