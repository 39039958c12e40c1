"""Retiring a pipeline: `cdc retire` drops its slot, and its publication when asked, so that the
source keeps no WAL for it; the lake stays for reading.

A slot nobody reads pins WAL until the source's disk fills, so a pipeline taken out of service
must give its slot up. Debezium's `slot.drop.on.stop` drops the slot whenever the connector
stops, which here would lose every change between two runs; this is the one-off step instead.

The command holds the pipeline's run lock, so no run of it is under way, and shows what it
will drop and what would be lost with it (changes in the WAL the slot has not confirmed, staged
files not yet in bronze) before anything is dropped; it drops only with `--yes`. The
retirement is recorded in the lake (`_state/retired.json`) before the slot is dropped, and
every later run refuses to start: a schedule left on would otherwise create a new slot, which
pins WAL again, and take a new snapshot. A retirement cut short (the server went away between
the record and the drop) is finished by running the command again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg
from psycopg import sql

from cdc_core.config import Config, SourceConfig
from cdc_core.errors import TerminalError, first_line
from cdc_core.lake import Lake
from cdc_core.lost_position import stored_position
from cdc_core.lsn import Lsn
from cdc_core.pg.catalog import publication_info
from cdc_core.pg.connect import connect
from cdc_core.pg.replication import publication_names
from cdc_core.pg.slot import SlotState, slot_state
from cdc_core.stager import staged_files
from cdc_core.state import (
    Retirement,
    retired_file,
    retirement,
    write_json,
)
from cdc_core.status import BRONZE_WATERMARK, PendingStatus, pending_files, table_status

Conn = psycopg.Connection[tuple[object, ...]]

# The Insert, Update, Delete and Truncate messages (what a pipeline stages) of transactions that
# end after the last staged file's end: those staged already (by a run that ended before it
# confirmed them) end at or before it. A transaction's rows come together, its commit last, and
# the commit row's LSN is where the transaction ends (protocol 1 streams nothing uncommitted).
_UNREAD = """
SELECT count(*) FILTER (WHERE get_byte(data, 0) IN (73, 85, 68, 84) AND commit_lsn > %s::pg_lsn),
       count(*)
FROM (
    SELECT data, max(lsn) OVER (PARTITION BY xid::text) AS commit_lsn
    FROM pg_logical_slot_peek_binary_changes(%s, NULL, %s,
        'proto_version', '1', 'publication_names', %s)) AS peeked
