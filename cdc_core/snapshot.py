"""Snapshots as jobs that survive restarts: plan chunks, read them group by group, then sweep.

A job covers some tables; each table is planned into chunks once (the plan is stored, so a
resumed job reads the same chunks) and read in groups of `max.threads` chunks, each group
under one MVCC snapshot (`cdc_core.snapshot_read`). A killed run re-reads at most the group
that was in flight. Once silver has merged a full (unfiltered) table snapshot, rows the
snapshot did not find are swept from the mirror: the source no longer has them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import psycopg

from cdc_core.config.model import NO_KEYS, KeyColumns, TablesOrder
from cdc_core.errors import first_line
from cdc_core.events import RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.pg import pgoutput as po
from cdc_core.pg.catalog import describe_relation, own_rows, table_info
from cdc_core.pg.sql_text import leaves_parentheses
from cdc_core.snapshot_plan import Chunk, ChunkPlan, plan_chunks
from cdc_core.state import finished_dir, read_json, snapshots_dir, write_json
from cdc_core.storage import Location

log = logging.getLogger("cdc_core.snapshot")

Kind = Literal["initial", "incremental", "blocking"]


@dataclass
class TableSnapshot:
    """One table's part of a job, and how far it got."""

    table: TableName
    plan: ChunkPlan
    columns: tuple[str, ...]
    condition: str | None = None  # a WHERE condition (incremental additional-conditions, --where)
    select: str | None = None  # a full SELECT instead of the table (blocking additional-conditions)
    groups_done: int = 0
    rows: int = 0
    first: int | None = None
    """WAL position before its first read (or the first commit that read did not see, when its
    snapshot still had running one already flushed): rows older are swept (a row changed after
    is the stream's, and so is its delete), and key changes from here on may have moved a row
    out of a later group's chunks to a key read before (`snapshot_window.departures`)."""
    last: int | None = None  # read position of its last group: silver has it once the stream does
    done: bool = False
    override: str | None = None  # the table's snapshot.select.statement.overrides SELECT
    ended: str | None = None  # why it is done without its read finished (stopped, gone, ...)

    @property
    def full(self) -> bool:
        """Read in the whole table's place (every row, or the rows the table's configured
        SELECT returns), so what was not found is gone."""
        return self.condition is None and self.select is None

    @property
    def query(self) -> str | None:
        """The SELECT the chunks read from instead of the table, if any."""
        return self.select or self.override

    def groups(self, size: int) -> list[tuple[int, ...]]:
        """Chunk numbers per group; a table without a key is read under one snapshot."""
        numbers = [c.number for c in self.plan.chunks]
        if not self.plan.key:
            return [tuple(numbers)]
        return [tuple(numbers[i : i + size]) for i in range(0, len(numbers), size)]

    def to_json(self) -> dict[str, object]:
        return {
            "table": str(self.table), "plan": self.plan.to_json(), "columns": list(self.columns),
            "condition": self.condition, "select": self.select, "groups_done": self.groups_done,
            "rows": self.rows, "first": self.first, "last": self.last, "done": self.done,
            "override": self.override, "ended": self.ended,
        }  # fmt: skip

    @classmethod
    def from_json(cls, d: dict[str, object]) -> TableSnapshot:
        return cls(
            TableName.parse(str(d["table"])), ChunkPlan.from_json(d["plan"]),  # type: ignore[arg-type]
            tuple(d["columns"]), d.get("condition"), d.get("select"),  # type: ignore[arg-type]
            int(d["groups_done"]), int(d["rows"]), d.get("first"), d.get("last"),  # type: ignore[call-overload, arg-type]
            bool(d["done"]), d.get("override"), d.get("ended"),  # type: ignore[arg-type]
        )  # fmt: skip


