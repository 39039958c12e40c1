"""Stages 1 and 2 wired together: read the slot, stage whole transactions, confirm durable data.

The slot's confirmed position moves only to what is durably staged, and past WAL that holds no
captured change (the server's own position once nothing is pending), so a quiet pipeline never
pins WAL. A transient failure (lost connection, server restart) drops the half-written file
and resumes from the last durable position, a few times, before the run gives up (exit 75);
any other failure drops the file too, and stops the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field

import psycopg

from cdc_core import faults
from cdc_core.config import Config
from cdc_core.drift import catalog_entries
from cdc_core.errors import TerminalError, TransientError, first_line
from cdc_core.events import ChangeChunk, RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.lost_position import forked_history
from cdc_core.lsn import Lsn
from cdc_core.pg import catalog
from cdc_core.pg.connect import connect
from cdc_core.pg.history import current_timeline
from cdc_core.pg.identity import identity_problem
from cdc_core.pg.replication import CaughtUp, Checkpoint, Event, SqlSource, StreamSource
from cdc_core.pg.slot import (
    advance_slot,
    ensure_publication,
    flush_position,
    next_xid,
    slot_state,
    usable_slot,
)
from cdc_core.reader import HEARTBEAT_PREFIX, WATERMARK_PREFIX, Assembler, Budget
from cdc_core.stager import Limits, StagedFile, Stager, XidFloor
from cdc_core.start import slot_missing
from cdc_core.state import (
    heartbeat_file,
    read_json,
    record_confirmed,
    recorded_oids,
    schema_history,
    write_json,
)
from cdc_core.transient import as_transient, transient_failures

log = logging.getLogger("cdc_core.capture")


@dataclass(frozen=True)
class CaptureSummary:
    """What one capture did."""

    transactions: int
    changes: int
    files: tuple[StagedFile, ...]
    end_position: Lsn  # the WAL flush position read at start (--once stops there)
    confirmed: Lsn
    seconds: float
    filtered: int = 0  # changes read and dropped on purpose (Debezium's NumberOfEventsFiltered)

    def plus(self, later: CaptureSummary) -> CaptureSummary:
        """This capture and a later one of the same run, as one."""
        return CaptureSummary(
            self.transactions + later.transactions, self.changes + later.changes,
            self.files + later.files, later.end_position, later.confirmed,
            self.seconds + later.seconds, self.filtered + later.filtered,
        )  # fmt: skip

    def describe(self) -> str:
        span = f"{self.files[0].start}..{self.files[-1].end}" if self.files else "nothing new"
        return (
            f"captured {self.transactions} transactions, {self.changes} changes in "
            f"{len(self.files)} staged files ({span}); slot confirmed at {self.confirmed} "
            f"({self.seconds:.1f} s)"
        )


def catch_up(config: Config, lake: Lake, position: Lsn) -> CaptureSummary:
    """Stage every change committed before `position` (a snapshot read's place in the stream).

    A small transaction holding a logical message (the read's high watermark, which the reader
    drops) is committed first, synchronously: the WAL is then flushed past `position`, so the
    capture that follows reaches it even on an idle server. `local`: a synchronous standby that
    is slow or gone does not hold the read up (the flush is all it needs).
    """
    with connect(config.pipeline.source.dsn) as conn:
        conn.execute("SET synchronous_commit = local")  # flushed here, no standby waited for
        conn.execute(
            "SELECT pg_logical_emit_message(true, %s, %s)", (WATERMARK_PREFIX, str(position))
        )
    return capture(config, lake)


def heartbeat(config: Config, lake: Lake, *, now_ms: int | None = None) -> bool:
    """Send a heartbeat if `heartbeat.interval.ms` asks for one now: the action query, then a
    logical decoding message in a transaction of its own, which the slot reads like any change.
    Returns whether it was sent."""
    source = config.pipeline.source
    if source.heartbeat_interval_ms <= 0:
        return False
    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    last = read_json(heartbeat_file(lake))
    if last is not None and now_ms - int(str(last["ts_ms"])) < source.heartbeat_interval_ms:
        return False
    with connect(source.dsn) as conn:
        if source.heartbeat_action_query:
            try:
                conn.execute(source.heartbeat_action_query.encode())
            except psycopg.Error as e:
                passing = as_transient(e)  # a lock or a busy server past source.query_timeout_s
                if passing is not None:
                    raise TransientError(f"source.heartbeat.action.query: {passing}") from e
                raise TerminalError(
                    f"{config.pipeline_file}: source.heartbeat.action.query failed: {first_line(e)}"
                ) from e
        with conn.transaction():  # committed and flushed: within the WAL this run reads
            conn.execute("SET LOCAL synchronous_commit = local")
            conn.execute(
                "SELECT pg_logical_emit_message(true, %s, %s)",
                (HEARTBEAT_PREFIX, json.dumps({"ts_ms": now_ms})),
            )
    write_json(heartbeat_file(lake), {"ts_ms": now_ms})
    log.info("heartbeat sent")
    return True


def capture(config: Config, lake: Lake) -> CaptureSummary:
    """Stage every change committed before the WAL flush position seen at start (`--once`).
    The slot must exist: a missing one (dropped since `start`) stops the run, never recreated."""
    started = time.monotonic()
    source = config.pipeline.source
    with connect(source.dsn) as conn:
        left = ensure_publication(  # adds nothing: only a run's start, which snapshots them
            conn, source.publication, source.tables, source.publication_autocreate_mode,
            add=False,
        )  # fmt: skip
        if left:
            log.warning("table %s left publication %s during this run: its changes are not "
                        "streamed until the next run adds it back and snapshots it",
                        ", ".join(map(str, left)), source.publication)  # fmt: skip
        if usable_slot(conn, source.slot) is None:  # only a run's start creates the slot
            raise slot_missing(config)
        end = flush_position(conn)
        floor = XidFloor(end, next_xid(conn))  # the id taken after `end` is read
        database = catalog.current_database(conn).name
    settings = config.pipeline.capture
    limits = Limits(
        file_changes=settings.file_changes,
        file_bytes=settings.file_bytes,
        row_group_changes=settings.chunk_changes,
        row_group_bytes=settings.chunk_bytes,
    )
    context = {"database": database, "pipeline": config.pipeline.name, "slot": source.slot}
    stager = Stager(
        lake.changes,
        lake.staging_tmp,
        limits=limits,
        compression=settings.compression,
        source=context,
        floor=floor,
    )
    stager.recover()
    counts = [0, 0, 0]  # transactions, changes, changes filtered
    for attempt in itertools.count():
        try:
            with transient_failures():  # a catalog query cut off too, not only the stream
                _capture_until(config, lake, stager, end, counts)
            break
        except TransientError as e:
            stager.abort()
            if settings.gives_up(attempt + 1):
                raise TransientError(
                    f"{e} (gave up after {attempt + 1} attempts; {len(stager.published)} files "
                    f"staged up to {stager.published_end} are safe, the next run resumes there)"
                ) from e
            wait = min(30.0, settings.retry_backoff_s * 2 ** min(attempt, 16))
            log.warning("capture interrupted (%s); retrying in %.1f s", e, wait)
            time.sleep(wait)
        except BaseException:  # a full disk, say: the half-written file must not keep it full
            stager.abort()
            raise
    try:
        confirmed = _settle_confirmation(config, lake, stager.durable_end())
    except TransientError as e:  # everything is staged; the next run confirms what this did not
        log.warning("could not check the slot's confirmed position (%s)", e)
        confirmed = stager.durable_end()
    return CaptureSummary(counts[0], counts[1], tuple(stager.published), end, confirmed,
                          time.monotonic() - started, counts[2])  # fmt: skip


def _capture_until(
    config: Config, lake: Lake, stager: Stager, end: Lsn, counts: list[int]
) -> None:  # fmt: skip
    source = config.pipeline.source
    settings = config.pipeline.capture
    slot: StreamSource | SqlSource
    if source.reader == "sql":
        slot = SqlSource(source.dsn, source.slot, source.publication,
                         peek_changes=settings.peek_changes)  # fmt: skip
    else:
        slot = StreamSource(source.dsn, source.slot, source.publication)
    with connect(source.dsn) as catalog_conn:
        reader = _Recording(slot, lake, source.slot, _same_history(config, lake, catalog_conn))
        assembler = Assembler(
            source.followed,
            lambda rel, types: _described(
                config,
                _keyed(lake, catalog_conn, catalog.describe_relation(catalog_conn, rel, types)),
            ),
            skip_before=stager.published_end,
            stop_at=end,
            budget=Budget(settings.chunk_changes, settings.chunk_bytes),
            skipped=source.skipped_operations.codes,
            keep_message=source.keeps_message,
            slot=source.slot,  # reset markers other pipelines on the database write are dropped
            columns=source.column_rules(),
            oids=_captured_oids(catalog_conn, lake, source.followed),
        )
        reader.open(stager.durable_end())
        try:
            with contextlib.closing(reader.events(end)) as events:  # a peek left unread ends here
                run = _Run(assembler, stager, reader, end, counts)
                run.consume(events)
            counts[2] += assembler.lone_filtered  # a failed attempt's are read again, if at all
            stager.flush()
            run.settle()
            reader.confirm(stager.durable_end())
        finally:
            reader.close()


def _same_history(
    config: Config, lake: Lake, conn: psycopg.Connection[tuple[object, ...]]
) -> int | None:
    """The source's timeline, once the lake's position is known to be in its WAL history: an
    attempt that reconnects after a failover (an address moved to a promoted standby) stops
    before it reads from a history that forked before what the lake holds, where the new
    primary's own changes would sort before it and be taken for staged already."""
    timeline = current_timeline(conn)
    forked = forked_history(config.pipeline.source.dsn, lake, timeline)
    if forked is not None:
        raise TerminalError(
            f"pipeline {config.pipeline.name}: {forked}; the next run decides under "
            f"snapshot.mode ({config.pipeline.snapshot.mode}): when_needed takes a new snapshot"
        )
    return timeline


def _captured_oids(
    conn: psycopg.Connection[tuple[object, ...]], lake: Lake, tables: Sequence[TableName]
) -> dict[TableName, int]:
    """Each captured table's OID, which the reader follows it by through renames and moves: the
    catalog's now, past the end of the WAL this capture reads, else the one the run's start
    recorded (a table renamed since is not found by its name)."""
    return recorded_oids(lake, tables) | {
        t: e.oid for t, e in catalog_entries(conn, list(tables)).items()
    }


def _keyed(
    lake: Lake, conn: catalog.Connection, described: RelationDescriptor
) -> RelationDescriptor:
    """A relation the catalog found no primary key for, keyed by the newest key the lake's
    schema history holds for it when the table is gone (dropped since the change was made:
    the catalog lost its key with it, `cdc_core.dropped`)."""
    if described.primary_key or catalog.relation_exists(conn, described.oid):
        return described
    history = schema_history(lake, TableName(described.schema, described.table).qualified)
    key = next((d.primary_key for _, d in reversed(history) if d.primary_key), ())
    return dataclasses.replace(described, primary_key=key) if key else described


def _described(config: Config, described: RelationDescriptor) -> RelationDescriptor:
    """A captured table's shape keyed as its events are (message.key.columns, else the primary
    key); a TerminalError when the identity the stream sent it with leaves that key out of its
    deletes (set while the pipeline ran, or before the run found it fixed): capture stops before
    any later change of the table is staged, and the slot stays before it."""
    table = TableName(described.schema, described.table)
    key = config.pipeline.source.message_key_columns.for_table(
        table, [c.name for c in described.columns]
    )
    problem = identity_problem(
        table, described.replica_identity,
        key if key is not None else described.primary_key,
        tuple(c.name for c in described.columns if c.in_identity),
        primary_key=described.primary_key,
    )  # fmt: skip
    if problem:
        raise TerminalError(
            f"pipeline {config.pipeline.name}: the stream holds changes of {table} made under a "
            f"replica identity set while the pipeline ran (or before it was fixed): {problem} "
            f"(if it still is). Capture stopped before them; they cannot be mirrored: take "
            f"{table} out of {_captured_by(config)} and run once (the stream passes them by), "
            "then put it back: the next run snapshots it again as a new table (unless "
            "snapshot.mode is no_data). Rows deleted meanwhile stay in its mirror unless you "
            "rebuild it: drop its silver directory and "
            f"`cdc snapshot --pipeline {config.pipeline.name} --table {table}`"
        )
    return described.keyed(key)


def _captured_by(config: Config) -> str:
    source = config.pipeline.source
    return f"the tables {source.tables_key} lets through" if source.discovered else "source.tables"


@dataclass
class _Recording:
    """The slot reader, recording each position in `_state/stream.json` before confirming it: a
    slot found ahead of the record is not the one this pipeline read (dropped and recreated)."""

    slot: StreamSource | SqlSource
    lake: Lake
    name: str
    timeline: int | None = None  # the source's: recorded with each position
    recorded: Lsn | None = None

    def open(self, position: Lsn) -> None:
        # Both readers report where they start as confirmed (the sql reader advances the slot
        # there, the stream reader's status messages carry it): recorded first, like any other
        # confirmation. A run killed after publishing a staged file and before recording its end
        # leaves that end ahead of the record, and the next run starts there.
        self._record(position)
        self.slot.open(position)

    def events(self, end: Lsn) -> Generator[Event, None, None]:
        return self.slot.events(end) if isinstance(self.slot, SqlSource) else self.slot.events()

    def confirm(self, position: Lsn) -> None:
        self._record(position)
        self.slot.confirm(position)
        faults.point("confirm.sent")

    def _record(self, position: Lsn) -> None:
        if self.recorded is None or position > self.recorded:
            record_confirmed(self.lake, self.name, position, timeline=self.timeline)
            self.recorded = position
            faults.point("confirm.recorded")

    def close(self) -> None:
        self.slot.close()


@dataclass
class _Run:
    """One pass over the slot: messages to the assembler, chunks to the stager, confirmations."""

    assembler: Assembler
    stager: Stager
    reader: _Recording
    end: Lsn
    counts: list[int]  # transactions, changes, changes filtered: in files published, or past
    held: list[int] = field(default_factory=lambda: [0, 0, 0])  # the same, not yet there

    def consume(self, events: Iterator[Event]) -> None:
        for event in events:
            if isinstance(event, list):
                faults.point("capture.transaction")
                for chunk in self.assembler.feed_many(event):
                    self._stage(chunk)
                if self.assembler.finished:  # committed after the end seen at start: the next
                    self.stager.flush()  # run's; every transaction committed before it is staged
                    self.settle()
                    self.reader.confirm(max(self.stager.durable_end(), self.end))
                    return
            elif isinstance(event, Checkpoint):
                self.stager.flush()
                self.settle()
                self.reader.confirm(self.stager.durable_end())
            elif isinstance(event, CaughtUp) and not self.assembler.in_transaction:
                if not self.stager.pending:  # nothing unstaged: WAL up to here holds nothing for us
                    self.reader.confirm(max(self.stager.durable_end(), event.position))
                if event.position >= self.end:
                    return

    def _stage(self, chunk: ChangeChunk) -> None:
        self.held[1] += len(chunk)
        self.held[2] += chunk.filtered  # counted with the changes they were read among
        self.held[0] += int(chunk.last and (len(chunk) > 0 or chunk.first_seq > 0))
        if self.stager.add(chunk) is not None:
            self.reader.confirm(self.stager.durable_end())
        self.settle()

    def settle(self) -> None:
        """Count what the stager holds nothing of any more (published, or past with nothing
        to stage). A failed attempt's `held` is dropped: the retry reads it again from
        `durable_end` and counts it then, once."""
        if not self.stager.pending:
            for i, n in enumerate(self.held):
                self.counts[i] += n
            self.held[:] = [0, 0, 0]


def _settle_confirmation(config: Config, lake: Lake, target: Lsn, timeout_s: float = 10.0) -> Lsn:
    """Make sure the slot really is confirmed at `target` once the walsender has gone."""
    source = config.pipeline.source
    deadline = time.monotonic() + timeout_s
    with connect(source.dsn, bounded=False, reads_slot=True) as conn:  # an advance decodes
        while True:
            state = slot_state(conn, source.slot)
            if state is None or state.confirmed_flush >= target:
                return state.confirmed_flush if state else target
            if state.active_pid is None:
                record_confirmed(lake, source.slot, target)
                return advance_slot(conn, source.slot, target)
            if time.monotonic() > deadline:
                log.warning("slot %s still active; confirmed at %s, not %s",
                            source.slot, state.confirmed_flush, target)  # fmt: skip
                return state.confirmed_flush
            time.sleep(0.05)
