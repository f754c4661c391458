"""Run uvicorn's own test suite on asyncio's loop and on ferroloop, and compare per test.

What it does, from a fresh clone (needs python3, cargo and network to PyPI):

1. setup, in the git-ignored work directory ``.uvicorn-suite/`` (``--workdir``):
   a virtualenv of its own (``venv/``) with the pinned test dependencies of
   ``requirements.txt``; uvicorn's source distribution (``UVICORN_VERSION``, checked against
   ``UVICORN_SDIST_SHA256``) downloaded with ``pip download --no-binary :all:`` and unpacked
   in ``src/``; ferroloop installed from this checkout with ``pip install`` (a release build by
   maturin, cargo's output in ``target/``), rebuilt only when its sources changed.
   Each step is skipped when its stamp says it is already done.
2. two runs of the whole suite, ``-n 2`` with pytest-xdist, each with the plugin
   ``loop_under_test.py``: first on asyncio's ``SelectorEventLoop`` (the reference), then on
   ``ferroloop.new_event_loop``. The plugin proves which loop every test ran on and writes
   each test's outcome to ``results/<loop>.json``; the full pytest output is in
   ``results/<loop>.log``.
3. the comparison: a test that passes on asyncio and not on ferroloop is run once more on
   ferroloop, alone, unless ``EXCEPTIONS.md`` lists it (section "Passes on asyncio, not on
   ferroloop") with its reason; if it fails again it is a regression.

Bounds: each test has ``--test-timeout`` seconds (pytest-timeout's signal method: SIGALRM fails
the test where it hangs, and the worker goes on; ferroloop runs signal handlers while it waits
in ``epoll_wait``, as asyncio does); if even that cannot stop it, faulthandler dumps every
thread's stack into the log ``FAULTHANDLER_GRACE`` seconds later. Each run has
``--run-budget`` seconds and everything ``--total-budget`` seconds of wall clock, after which
pytest is interrupted (then killed), and the tests it did not finish count as not passed.

The job fails (exit 1) on any regression that is not excepted, when the loop proof fails
(no test ran on ferroloop, or an anyio test ran on another loop), and with ``--check`` when
ferroloop passes fewer tests than ``baseline.json`` records. ``--record`` rewrites the
baseline, never lowering the ferroloop count. The last line is
``uvicorn-suite: N passed, M failed``: N tests passed on ferroloop, M are regressions that
fail the job.

Usage, from the repository root::

    python3 tests/external/uvicorn/run.py --check     # what `make test-uvicorn` runs
    python3 tests/external/uvicorn/run.py -k websocket --loops ferroloop   # a quick look
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

UVICORN_VERSION = "0.54.0"
UVICORN_SDIST_SHA256 = "a2e33cbfaa0306f8e6b0c13e0cb89d7d7a2da3e62b90c66e18c33d9807b28620"

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
REQUIREMENTS = HERE / "requirements.txt"
EXCEPTIONS = HERE / "EXCEPTIONS.md"
BASELINE = HERE / "baseline.json"
EXCEPTIONS_SECTION = "## Passes on asyncio, not on ferroloop"
# The ferroloop sources whose change means the installed wheel is stale.
FERROLOOP_INPUTS = ("Cargo.toml", "Cargo.lock", "pyproject.toml", "crates", "python")
# After the budget runs out pytest gets SIGINT (it then writes its report); this long to do so.
INTERRUPT_GRACE = 30.0
# Seconds past --test-timeout after which faulthandler dumps the stacks of a test still running.
FAULTHANDLER_GRACE = 15
# More diverging tests than this are not flakes: they are not retried.
MAX_RETRIES = 40


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, cap: float | None = None) -> float:
        left = max(self.end - time.monotonic(), 1.0)
        return left if cap is None else min(left, cap)


def log(message: str) -> None:
    print(message, flush=True)


def run(command: list[str], deadline: Deadline, **kwargs: Any) -> None:
    """Run a setup command, bounded by the deadline; its output goes to ours."""
    log("$ " + " ".join(command))
    subprocess.run(command, check=True, timeout=deadline.left(), **kwargs)


def digest(paths: list[Path], root: Path) -> str:
    sha = hashlib.sha256()
    for path in sorted(paths):
        sha.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()


def ferroloop_sources() -> list[Path]:
    files = []
    for name in FERROLOOP_INPUTS:
        path = REPO / name
        candidates = path.rglob("*") if path.is_dir() else [path]
        files.extend(
            file
            for file in candidates
            if file.is_file()
            and "__pycache__" not in file.parts
            and "target" not in file.relative_to(REPO).parts
            and file.suffix not in (".so", ".pyc")
        )
    return files


class Suite:
    """The work directory: its virtualenv, uvicorn's sources and the results."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.venv = workdir / "venv"
        self.python = self.venv / "bin" / "python"
        self.source = workdir / "src" / f"uvicorn-{UVICORN_VERSION}"
        self.results = workdir / "results"

    def setup(self, deadline: Deadline, rebuild: bool) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.results.mkdir(exist_ok=True)
        self.setup_venv(deadline)
        self.setup_uvicorn(deadline)
        self.setup_ferroloop(deadline, rebuild)

    def setup_venv(self, deadline: Deadline) -> None:
        stamp = self.venv / ".requirements-sha256"
        wanted = hashlib.sha256(REQUIREMENTS.read_bytes() + sys.version.encode()).hexdigest()
        if stamp.exists() and stamp.read_text() == wanted and self.python.exists():
            log(f"setup: {self.venv} is up to date with requirements.txt")
            return
        if self.venv.exists():
            shutil.rmtree(self.venv)
        run([sys.executable, "-m", "venv", str(self.venv)], deadline)
        pip = [str(self.python), "-m", "pip", "--disable-pip-version-check", "-q"]
        run([*pip, "install", "--upgrade", "pip"], deadline)
        run([*pip, "install", "-r", str(REQUIREMENTS)], deadline)
        stamp.write_text(wanted)

    def setup_uvicorn(self, deadline: Deadline) -> None:
        if (self.source / "tests" / "conftest.py").exists():
            log(f"setup: uvicorn {UVICORN_VERSION} sources are in {self.source}")
            return
        downloads = self.workdir / "downloads"
        sdist = downloads / f"uvicorn-{UVICORN_VERSION}.tar.gz"
        if not sdist.exists():
            run(
                [
                    *(str(self.python), "-m", "pip", "--disable-pip-version-check", "-q"),
                    *("download", "--no-binary", ":all:", "--no-deps"),
                    *("-d", str(downloads), f"uvicorn=={UVICORN_VERSION}"),
                ],
                deadline,
            )
        actual = hashlib.sha256(sdist.read_bytes()).hexdigest()
        if actual != UVICORN_SDIST_SHA256:
            sdist.unlink()
            raise SystemExit(
                f"uvicorn-suite: {sdist.name} has sha256 {actual}, expected "
                f"{UVICORN_SDIST_SHA256}; deleted it, run again to download it anew"
            )
        with tarfile.open(sdist) as archive:
            archive.extractall(self.source.parent, filter="data")
        log(f"setup: unpacked {sdist.name} into {self.source.parent}")

    def setup_ferroloop(self, deadline: Deadline, rebuild: bool) -> None:
        stamp = self.venv / ".ferroloop-sources-sha256"
        wanted = digest(ferroloop_sources(), REPO)
        if not rebuild and stamp.exists() and stamp.read_text() == wanted:
            log("setup: ferroloop in the suite's venv is built from the current sources")
            return
        started = time.monotonic()
        env = {**os.environ, "CARGO_TARGET_DIR": str(self.workdir / "target")}
        run(
            [
                *(str(self.python), "-m", "pip", "--disable-pip-version-check", "-q"),
                *("install", "--no-deps", "--force-reinstall", str(REPO)),
            ],
            deadline,
            env=env,
        )
        stamp.write_text(wanted)
        log(f"setup: built and installed ferroloop in {time.monotonic() - started:.0f} s")

    def pytest(
        self, loop: str, args: argparse.Namespace, deadline: Deadline, *selection: str
    ) -> dict[str, Any]:
        """One run of uvicorn's suite on ``loop``; returns the plugin's report."""
        tag = loop if not selection else f"{loop}-retry"
        report = self.results / f"{tag}.json"
        output = self.results / f"{tag}.log"
        report.unlink(missing_ok=True)
        (self.workdir / "tmp").mkdir(exist_ok=True)
        jobs = args.jobs if not selection else 0
        command = [
            *(str(self.python), "-m", "pytest", "-p", "loop_under_test"),
            *(f"--loop-under-test={loop}", f"--loop-report={report}"),
            *("-n", str(jobs), "-p", "no:cacheprovider", "-q", "-rfEs"),
            *(f"--timeout={args.test_timeout:g}", "--timeout-method=signal"),
            # A watchdog thread that needs no GIL: dumps every stack into the log if SIGALRM
            # could not stop a test (the run budget then ends the run).
            *("-o", f"faulthandler_timeout={args.test_timeout + FAULTHANDLER_GRACE:g}"),
            f"--basetemp={self.workdir / 'tmp' / tag}",
            *args.pytest_args,
            *selection,
        ]
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        env.update(
            PYTHONPATH=str(HERE),
            VIRTUAL_ENV=str(self.venv),
            PATH=f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            PYTHONDONTWRITEBYTECODE="1",
        )
        started = time.monotonic()
        with open(output, "wb") as out:
            proc = subprocess.Popen(
                command,
                cwd=self.source,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            interrupted = wait_bounded(proc, deadline.left(args.run_budget))
        elapsed = time.monotonic() - started
        if not report.exists():
            raise SystemExit(
                f"uvicorn-suite: the {tag} run wrote no report (exit status {proc.returncode}); "
                f"see {output}"
            )
        result: dict[str, Any] = json.loads(report.read_text(encoding="utf-8"))
        result["elapsed"] = elapsed
        result["interrupted"] = interrupted
        result["log"] = str(output)
        return result


def exited(pid: int, seconds: float) -> bool:
    """Waits up to ``seconds`` for ``pid`` to exit, leaving it unreaped (its pid stays ours)."""
    end = time.monotonic() + seconds
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= end:
            return False
        time.sleep(0.2)
    return True


def wait_bounded(proc: subprocess.Popen[bytes], seconds: float) -> bool:
    """Waits for pytest; past ``seconds`` interrupts it, then kills its session. True if cut.

    pytest runs in a session of its own, so the kill also ends the test processes it left
    behind; it is sent before pytest is reaped, so the group id cannot have been reused.
    """
    interrupted = not exited(proc.pid, seconds)
    if interrupted:
        log(f"uvicorn-suite: out of time after {seconds:.0f} s, interrupting pytest")
        proc.send_signal(signal.SIGINT)  # pytest then stops its workers and writes its report
        exited(proc.pid, INTERRUPT_GRACE)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return interrupted


def count(result: dict[str, Any], outcome: str) -> int:
    return sum(1 for entry in result["tests"].values() if entry["outcome"] == outcome)


def passed(result: dict[str, Any]) -> set[str]:
    return {nodeid for nodeid, entry in result["tests"].items() if entry["outcome"] == "passed"}


def describe(loop: str, result: dict[str, Any]) -> str:
    summary = result["summary"]
    counts = ", ".join(
        f"{count(result, outcome)} {outcome}"
        for outcome in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
        if outcome in ("passed", "failed") or count(result, outcome)
    )
    cut = ", INTERRUPTED by the time budget" if result["interrupted"] else ""
    other = summary.get("tests_with_other_loops")
    also = f", {other} also built an asyncio loop" if other else ""
    return (
        f"{loop:<9}: {counts} of {summary['tests']} tests in {result['elapsed']:.0f} s{cut}; "
        f"{summary['tests_on_loop']} ran on {summary['expected_loop_type']} "
        f"({summary['async_tests_on_loop']} async test bodies, "
        f"{summary['loops_created']} loops created{also}); log: {result['log']}"
    )


def read_exceptions(path: Path) -> dict[str, str]:
    """Test ids, with reasons, from the rows ``| `nodeid` | reason |`` of one section."""
    exceptions: dict[str, str] = {}
    in_section = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            in_section = line.strip() == EXCEPTIONS_SECTION
        elif in_section and (row := re.match(r"\|\s*`([^`]+::[^`]+)`\s*\|(.*)\|\s*$", line)):
            exceptions[row.group(1)] = row.group(2).strip()
    return exceptions


def failure_lines(longrepr: str) -> list[str]:
    """The ``E`` lines of a pytest failure (at most three), else its last line."""
    errors = [line for line in longrepr.splitlines() if line.startswith("E ")]
    lines = errors[:3] if errors else (longrepr.strip().splitlines() or ["?"])[-1:]
    return [line[:200] for line in lines]


def check_baseline(path: Path, ferroloop_passed: int) -> list[str]:
    recorded = json.loads(path.read_text(encoding="utf-8"))["ferroloop_passed"]
    if ferroloop_passed < recorded:
        return [f"ferroloop passed {ferroloop_passed} tests, fewer than the {recorded} recorded"]
    log(f"baseline : ferroloop passed {ferroloop_passed}, recorded {recorded}: ok")
    return []


def record_baseline(path: Path, asyncio_result: dict[str, Any], ferroloop_passed: int) -> None:
    old = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if ferroloop_passed < old.get("ferroloop_passed", 0):
        raise SystemExit(
            f"uvicorn-suite: refusing to lower the baseline from {old['ferroloop_passed']} "
            f"to {ferroloop_passed}"
        )
    baseline = {
        "uvicorn": UVICORN_VERSION,
        "python": platform.python_version(),
        "tests": asyncio_result["summary"]["tests"],
        "asyncio_passed": count(asyncio_result, "passed"),
        "ferroloop_passed": ferroloop_passed,
    }
    path.write_text(json.dumps(baseline, indent=1) + "\n", encoding="utf-8")
    log(f"baseline : recorded {baseline} in {path}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=REPO / ".uvicorn-suite")
    parser.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers (default 2)")
    parser.add_argument("--test-timeout", type=float, default=30.0, help="seconds per test")
    parser.add_argument("--run-budget", type=float, default=330.0, help="seconds per run")
    parser.add_argument("--total-budget", type=float, default=840.0, help="seconds in all")
    parser.add_argument("--rebuild", action="store_true", help="reinstall ferroloop anyway")
    parser.add_argument("--check", action="store_true", help="fail if below baseline.json")
    parser.add_argument("--record", action="store_true", help="rewrite baseline.json")
    parser.add_argument(
        "--loops",
        choices=("both", "ferroloop"),
        default="both",
        help="'ferroloop' skips the reference run (no comparison, no baseline)",
    )
    parser.add_argument(
        "-k", dest="keyword", help="only the tests matching this pytest -k expression"
    )
    args = parser.parse_args(argv)
    args.pytest_args = ["-k", args.keyword] if args.keyword else []
    partial = args.keyword or args.loops != "both"
    if partial and (args.check or args.record):
        parser.error("--check and --record need the whole suite on both loops")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    deadline = Deadline(args.total_budget)
    suite = Suite(args.workdir.resolve())
    log(
        f"uvicorn-suite: uvicorn {UVICORN_VERSION} on Python {platform.python_version()}, "
        f"work directory {suite.workdir}"
    )
    suite.setup(deadline, args.rebuild)

    problems: list[str] = []
    results: dict[str, dict[str, Any]] = {}
    for loop in ("asyncio", "ferroloop") if args.loops == "both" else ("ferroloop",):
        results[loop] = suite.pytest(loop, args, deadline)
        log(describe(loop, results[loop]))
        problems += [f"{loop} run: {p}" for p in results[loop]["summary"]["problems"]]
        if results[loop]["interrupted"]:
            problems.append(f"{loop} run: interrupted by the time budget")
    ferroloop = results["ferroloop"]
    ferroloop_passed = passed(ferroloop)

    regressions: list[str] = []
    if "asyncio" in results:
        exceptions = read_exceptions(EXCEPTIONS)
        diverging = sorted(passed(results["asyncio"]) - ferroloop_passed)
        flaky: list[str] = []
        to_retry = [test for test in diverging if test not in exceptions]
        if to_retry and len(to_retry) <= MAX_RETRIES and not ferroloop["interrupted"]:
            retry = suite.pytest("ferroloop", args, deadline, *to_retry)
            flaky = sorted(passed(retry) & set(to_retry))
            ferroloop_passed |= set(flaky)
        excepted = [test for test in diverging if test in exceptions and test not in flaky]
        regressions = [test for test in diverging if test not in exceptions and test not in flaky]
        log(
            f"compare  : {len(diverging)} tests pass on asyncio and not on ferroloop: "
            f"{len(excepted)} listed in EXCEPTIONS.md, {len(flaky)} passed on a retry, "
            f"{len(regressions)} regressions"
        )
        for test in flaky:
            log(f"  flaky (passed on retry): {test}")
        for test in excepted:
            reason = exceptions[test]
            log(f"  excepted: {test}: {reason[:90]}{'...' if len(reason) > 90 else ''}")
        for test in regressions:
            outcome = ferroloop["tests"].get(test, {"outcome": "not run", "longrepr": ""})
            log(f"  REGRESSION: {test}: {outcome['outcome']}")
            for line in failure_lines(outcome["longrepr"]):
                log(f"      {line}")
        for test in sorted(set(exceptions) & ferroloop_passed):
            log(f"  now passes on ferroloop, remove it from EXCEPTIONS.md: {test}")
        if regressions:
            problems.append(f"{len(regressions)} regressions (details in {ferroloop['log']})")
        if args.check:
            problems += check_baseline(BASELINE, len(ferroloop_passed))
        if args.record and problems:
            problems.append("baseline.json not recorded: the run has failures")
        elif args.record:
            record_baseline(BASELINE, results["asyncio"], len(ferroloop_passed))
    else:
        # No reference run: every test that did not pass counts against the loop.
        regressions = sorted(
            test
            for test, entry in ferroloop["tests"].items()
            if entry["outcome"] in ("failed", "error", "xpassed")
        )
        if regressions:
            problems.append(f"{len(regressions)} tests failed (no reference run to compare)")

    log(f"uvicorn-suite: {time.monotonic() - started:.0f} s in all")
    for problem in problems:
        log(f"uvicorn-suite: FAILED: {problem}")
    log(f"uvicorn-suite: {len(ferroloop_passed)} passed, {len(regressions)} failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
