"""Callgrind's client requests from Python (`callgrind_marks.c`, compiled with `cc` on first use):
count only the workloads of a process, not its start-up, and dump each one's count under a name.

    marks = load()            # None if valgrind's headers or a C compiler are missing
    marks.start()             # under `valgrind --tool=callgrind --instr-atstart=no`
    marks.zero(); work(); marks.dump("work")

`read_dumps(prefix)` returns {name: instructions} from the files callgrind wrote.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "callgrind_marks.c"
TRIGGER = re.compile(r"^desc: Trigger: Client Request: (.*)$", re.MULTILINE)
TOTALS = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


class Marks:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        lib.marks_dump.argtypes = [ctypes.c_char_p]

    def start(self) -> None:
        self._lib.marks_start()

    def zero(self) -> None:
        self._lib.marks_zero()

    def dump(self, name: str) -> None:
        self._lib.marks_dump(name.encode())


def load() -> Marks | None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not Path("/usr/include/valgrind/callgrind.h").exists():
        return None
    out = Path(tempfile.mkdtemp(prefix="callgrind_marks_")) / "marks.so"
    cmd = [compiler, "-O2", "-shared", "-fPIC", str(SOURCE), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    return Marks(ctypes.CDLL(str(out)))


def read_dumps(prefix: Path) -> dict[str, int]:
    """{name: instructions} of every named dump callgrind wrote as `prefix.N`."""
    counts = {}
    for path in prefix.parent.glob(prefix.name + ".*"):
        text = path.read_text()
        name, total = TRIGGER.search(text), TOTALS.search(text)
        if name and total:
            counts[name.group(1)] = int(total.group(1))
    return counts
