"""Run the loop-agnostic part of CPython's own asyncio test suite against ferroloop.

The tests are this interpreter's ``test.test_asyncio`` (the stdlib's ``test`` package).
Which modules and classes run, and how the loop under test is installed, is defined in
``cpython_asyncio_worker.py``; this script runs one worker process per module (``--jobs``
at a time), survives hangs and crashes, and reports.

Hangs and crashes: each test has ``--test-timeout`` seconds (a faulthandler watchdog in
the worker dumps every thread's stack and exits), each module ``--module-budget`` seconds
and the whole run ``--total-budget`` seconds of wall clock, so even a loop that hangs in
every test cannot hold CI for more than about seven minutes. A test that hangs or kills
its worker is booked as an error with the stack dump or the exit status, and the worker is
started again with the module's remaining tests. Tests still unrun when a budget is spent
are booked as errors.

Proof that the tests ran on the loop under test: the worker counts the loops it hands
out (and refuses loops of another type); the summary shows per module how many tests
created one ("on loop"), and the run fails if any module, or any per-loop class
(``FerroloopEventLoopTests``...), created none.

Usage (from the repository root, in the venv)::

    python tests/external/run_cpython_asyncio.py                       # ferroloop
    python tests/external/run_cpython_asyncio.py --loop uvloop -v      # compare
    python tests/external/run_cpython_asyncio.py --tasks native -v     # tasks: ferroloop.Task
    python tests/external/run_cpython_asyncio.py --json out.json \\
        --check tests/external/cpython_asyncio_baseline.json

``--tasks native`` installs ``ferroloop.task_factory`` on every loop the tests get from the
policy, so the suite's tasks (TaskGroup, timeouts, wait_for, locks, queues, streams...) are
ferroloop.Task rather than asyncio's; its baseline is a separate file.

``--check`` fails (exit 1) when fewer tests pass than the baseline records; the count may
only go up. ``--record`` rewrites the baseline (from full ferroloop runs only, and never
lower than the recorded count). Non-passing tests and why: ``EXCEPTIONS.md``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import itertools
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cpython_asyncio_worker import LOOPS, MODULES, START_MARKER, TASKS

WORKER = Path(__file__).with_name("cpython_asyncio_worker.py")
OUTCOMES = ("passed", "failed", "error", "skipped")
# Stack dumps and crash output kept per hung or crashed test.
STDERR_TAIL_CHARS = 6000


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            break  # the worker died mid-line; nothing after it is trustworthy
    return events


def describe_exit(returncode: int, killed: bool, stderr_tail: str, test_timeout: float) -> str:
    if killed:
        return "killed: the time budget (--module-budget, --total-budget) ran out in this test"
    if "Timeout (" in stderr_tail:
        return f"timeout: still running after {test_timeout:g}s (stacks below)"
    if returncode < 0:
        return f"worker crashed: killed by {signal.Signals(-returncode).name}"
    return f"worker exited with status {returncode} during this test"


def run_module(name: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """Run one module to completion, relaunching its worker after a hang or crash."""
    started = time.monotonic()
    deadline = min(started + args.module_budget, args.run_deadline)
    tests: dict[str, dict[str, Any]] = {}
    planned: list[str] | None = None
    finished = False
    unrun_reason = "not run: the time budget ran out"
    with tempfile.TemporaryDirectory(prefix=f"cpython-{name}-") as tmp:
        workdir = Path(tmp)
        # Each attempt books at least the test it died in, so the attempts run out.
        for attempt in itertools.count(1):
            results = workdir / f"results-{attempt}.jsonl"
            skip = workdir / f"skip-{attempt}.json"
            skip.write_text(json.dumps(sorted(tests)), encoding="utf-8")
            stderr_path = workdir / f"stderr-{attempt}.txt"
            command = [
                sys.executable,
                str(WORKER),
                *("--loop", args.loop, "--module", name, "--tasks", args.tasks),
                *("--results", str(results), "--skip", str(skip)),
                *("--test-timeout", str(args.test_timeout)),
            ]
            attempt_started = time.monotonic()
            with open(stderr_path, "wb") as stderr:
                # Own session, so a kill also takes the test's own child processes.
                proc = subprocess.Popen(
                    command,
                    cwd=workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=stderr,
                    stderr=stderr,
                    start_new_session=True,
                )
                killed = False
                try:
                    proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
                except subprocess.TimeoutExpired:
                    killed = True
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            stderr_text = stderr_path.read_text(encoding="utf-8", errors="replace")
            stderr_tail = stderr_text.rpartition(START_MARKER)[2][-STDERR_TAIL_CHARS:]
            pending = None
            for event in read_events(results):
                kind = event["event"]
                if kind == "plan" and planned is None:
                    planned = event["ids"]
                elif kind == "start":
                    pending = event["id"]
                elif kind == "result":
                    tests[event["id"]] = {key: event[key] for key in event if key != "event"}
                    pending = None
                elif kind == "done":
                    finished = True
                elif kind == "setup-error":
                    tests[f"{name} (worker setup)"] = error_record(event["detail"])
            if finished:
                break
            if pending is not None:
                reason = describe_exit(proc.returncode, killed, stderr_tail, args.test_timeout)
                tests[pending] = error_record(f"{reason}\n{stderr_tail}")
                tests[pending]["duration"] = round(time.monotonic() - attempt_started, 3)
            else:
                reason = f"worker exited with status {proc.returncode} outside any test"
                tests[f"{name} (worker)"] = error_record(f"{reason}\n{stderr_tail}")
                unrun_reason = f"not run: the worker died outside a test (see '{name} (worker)')"
            if pending is None or killed:
                break  # nothing more to gain from another attempt
    unrun = [test_id for test_id in planned or () if test_id not in tests]
    for test_id in unrun:
        tests[test_id] = error_record(unrun_reason)
    counts = {outcome: 0 for outcome in OUTCOMES}
    for record in tests.values():
        counts[record["outcome"]] += 1
    return {
        "run": len(tests),
        **counts,
        "on_loop": sum(1 for record in tests.values() if record["loops"] > 0),
        "loops": sum(record["loops"] for record in tests.values()),
        "seconds": round(time.monotonic() - started, 1),
        "tests": dict(sorted(tests.items())),
    }


def idle_per_loop_classes(loop: str, modules: dict[str, dict[str, Any]]) -> list[str]:
    """The per-loop classes (``Ferroloop...``) none of whose tests got a loop under test.

    Such a class would run on whatever loop the module builds by itself: its loop factory
    override did not take (the module renamed the method, say).
    """
    loops_by_class: dict[str, int] = {}
    for report in modules.values():
        for test_id, record in report["tests"].items():
            module, _, rest = test_id.partition(".test_asyncio.")[2].partition(".")
            class_name = rest.partition(".")[0]
            if class_name.startswith(loop.capitalize()):
                key = f"{module}.{class_name}"
                loops_by_class[key] = loops_by_class.get(key, 0) + record["loops"]
    return sorted(name for name, loops in loops_by_class.items() if loops == 0)


def error_record(detail: str) -> dict[str, Any]:
    return {"outcome": "error", "detail": detail, "loops": 0, "duration": 0.0}


def headline(detail: str) -> str:
    """The line of a traceback that says what went wrong (its last non-blank line)."""
    lines = [line for line in detail.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].startswith(("timeout:", "killed:", "worker ", "not run:")):
        return lines[0]
    return lines[-1][:160]


def print_summary(loop: str, tasks: str, modules: dict[str, dict[str, Any]], verbose: bool) -> None:
    header = f"{'module':<22}{'run':>6}{'passed':>8}{'failed':>8}{'errors':>8}"
    header += f"{'skipped':>9}{'on loop':>9}{'secs':>7}"
    with_tasks = " with ferroloop.Task" if tasks == "native" else ""
    print(f"CPython {platform.python_version()} test.test_asyncio on {loop}{with_tasks}")
    print(header)
    print("-" * len(header))
    for name, report in modules.items():
        print(
            f"{name:<22}{report['run']:>6}{report['passed']:>8}{report['failed']:>8}"
            f"{report['error']:>8}{report['skipped']:>9}{report['on_loop']:>9}"
            f"{report['seconds']:>7.1f}"
        )
    totals = total_counts(modules)
    print("-" * len(header))
    print(
        f"{'TOTAL':<22}{totals['run']:>6}{totals['passed']:>8}{totals['failed']:>8}"
        f"{totals['error']:>8}{totals['skipped']:>9}{totals['on_loop']:>9}"
        f"{totals['seconds']:>7.1f}"
    )
    print(f"{totals['loops']} {loop} loops created")
    if verbose:
        for report in modules.values():
            for test_id, record in report["tests"].items():
                if record["outcome"] != "passed":
                    print(
                        f"  {record['outcome'].upper():<8}{test_id}: {headline(record['detail'])}"
                    )


def total_counts(modules: dict[str, dict[str, Any]]) -> dict[str, Any]:
    keys = ("run", *OUTCOMES, "on_loop", "loops", "seconds")
    return {key: sum(report[key] for report in modules.values()) for key in keys}


def passed_ids(modules: dict[str, dict[str, Any]]) -> list[str]:
    return sorted(
        test_id
        for report in modules.values()
        for test_id, record in report["tests"].items()
        if record["outcome"] == "passed"
    )


def same_series(version: str) -> bool:
    """Whether ``version`` is this interpreter's feature release (3.11.x): same test suite."""
    return version.split(".")[:2] == platform.python_version().split(".")[:2]


