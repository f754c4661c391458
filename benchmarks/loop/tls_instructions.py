"""Instructions per message of a TLS echo server, counted by callgrind (not timed).

    python benchmarks/loop/tls_instructions.py [--loops ferroloop,asyncio-sslproto,uvloop]
        [--keep DIR]

The server (1 KiB echo in `data_received`, the `tls_echo` benchmark's server, on one loop)
runs under `valgrind --tool=callgrind`; a client in this process (asyncio, not measured) opens
4 TLS connections and echoes 1 KiB messages, one in flight per connection. The server is run
twice, for two message counts, and the difference of the two instruction totals divided by the
difference of the counts is the cost of one message: start-up, imports and handshakes cancel
out. Instruction counts do not depend on what else the machine runs, which the timed
`tls_echo` benchmark on a shared 2-core machine does.

`--keep DIR` keeps the callgrind files there (`callgrind.<loop>.<messages>`), for
`callgrind_annotate --inclusive=yes` and per-function differences between the two counts.

`asyncio-sslproto` is ferroloop with asyncio's own `sslproto.SSLProtocol` in place of
ferroloop's (the state before the native record path), to measure that path alone.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path

import tls_echo

SIZE = 1024
CONNECTIONS = 4
COUNTS = (400, 2000)

SERVER = r"""
import asyncio, ssl, sys
loop_name, certfile, CONNECTIONS = sys.argv[1], sys.argv[2], int(sys.argv[3])
if loop_name == "uvloop":
    import uvloop
    new_loop = uvloop.new_event_loop
else:
    import ferroloop
    new_loop = ferroloop.new_event_loop
    if loop_name == "asyncio-sslproto":
        from asyncio import sslproto
        import ferroloop._transports
        ferroloop._transports.SSLProtocol = sslproto.SSLProtocol

class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        self.transport.write(data)
    def connection_lost(self, exc):
        gone.append(1)
        if len(gone) == CONNECTIONS:
            done.set_result(None)

async def main():
    global done
    done = asyncio.get_running_loop().create_future()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certfile)
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0, ssl=context)
    print(server.sockets[0].getsockname()[1], flush=True)
    await done
    server.close()

gone = []
loop = new_loop()
loop.run_until_complete(main())
loop.close()
"""


async def _client(port: int, cafile: str, messages: int) -> None:
    context = ssl.create_default_context(cafile=cafile)
    per_connection = messages // CONNECTIONS

    async def one() -> None:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname="localhost"
        )
        payload = b"m" * SIZE
        for _ in range(per_connection):
            writer.write(payload)
            await reader.readexactly(SIZE)
        writer.close()
        await writer.wait_closed()

    await asyncio.gather(*(one() for _ in range(CONNECTIONS)))


def _instructions(loop_name: str, cert: Path, ca: Path, messages: int, tmp: Path) -> int:
    script = tmp / "server.py"
    script.write_text(SERVER)
    out = tmp / f"callgrind.{loop_name}.{messages}"
    server = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            str(script),
            loop_name,
            str(cert),
            str(CONNECTIONS),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert server.stdout is not None
    port = int(server.stdout.readline())
    asyncio.run(_client(port, str(ca), messages))
    if server.wait(timeout=600) != 0:
        raise SystemExit(f"{loop_name} server failed")
    summary = re.search(r"^summary:\s+(\d+)", out.read_text(), re.MULTILINE)
    assert summary, f"no summary line in {out}"
    return int(summary.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loops", default="ferroloop,asyncio-sslproto,uvloop")
    parser.add_argument("--keep", metavar="DIR", help="keep the callgrind files in DIR")
    args = parser.parse_args()
    found = tls_echo._certs()
    if isinstance(found, str):
        raise SystemExit(found)
    cert, ca = found
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.keep) if args.keep else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for loop_name in args.loops.split(","):
            low, high = (_instructions(loop_name, cert, ca, n, out) for n in COUNTS)
            per_message = (high - low) / (COUNTS[1] - COUNTS[0])
            print(f"{loop_name:18} {per_message:10,.0f} instructions per 1 KiB message")


if __name__ == "__main__":
    main()
