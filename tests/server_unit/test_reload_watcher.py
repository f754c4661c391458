"""--reload: the polling watcher, stopping a stubborn child, and one end-to-end reload (in a
subprocess, with a fake HttpServer); plus the single-process signal path end to end."""

from __future__ import annotations

import os
import signal
import time

import pytest
from ferroloop.server import reload as reload_module
from ferroloop.server.config import DEFAULT_RELOAD_EXCLUDES, Config
from ferroloop.server.reload import FileWatcher, Reloader
from server_unit_harness import finish, read_until, running_harness


def bump(path, seconds=10.0) -> None:
    stat = path.stat()
    os.utime(path, (stat.st_atime, stat.st_mtime + seconds))


def test_watcher_sees_modified_new_and_removed_files(tmp_path):
    (tmp_path / "a.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "b.py").write_text("")
    watcher = FileWatcher([tmp_path], ["*.py"], DEFAULT_RELOAD_EXCLUDES)
    assert watcher.changes() == []
    bump(tmp_path / "pkg" / "b.py")
    assert watcher.changes() == [tmp_path / "pkg" / "b.py"]
    assert watcher.changes() == []
    (tmp_path / "c.py").write_text("")
    (tmp_path / "a.py").unlink()
    assert watcher.changes() == [tmp_path / "a.py", tmp_path / "c.py"]


def test_watcher_ignores_excluded_and_unmatched_files(tmp_path):
    for name in (".hidden", "__pycache__", "node"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.py").write_text("")
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / ".swap.py").write_text("")
    (tmp_path / "m.pyc").write_text("")
    watcher = FileWatcher([tmp_path], ["*.py"], DEFAULT_RELOAD_EXCLUDES)
    assert set(watcher.snapshot()) == {tmp_path / "node" / "x.py"}
    for path in (tmp_path / ".hidden" / "x.py", tmp_path / "notes.txt", tmp_path / ".swap.py"):
        bump(path)
    assert watcher.changes() == []


def test_watcher_custom_patterns(tmp_path):
    (tmp_path / "index.html").write_text("")
    (tmp_path / "tmp_scratch.py").write_text("")
    watcher = FileWatcher([tmp_path], ["*.py", "*.html"], ["tmp*"])
    assert set(watcher.snapshot()) == {tmp_path / "index.html"}


def test_reload_dirs_default_to_cwd(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    config = Config("m:app", reload=True, log_config=None)
    assert config.reload_dirs == [tmp_path.resolve()]
    assert config.reload_includes == ["*.py"]


def test_stop_child_escalates_for_a_child_ignoring_sigterm(monkeypatch, tmp_path):
    monkeypatch.setattr(reload_module, "STOP_ESCALATION", 0.2)
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        time.sleep(30)
        os._exit(0)
    reloader = Reloader(Config("m:app", reload_dirs=[str(tmp_path)], log_config=None), [])
    reloader.pid = pid
    time.sleep(0.1)  # let the child set its handlers
    started = time.monotonic()
    reloader.stop_child()
    assert reloader.pid is None
    assert 0.15 < time.monotonic() - started < 3
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, 0)  # already reaped


def test_reload_end_to_end(tmp_path):
    with running_harness(tmp_path, reload=True, reload_delay=0.1) as proc:
        output = read_until(proc, "Started server process")
        assert "Started reloader process" in output and "using polling" in output
        assert "Will watch for changes in these directories" in output
        bump(tmp_path / "ferroloop_sup_app.py")
        output += read_until(proc, "Started server process")
        assert "Detected change in 'ferroloop_sup_app.py', reloading" in output
        proc.send_signal(signal.SIGTERM)
    output += finish(proc)
    assert proc.returncode == 0, output
    assert output.count("Started server process") == 2
    assert output.count("Finished server process") == 2
    assert "Stopping reloader process" in output


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_single_process_signal_shuts_down_gracefully_and_exits_0(tmp_path, sig):
    # uvicorn raises the signal again after its shutdown (and so dies by SIGTERM); ferroloop
    # exits with status 0.
    with running_harness(tmp_path) as proc:
        output = read_until(proc, "ferroloop running on")
        proc.send_signal(sig)
    output += finish(proc)
    assert proc.returncode == 0, output
    assert "Shutting down" in output and "Finished server process" in output