@dataclass
class SnapshotJob:
    """A snapshot of some tables: initial (or always / when_needed), incremental or blocking."""

    id: str  # when it was planned, its kind and a random part: `plan_job`
    kind: Kind
    origin: str  # snapshot.mode, a signal id, the command line, a new table
    tables: list[TableSnapshot] = field(default_factory=list)
    created_us: int = field(default_factory=lambda: time.time_ns() // 1000)
    stopped: bool = False
    signal: str | None = None  # the key of the signal row that asked for it (`SignalRow.key`)
    paused_us: int | None = None  # when a pause-snapshot signal paused it; None: not paused
    paused_total_us: int = 0  # time spent paused by pauses that ended (resumed)
    started: bool = False  # STARTED was sent (before its first read, or before a pause)

    @property
    def paused(self) -> bool:
        return self.paused_us is not None and not self.finished

    def paused_seconds(self, now_us: int) -> int:
        """Debezium's SnapshotPausedDurationInSeconds, the pause under way included."""
        ongoing = now_us - self.paused_us if self.paused_us is not None and self.paused else 0
        return max(0, self.paused_total_us + ongoing) // 1_000_000

    def stop(self, now_us: int) -> None:
        """Stopped (a stop-snapshot signal, a lost position): a pause under way ends here."""
        self.stopped = True
        self.end_pause(now_us)

    def end(self, part: TableSnapshot, why: str) -> None:
        """`part` done without its read finished: no more chunks are read, nothing is swept."""
        part.done, part.ended = True, why
        if self.finished:
            self.end_pause(time.time_ns() // 1000)

    def end_pause(self, now_us: int) -> None:
        if self.paused_us is not None:
            self.paused_total_us += max(0, now_us - self.paused_us)
            self.paused_us = None

    @property
    def reading(self) -> bool:
        return not self.stopped and any(not t.done and t.last is None for t in self.tables)

    @property
    def finished(self) -> bool:
        return self.stopped or all(t.done for t in self.tables)

    def save(self, lake: Lake) -> None:
        write_json(snapshots_dir(lake) / f"{self.id}.json", self.to_json())

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id, "kind": self.kind, "origin": self.origin, "created_us": self.created_us,
            "stopped": self.stopped, "tables": [t.to_json() for t in self.tables],
            "signal": self.signal, "paused_us": self.paused_us,
            "paused_total_us": self.paused_total_us, "started": self.started,
        }  # fmt: skip

    @classmethod
    def from_json(cls, d: dict[str, object]) -> SnapshotJob:
        tables = [TableSnapshot.from_json(t) for t in d["tables"]]  # type: ignore[attr-defined]
        signal = None if d.get("signal") is None else str(d["signal"])
        paused = d.get("paused_us")
        started = d.get("started", any(t.groups_done for t in tables))  # saved before it was kept
        return cls(str(d["id"]), d["kind"], str(d["origin"]), tables, int(d["created_us"]),  # type: ignore[arg-type, call-overload]
                   bool(d.get("stopped")), signal,
                   None if paused is None else int(str(paused)),
                   int(str(d.get("paused_total_us") or 0)), bool(started))  # fmt: skip


def set_paused(jobs: Sequence[SnapshotJob], *, paused: bool, now_us: int) -> list[SnapshotJob]:
    """Pause (or resume) the unfinished incremental jobs; returns those whose state changed.
    As in Debezium, pausing a paused snapshot or resuming a running one changes nothing, and
    only incremental snapshots pause (initial and blocking ones run to their end). A job with
    no chunk left to read is not paused: silver finishes it."""
    changed = []
    for job in jobs:
        if job.kind != "incremental" or job.finished or job.paused == paused:
            continue
        if paused and not job.reading:
            continue
        if paused:
            job.paused_us = now_us
        else:
            job.end_pause(now_us)
        changed.append(job)
    return changed


def load_jobs(lake: Lake) -> list[SnapshotJob]:
    """Every job, oldest first: those not yet archived (`load_current`) and the finished ones
    archived since (`archive_finished`). For reports (`cdc status`); a batch reads only the
    current ones."""
    found = {j.id: j for j in _read_jobs(snapshots_dir(lake))}
    found |= {j.id: j for j in _read_jobs(finished_dir(lake))}  # one a crash left in both
    return sorted(found.values(), key=lambda j: j.created_us)


def load_current(lake: Lake) -> list[SnapshotJob]:
    """The jobs a run goes on with, oldest first: every unfinished one, and those finished
    since a run last archived them (`archive_finished`)."""
    return sorted(_read_jobs(snapshots_dir(lake)), key=lambda j: j.created_us)


def _read_jobs(folder: Location) -> list[SnapshotJob]:
    if not folder.is_dir():
        return []
    found = (read_json(p) for p in folder.glob("*.json"))
    return [SnapshotJob.from_json(d) for d in found if d is not None]  # None: removed since


def archive_finished(lake: Lake, jobs: Sequence[SnapshotJob]) -> None:
    """Move the finished `jobs` out of the folder every batch reads, into `finished/`: a
    pipeline that snapshots often (snapshot.mode always, a signal a day) would otherwise
    parse every chunk plan it ever made at the start of each batch. Taken at a run's start,
    once the signals are taken: a job saved for a signal that a crash left unmarked
    processed is found there first, by its signal key. Written before removed, so a crash in
    between leaves it in both (`load_jobs` counts it once, the next run moves it again)."""
    for job in jobs:
        if job.finished:
            write_json(finished_dir(lake) / f"{job.id}.json", job.to_json())
            (snapshots_dir(lake) / f"{job.id}.json").unlink(missing_ok=True)


def finished_initial(lake: Lake) -> bool:
    """Whether an archived job is a finished initial snapshot (its id names its kind)."""
    folder = finished_dir(lake)
    return folder.is_dir() and any(True for _ in folder.glob("*-initial-*.json"))


def searched_from(lake: Lake) -> int | None:
    """Where the snapshots under way still search the staged stream: the earliest `first` of
    a table some group of a job not stopped has read, and not yet the last one, nor ended.
    Each of its later groups looks there for rows key changes took out of its chunks (a pause
    can hold the rest of a snapshot for days); None: no such table."""
    firsts = [t.first for j in load_current(lake) if not j.stopped for t in j.tables
              if t.first is not None and t.last is None and not t.done]  # fmt: skip
    return min(firsts, default=None)


def plan_job(
    conn: psycopg.Connection[tuple[object, ...]], kind: Kind, origin: str,
    tables: Sequence[TableName], *, chunk_size: int,
    conditions: dict[TableName, str] | None = None, surrogate_key: str | None = None,
    overrides: Callable[[TableName], str | None] | None = None,
    order: TablesOrder = "disabled", keys: KeyColumns = NO_KEYS,
) -> SnapshotJob:  # fmt: skip
    """Plan every table's chunks now (the plan is kept with the job). `overrides` gives the
    SELECT a table without a condition reads instead of its rows (a snapshot taking the whole
    table's place: snapshot.select.statement.overrides). `order`: the tables are read as
    given, or by their estimated rows (snapshot.tables.order.by.row.count; ties as given).
    A `surrogate_key` does not apply to a table whose mirror is a multiset (`keys`:
    message.key.columns): it is read under one snapshot, in block ranges, whatever the key."""
    job = SnapshotJob(
        f"{time.strftime('%Y%m%dT%H%M%S')}-{kind}-{uuid.uuid4().hex[:6]}", kind, origin
    )
    for table in tables:
        condition = (conditions or {}).get(table)
        key = [surrogate_key] if surrogate_key else None
        if key and multiset_problem(conn, table, keys):
            log.info("snapshot %s: %s has no key, so its read is one group under one "
                     "snapshot: surrogate-key %s is not used for it", job.id, table,
                     surrogate_key)  # fmt: skip
            key = None
        plan = plan_chunks(conn, table, key=key, chunk_size=chunk_size)
        columns = _columns(conn, table)
        override = overrides(table) if overrides and not condition else None
        if (override or (condition and kind == "blocking")) and not plan.key:
            plan = dataclasses.replace(plan, chunks=(Chunk(0, None, None),))  # no ctid: one chunk
        part = TableSnapshot(table, plan, columns, override=override)
        if condition and kind == "blocking":
            part.select = condition
        elif condition:
            part.condition = condition
        job.tables.append(part)
    if order != "disabled":
        job.tables.sort(key=lambda t: t.plan.estimated_rows, reverse=order == "descending")
    return job


def multiset_problem(
    conn: psycopg.Connection[tuple[object, ...]], table: TableName, keys: KeyColumns
) -> str | None:
    """Why `table` cannot be read in part, or None: without a primary key or
    message.key.columns its mirror is a multiset of rows, which its snapshot replaces whole
    (nothing tells which of the mirror's rows a partial read stands for)."""
    info = table_info(conn, [table]).get(table)
    if info is None or info.primary_key or keys.for_table(table, info.columns) is not None:
        return None
    return (
        f"{table} has no primary key (nor message.key.columns): its mirror is a multiset of "
        "rows that a snapshot replaces whole, so a snapshot of it reads every row; request "
        "it without a condition, or key the table (a primary key, or message.key.columns)"
    )


def condition_problem(
    conn: psycopg.Connection[tuple[object, ...]], table: TableName, condition: str,
    keys: KeyColumns, *, select: bool = False,
) -> str | None:  # fmt: skip
    """Why `condition` (a WHERE condition on `table`, or with `select` a whole SELECT) cannot
    be read, or None. A table whose mirror is a multiset is read whole (`multiset_problem`,
    `keys`: message.key.columns). Nothing in it may reach past the parentheses a read puts it
    in (`sql_text.leaves_parentheses`); then the server plans it as one statement (EXPLAIN,
    read-only, in the extended protocol, which refuses several; nothing runs), on lines of its
    own, as reads put it, so a trailing `--` comment cannot hide the closing parenthesis."""
    multiset = multiset_problem(conn, table, keys)
    if multiset is not None:
        return multiset
    what = "SELECT" if select else "condition"
    reaches = leaves_parentheses(condition)
    if reaches is not None:
        return f"the {what} {condition!r} for {table} is refused: {reaches}"
    source = (
        f"(\n{condition}\n) AS cdc_selected"
        if select
        else f"{own_rows(conn, table).as_string(conn)} WHERE (\n{condition}\n)"
    )
    refused = planning_error(conn, source)
    if refused is not None:
        return f"the {what} {condition!r} for {table} does not run: {first_line(refused)}"
    return None


def planning_error(
    conn: psycopg.Connection[tuple[object, ...]], source: str, *, lock_wait_ms: int | None = None
) -> psycopg.Error | None:
    """The error the server gives planning `SELECT * FROM source` (EXPLAIN, read-only, in the
    extended protocol, which refuses several statements: nothing runs), or None. `lock_wait_ms`:
    how long planning waits for the tables' locks (else up to the session's statement timeout)."""
    try:
        with conn.transaction():
            conn.execute("SET TRANSACTION READ ONLY")
            if lock_wait_ms is not None:
                conn.execute(f"SET LOCAL lock_timeout = {int(lock_wait_ms)}")
            conn.execute(f"EXPLAIN SELECT * FROM {source}", binary=True)  # binary: extended
    except psycopg.Error as e:
        return e
    return None


def _columns(conn: psycopg.Connection[tuple[object, ...]], table: TableName) -> tuple[str, ...]:
    """The columns pgoutput sends, in its order: not dropped, not generated."""
    rows = conn.execute(
        "SELECT attname::text FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
        "AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
        (str(table),),
    ).fetchall()
    return tuple(str(r[0]) for r in rows)


def catalog_descriptor(
    conn: psycopg.Connection[tuple[object, ...]], table: TableName
) -> RelationDescriptor:
    """The table's Relation descriptor as the catalog has it now: the shape of snapshot rows."""
    info = table_info(conn, [table])[table]
    if info is None:
        raise psycopg.errors.UndefinedTable(f"table {table} does not exist")
    rows = conn.execute(
        "SELECT attname::text, atttypid::int, atttypmod FROM pg_attribute WHERE attrelid = %s "
        "AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
        (info.oid,),
    ).fetchall()
    names = [str(r[0]) for r in rows]
    identity = {  # the columns a Relation message flags: the replica identity's
        po.ReplicaIdentity.FULL: set(names),
        po.ReplicaIdentity.NOTHING: set(),
    }.get(info.replica_identity, set(info.identity_columns))
    relation = po.Relation(
        None, info.oid, table.schema, table.name, info.replica_identity,
        tuple(
            po.RelationColumn(str(n), int(str(o)), int(str(m)), str(n) in identity)
            for n, o, m in rows
        ),
    )  # fmt: skip
    return describe_relation(conn, relation, {})
