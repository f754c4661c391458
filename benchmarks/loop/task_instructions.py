"""Where a gathered task's instructions go, counted by callgrind: a noise-free breakdown.

    python benchmarks/loop/task_instructions.py [--loops ferroloop,uvloop] [--tasks 4000,12000]
        [--keep DIR]

The workload is the `gather` benchmark's (batches of 1000 `_small` coroutines that each await
`asyncio.sleep(0)` once, gathered). Each loop runs it under `valgrind --tool=callgrind` for two
task counts; the difference of the two runs divided by the difference of the counts is the cost of
one task, with start-up cancelled out. `PYTHONHASHSEED=0` makes the counts repeat exactly.

The runs use `--separate-callers=30`, so every function's own (exclusive) cost is recorded per
calling context (its chain of up to 30 callers). Each context is charged to the component of the
nearest recognisable caller (`component`): for example, the allocator called by `Task.__init__`
is Task machinery, the same allocator called by the loop's `call_soon` is the loop's. Python code
is told apart by how the loop reached it (a small task's step, the outer task's wake-up, or a done
callback run by the loop), since CPython 3.11 runs Python-to-Python calls in one C frame. A
callgrind file is about 450 MB; each run takes about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BATCH = 1000
LOOP_OBJECTS = ("_native.cpython", "/uvloop/loop.cpython", "/rloop/")
# Frames between the loop's dispatch code and a Python callback: skipped when deciding who
# called a Python function.
CALL_GLUE = frozenset(
    (
        "PyObject_Call",
        "_PyObject_Call",
        "PyObject_Vectorcall",
        "_PyObject_VectorcallTstate",
        "PyObject_CallOneArg",
        "PyVectorcall_Call",
    )
)

# In the order the table lists them.
COMPONENTS = (
    "coroutine: create and free",
    "coroutine: body (_small, sleep, __sleep0)",
    "gather + batch driver (Python)",
    "gather: _done_callback (Python)",
    "C Task/Future: the rest",
    "C Task: all_tasks WeakSet add + remove",
    "C Task: eager 'Task-N' name",
    "C Task: call_soon helper (attribute lookup + call)",
    "C Task: _enter_task/_leave_task",
    "loop (call_soon, handles, run loop, create_task)",
    "cyclic GC",
    "other",
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loops", default="ferroloop,uvloop", help="comma-separated loop names")
    parser.add_argument("--tasks", default="4000,12000", help="the two task counts")
    parser.add_argument("--keep", type=Path, help="keep the callgrind files in this directory")
    parser.add_argument("--child", nargs=2, metavar=("LOOP", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.tasks = sorted(int(n) for n in args.tasks.split(","))
    if len(args.tasks) != 2 or args.tasks[0] >= args.tasks[1] or args.tasks[0] % BATCH:
        parser.error(f"--tasks takes two different multiples of {BATCH}, e.g. 4000,12000")
    return args


def child(name: str, n: int) -> None:
    """The gather workload: one warm-up batch, then n tasks in batches."""
    import gather

    new = (
        asyncio.new_event_loop
        if name == "asyncio"
        else importlib.import_module(name).new_event_loop
    )
    loop = new()
    try:
        assert loop.run_until_complete(gather._batches(BATCH, BATCH)) == 0
        assert loop.run_until_complete(gather._batches(n, BATCH)) == 0
    finally:
        loop.close()


def exclusive_by_context(path: Path) -> tuple[collections.Counter[str], dict[str, str]]:
    """{calling context: exclusive instructions} and {function: object file} of one run."""
    costs: collections.Counter[str] = collections.Counter()
    objects: dict[str, str] = {}
    fn = ob = ""
    after_call = False
    with path.open(errors="replace") as f:
        for line in f:
            first = line[:1]
            if first.isdigit() or first in "+-*":
                if after_call:  # the inclusive cost of a call, not this function's own
                    after_call = False
                    continue
                fields = line.split()
                if len(fields) >= 2:
                    costs[fn] += int(fields[1])
            elif line.startswith("fn="):
                fn = line[3:].rstrip("\n")
                objects.setdefault(fn.split("'", 1)[0], ob)
            elif line.startswith("ob="):
                ob = line[3:].rstrip("\n")
            elif line.startswith("calls="):
                after_call = True
    return costs, objects


def component(context: str, objects: dict[str, str]) -> str:
    """The component a calling context's cost belongs to (see the module docs)."""
    chain = [f for f in context.split("'") if not f.isdigit()]  # innermost first
    if "gc_collect_main" in chain:
        return "cyclic GC"
    for i, f in enumerate(chain):
        caller = chain[i + 1] if i + 1 < len(chain) else ""
        if f == "type_call" and any("create_task" in g for g in chain[i : i + 8]):
            return "C Task/Future: the rest"  # allocating the Task object
        if f == "PyObject_ClearWeakRefs" and "TaskObj_dealloc" in chain[i : i + 3]:
            return "C Task: all_tasks WeakSet add + remove"
        if f == "PyObject_VectorcallMethod" and caller == "_asyncio_Task___init__":
            return "C Task: all_tasks WeakSet add + remove"
        if f == "PyUnicode_FromFormat" and caller == "_asyncio_Task___init__":
            return "C Task: eager 'Task-N' name"
        if f in ("_Py_MakeCoro", "gen_dealloc"):
            return "coroutine: create and free"
        if f == "PyIter_Send" and caller == "task_step_impl":
            steppers = ("task_wakeup", "TaskStepMethWrapper_call")
            via = next((g for g in chain[i + 2 :] if g in steppers), "")
            if via == "task_wakeup":  # the outer task, woken when a batch is done
                return "gather + batch driver (Python)"
            return "coroutine: body (_small, sleep, __sleep0)"
        if f == "_PyFunction_Vectorcall":
            j = i + 1
            while j < len(chain) and (chain[j] in CALL_GLUE or chain[j].startswith("__Pyx_")):
                j += 1
            if j < len(chain) and any(s in objects.get(chain[j], "") for s in LOOP_OBJECTS):
                return "gather: _done_callback (Python)"
        where = objects.get(f, "")
        if "_asyncio.cpython" in where:
            if f == "call_soon":
                return "C Task: call_soon helper (attribute lookup + call)"
            if f in ("enter_task", "leave_task"):
                return "C Task: _enter_task/_leave_task"
            return "C Task/Future: the rest"
        if any(s in where for s in LOOP_OBJECTS):
            return "loop (call_soon, handles, run loop, create_task)"
    return "other"