def check_baseline(path: Path, loop: str, tasks: str, modules: dict[str, dict[str, Any]]) -> bool:
    baseline = json.loads(path.read_text(encoding="utf-8"))
    if baseline["loop"] != loop:
        sys.exit(f"{path} records a {baseline['loop']} run; this run is on {loop}")
    if baseline.get("tasks", "asyncio") != tasks:
        sys.exit(f"{path} records a run with {baseline.get('tasks', 'asyncio')} tasks, not {tasks}")
    if not same_series(baseline["python"]):
        sys.exit(
            f"{path} was recorded with CPython {baseline['python']}'s test suite; this is "
            f"{platform.python_version()}: record a baseline for it with --record"
        )
    expected = sum(baseline["modules"].get(name, 0) for name in modules)
    passed = total_counts(modules)["passed"]
    now = set(passed_ids(modules))
    lost = [
        test_id
        for test_id in baseline["passed_tests"]
        if test_id.split(".")[2] in modules and test_id not in now
    ]
    for test_id in lost:
        module = modules[test_id.split(".")[2]]
        record = module["tests"].get(test_id)
        why = f"{record['outcome']}: {headline(record['detail'])}" if record else "not run"
        print(f"REGRESSION {test_id} passed in the baseline; now {why}")
    verdict = "OK" if passed >= expected else "FAIL"
    print(f"baseline check {verdict}: {passed} passed, baseline {expected} ({path})")
    if passed > expected:
        print(f"  {passed - expected} more than recorded: raise the baseline with --record {path}")
    return passed >= expected


