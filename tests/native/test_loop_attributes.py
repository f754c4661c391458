"""A ferroloop loop keeps its attributes in slots, so its instance ``__dict__`` is never made.

CPython 3.12 and 3.13 specialise a method load (``loop.call_soon``) only on an object whose dict
has not been made (3.11 has a slower form for one that has), and 3.13 makes the dict of an
object whose layout is larger than a bare object's (``LoopCore``'s) for its first attribute that
is not a slot. ``ferroloop.Loop.__slots__`` lists every attribute asyncio and ferroloop set, and
nothing ferroloop does on a task's path (``own_call_soon`` in ``cached_method.rs``) makes the
dict.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from pathlib import Path

import ferroloop
import pytest

# The specialised method loads that read no instance dict (3.11: LOAD_METHOD_*, 3.12+:
# LOAD_ATTR_METHOD_*). Not in it: the generic instruction, and 3.11's LOAD_METHOD_WITH_DICT.
NO_DICT_METHOD_LOADS = {
    f"{prefix}_{kind}"
    for prefix in ("LOAD_METHOD", "LOAD_ATTR_METHOD")
    for kind in ("WITH_VALUES", "NO_DICT", "LAZY_DICT")
}


def _a_loops_life(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        await asyncio.sleep(0)
        srv = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        _reader, writer = await asyncio.open_connection(*srv.sockets[0].getsockname())
        writer.close()
        await writer.wait_closed()
        srv.close()
        await srv.wait_closed()
        assert await loop.run_in_executor(None, lambda: 1) == 1
        await loop.getaddrinfo("127.0.0.1", 80)
        loop.add_signal_handler(signal.SIGUSR1, lambda: None)
        loop.remove_signal_handler(signal.SIGUSR1)
        a, b = socket.socketpair()
        with a, b:
            a.setblocking(False)
            b.setblocking(False)
            await loop.sock_sendall(a, b"x")
            assert await loop.sock_recv(b, 1) == b"x"

        async def agen():
            yield 1

        async for _ in agen():
            pass
        fut = loop.create_future()
        fut.add_done_callback(lambda _f: None)
        fut.set_result(None)
        await asyncio.gather(*(asyncio.sleep(0) for _ in range(3)))

    loop.run_until_complete(main())
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())


def test_a_loops_life_leaves_its_instance_dict_empty():
    loop = ferroloop.new_event_loop()
    try:
        _a_loops_life(loop)
    finally:
        loop.close()
    assert vars(loop) == {}
    # A user's own attribute still has somewhere to go.
    loop.mine = 1
    assert vars(loop) == {"mine": 1}


SPECIALISED = """
import dis, sys
import ferroloop
sys.path.insert(0, sys.argv[1])
from test_loop_attributes import _a_loops_life

loop = ferroloop.new_event_loop()
_a_loops_life(loop)


def calls(loop):
    for _ in range(200):
        loop.call_soon(print).cancel()
        loop.time()
        loop.create_future().cancel()


for _ in range(5):
    calls(loop)
loop.close()
for ins in dis.get_instructions(calls, adaptive=True):
    if ins.argval in ("call_soon", "time", "create_future"):
        print(ins.argval, ins.opname)
"""


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="CPython's specialisation")
def test_method_loads_on_a_loop_stay_specialised():
    # In a fresh interpreter: an instance attribute named like a method, set on any loop before
    # (``loop.call_soon = ...`` in another test), joins the class's shared keys and stops that
    # method's loads from specialising on every loop of the process, as it would in a program.
    here = str(Path(__file__).resolve().parent)
    out = subprocess.run(
        [sys.executable, "-c", SPECIALISED, here],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    loads = dict(line.split() for line in out.splitlines())
    assert set(loads) == {"call_soon", "time", "create_future"}, out
    assert set(loads.values()) <= NO_DICT_METHOD_LOADS, loads
