"""The CPython loans (crates/py/src/cpython_loans.rs): on a CPython ferroloop was not checked
on, the import works, warns once, and the loop runs on the portable paths."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

import pytest

# A free-threaded build (3.14t): the layout loans are not read there and fall back without a
# check or a warning (cpython_loans.rs), whatever the version.
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))

SCRIPT = """
import asyncio, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import ferroloop
    from ferroloop import _native
print(len([w for w in caught if issubclass(w.category, RuntimeWarning)]))
print(ferroloop.Task is asyncio.Task, _native.HANDLE_POOL, _native.CONTEXT_POOL)
print(sorted(k for k, v in _native.CPYTHON_LOANS.items() if v.startswith("fallback")))

async def main():
    task = asyncio.get_running_loop().create_task(asyncio.sleep(0, "done"))
    return type(task) is asyncio.Task, await task

print(ferroloop.run(main()))
"""


PLAIN = """
import asyncio, ferroloop

async def main():
    return await asyncio.get_running_loop().create_task(asyncio.sleep(0, "done"))

print(ferroloop.run(main()))
"""


def run(env_value: str, *flags: str, script: str = SCRIPT) -> subprocess.CompletedProcess[str]:
    # PYTHON_GIL=1: a free-threaded build starts with its GIL on, so importing ferroloop (which
    # declares that it uses the GIL) adds no RuntimeWarning of the interpreter's to the count.
    env = dict(os.environ, FERROLOOP_PORTABLE=env_value, PYTHON_GIL="1")
    return subprocess.run(
        [sys.executable, *flags, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_unknown_python_imports_with_one_warning_and_the_portable_paths():
    result = run("unknown-python")
    assert result.returncode == 0, result.stderr
    count, kinds, failed, outcome = result.stdout.splitlines()
    assert count == ("0" if FREE_THREADED else "1")
    assert kinds == "True False False"
    assert failed == "['context_layout', 'gc_header', 'handle_reuse', 'task_layout']"
    assert outcome == "(True, 'done')"


@pytest.mark.skipif(FREE_THREADED, reason="no loan is checked on a free-threaded build: no warning")
def test_the_warning_made_an_error_does_not_fail_the_import():
    result = run("unknown-python", "-W", "error::RuntimeWarning", script=PLAIN)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    assert result.stderr.count("RuntimeWarning: ferroloop on CPython") == 1


def test_forced_fallbacks_are_silent():
    result = run("1")
    assert result.returncode == 0, result.stderr
    count, kinds, failed, outcome = result.stdout.splitlines()
    assert (count, kinds, failed, outcome) == ("0", "True False False", "[]", "(True, 'done')")
