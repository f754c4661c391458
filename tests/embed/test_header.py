"""``ferroloop.h`` (shipped in the package, found by ``ferroloop.get_include()``) compiles, and
the layout it declares is the one the capsule exports."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sysconfig
from pathlib import Path

import ferroloop
import pytest
from ferroloop import _native

PROBE = r"""
#include <ferroloop.h>
#include <stdio.h>
int main(void) {
    printf("%zu %zu %d %d\n", offsetof(FerroloopCAPI, remote_new), sizeof(FerroloopCAPI),
           FERROLOOP_ERR_CLOSED, FERROLOOP_ERR_INVALID);
    return 0;
}
"""


def test_get_include_holds_the_header() -> None:
    assert (Path(ferroloop.get_include()) / "ferroloop.h").is_file()


def test_capsule_reports_version_1_and_its_size() -> None:
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = get_pointer(_native._C_API, b"ferroloop._native._C_API")
    version, size = (ctypes.c_uint32 * 2).from_address(address)
    assert version == 1
    assert size == 8 + 5 * ctypes.sizeof(ctypes.c_void_p)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_header_compiles_and_declares_the_exported_layout(tmp_path: Path) -> None:
    source = tmp_path / "probe.c"
    source.write_text(PROBE)
    exe = tmp_path / "probe"
    includes = [ferroloop.get_include(), sysconfig.get_paths()["include"]]
    subprocess.run(
        ["cc", "-std=c99", "-Wall", "-Werror", *(f"-I{i}" for i in includes), "-o", exe, source],
        check=True,
    )
    out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split()
    pointer = ctypes.sizeof(ctypes.c_void_p)
    assert out == ["8", str(8 + 5 * pointer), "-1", "-2"]
