"""The TCP echo served by C with no Python at all, next to the loops' Protocol and streams echoes.

`echo_floor.c` echoes each read back at once from a level-triggered epoll loop, pinned like a
loop's server and driven by the same client, so its server CPU per message is nearly all the
kernel's socket work, which every loop pays alike, and its messages/s is what the client's core
and the kernel allow when the server costs next to nothing in user space. At 1 KiB that bounds
what a loop's server can reach here (`floor ÷ peer` is then the largest ratio over that peer a
loop could show). At 64 KiB the kernel's copies are nearly all of every server's cost, so a
loop's server can match it, and messages/s there moves with scheduling as much as with the
server. run.py measures it in every repeat of tcp_proto_echo's and tcp_streams_echo's cases,
right after the loops' runs of that repeat; the report prints each loop's median as a share of
it under those tables.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

import echo_measure
from launch import ChildFailed, tail

SOURCE = Path(__file__).with_name("echo_floor.c")


@functools.cache
def _build() -> str:
    """The executable, compiled once per run; ChildFailed if it cannot be."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise ChildFailed("no C compiler (cc or gcc) found to build echo_floor.c")
    out = Path(tempfile.mkdtemp(prefix="ferroloop-echo-floor-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    exe = out / "echo_floor"
    built = subprocess.run(
        [compiler, "-O2", "-Wall", "-Wextra", str(SOURCE), "-o", str(exe)],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        raise ChildFailed(f"compiling echo_floor.c failed:\n{tail(built.stderr)}")
    return str(exe)


def measure(params: dict, pins: tuple[list, list]) -> dict:
    """One sample, shaped as a loop's tcp_proto_echo sample; ChildFailed if it fails."""
    server_command = [*pins[0], _build(), str(params["clients"])]
    client_config = {"transport": "tcp", **params}
    server, client = echo_measure.serve_and_load(
        server_command, params, client_config, echo_measure.client_command("tcp"), pins
    )
    messages = server["echoed_bytes"] / params["size"]
    problems = list(client["problems"])
    if messages != client["round_trips"]:
        problems.append(
            f"the server echoed {messages:g} messages' worth of bytes; "
            f"the client completed {client['round_trips']} round trips"
        )
    msgs_per_s = client["msgs_per_s"]
    return {
        "metrics": {
            "msgs_per_s": msgs_per_s,
            "mb_per_s": msgs_per_s * params["size"] / 1e6,
            "server_cpu_us_per_msg": server["cpu_s"] / messages * 1e6 if messages else float("nan"),
        },
        "info": {"client_busy": round(client["client_busy"], 3)},
        "problems": problems,
    }
