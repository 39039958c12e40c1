"""The run lock: a second run of a pipeline is refused naming the holder; the lock of a run that
died is taken over with a warning; pipelines with their own roots do not meet."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from cdc_core.errors import EXIT_TRANSIENT, TerminalError
from cdc_core.lake import Lake
from cdc_core.run_lock import RunLockedError, holder_file, lock_file, read_holder, run_lock

HOLD = """\
import sys, time
from cdc_core.lake import Lake
from cdc_core.run_lock import run_lock
with run_lock(Lake(sys.argv[1]), "orders"):
    print("locked", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return Lake(str(tmp_path / "orders"))


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(done.stdout)


def _write_holder(lake: Lake, pid: int, pipeline: str = "orders") -> None:
    holder_file(lake).parent.mkdir(parents=True, exist_ok=True)
    holder_file(lake).write_text(json.dumps({
        "host": socket.gethostname(), "pid": pid, "pipeline": pipeline,
        "started_at": "2024-05-01T10:00:00+00:00", "command": "jobs/ingest.py --pipeline orders",
    }))  # fmt: skip


@pytest.fixture
def other_process_holds(lake: Lake) -> Iterator[subprocess.Popen[str]]:
    """A process holding the lake's run lock for pipeline orders."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, lake.root], stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "locked"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_second_run_is_refused_with_a_message_naming_the_holder(lake: Lake) -> None:
    with (
        run_lock(lake, "orders") as me,
        pytest.raises(RunLockedError) as refused,
        run_lock(lake, "orders"),
    ):
        pytest.fail("two runs held the lock")
    message = str(refused.value)
    assert f"pid {os.getpid()} on host {socket.gethostname()}, started {me.started_at}" in message
    assert str(lock_file(lake)) in message
    assert "pipeline orders is already running" in message
    assert refused.value.exit_code == EXIT_TRANSIENT  # nothing was done: a retry is safe


def test_a_run_that_ends_releases_the_lock(lake: Lake, caplog: pytest.LogCaptureFixture) -> None:
    with run_lock(lake, "orders"):
        assert read_holder(lake) is not None
    assert not holder_file(lake).exists()
    assert lock_file(lake).exists()  # the lock file stays: every run locks the same file
    with run_lock(lake, "orders"):
        pass
    assert not caplog.records  # a clean release leaves nothing stale


def test_a_run_that_fails_releases_the_lock(lake: Lake, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="boom"), run_lock(lake, "orders"):
        raise ValueError("boom")
    with run_lock(lake, "orders"):
        pass
    assert not caplog.records


def test_a_holder_file_beside_a_free_lock_is_taken_over_with_a_warning(
    lake: Lake, caplog: pytest.LogCaptureFixture
) -> None:
    dead = _dead_pid()
    _write_holder(lake, dead)
    with run_lock(lake, "orders") as me:
        holder = read_holder(lake)
        assert holder is not None
        assert holder.pid == os.getpid() == me.pid
    [warning] = caplog.records
    assert warning.levelname == "WARNING"
    assert (f"stale lock of pid {dead} on host {socket.gethostname()} from "
            "2024-05-01T10:00:00+00:00 taken over") in warning.getMessage()  # fmt: skip


def test_a_run_killed_with_sigkill_leaves_a_lock_the_next_run_takes_over(
    lake: Lake, other_process_holds: subprocess.Popen[str], caplog: pytest.LogCaptureFixture
) -> None:
    holder = other_process_holds
    with pytest.raises(RunLockedError, match=f"pid {holder.pid} on host"), run_lock(lake, "orders"):
        pass
    holder.send_signal(signal.SIGKILL)  # no finally block runs: the holder file stays behind
    holder.wait()
    assert read_holder(lake) is not None
    with run_lock(lake, "orders"):
        pass
    assert f"stale lock of pid {holder.pid} on host" in caplog.text


def test_a_refusal_while_the_new_holder_takes_over_names_the_new_holder(lake: Lake) -> None:
    _write_holder(lake, _dead_pid())  # the dead run's file, still there
    lock_file(lake).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file(lake), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the new holder has the lock, its file is not written yet
    later = threading.Timer(0.3, _write_holder, (lake, os.getpid()))
    later.start()
    try:
        with (
            pytest.raises(RunLockedError, match=f"pid {os.getpid()} on host"),
            run_lock(lake, "orders"),
        ):
            pass
    finally:
        later.join()
        os.close(fd)


def test_another_pipeline_on_the_same_root_is_refused_as_terminal(lake: Lake) -> None:
    with (
        run_lock(lake, "orders"),
        pytest.raises(TerminalError) as refused,
        run_lock(lake, "payments"),
    ):
        pass
    assert not isinstance(refused.value, RunLockedError)  # retrying would not fix it
    assert "is in use by pipeline orders" in str(refused.value)
    assert "each pipeline needs a target.root of its own" in str(refused.value)


def test_pipelines_with_their_own_roots_run_at_the_same_time(tmp_path: Path) -> None:
    orders, payments = Lake(str(tmp_path / "orders")), Lake(str(tmp_path / "payments"))
    with run_lock(orders, "orders"), run_lock(payments, "payments"):
        assert read_holder(orders) is not None
        assert read_holder(payments) is not None


def test_a_file_system_without_locks_runs_with_a_warning(
    lake: Lake, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with run_lock(lake, "orders"):
        pass
    assert "this file system has no locks" in caplog.text


def test_the_holder_records_who_runs(lake: Lake) -> None:
    with run_lock(lake, "orders"):
        data = json.loads(holder_file(lake).read_text())
    assert data["host"] == socket.gethostname()
    assert data["pid"] == os.getpid()
    assert data["pipeline"] == "orders"
    assert data["command"]
    assert datetime.fromisoformat(data["started_at"]).utcoffset() == timedelta(0)
