"""Entry point of every benchmark child process: build one loop, run one benchmark, print JSON.

    child.py probe LOOP
    child.py MODULE ENTRY LOOP PARAMS_JSON     (ENTRY is `run`, or `serve` for the echo server)

The child installs an exception handler on the loop: a benchmark that made the loop report an
unhandled error is not a clean measurement, so those reports travel back as `problems`.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys

import loops
from launch import RESULT_PREFIX


def emit(result: dict) -> None:
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["probe"] and len(argv) == 2:
        emit(loops.probe(argv[1]))
        return 0
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    module_name, entry, loop_name, params = argv
    module = importlib.import_module(module_name)
    loop = loops.factory(loop_name)()
    asyncio.set_event_loop(loop)
    handler_reports: list[str] = []

    def on_error(_loop: asyncio.AbstractEventLoop, context: dict) -> None:
        handler_reports.append(f"{context.get('message')!r}: {context.get('exception')!r}")

    loop.set_exception_handler(on_error)
    try:
        result = getattr(module, entry)(loop, json.loads(params))
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    problems = result.setdefault("problems", [])
    problems.extend(f"loop exception handler called: {r}" for r in handler_reports[:5])
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