def run(name: str, n: int, out: Path) -> tuple[collections.Counter[str], dict[str, str]]:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    command = [
        "valgrind", "--tool=callgrind", "--separate-callers=30", "--compress-strings=no",
        "--compress-pos=no", f"--callgrind-out-file={out}",
        sys.executable, __file__, "--child", name, str(n),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0 or not out.exists():
        sys.exit(f"{name} failed under callgrind:\n{done.stderr[-2000:]}")
    return exclusive_by_context(out)


def breakdown(name: str, tasks: list[int], workdir: Path, keep: bool) -> dict[str, float]:
    runs = []
    for n in tasks:
        out = workdir / f"callgrind.{name}.{n}.out"
        runs.append(run(name, n, out))
        if not keep:
            out.unlink()
    (small, _), (large, objects) = runs
    per_task: collections.Counter[str] = collections.Counter()
    dn = tasks[1] - tasks[0]
    for context, cost in large.items():
        per_task[component(context, objects)] += (cost - small.get(context, 0)) / dn
    return per_task


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]))
        return 0
    loops = args.loops.split(",")
    with tempfile.TemporaryDirectory(prefix="ferroloop-tasks-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        results = {name: breakdown(name, args.tasks, workdir, bool(args.keep)) for name in loops}
    width = max(len(c) for c in COMPONENTS)
    print(f"instructions per task, gather workload, tasks {args.tasks[0]} -> {args.tasks[1]}\n")
    print(f"| {'component':{width}} | " + " | ".join(f"{n:>9}" for n in loops) + " |")
    print(f"|{'-' * (width + 2)}|" + "|".join("-" * 10 + ":" for _ in loops) + "|")
    for c in COMPONENTS:
        cells = " | ".join(f"{results[n].get(c, 0):9,.0f}" for n in loops)
        print(f"| {c:{width}} | {cells} |")
    totals = " | ".join(f"{sum(results[n].values()):9,.0f}" for n in loops)
    print(f"| {'total':{width}} | {totals} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
