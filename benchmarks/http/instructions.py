"""Instructions per request of the ferroloop server, counted by callgrind: a noise-free cost.

    python benchmarks/http/instructions.py [--app hello_asgi:app] [--requests 2000,8000]
        [--conns 16] [--top 25] [--keep DIR]

Requests/s on a shared machine moves with whatever else runs; the number of instructions the
server executes for a request does not. The server runs under `valgrind --tool=callgrind` with
`--limit-max-requests N` (it exits by itself after N responses) while wrk keeps N connections
busy; this is done for two values of N, and the difference of the two totals divided by the
difference of the Ns is the cost of one request, with start-up and shutdown cancelled out.
Only user-space instructions are counted (callgrind does not see the kernel): this measures
ferroloop's and the interpreter's work, not the TCP stack's.

With `--top K`, the K functions whose own (exclusive) instruction count grows most per request
are listed, from the difference of the two runs' `callgrind_annotate` reports: where a request's
instructions go.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import servers

WRK_SCRIPT = "-- plain GET: wrk's default request\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--app", default="hello_asgi:app", help="from benchmarks/http/apps")
    parser.add_argument("--path", default="/", help="request path (/)")
    parser.add_argument("--requests", default="2000,8000", help="the two values of N")
    parser.add_argument("--conns", type=int, default=16, help="wrk connections (16)")
    parser.add_argument("--top", type=int, default=0, help="list the K costliest functions")
    parser.add_argument("--keep", type=Path, help="keep the callgrind files in this directory")
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="one more argument for the server (repeatable), e.g. --server-arg=--app-task=asyncio",
    )
    args = parser.parse_args(argv)
    args.requests = sorted(int(n) for n in args.requests.split(","))
    if len(args.requests) != 2 or args.requests[0] >= args.requests[1]:
        parser.error("--requests takes two different counts, e.g. 2000,8000")
    return args


@dataclass(frozen=True)
class UnderCallgrind:
    """ferroloop's benchmark command line under callgrind, ending after `requests` responses."""

    out: Path
    requests: int
    extra: tuple[str, ...] = ()
    name: str = "ferroloop"

    def command(self, app: str, port: int | str) -> list[str]:
        return [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={self.out}",
            *servers.BY_NAME["ferroloop"].command(app, port),
            "--limit-max-requests", str(self.requests),
            *self.extra,
        ]  # fmt: skip


def run_once(args, n: int, out: Path) -> int:
    """Serve n requests under callgrind; return the total instruction count."""
    log = out.with_suffix(".log")
    proc = servers.ServerProcess(
        UnderCallgrind(out, n, tuple(args.server_arg)), args.app, [], log
    )
    with proc:
        url = f"http://{servers.HOST}:{proc.port}{args.path}"
        deadline = time.monotonic() + 120
        while not log.exists() or "running on" not in log.read_text(errors="replace").lower():
            if not proc.alive() or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start:\n{proc.log_tail()}")
            time.sleep(0.2)
        script = out.with_suffix(".lua")
        script.write_text(WRK_SCRIPT)
        wrk = subprocess.Popen(
            ["wrk", "-t1", f"-c{args.conns}", "-d3600s", "-s", str(script), url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert proc.proc is not None
            proc.proc.wait(timeout=1800)
        finally:
            wrk.kill()
            wrk.wait()
    text = out.read_text(errors="replace")
    match = re.search(r"^(?:totals|summary): (\d+)", text, re.MULTILINE)
    if match is None:
        raise SystemExit(f"no totals in {out}:\n{proc.log_tail()}")
    return int(match.group(1))


def self_costs(out: Path) -> dict[str, int]:
    """{function: exclusive instructions} from callgrind_annotate."""
    done = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--threshold=100", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    costs = {}
    for line in done.stdout.splitlines():
        match = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*)$", line)
        if match and ":" in match.group(2):
            costs[match.group(2).strip()] = int(match.group(1).replace(",", ""))
    return costs


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    for tool in ("valgrind", "callgrind_annotate", "wrk"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found (apt-get install -y valgrind wrk)")
    info = servers.probe(servers.BY_NAME["ferroloop"])
    if info.get("debug_build") is not False:
        sys.exit("ferroloop is a debug build (or says nothing); run `make build` first.")
    with tempfile.TemporaryDirectory(prefix="ferroloop-instr-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        outs = [workdir / f"callgrind.{n}.out" for n in args.requests]
        totals = [run_once(args, n, out) for n, out in zip(args.requests, outs, strict=True)]
        dn = args.requests[1] - args.requests[0]
        per_request = (totals[1] - totals[0]) / dn
        print(
            f"{args.app} {args.path}: {per_request:,.0f} instructions per request "
            f"(N={args.requests[0]}: {totals[0]:,}; N={args.requests[1]}: {totals[1]:,}; "
            f"ferroloop {info.get('native_sha256')})"
        )
        if args.top:
            small, large = (self_costs(out) for out in outs)
            growth = {fn: (large[fn] - small.get(fn, 0)) / dn for fn in large}
            print(f"\n{'per request':>12}  function (exclusive instructions)")
            for fn, cost in sorted(growth.items(), key=lambda kv: -kv[1])[: args.top]:
                print(f"{cost:12,.0f}  {fn}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
