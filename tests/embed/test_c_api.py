"""The C API used from C, as ferroloop.h tells an extension to: a pthread without the GIL
resolves a future registered by token and queues a callback that raises. ferroloop only (the
C API is ferroloop's; the Rust wrapper's fallback is what other loops get, tests/embed
test_wake_ext.py). Built with the system C compiler and loaded with ctypes.PyDLL, which keeps
the GIL across calls, as a C extension's functions would."""

from __future__ import annotations

import asyncio
import ctypes
import shutil
import subprocess
import sysconfig
from pathlib import Path

import ferroloop
import pytest

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> ctypes.PyDLL:
    lib = tmp_path_factory.mktemp("c_probe") / "c_probe.so"
    includes = [ferroloop.get_include(), sysconfig.get_paths()["include"]]
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-pthread"]
        + [f"-I{i}" for i in includes]
        + ["-o", str(lib), str(Path(__file__).with_name("c_probe.c"))],
        check=True,
    )
    dll = ctypes.PyDLL(str(lib))
    dll.probe_start.restype = ctypes.c_void_p
    dll.probe_start.argtypes = [ctypes.py_object, ctypes.py_object, ctypes.c_long]
    dll.probe_run.argtypes = [ctypes.c_void_p]
    dll.probe_finish.argtypes = [ctypes.c_void_p]
    dll.probe_rejects.argtypes = [ctypes.py_object]
    return dll


def test_c_thread_resolves_a_future_and_its_callback_error_reaches_the_handler(probe) -> None:
    loop = ferroloop.new_event_loop()
    contexts: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: contexts.append(context))
    try:
        future = loop.create_future()
        job = probe.probe_start(loop, future, 42)
        assert job
        assert probe.probe_run(job) == 0  # both queued (FERROLOOP_OK)
        assert loop.run_until_complete(asyncio.wait_for(future, 5)) == 42
        loop.run_until_complete(asyncio.sleep(0.01))
        assert len(contexts) == 1
        assert isinstance(contexts[0]["exception"], ValueError)
        assert "native callback" in contexts[0]["message"]
        probe.probe_finish(job)
    finally:
        loop.close()


def test_c_thread_after_close_gets_err_closed_and_keeps_its_arg(probe) -> None:
    loop = ferroloop.new_event_loop()
    future = loop.create_future()
    job = probe.probe_start(loop, future, 7)
    loop.close()
    # FERROLOOP_ERR_CLOSED (-1) for both: -1 * 100 + -1.
    assert probe.probe_run(job) == -101
    assert not future.done()
    probe.probe_finish(job)


def test_remote_new_rejects_another_loop_with_type_error(probe) -> None:
    loop = asyncio.new_event_loop()
    try:
        assert probe.probe_rejects(loop) == 1
    finally:
        loop.close()


def test_remote_new_on_a_closed_loop_raises(probe) -> None:
    loop = ferroloop.new_event_loop()
    future = loop.create_future()
    loop.close()
    with pytest.raises(RuntimeError, match="closed"):
        probe.probe_start(loop, future, 1)
