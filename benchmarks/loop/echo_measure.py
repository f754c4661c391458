"""Parent side of the echo benchmarks: one server child, one client process, results merged.

The server (`child.py BENCH serve LOOP PARAMS`, the loop under test) runs on core 0 and prints
its address; the client, the same program for every server loop, runs on core 1 against it. That
is echo_client.c (compiled once per run with `cc -O2`, linked with OpenSSL's libssl and
libcrypto), whose CPU per message is nearly all the kernel's socket work (and over TLS OpenSSL's
record work), about 10 to 35% less than the Python client's over tcp, unix and udp and a fifth
of it over tls; after `use_client("python")` (run.py's `--echo-client python`) it is
echo_client.py on uvloop. Every wait is bounded: the server has ANNOUNCE_TIMEOUT_S to open its
socket, the client its planned time plus GRACE_S, the server GRACE_S more to finish after the
client left. A server that cannot open this kind of server (NotImplementedError) makes the cell
`unsupported`; a crash, a hang or a client that saw wrong data makes it failed or problematic.
"""

from __future__ import annotations

import atexit
import functools
import json
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from launch import ChildFailed, child_command, parse_result, tail

PYTHON_CLIENT = str(Path(__file__).with_name("echo_client.py"))
C_CLIENT_SOURCE = Path(__file__).with_name("echo_client.c")
C_CLIENT_FLAGS = ("-O2", "-Wall", "-Wextra")
C_CLIENT_LIBS = ("-lssl", "-lcrypto")  # OpenSSL, for tls
CLIENTS = ("c", "python")
ANNOUNCE_TIMEOUT_S = 30.0
GRACE_S = 20.0  # beyond the planned run time, before a stuck process is declared hung
CLIENT_SETUP_S = 15.0  # connecting (and TLS handshakes) before the warm-up starts


_client = "c"  # which client drives the echoes in this run: see use_client()


def use_client(kind: str) -> None:
    """Choose the client for every echo: "c" (the default) or "python"."""
    global _client
    if kind not in CLIENTS:
        raise ValueError(f"unknown echo client {kind!r}; choose from {', '.join(CLIENTS)}")
    _client = kind


@functools.cache
def _build_c_client() -> tuple[str | None, str]:
    """(the executable, "") or (None, why not): echo_client.c compiled once per run."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None, "no C compiler (cc or gcc) found to build echo_client.c"
    out = Path(tempfile.mkdtemp(prefix="ferroloop-echo-client-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    exe = out / "echo_client"
    built = subprocess.run(
        [compiler, *C_CLIENT_FLAGS, str(C_CLIENT_SOURCE), "-o", str(exe), *C_CLIENT_LIBS],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        return None, (
            f"compiling echo_client.c failed:\n{tail(built.stderr)}\n"
            "(it needs OpenSSL's headers and libraries: apt-get install libssl-dev)"
        )
    return str(exe), ""


def client_command(transport: str) -> Callable[[dict], list[str]]:
    """How to start the client for TRANSPORT, given its config; builds the C client once."""
    if _client == "python":
        return lambda config: [sys.executable, PYTHON_CLIENT, json.dumps(config)]
    exe, why_not = _build_c_client()
    if exe is None:
        raise ChildFailed(f"{why_not}\n(or run with --echo-client python)")
    keys = ("transport", "address", "clients", "size", "warmup_s", "duration_s")
    if transport == "tls":
        keys += ("cafile",)
    return lambda config: [exe, *(str(config[key]) for key in keys)]


def _read_address(server: subprocess.Popen, timeout: float) -> object:
    ready, _, _ = select.select([server.stdout], [], [], timeout)
    if not ready:
        raise ChildFailed(f"echo server hung: no address within {timeout:.0f} s", hung=True)
    line = server.stdout.readline()
    if not line:
        raise ChildFailed("echo server exited before announcing its address")
    announced = json.loads(line)
    if "unsupported" in announced:
        raise ChildFailed(f"unsupported: {announced['unsupported']}", unsupported=True)
    return announced["address"]


def _run_client(command: list[str], pin: list[str], timeout: float) -> dict:
    try:
        client = subprocess.run(
            [*pin, *command],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise ChildFailed(
            f"echo client hung: no result within {timeout:.0f} s", hung=True
        ) from None
    if client.returncode != 0:
        raise ChildFailed(f"echo client exited with {client.returncode}\n{tail(client.stderr)}")
    return parse_result(client.stdout, client.stderr, "echo client")


def serve_and_load(
    server_command: list[str],
    server_params: dict,
    client_config: dict,
    make_client: Callable[[dict], list[str]],
    pins: tuple[list, list],
) -> tuple[dict, dict]:
    """Start SERVER_COMMAND (already pinned), run the client against the address it prints,
    and return (the server's result, the client's result)."""
    server = subprocess.Popen(
        server_command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        client_config["address"] = _read_address(server, ANNOUNCE_TIMEOUT_S)
        planned = CLIENT_SETUP_S + server_params["warmup_s"] + server_params["duration_s"]
        command = make_client(client_config)
        client_result = _run_client(command, pins[1], planned + GRACE_S)
        try:
            out, err = server.communicate(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            message = f"echo server hung: alive {GRACE_S:.0f} s after the client left"
            raise ChildFailed(message, hung=True) from None
    except ChildFailed as exc:
        if server.poll() is None:
            server.kill()
        _, err = server.communicate()
        if exc.unsupported:
            raise
        raise ChildFailed(f"{exc}\nserver stderr:\n{tail(err)}", exc.hung) from None
    if server.returncode != 0:
        raise ChildFailed(f"echo server exited with {server.returncode}\n{tail(err)}")
    return parse_result(out, err, "echo server"), client_result


def measure(
    bench: str,
    loop_name: str,
    params: dict,
    pins: tuple[list, list],
    transport: str,
    server_extra: dict | None = None,
    client_extra: dict | None = None,
) -> dict:
    """Run BENCH's server on LOOP against the echo client over TRANSPORT; one sample.

    transport is tcp, unix, tls or udp (see echo_client.py and echo_client.c). server_extra
    and client_extra reach only that side (certificate paths, say), so they stay out of the
    recorded params.
    """
    make_client = client_command(transport)
    with tempfile.TemporaryDirectory(prefix="ferroloop-bench-") as tmp:
        server_params = {**params, **(server_extra or {})}
        if transport == "unix":
            server_params["path"] = str(Path(tmp) / "echo.sock")
        client_config = {"transport": transport, **params, **(client_extra or {})}
        server_command = child_command(
            pins[0], bench, "serve", loop_name, json.dumps(server_params)
        )
        result, client = serve_and_load(
            server_command, server_params, client_config, make_client, pins
        )
    result["metrics"]["msgs_per_s"] = client["msgs_per_s"]
    result["problems"] += client["problems"]
    info = result.setdefault("info", {})
    info["client_loop"] = client["client_loop"]
    info["client_busy"] = round(client["client_busy"], 3)
    info["client_round_trips"] = client["round_trips"]
    for key in ("lost", "late", "tls"):
        if key in client:
            info[key] = client[key]
    server_messages = info.get("echoed_bytes", 0) / params["size"]
    if transport != "udp" and server_messages != client["round_trips"]:
        result["problems"].append(
            f"the server echoed {server_messages:g} messages' worth of bytes; "
            f"the client completed {client['round_trips']} round trips"
        )
    return result
