"""The source's WAL history: timelines, and whether the lake's position is on the server's.

A promoted standby starts a new timeline where it stopped replaying its primary's WAL (the
switchpoint), and its LSNs go on from there. The lake's position is recorded with the timeline
it was read on (`_state/stream.json`, "timeline"). On a server with a later timeline, the
position is still in the server's history when it is at or before the switchpoint of the
recorded timeline (`TIMELINE_HISTORY`): the standby had received everything the lake holds. Past
it, the old primary sent the pipeline changes its standby never received: the lake holds rows
the new primary does not have, and the new primary's own changes up to the lake's position
would sort before what the lake holds, and be taken for staged already.
"""

from __future__ import annotations

import psycopg

from cdc_core.config import Dsn
from cdc_core.lsn import Lsn
from cdc_core.pg.connect import connect
from cdc_core.pg.slot import refusable_value


def current_timeline(conn: psycopg.Connection[tuple[object, ...]]) -> int | None:
    """The server's timeline: the first 8 hex digits of its current WAL file's name. None on a
    standby (no current WAL position) or where the server does not let the role ask."""
    name = refusable_value(conn, "SELECT pg_walfile_name(pg_current_wal_lsn())")
    return int(str(name)[:8], 16) if name else None


def switchpoint(history: str, timeline: int) -> Lsn | None:
    """Where `timeline` ended in a timeline history file's text (lines of: parent timeline, the
    LSN it switched at, a reason), None when it is not one of the file's ancestors."""
    for line in history.splitlines():
        fields = line.split("\t")
        if len(fields) >= 2 and fields[0].strip().isdigit() and int(fields[0]) == timeline:
            return Lsn.parse(fields[1].strip())
    return None


def timeline_history(dsn: Dsn, timeline: int) -> str:
    """The server's history file of `timeline` (2 or later), over a replication connection."""
    with connect(dsn, replication=True) as conn:
        row = conn.execute(f"TIMELINE_HISTORY {int(timeline)}").fetchone()
    if row is None:
        return ""
    content = row[1]
    return bytes(content).decode() if isinstance(content, bytes | memoryview) else str(content)


def forked_before(dsn: Dsn, current: int | None, recorded: int | None, position: Lsn) -> str | None:
    """Why `position`, read on timeline `recorded`, is not in the history of the server at `dsn`,
    now on timeline `current` (the words for an error); None when it is, or when either
    timeline is unknown."""
    if recorded is None or current is None or current == recorded:
        return None
    if current < recorded:
        return (f"the server is on timeline {current}, older than timeline {recorded} the lake's "
                f"position {position} was read on (the old primary, after a failover)")  # fmt: skip
    switched = switchpoint(timeline_history(dsn, current), recorded)
    if switched is None:
        return (f"the server's timeline {current} does not descend from timeline {recorded} "
                f"the lake's position {position} was read on")  # fmt: skip
    if position <= switched:
        return None
    return (
        f"the server is a standby promoted at {switched} (timeline {recorded} to {current}), "
        f"before the lake's position {position}: the old primary sent the pipeline changes its "
        "standby never received, so the lake holds changes this server never had, and this "
        f"server's own changes after {switched} would sort before what the lake holds and be "
        "skipped. Failover slots need synchronized_standby_slots on the primary (runbook 3)"
    )
