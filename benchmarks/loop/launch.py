"""Starting benchmark children: pinned to a core, bounded in time, with their output parsed.

A child prints one line `RESULT <json>` on stdout when it is done; anything else it prints is kept
only for error reports. Every child gets a timeout, so a loop that hangs costs one cell of the
table, not the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHILD = str(Path(__file__).with_name("child.py"))
RESULT_PREFIX = "RESULT "


class ChildFailed(Exception):
    """A child crashed, hung, or printed no result; the message says which and shows its stderr.

    `hung`: it would hang again, so the runner does not wait for it twice. `unsupported`: the loop
    lacks the feature the benchmark needs (NotImplementedError); not a failure of the loop.
    """

    def __init__(self, message: str, hung: bool = False, unsupported: bool = False) -> None:
        super().__init__(message)
        self.hung = hung
        self.unsupported = unsupported


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def parse_result(stdout: str, stderr: str, what: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    raise ChildFailed(f"{what} printed no result\n{tail(stderr)}")


def child_command(pin: list[str], *args: str) -> list[str]:
    return [*pin, sys.executable, CHILD, *args]


def run_child(pin: list[str], args: list[str], timeout: float, what: str) -> dict:
    """Run child.py with `args` to completion and return its result dict."""
    try:
        proc = subprocess.run(
            child_command(pin, *args), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        message = f"{what} hung: no result within {timeout:.0f} s\n{tail(stderr)}"
        raise ChildFailed(message, hung=True) from None
    if proc.returncode != 0:
        raise ChildFailed(f"{what} exited with status {proc.returncode}\n{tail(proc.stderr)}")
    return parse_result(proc.stdout, proc.stderr, what)
