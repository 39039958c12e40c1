"""Named points in the code where tests make things happen at exactly the wrong moment.

`point(name)` does nothing unless a test hooked `name`: in this process (`hooked`), the hook runs
in line; across processes, `CDC_FAULT=name` (or `name@N`, the N-th time the point is reached)
makes the process kill itself there with SIGKILL, the crash no `finally` block survives. Points
are placed where a race or a crash decides correctness, so tests reproduce the case instead of
hoping for it. Before dying the process writes `fault injected: <name>@<N>` to stderr, so a
test knows where its kill landed.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator

from cdc_core.errors import UsageError

ENV = "CDC_FAULT"

# every point the product has, so a test schedule can name them and a typo is caught
POINTS = (
    "capture.transaction",  # a transaction read from the slot, not staged yet
    "stager.before_publish",  # a change file written and fsynced under tmp/, not renamed
    "stager.after_publish",  # a change file published, the slot not confirmed past it
    "confirm.recorded",  # the position recorded in _state, not yet sent to the server
    "confirm.sent",  # the slot confirmed
    "bronze.before_commit",  # envelopes built, the bronze commit not made
    "bronze.between_commits",  # transaction events committed, bronze changes not yet
    "bronze.after_commit",  # bronze committed, silver not merged
    "silver.before_merge",  # a table's MERGE about to run
    "silver.dead_letters",  # a table's dead letters recorded, its MERGE not made
    "silver.after_merge",  # a table merged, the next not yet
    "snapshot.chunk_read",  # a snapshot chunk read and written to bronze, not marked done
    "snapshot.chunk_done",  # a chunk marked done
    "snapshot.after_export",  # a read's snapshot exported, its high watermark not taken
    "window.low_watermark",  # an incremental snapshot window opened, the chunk not read
    "window.high_watermark",  # a window's chunk read, its high watermark emitted
    "batch.before_record",  # the batch done, its metrics line not written
)

_hooks: dict[str, Callable[[], None]] = {}
_hits: dict[str, int] = {}


def point(name: str) -> None:
    hook = _hooks.get(name)
    if hook is not None:
        hook()
    wanted = os.environ.get(ENV)
    if wanted:
        _maybe_die(name, wanted)


def _maybe_die(name: str, wanted: str) -> None:
    target, _, nth = wanted.partition("@")
    if target != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == (int(nth) if nth else 1):
        os.write(2, f"fault injected: {name}@{_hits[name]}\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)


def check_env() -> None:
    """Refuse a `CDC_FAULT` that names no point (a typo would make a crash test pass vacuously)."""
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    target, _, nth = wanted.partition("@")
    if target not in POINTS or (nth and not (nth.isdigit() and int(nth) > 0)):
        raise UsageError(f"{ENV}={wanted!r}: expected one of {', '.join(POINTS)}, optionally @N")


@contextlib.contextmanager
def hooked(name: str, hook: Callable[[], None]) -> Iterator[None]:
    """Run `hook` at point `name` while the block runs (in this process)."""
    _hooks[name] = hook
    try:
        yield
    finally:
        _hooks.pop(name, None)
