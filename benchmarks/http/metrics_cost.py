"""What ``--metrics`` costs: hello and FastAPI req/s with and without it, in one run.

    python benchmarks/http/metrics_cost.py [--rounds 5]   # needs wrk

Issue 32's target: metrics on costs less than 2% of hello req/s. One worker (the request
counters are written on the worker's seat only when it has one: ``--metrics`` gives it one)
and ``--workers 2`` behind the front (where every worker has a seat anyway, so the difference
there is the exporter alone). ``wrk -t1 -c64 -d5s`` after a 1 s warm-up, the servers rotated
each round (``dispatch_noload.measure``), medians printed with the ratio on/off.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dispatch_noload

BASE = ["-m", "ferroloop", "--no-access-log"]
CONFIGS = {
    "w1": (BASE, []),
    "w1-metrics": (BASE, ["--metrics", "--metrics-port", "0"]),
    "w2": (BASE, ["--workers", "2"]),
    "w2-metrics": (BASE, ["--workers", "2", "--metrics", "--metrics-port", "0"]),
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    dispatch_noload.SERVERS.update(CONFIGS)
    names = list(CONFIGS)
    results: dict[tuple[str, str], list[float]] = {}
    for rnd in range(args.rounds):
        for scenario, (app, path) in dispatch_noload.SCENARIOS.items():
            for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
                rps, errors = dispatch_noload.measure(name, app, path)
                results.setdefault((scenario, name), []).append(rps)
                print(rnd, scenario, name, round(rps), "ERRORS" if errors else "", flush=True)
    print()
    for scenario in dispatch_noload.SCENARIOS:
        for base in ("w1", "w2"):
            off = statistics.median(results[(scenario, base)])
            on = statistics.median(results[(scenario, f"{base}-metrics")])
            print(
                f"{scenario:8} {base}: off {off:9.0f} req/s, on {on:9.0f} req/s, "
                f"on ÷ off {on / off:.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
