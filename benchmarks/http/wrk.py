"""Running wrk: the command line, its Lua script, and the numbers it reports.

Every run is `taskset -c 1 wrk -t1 -c{N} -d{D}s --latency -s SCRIPT URL`. The script is the
scenario's request (method, body, headers; none for a plain GET) plus a `done()` hook that wrk
calls once at the end and that prints one `WRK_RESULT {json}` line: the same counters wrk's own
report is built from (requests, bytes, duration, the error counts, latency percentiles), as exact
integers rather than rounded text with units. No `request()` or `response()` hook is defined, so
wrk keeps its fast path (one pre-built request, no Lua per response). The human-readable report,
with the `--latency` distribution, is kept in the JSON as it was printed.

wrk's latency is measured from sending a request to its response on a connection that always
has one request in flight (closed loop), so a slow server also sends fewer requests: p99 here
is not an open-loop latency at a fixed rate (wrk2's), but it is comparable between servers.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
from pathlib import Path

RESULT_PREFIX = "WRK_RESULT "
DONE_HOOK = r"""
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRK_RESULT {\"requests\": %.0f, \"bytes\": %.0f, \"duration_us\": %.0f, " ..
    "\"errors\": {\"connect\": %.0f, \"read\": %.0f, \"write\": %.0f, " ..
    "\"status\": %.0f, \"timeout\": %.0f}, " ..
    "\"latency_us\": {\"p50\": %.0f, \"p90\": %.0f, \"p99\": %.0f, \"max\": %.0f, " ..
    "\"mean\": %.1f}}\n",
    summary.requests, summary.bytes, summary.duration,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
"""


class WrkFailed(Exception):
    """wrk crashed, hung or printed no result line."""


def available() -> str | None:
    """None if wrk can run here, else why not."""
    if shutil.which("wrk") is None:
        return "wrk not found (apt-get install -y wrk)"
    return None


def version() -> str:
    """wrk's version line (`wrk -v` prints it, then exits with status 1)."""
    done = subprocess.run(["wrk", "-v"], capture_output=True, text=True)
    first = (done.stdout or done.stderr).strip().splitlines()[:1]
    return first[0].split(" Copyright")[0].strip() if first else "unknown"


def write_script(path: Path, prelude: str) -> Path:
    path.write_text(prelude.strip() + "\n" + DONE_HOOK)
    return path


def run(
    pin: list[str], url: str, conns: int, duration: int, script: Path, threads: int = 1
) -> dict:
    """One wrk run; returns the parsed counters plus `rps`, `client_cpu_s` and the raw output."""
    cmd = [
        *pin,
        "wrk",
        f"-t{threads}",
        f"-c{conns}",
        f"-d{duration}s",
        "--latency",
        "-s",
        str(script),
        url,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 30)
    except subprocess.TimeoutExpired:
        raise WrkFailed(f"wrk did not finish within {duration + 30} s") from None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise WrkFailed(f"wrk exited with status {done.returncode}: {done.stderr.strip()}")
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX) :])
            break
    else:
        raise WrkFailed(f"wrk printed no result line\n{done.stdout}\n{done.stderr}")
    seconds = result["duration_us"] / 1e6
    result["rps"] = result["requests"] / seconds if seconds > 0 else 0.0
    # Only wrk is reaped in between, so this is wrk's CPU time; near `seconds` means wrk's
    # core was saturated and the client, not the server, set the pace.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result["client_cpu_s"] = round(cpu, 3)
    result["client_busy"] = round(cpu / seconds, 3) if seconds > 0 else None
    result["output"] = done.stdout
    return result


def error_count(result: dict) -> int:
    """Socket errors (connect, read, write, timeout) plus responses with status >= 400."""
    return sum(result["errors"].values())


def describe_errors(result: dict) -> str:
    errors = result["errors"]
    parts = [f"{errors['status']} responses with status >= 400"] if errors["status"] else []
    socket = {k: v for k, v in errors.items() if k != "status" and v}
    if socket:
        parts.append("socket errors: " + ", ".join(f"{k} {v}" for k, v in socket.items()))
    return "; ".join(parts) + f" (in {result['requests']} requests)"
