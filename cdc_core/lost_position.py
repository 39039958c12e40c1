"""Going on from a new slot without a snapshot, when an operator says nothing was missed.

A run whose stored stream position is gone (the slot was dropped, lost its WAL, or was
recreated) stops under `snapshot.mode` initial and no_data, and re-reads every table under
when_needed and always: the changes between the stored position and the new slot are missing,
and nothing else can bring them back. When the operator knows there were none (writes stopped
and the pipeline drained before a `pg_upgrade`, a failover or a slot dropped by hand),
`cdc accept-lost-position` records that for the position the lake holds now; the next run then
takes the slot's position as its own (a lost slot is dropped, a missing one created) and
streams on without a snapshot. The request names the stored position it was made for, so it
never accepts a later loss, and it is refused when the server's WAL is behind the stored
position: that is not the history the lake followed (a cluster restored or loaded anew), and
its positions would sort before what silver holds.
"""

from __future__ import annotations

import logging
import time

import psycopg

from cdc_core.config import Dsn
from cdc_core.errors import TerminalError
from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.pg.history import forked_before
from cdc_core.pg.slot import SlotState, slot_state
from cdc_core.stager import staged_files
from cdc_core.state import read_json, read_stream, stream_file, write_json
from cdc_core.storage import Location

log = logging.getLogger("cdc_core.lost_position")

Conn = psycopg.Connection[tuple[object, ...]]


def accept_file(lake: Lake) -> Location:
    return lake.state / "accept_lost_position.json"


def stored_position(lake: Lake) -> Lsn | None:
    stored = read_stream(lake)
    return Lsn.parse(str(stored["confirmed"])) if isinstance(stored, dict) else None


def request_accept(lake: Lake, slot: str, stored: Lsn) -> Location:
    """Record the operator's word that no change was made after `stored` (`cdc
    accept-lost-position`); the next run acts on it."""
    path = accept_file(lake)
    write_json(path, {"slot": slot, "stored": str(stored), "requested_us": time.time_ns() // 1000})
    return path


def requested(lake: Lake) -> Lsn | None:
    """The stored position an `accept-lost-position` request was made for, if one stands."""
    request = read_json(accept_file(lake))
    return Lsn.parse(str(request["stored"])) if isinstance(request, dict) else None


def done(lake: Lake) -> None:
    accept_file(lake).unlink(missing_ok=True)


def forgo(conn: Conn, pipeline: str, slot_name: str, lake: Lake, stored: Lsn) -> None:
    """Give up the stored position for the slot's: a lost slot is dropped (the run creates a
    new one), a recreated one kept, and the stored position removed, so the run records the
    slot's. Refused when the server's WAL is behind `stored`."""
    slot = slot_state(conn, slot_name)
    try:
        refuse_wal_behind(conn, pipeline, stored, "cdc accept-lost-position: ")
    except TerminalError:
        done(lake)  # refused for good: a later run must not meet it again
        raise
    log.warning(
        "pipeline %s: the stored position %s is gone (%s); accepted by cdc "
        "accept-lost-position: the run goes on from the slot's position without a snapshot, "
        "and changes made after %s and before it were never read", pipeline, stored,
        _what(slot, slot_name, stored), stored,
    )  # fmt: skip
    if slot is not None and slot.wal_status == "lost":
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot_name,))
    stream_file(lake).unlink(missing_ok=True)


def forked_history(dsn: Dsn, lake: Lake, timeline: int | None) -> str | None:
    """Why the lake's position (the stored one, or the last staged file's end when that is
    later) is not in the WAL history of the source, on `timeline` now (`cdc_core.pg.history`):
    a standby promoted before that position. None when it is, or when a timeline is unknown."""
    stored = read_stream(lake)
    if not isinstance(stored, dict) or stored.get("timeline") in (None, timeline):
        return None  # the same history: no listing of the staged files (a LIST on S3)
    staged = staged_files(lake.changes)
    end = max(Lsn.parse(str(stored["confirmed"])), staged[-1].end if staged else Lsn(0))
    return forked_before(dsn, timeline, int(stored["timeline"]), end)


def wal_behind(conn: Conn, stored: Lsn) -> Lsn | None:
    """The server's WAL position, when it is behind `stored` (None when it is not)."""
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    current = Lsn.parse(str(row[0]))
    return current if current < stored else None


def refuse_wal_behind(conn: Conn, pipeline: str, stored: Lsn, what: str = "") -> None:
    """Stop when the server's WAL is behind the lake's stored position: that server is not the
    WAL history the lake followed (a dump restored on another cluster, a new server), and every
    change it sends, a new snapshot's too, would sort before what the lake holds: staging and
    silver would take it for applied already and leave it out without a word."""
    current = wal_behind(conn, stored)
    if current is None:
        return
    raise TerminalError(
        f"pipeline {pipeline}: {what}the server's WAL position {current} is behind the stored "
        f"position {stored}, so this is not the WAL history the lake followed (a dump restored "
        "on another cluster, a new server): every change it sends, a new snapshot's too, would "
        "sort before what the lake holds and be left out. Point target.root at a new lake for "
        "this source (the old one keeps what it held), or source.dsn back at the server the lake "
        "followed"
    )


def _what(slot: SlotState | None, name: str, stored: Lsn) -> str:
    if slot is None:
        return f"slot {name} does not exist; a new one is created"
    if slot.wal_status == "lost":
        return f"slot {name} lost its WAL; it is dropped and a new one created"
    if slot.confirmed_flush > stored:
        return f"slot {name} is ahead of it, at {slot.confirmed_flush}; it is kept"
    return (f"slot {name} is at {slot.confirmed_flush}, on another database cluster than the "
            "stored position's; it is kept")  # fmt: skip