def record_baseline(path: Path, tasks: str, modules: dict[str, dict[str, Any]]) -> None:
    """Write the baseline; refuses to lower a baseline recorded on the same CPython."""
    passed = total_counts(modules)["passed"]
    if path.exists():
        old = json.loads(path.read_text(encoding="utf-8"))
        if same_series(old["python"]) and old["passed"] > passed:
            sys.exit(
                f"not lowering the baseline in {path} from {old['passed']} to {passed} passed; "
                "fix the regression, or delete the file to record a lower count on purpose"
            )
    baseline = {
        "loop": "ferroloop",
        "tasks": tasks,
        "python": platform.python_version(),
        "passed": passed,
        "modules": {name: report["passed"] for name, report in modules.items()},
        "passed_tests": passed_ids(modules),
    }
    path.write_text(json.dumps(baseline, indent=1) + "\n", encoding="utf-8")
    print(f"baseline recorded: {baseline['passed']} passed -> {path}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--loop", choices=LOOPS, default="ferroloop", help="loop under test")
    parser.add_argument(
        "--tasks",
        choices=TASKS,
        default="asyncio",
        help="the Task class of the loops' tasks: asyncio's (default) or ferroloop.Task",
    )
    parser.add_argument(
        "--module",
        action="append",
        choices=sorted(MODULES),
        help="run only this module (repeatable); default: all",
    )
    parser.add_argument("--json", type=Path, help="write every test's outcome here")
    parser.add_argument("--check", type=Path, metavar="BASELINE.json")
    parser.add_argument("--record", type=Path, metavar="BASELINE.json")
    parser.add_argument("--jobs", type=int, default=2, help="modules run at once (default 2)")
    parser.add_argument("--test-timeout", type=float, default=30.0, help="seconds (default 30)")
    parser.add_argument(
        "--module-budget", type=float, default=150.0, help="seconds per module (default 150)"
    )
    parser.add_argument(
        "--total-budget",
        type=float,
        default=420.0,
        help="seconds for the whole run (default 420); later modules get what is left",
    )
    parser.add_argument(
        "--cpython-tests",
        type=Path,
        metavar="DIR",
        help="directory holding CPython's test package, if the interpreter lacks it",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="list non-passing tests")
    args = parser.parse_args(argv)
    if args.record and (args.loop != "ferroloop" or args.module):
        parser.error("--record takes a full ferroloop run: --loop ferroloop, no --module")
    return args


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    if args.cpython_tests:
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(args.cpython_tests.resolve()), env.get("PYTHONPATH")])
        )
        sys.path.insert(0, str(args.cpython_tests.resolve()))
    if importlib.util.find_spec("test.test_asyncio") is None:
        sys.exit(
            "this interpreter has no test.test_asyncio (CPython's test suite); point "
            "--cpython-tests at the directory that holds its 'test' package"
        )
    for needed in {args.loop, "ferroloop" if args.tasks == "native" else "asyncio"} - {"asyncio"}:
        try:
            importlib.import_module(needed)
        except ImportError as exc:
            sys.exit(f"cannot import {needed}: {exc}")
    env.pop("PYTHONASYNCIODEBUG", None)  # the tests choose debug mode themselves
    return env


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = worker_env(args)
    names = [name for name in MODULES if not args.module or name in args.module]
    args.run_deadline = time.monotonic() + args.total_budget
    finished = itertools.count(1)  # next() on it is atomic, so threads can share it

    def run(name: str) -> dict[str, Any]:
        report = run_module(name, args, env)
        print(
            f"[{next(finished)}/{len(names)}] {name}: {report['passed']}/{report['run']} passed "
            f"({report['seconds']}s)",
            file=sys.stderr,
            flush=True,
        )
        return report

    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        reports = dict(zip(names, pool.map(run, names), strict=True))
    modules = {name: reports[name] for name in sorted(names)}

    print_summary(args.loop, args.tasks, modules, args.verbose)
    ok = True
    idle = [name for name, report in modules.items() if report["loops"] == 0]
    idle += idle_per_loop_classes(args.loop, modules)
    if idle:
        ok = False
        print(f"FAIL: no {args.loop} loop was created by: {', '.join(idle)}")
    if args.json:
        result = {
            "loop": args.loop,
            "tasks": args.tasks,
            "python": platform.python_version(),
            "totals": total_counts(modules),
            "modules": modules,
        }
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if args.check and not check_baseline(args.check, args.loop, args.tasks, modules):
        ok = False
    if args.record:
        if not ok:
            sys.exit("not recording a baseline from a failed run")
        record_baseline(args.record, args.tasks, modules)
    totals = total_counts(modules)
    # A plain closing line, as CI summaries read it (expected failures included: see EXCEPTIONS.md).
    print(
        f"cpython-asyncio: {totals['passed']} passed, "
        f"{totals['failed'] + totals['error']} failed, {totals['skipped']} skipped"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
