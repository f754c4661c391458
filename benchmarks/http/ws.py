"""WebSocket echo: ferroloop against granian, uvicorn and hypercorn, one worker each.

    python benchmarks/http/ws.py [--servers ...] [--sizes 64,16384] [--connections 64]
        [--duration 4] [--repeats 3] [--out DIR]

What it measures: a chat or push server's message path. Each of the client's connections
(`ws_client.c`, epoll in C, on core 1; the server on core 0) keeps one binary message in flight:
the server decodes the masked frame, the app (`apps/ws_echo_asgi.py`) gets it from `receive()`
and sends it back with `send()`, the server frames and writes it, and the client checks the echo
byte for byte before sending the next. Reported per server: echoes per second (median, min and
max over the repeats) and the server's CPU time per echo (its process tree's user+system time,
from /proc, from the first handshake to the end, over every echo in that time), with ratios
ferroloop ÷ peer; the client's core busy share says whether the client, not the server, was
the limit (near 100%).

Every cell starts the server afresh (the same command lines as `run.py`; each peer with its
default WebSocket implementation: granian's own, uvicorn's websockets-sansio, hypercorn's
wsproto), waits until it answers HTTP, runs the client, and stops the server. Servers alternate
within each repeat. A debug build of ferroloop is refused. Results: `ws.md` and `ws.json` in
`--out` (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/machine.py
import servers
from machine import cpu_pins, fmt, run_meta

RESULTS = Path(__file__).resolve().parent.parent / "results"
APP = "ws_echo_asgi:app"
CLIENT_SOURCE = Path(__file__).with_name("ws_client.c")
WARMUP_S = 1.0
GRACE_S = 30.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", default=",".join(servers.NAMES))
    parser.add_argument("--sizes", default="64,16384", help="message sizes in bytes")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--duration", type=float, default=4.0, help="measured seconds per cell")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.servers = [s for s in args.servers.split(",") if s]
    unknown = set(args.servers) - set(servers.NAMES)
    if unknown:
        parser.error(f"unknown servers: {', '.join(sorted(unknown))}")
    args.sizes = [int(s) for s in args.sizes.split(",")]
    return args


def build_client(workdir: Path) -> str:
    exe = workdir / "ws_client"
    built = subprocess.run(
        ["cc", "-O2", "-Wall", "-Wextra", str(CLIENT_SOURCE), "-o", str(exe)],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        sys.exit(f"compiling ws_client.c failed:\n{built.stderr}")
    return str(exe)


def http_ok(host: str, port: int, timeout: float) -> None:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/")
        response = conn.getresponse()
        if response.status != 200 or response.read() != b"ok":
            raise http.client.HTTPException(f"unexpected answer {response.status}")
    finally:
        conn.close()


def measure(server, size: int, args, pins, client: str, workdir: Path) -> dict:
    log_path = workdir / f"{server.name}-{size}.log"
    with servers.ServerProcess(server, APP, pins[0], log_path) as proc:
        proc.wait_ready(http_ok)
        cpu0 = proc.cpu_seconds()
        command = [
            *pins[1], client, str(proc.port), str(args.connections), str(size),
            str(WARMUP_S), str(args.duration),
        ]  # fmt: skip
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=WARMUP_S + args.duration + GRACE_S,
            )
        except subprocess.TimeoutExpired:
            return {"error": "the client hung"}
        cpu = proc.cpu_seconds() - cpu0
        if done.returncode != 0 or "RESULT " not in done.stdout:
            return {"error": f"client failed: {done.stderr.strip()[-300:]}\n{proc.log_tail(5)}"}
        result = json.loads(done.stdout.split("RESULT ", 1)[1])
    if result["errors"]:
        return {"error": f"{result['errors']} echo errors", **result}
    # The server's CPU time from the first handshake to the end, over every echo in that time
    # (the warm-up's too); the 64 handshakes add a little to it.
    echoes = result["echoes_total"]
    result["server_cpu_us_per_msg"] = cpu / echoes * 1e6 if echoes else None
    return result


def cell_values(cases: list[dict], size: int, name: str, key: str) -> list[float]:
    return [c[key] for c in cases if c["size"] == size and c["server"] == name and c.get(key)]


def table(cases: list[dict], names: list[str], key: str, title: str, higher: bool) -> str:
    peers = [n for n in names if n != "ferroloop"]
    header = [*names, *(f"ferroloop ÷ {n}" for n in peers)]
    lines = [f"### {title}", "", "| size | " + " | ".join(header) + " |"]
    lines.append("|---|" + "---:|" * len(header))
    for size in sorted({c["size"] for c in cases}):
        medians, cells = {}, []
        for name in names:
            values = cell_values(cases, size, name, key)
            if not values:
                cells.append("failed")
                continue
            medians[name] = statistics.median(values)
            cells.append(f"{fmt(medians[name])} ({fmt(min(values))} to {fmt(max(values))})")
        for peer in peers:
            both = "ferroloop" in medians and peer in medians
            cells.append(fmt(medians["ferroloop"] / medians[peer]) if both else "—")
        lines.append(f"| {size} B | " + " | ".join(cells) + " |")
    better = "higher" if higher else "lower"
    lines += ["", f"Median (min to max) over the repeats; {better} is better."]
    return "\n".join(lines)


def report(meta: dict, cases: list[dict], names: list[str]) -> str:
    busy = [c["client_busy"] for c in cases if "client_busy" in c]
    failures = [f"- {c['server']} {c['size']} B: {c['error']}" for c in cases if "error" in c]
    echoes_title = f"Echoes per second, {meta['connections']} connections"
    parts = [
        "# WebSocket echo benchmark",
        "\n".join(f"- {k}: {v}" for k, v in meta.items()),
        f"- client core busy (median over all cells): {statistics.median(busy):.0%}"
        if busy
        else "- client: no result",
        table(cases, names, "msgs_per_s", echoes_title, True),
        table(cases, names, "server_cpu_us_per_msg", "Server CPU per echo (µs)", False),
        "## Failures\n\n" + ("\n".join(failures) or "None."),
    ]
    return "\n\n".join(parts)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    pin0, pin1, pin_warning = cpu_pins()
    if pin_warning:
        print(f"warning: {pin_warning}", file=sys.stderr)
    available, missing = {}, {}
    for name in args.servers:
        try:
            available[name] = servers.probe(servers.BY_NAME[name])
        except LookupError as exc:
            missing[name] = str(exc)
    if available.get("ferroloop", {}).get("debug_build", False) is not False:
        sys.exit("ferroloop is a debug build (or its build is unknown); run `make build` first")
    names = [n for n in args.servers if n in available]
    started, load_before = time.time(), os.getloadavg()[0]
    cases = []
    with tempfile.TemporaryDirectory(prefix="ferroloop-ws-bench-") as tmp:
        client = build_client(Path(tmp))
        for repeat in range(args.repeats):
            for size in args.sizes:
                for name in names:
                    sample = measure(
                        servers.BY_NAME[name], size, args, (pin0, pin1), client, Path(tmp)
                    )
                    sample.update(server=name, size=size, repeat=repeat)
                    cases.append(sample)
                    shown = sample.get("error") or (
                        f"{fmt(sample['msgs_per_s'])} msg/s, "
                        f"{fmt(sample['server_cpu_us_per_msg'])} µs/msg, "
                        f"client busy {sample['client_busy']:.0%}"
                    )
                    print(
                        f"[{repeat + 1}/{args.repeats}] {name} {size} B: {shown}", file=sys.stderr
                    )
    meta = {
        **run_meta("benchmarks/http/ws.py", argv, started, load_before, pin_warning is None),
        "connections": args.connections,
        "duration_s_per_cell": args.duration,
        "repeats": args.repeats,
        "servers": available,
        "missing": missing,
    }
    text = report(meta, cases, names)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ws.md").write_text(text + "\n")
    (args.out / "ws.json").write_text(json.dumps({"meta": meta, "cases": cases}, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
