"""Event loop benchmarks: ferroloop against asyncio, uvloop and rloop on this machine, in one run.

    python benchmarks/loop/run.py [--quick] [--repeat R] [--only NAME] [--loops a,b,...]
                                  [--echo-client c|python]

Every measurement runs in a fresh process pinned to core 0 (the echo clients to core 1), one
loop per process; repeats are interleaved across loops so slow drift on a noisy machine spreads
over every column. The echoes (tcp, unix, udp and tls) are driven by echo_client.c unless
`--echo-client python` asks for echo_client.py. Results: benchmarks/results/loop.{md,json,png}.
See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/machine.py
import echo_measure
import loops
import report
from launch import ChildFailed, run_child
from machine import cpu_pins, fmt, run_meta
from wake_floor import measure as measure_wake_floor

BENCHMARKS = (
    "call_soon",
    "calling",
    "iteration",
    "timers",
    "futures",
    "gather",
    "threadsafe",
    "storm_latency",
    "sock_echo",
    "tcp_proto_echo",
    "tcp_streams_echo",
    "unix_echo",
    "udp_echo",
    "pipe_echo",
    "tls_echo",
)
RESULTS = Path(__file__).resolve().parent.parent / "results"
CHILD_TIMEOUT_S = 120.0  # one measurement; the slowest takes a few seconds on a release build


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, help="fresh processes per loop (default 5; 2 quick)")
    parser.add_argument("--quick", action="store_true", help="smaller N, 2 repeats: smoke test")
    parser.add_argument(
        "--only", action="append", choices=BENCHMARKS, help="run only this benchmark (repeatable)"
    )
    parser.add_argument(
        "--loops",
        default=",".join(loops.NAMES),
        help=f"comma-separated subset of {','.join(loops.NAMES)} (default: all)",
    )
    parser.add_argument(
        "--echo-client",
        choices=echo_measure.CLIENTS,
        default="c",
        help="load generator of the echoes: c (echo_client.c, compiled with cc and linked with "
        "OpenSSL; default) or python (echo_client.py on uvloop)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"output dir (default {RESULTS})")
    args = parser.parse_args(argv)
    args.only = [bench for bench in BENCHMARKS if bench in (args.only or BENCHMARKS)]
    args.loops = [name.strip() for name in args.loops.split(",") if name.strip()]
    unknown = sorted(set(args.loops) - set(loops.NAMES))
    if unknown:
        parser.error(f"unknown loop(s) {', '.join(unknown)}; choose from {', '.join(loops.NAMES)}")
    if args.repeat is None:
        args.repeat = 2 if args.quick else 5
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def probe_loops(names: list[str], pin: list[str]) -> tuple[dict, dict]:
    """Which loops can run here: {name: build info} and {name: why it is skipped}."""
    available, skipped = {}, {}
    for name in names:
        try:
            available[name] = run_child(pin, ["probe", name], 60.0, f"probing {name}")
        except ChildFailed as exc:
            skipped[name] = str(exc).strip().splitlines()[-1]
    if "ferroloop" in skipped:
        sys.exit(
            f"ferroloop cannot be loaded: {skipped['ferroloop']}\n"
            "Build it with `make build`, or leave it out with --loops asyncio,uvloop,rloop."
        )
    debug = available.get("ferroloop", {}).get("debug_build", False)
    if debug is None:
        sys.exit("ferroloop._native has no DEBUG_BUILD constant; cannot rule out a debug build.")
    if debug:
        sys.exit(
            "ferroloop is a debug build (ferroloop._native.DEBUG_BUILD is True); its numbers would "
            "mislead. Build a release build with `make build` and run again."
        )
    return available, skipped


def measure(module, loop_name: str, params: dict, pins: tuple[list, list]) -> dict:
    if hasattr(module, "measure"):  # benchmarks with more than one process (sock_echo)
        return module.measure(loop_name, params, pins)
    args = [module.__name__, "run", loop_name, json.dumps(params)]
    return run_child(pins[0], args, CHILD_TIMEOUT_S, f"{module.__name__} on {loop_name}")


def progress(case: str, rep: int, repeat: int, loop_name: str, sample: dict, metric) -> None:
    if sample.get("unsupported"):
        shown = sample["error"].splitlines()[0]
    elif "error" in sample:
        shown = "ERROR: " + sample["error"].splitlines()[0]
    else:
        shown = f"{fmt(sample['metrics'][metric.key])} {metric.unit}"
        if sample.get("problems"):
            shown += f"  [{len(sample['problems'])} problem(s)]"
    print(f"  {case:<22} {rep + 1}/{repeat}  {loop_name:<10} {shown}", file=sys.stderr, flush=True)


def run_cases(
    args: argparse.Namespace, names: list[str], pins: tuple[list, list], skipped: dict
) -> list[dict]:
    """Every case of every selected benchmark; a benchmark that cannot run here goes to skipped."""
    cases = []
    for bench in args.only:
        module = importlib.import_module(bench)
        reason = module.unavailable() if hasattr(module, "unavailable") else None
        if reason:
            print(f"{bench}: skipped ({reason})", file=sys.stderr, flush=True)
            skipped[bench] = reason
            continue
        for label, (full, quick) in module.CASES.items():
            params = quick if args.quick else full
            case = {"bench": bench, "case": label, "params": params, "runs": {n: [] for n in names}}
            case_name = f"{bench} {label}".strip()
            hung = set()  # a loop that hung once would hang again: do not wait for it twice
            unsupported = {}  # loop -> the first run's error: a missing feature stays missing
            for rep in range(args.repeat):
                shift = rep % len(names)
                for loop_name in names[shift:] + names[:shift]:
                    try:
                        if loop_name in hung:
                            raise ChildFailed("not run: an earlier run of this case hung")
                        if loop_name in unsupported:
                            raise ChildFailed(unsupported[loop_name], unsupported=True)
                        sample = measure(module, loop_name, params, pins)
                    except ChildFailed as exc:
                        sample = {"error": str(exc)}
                        if exc.hung:
                            hung.add(loop_name)
                        if exc.unsupported:
                            sample["unsupported"] = True
                            unsupported[loop_name] = str(exc)
                    case["runs"][loop_name].append(sample)
                    progress(case_name, rep, args.repeat, loop_name, sample, module.METRICS[0])
                if hasattr(module, "floor"):  # the same work with no Python (echo_floor.py)
                    try:
                        sample = module.floor(params, pins)
                    except ChildFailed as exc:
                        sample = {"error": str(exc)}
                    case.setdefault("floor", []).append(sample)
                    progress(case_name, rep, args.repeat, "C floor", sample, module.METRICS[0])
            cases.append(case)
    return cases


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    echo_measure.use_client(args.echo_client)
    pin0, pin1, pin_warning = cpu_pins()
    if pin_warning:
        print(f"warning: {pin_warning}", file=sys.stderr)
    available, skipped = probe_loops(args.loops, pin0)
    for name, reason in skipped.items():
        print(f"{name}: not available ({reason}); skipping its column", file=sys.stderr)
    names = [name for name in args.loops if name in available]
    if not names:
        sys.exit("no loop could be loaded")
    started, load_before = time.time(), os.getloadavg()[0]
    skipped_benchmarks: dict[str, str] = {}
    cases = run_cases(args, names, (pin0, pin1), skipped_benchmarks)
    wake_floor = (
        {"wake_floor": measure_wake_floor(pin0, args.repeat, args.quick)}
        if "threadsafe" in args.only and "threadsafe" not in skipped_benchmarks
        else {}
    )
    meta = {
        **run_meta("benchmarks/loop/run.py", argv, started, load_before, pin_warning is None),
        "cpus": os.cpu_count(),
        "repeat": args.repeat,
        "quick": args.quick,
        "echo_client": args.echo_client,
        "loops": available,
        "skipped": skipped,
        "skipped_benchmarks": skipped_benchmarks,
        **wake_floor,
    }
    modules = {case["bench"]: importlib.import_module(case["bench"]) for case in cases}
    text = report.write_all(args.out, meta, cases, modules)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
