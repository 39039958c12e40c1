"""The run lock: one ingest run of a pipeline at a time, held on `<root>/_state/run.lock`.

The lock is the kernel's `flock` on that file, so it lives exactly as long as the process that
took it: a run killed by SIGKILL or OOM never blocks the next one. Who holds it is written next
to it, atomically, in `_state/run.holder.json` (host, pid, pipeline, start, command) and removed
before the lock is released. A run that finds the lock taken names the holder and stops; a run
that gets the lock and still finds a holder file knows that run died holding it, says so and
takes over (every stage resumes where it stopped: there is nothing else to clean). Maintenance,
`cdc status`, `cdc validate` and `cdc snapshot` do not take it; they are safe next to a run.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from cdc_core.errors import TerminalError, TransientError
from cdc_core.lake import Lake
from cdc_core.state import write_json
from cdc_core.storage import Location

log = logging.getLogger("cdc_core.run_lock")

# A run writes its holder file right after it takes the lock; until then the file is missing or
# still names the dead run it takes over from. A run refused in that gap waits this long for it.
_HOLDER_WAIT_S = 2.0


class RunLockedError(TransientError):
    """Another run of the pipeline holds its run lock: this run did nothing, and running again
    once the holder has finished is safe (exit 75, which schedulers retry)."""


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a pipeline's run lock."""

    host: str
    pid: int
    pipeline: str
    started_at: str  # UTC, ISO-8601
    command: str

    @classmethod
    def this_process(cls, pipeline: str) -> Holder:
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return cls(socket.gethostname(), os.getpid(), pipeline, started, shlex.join(sys.argv))

    @classmethod
    def parse(cls, data: object) -> Holder | None:
        """The holder recorded in `data`; None when it does not record one."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(str(data["host"]), int(data["pid"]), str(data["pipeline"]),
                       str(data["started_at"]), str(data.get("command", "")))  # fmt: skip
        except (KeyError, TypeError, ValueError):
            return None

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, started {self.started_at}"

    def gone(self) -> bool:
        """True when the holder ran on this host and its process no longer exists."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        return False


def lock_file(lake: Lake) -> Path:
    """The file the run lock is taken on; it stays (removing it would let two runs lock two
    different files). An object store has no locks: a lake there is locked on the driver's
    host (`CDC_LOCK_DIR`, default ~/.cache/cdc-lake/locks), and only its holder object is
    shared, so a run on another host is seen (the takeover warning) but not refused."""
    state = lake.state
    if isinstance(state, Path):
        return state / "run.lock"
    folder = Path(os.environ.get("CDC_LOCK_DIR") or Path.home() / ".cache" / "cdc-lake" / "locks")
    return folder / f"{hashlib.sha256(lake.root.encode()).hexdigest()[:16]}.lock"


def holder_file(lake: Lake) -> Location:
    """Who holds the run lock; present while a run holds it, or after a run died holding it."""
    return lake.state / "run.holder.json"


def read_holder(lake: Lake) -> Holder | None:
    """The holder recorded beside the lock, or None (no file, or one that names no one)."""
    try:
        return Holder.parse(json.loads(holder_file(lake).read_text()))
    except (FileNotFoundError, ValueError):
        return None


@contextmanager
def run_lock(lake: Lake, pipeline: str) -> Iterator[Holder]:
    """Hold `pipeline`'s run lock for the block. Raises `RunLockedError` (exit 75) naming the
    holder when another run holds it; takes over, with a warning, the lock of a run that died.
    A lake on a bucket that does not exist stops it before anything is written there."""
    if lake.store_problem is not None:
        raise lake.store_problem
    path = lock_file(lake)
    path.parent.mkdir(parents=True, exist_ok=True)
    # os.open's descriptors are not inherited: Spark's JVM, a child, must not keep the lock
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _lock(fd, path):
            raise _refusal(lake, pipeline)
        me = Holder.this_process(pipeline)
        previous = read_holder(lake)
        if previous is not None:
            log.warning("%s", _takeover_message(previous, me, path))
        write_json(holder_file(lake), asdict(me))
        try:
            yield me
        finally:  # the holder file goes first: one left beside a free lock means a run died
            holder_file(lake).unlink(missing_ok=True)
    finally:
        os.close(fd)  # releases the lock


def _lock(fd: int, path: Path) -> bool:
    """Take the lock without waiting: False when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        log.warning("cannot lock %s (%s): this file system has no locks, so a second run of "
                    "the pipeline at the same time is not detected", path, e.strerror)  # fmt: skip
    return True


def _refusal(lake: Lake, pipeline: str) -> TerminalError | RunLockedError:
    path = lock_file(lake)
    holder = _holder_of_taken_lock(lake)
    if holder is None:
        return RunLockedError(
            f"pipeline {pipeline} is already running: another run holds {path} (it has not "
            "recorded who it is yet); this run did nothing: run it again once that one ends"
        )
    if holder.pipeline != pipeline:
        return TerminalError(
            f"target.root {lake.root} is in use by pipeline {holder.pipeline} "
            f"({holder.describe()}, holding {path}): each pipeline needs a target.root of its own"
        )
    return RunLockedError(
        f"pipeline {pipeline} is already running: {holder.describe()} (`{holder.command}`) "
        f"holds {path}; this run did nothing. Let that run finish (a scheduler's retry of exit "
        "75 will), or stop it (SIGTERM lets a --continuous run finish its batch) and run again"
    )


def _holder_of_taken_lock(lake: Lake) -> Holder | None:
    deadline = time.monotonic() + _HOLDER_WAIT_S
    holder = read_holder(lake)
    while (holder is None or holder.gone()) and time.monotonic() < deadline:
        time.sleep(0.1)
        holder = read_holder(lake)
    return holder


def _takeover_message(previous: Holder, me: Holder, path: Path) -> str:
    text = (f"stale lock of pid {previous.pid} on host {previous.host} from {previous.started_at} "
            f"taken over ({path}, `{previous.command}`): that run ended without releasing it; "
            "this run resumes its work")  # fmt: skip
    if previous.host != me.host:
        text += (" (if it is in fact still running, the lake's file system does not share "
                 "locks between hosts: stop one of the two)")  # fmt: skip
    if previous.pipeline != me.pipeline:
        text += (f"; it was a run of pipeline {previous.pipeline}: each pipeline needs a "
                 "target.root of its own")  # fmt: skip
    return text