"""
PEEK_LIMIT = 1_000_000  # messages: the count stops at the transaction that passes it


@dataclass(frozen=True)
class Plan:
    """What retiring the pipeline drops, and what is lost with it."""

    pipeline: str
    slot_name: str
    slot: SlotState | None  # None: no slot (never created, or dropped already)
    unread: int | None  # changes in the WAL past the slot's confirmed position (None: unknown)
    unread_error: str | None
    pending: PendingStatus  # staged files not yet in bronze
    publication: str
    publication_exists: bool
    drop_publication: bool
    retired: Retirement | None  # an earlier cdc retire's record
    unread_more: bool = False  # the count stopped at the peek's limit: at least `unread`
    sharers: tuple[str, ...] = ()  # other pgoutput slots on the database (`_sharers`)

    def lines(self) -> list[str]:
        lines = (
            []
            if self.retired is None
            else [f"pipeline {self.pipeline} was {self.retired.describe()}"]
        )
        if self.slot is None:
            lines.append(f"slot {self.slot_name}: does not exist, nothing to drop")
        else:
            lines.append(f"drop slot {self.slot.name} (confirmed {self.slot.confirmed_flush})")
            if self.unread_error is not None:
                lines.append(f"  changes not yet read from it: unknown ({self.unread_error})")
            elif self.unread:
                many = f"at least {self.unread}" if self.unread_more else str(self.unread)
                lines.append(f"  {many} changes in the WAL not yet read into the lake "
                             "are LOST with it: run the pipeline first to keep them")  # fmt: skip
            else:
                lines.append("  every change it holds is in the lake")
        if self.pending.files:
            lines.append(f"{self.pending.files} staged files are not yet in bronze: no run "
                         "applies them after this (run the pipeline with Spark first)")  # fmt: skip
        lines.append(self._publication_line())
        lines.append("keep the lake; refuse every later run (_state/retired.json)")
        return lines

    def _publication_line(self) -> str:
        name = self.publication
        if not self.publication_exists:
            return f"publication {name}: does not exist, nothing to drop"
        if self.drop_publication and self.sharers:
            return (f"keep publication {name}, --drop-publication notwithstanding: logical "
                    f"slots {', '.join(self.sharers)} on this database decode with pgoutput, "
                    "and one may read through it (a pipeline whose publication is gone needs a "
                    f"new slot and a new snapshot); drop it once none does: DROP PUBLICATION "
                    f"{name}")  # fmt: skip
        if self.drop_publication:
            return f"drop publication {name} (--drop-publication)"
        return (f"keep publication {name} (it holds no WAL; --drop-publication drops it when "
                "no other pipeline reads through it)")  # fmt: skip


def plan(config: Config, lake: Lake, *, drop_publication: bool) -> Plan:
    """Look at the slot, its unread changes and the lake; change nothing. Refuses a slot a
    process is reading: whatever reads it is not this pipeline's run (the caller holds its run
    lock), and a dropped slot cannot be given back."""
    source = config.pipeline.source
    with connect(source.dsn) as conn:
        slot = slot_state(conn, source.slot)
        if slot is not None and slot.active_pid is not None:
            raise in_use(source.slot, slot.active_pid)
        staged = staged_files(lake.changes)
        staged_end = staged[-1].end if staged else Lsn(0)
        unread, unread_error, more = (
            (None, None, False) if slot is None else _unread(conn, slot, source, staged_end)
        )
        exists = publication_info(conn, source.publication) is not None
        sharers = _sharers(conn, source.slot)
    bronze = table_status("bronze", lake.place(lake.bronze), BRONZE_WATERMARK)
    pending = pending_files(lake, bronze.staged_end, staged)
    return Plan(config.pipeline.name, source.slot, slot, unread, unread_error, pending,
                source.publication, exists, drop_publication, retirement(lake),
                unread_more=more, sharers=sharers)  # fmt: skip


def _unread(
    conn: Conn, slot: SlotState, source: SourceConfig, staged_end: Lsn
) -> tuple[int | None, str | None, bool]:
    """Count the changes the slot holds that are not staged: a peek that moves nothing, of at
    most `PEEK_LIMIT` messages (a slot far behind is not decoded whole to count it); True when
    the count stopped there."""
    publication = source.publication
    if slot.wal_status == "lost":
        return None, "the slot lost its WAL", False
    name = publication_names(publication)
    try:
        with conn.transaction():
            row = conn.execute(_UNREAD, (str(staged_end), slot.name, PEEK_LIMIT, name)).fetchone()
    except psycopg.errors.ObjectInUse as e:  # a reader attached since: the drop refuses too
        raise in_use(slot.name, None) from e
    except psycopg.Error as e:
        why = first_line(e)
        return None, why, False
    if row is None:
        return 0, None, False
    return int(str(row[0])), None, int(str(row[1])) >= PEEK_LIMIT


def in_use(slot: str, pid: int | None, *, recorded: bool = False) -> TerminalError:
    """`recorded`: the retirement is recorded already (runs are refused), the slot not dropped."""
    by = f"process {pid}" if pid is not None else "a process"
    end = (f"SELECT pg_terminate_backend({pid})" if pid is not None else
           f"SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE "
           f"slot_name = '{slot}'")  # fmt: skip
    state = ("the retirement is recorded and runs are refused, but the slot is not dropped"
             if recorded else "nothing was dropped")  # fmt: skip
    return TerminalError(
        f"slot {slot} is being read by {by}, not by a run of this pipeline on this lake (its "
        f"run lock is held here): stop that reader, or end its session with {end}, and run "
        f"cdc retire again; {state}"
    )


def carry_out(config: Config, lake: Lake, planned: Plan) -> list[str]:
    """Record the retirement, then drop what `planned` says; what was done, one line each."""
    source = config.pipeline.source
    slot = planned.slot
    kept = slot.confirmed_flush if slot is not None else stored_position(lake)
    confirmed = None if kept is None else str(kept)
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    earlier = planned.retired
    if earlier is not None:  # finishing one cut short, or run again: the first record stands
        at, confirmed = earlier.at, earlier.confirmed
    record = {"at": at, "slot": source.slot, "confirmed": confirmed, "done": False}
    write_json(retired_file(lake), record)
    done = []
    with connect(source.dsn) as conn:
        if slot_state(conn, source.slot) is not None:
            _drop_slot(conn, source.slot)
            done.append(f"dropped slot {source.slot}")
        drop = planned.drop_publication and not _sharers(conn, source.slot)  # made since?
        if drop and publication_info(conn, source.publication) is not None:
            _drop_publication(conn, source.publication)
            done.append(f"dropped publication {source.publication}")
    write_json(retired_file(lake), {**record, "done": True})
    done.append(f"pipeline {config.pipeline.name} retired ({retired_file(lake)}); its lake at "
                f"{lake.root} is kept")  # fmt: skip
    return done


def _sharers(conn: Conn, slot: str) -> tuple[str, ...]:
    """The other logical slots on the database that decode with pgoutput: which publication a
    slot's reader names is not on the server, so any of them may read through this one."""
    rows = conn.execute(
        "SELECT slot_name::text FROM pg_replication_slots WHERE database = current_database() "
        "AND plugin = 'pgoutput' AND slot_name <> %s ORDER BY slot_name", (slot,),
    ).fetchall()  # fmt: skip
    return tuple(str(r[0]) for r in rows)


def _drop_slot(conn: Conn, name: str) -> None:
    try:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    except psycopg.errors.UndefinedObject:
        return  # dropped meanwhile
    except psycopg.errors.ObjectInUse as e:  # a reader attached after the plan looked
        raise in_use(name, None, recorded=True) from e


def _drop_publication(conn: Conn, name: str) -> None:
    try:
        conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))
    except psycopg.errors.InsufficientPrivilege as e:
        raise TerminalError(
            f"publication {name} can be dropped only by its owner or a superuser (the server "
            f"said: {first_line(e)}): the slot is dropped and the pipeline "
            f"retired; drop the publication as its owner (DROP PUBLICATION {name}), or run cdc "
            "retire --drop-publication again as a role that owns it"
        ) from e
