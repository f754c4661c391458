"""asyncio.create_subprocess_exec / _shell: pipes, communicate, return codes, signals."""

from __future__ import annotations

import asyncio
import signal
import sys
from asyncio.subprocess import DEVNULL, PIPE, STDOUT

import pytest

UPPERCASE_STDIN = "import sys; sys.stdout.write(sys.stdin.read().upper())"


def test_exec_communicate_round_trip(loop, run):
    async def main():
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", UPPERCASE_STDIN, stdin=PIPE, stdout=PIPE
        )
        running = process.returncode
        stdout, stderr = await process.communicate(b"shout this")
        return running, stdout, stderr, process.returncode

    assert run(main()) == (None, b"SHOUT THIS", None, 0)


def test_shell_exit_status_and_merged_stderr(loop, run):
    async def main():
        process = await asyncio.create_subprocess_shell(
            "echo out; echo err >&2; exit 3", stdout=PIPE, stderr=STDOUT
        )
        stdout, _ = await process.communicate()
        return sorted(stdout.split()), process.returncode

    assert run(main()) == ([b"err", b"out"], 3)


def test_separate_stdout_and_stderr_pipes(loop, run):
    async def main():
        process = await asyncio.create_subprocess_shell(
            "printf out; printf err >&2", stdout=PIPE, stderr=PIPE
        )
        return await process.communicate(), process.returncode

    assert run(main()) == ((b"out", b"err"), 0)


def test_wait_returns_the_return_code(loop, run):
    async def main():
        process = await asyncio.create_subprocess_exec("/bin/sh", "-c", "exit 7")
        first = await process.wait()
        second = await process.wait()  # waiting again returns the same code
        return first, second, process.returncode

    assert run(main()) == (7, 7, 7)


def test_reading_stdout_line_by_line(loop, run):
    async def main():
        process = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", "echo one; echo two", stdout=PIPE
        )
        lines = [await process.stdout.readline() for _ in range(3)]
        await process.wait()
        return lines

    assert run(main()) == [b"one\n", b"two\n", b""]


@pytest.mark.parametrize(
    ("method", "signum"),
    [("kill", signal.SIGKILL), ("terminate", signal.SIGTERM), ("send_signal", signal.SIGUSR1)],
)
def test_process_killed_by_a_signal_reports_minus_the_signal(loop, run, method, signum):
    async def main():
        process = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", "echo ready; exec sleep 30", stdout=PIPE
        )
        await process.stdout.readline()  # the shell has started and become sleep
        if method == "send_signal":
            process.send_signal(signum)
        else:
            getattr(process, method)()
        code = await process.wait()
        await process.stdout.read()
        return code

    assert run(main()) == -signum


def test_many_concurrent_short_subprocesses(loop, run):
    async def one(index):
        process = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", f"echo {index}; exit {index % 4}", stdout=PIPE
        )
        stdout, _ = await process.communicate()
        return int(stdout), process.returncode

    async def main():
        return await asyncio.gather(*(one(index) for index in range(20)))

    assert run(main()) == [(index, index % 4) for index in range(20)]


def test_subprocess_that_exits_without_reading_its_stdin(loop, run):
    async def main():
        process = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", "exit 0", stdin=PIPE, stdout=PIPE
        )
        # More than a pipe buffer: the write hits a closed pipe, which communicate() ignores.
        stdout, _ = await process.communicate(b"x" * (1 << 20))
        return stdout, process.returncode

    assert run(main()) == (b"", 0)


def test_subprocess_pid_and_devnull(loop, run):
    async def main():
        process = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", "echo $$", stdin=DEVNULL, stdout=PIPE, stderr=DEVNULL
        )
        stdout, _ = await process.communicate()
        return process.pid, int(stdout), process.stdin, process.stderr

    pid, reported, stdin, stderr = run(main())
    assert pid == reported
    assert (stdin, stderr) == (None, None)


def test_exec_of_a_missing_program_raises_file_not_found(loop, run, tmp_path):
    async def main():
        with pytest.raises(FileNotFoundError):
            await asyncio.create_subprocess_exec(str(tmp_path / "no-such-program"))

    run(main())


def test_subprocess_exec_with_a_protocol(loop, run):
    class Collect(asyncio.SubprocessProtocol):
        def __init__(self):
            self.events = []
            self.output = bytearray()
            self.exited = loop.create_future()

        def connection_made(self, transport):
            self.events.append("connection_made")

        def pipe_data_received(self, fd, data):
            self.output += data

        def pipe_connection_lost(self, fd, exc):
            self.events.append(f"pipe_connection_lost({fd})")

        def process_exited(self):
            self.events.append("process_exited")
            self.exited.set_result(None)

        def connection_lost(self, exc):
            self.events.append("connection_lost")

    async def main():
        transport, protocol = await loop.subprocess_exec(
            Collect, "/bin/sh", "-c", "echo via protocol; exit 5", stdin=None, stderr=None
        )
        await protocol.exited
        while "connection_lost" not in protocol.events:
            await asyncio.sleep(0.01)
        code = transport.get_returncode()
        transport.close()
        return protocol, code

    protocol, code = run(main())
    assert code == 5
    assert bytes(protocol.output) == b"via protocol\n"
    assert protocol.events[0] == "connection_made"
    assert protocol.events[-1] == "connection_lost"
    assert sorted(protocol.events[1:-1]) == ["pipe_connection_lost(1)", "process_exited"]


def test_large_output_through_the_stdout_pipe(loop, run):
    size = 4 << 20  # far more than a pipe buffer

    async def main():
        process = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", f"head -c {size} /dev/zero", stdout=PIPE
        )
        stdout, _ = await process.communicate()
        return len(stdout), stdout.count(0), process.returncode

    assert run(main()) == (size, size, 0)
