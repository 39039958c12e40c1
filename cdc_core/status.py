"""`cdc status`: where a pipeline stands, from the slot, `_state` and the Delta logs, no Spark.

Each part is read on its own, so what can be read is shown even when another part cannot: an
unreachable source still shows what the lake says (and exits 75, try again; 1 when the server
refused the login, which no retry changes), a table whose log
cannot be read is a line of its own. The exit code says whether someone has to act: 1 for a
missing or lost slot, a pipeline that has not run for `--stale-after`, or an unreadable part.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Literal

import psycopg

from cdc_core import delta_log, dropped
from cdc_core.config import ByteSize, Config, Dsn, SourceConfig, with_tables
from cdc_core.errors import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_TRANSIENT,
    CdcError,
    ConfigError,
    TransientError,
    first_line,
)
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.lost_position import forked_history
from cdc_core.lsn import ZERO, Lsn
from cdc_core.metrics import last_batch
from cdc_core.pg import waits
from cdc_core.pg.catalog import SLOT_READER, Connection, SlotInfo
from cdc_core.pg.connect import connect
from cdc_core.pg.discover import discover
from cdc_core.pg.history import current_timeline
from cdc_core.pg.slot import system_identifier
from cdc_core.run_lock import Holder, read_holder
from cdc_core.snapshot import load_jobs
from cdc_core.stager import StagedFile, staged_files
from cdc_core.state import (
    Retirement,
    check_owner,
    damaged_documents,
    known_tables_file,
    other_cluster,
    read_json,
    read_stream,
    retirement,
    snapshots_dir,
)
from cdc_core.storage import Location

log = logging.getLogger("cdc_core.status")

BRONZE_WATERMARK = "bronze_staged_end"  # cdc_core.bronze.WATERMARK (bronze imports pyspark)
SILVER_WATERMARK = "silver_applied"  # cdc_core.silver.WATERMARK
_LABEL = 12  # width of the human form's label column
_SLOT_QUERY = f"""
SELECT active, active_pid, wal_status, confirmed_flush_lsn::text, restart_lsn::text,
       pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn()
                            ELSE pg_current_wal_lsn() END, restart_lsn)::bigint,
       safe_wal_size, slot_type, plugin, database, current_database(), ({SLOT_READER})
FROM pg_replication_slots WHERE slot_name = %s
"""

TableState = Literal["created", "not_created", "unreadable"]


@dataclass(frozen=True)
class SlotStatus:
    """The pipeline's replication slot as `pg_replication_slots` shows it (None: not known)."""

    name: str
    exists: bool | None = None
    active: bool | None = None
    active_pid: int | None = None
    wal_status: str | None = None
    confirmed_flush_lsn: str | None = None
    restart_lsn: str | None = None
    retained_wal_bytes: int | None = None  # WAL the server keeps for the slot
    safe_wal_size_bytes: int | None = None  # WAL left before max_slot_wal_keep_size loses it
    unusable: str | None = None  # why runs cannot read it (another plugin, another database's)
    reader: str | None = None  # the application_name of the process reading it now
    foreign_reader: bool = False  # that process is no run of this product (`SlotInfo`)
    held_by: str | None = None
    """The oldest transaction open in the slot's database, with its way out, when it is what
    keeps most of the retained WAL (the restart position far behind the confirmed one)."""


@dataclass(frozen=True)
class SourceStatus:
    reachable: bool
    error: str | None = None
    system_identifier: str | None = None  # the cluster's (None: not shown to the role)
    timeline: int | None = None  # the server's WAL timeline (a promoted standby starts one)
    lasting: bool = False  # unreachable for a reason no retry fixes (a login refused)


@dataclass(frozen=True)
class BatchStatus:
    """The last line of `_state/batches.jsonl`, written by the ingest job; None: not recorded."""

    batch: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    seconds: float | None = None
    lsn_from: str | None = None
    lsn_to: str | None = None
    changes: int | None = None
    transactions: int | None = None
    freshness_p50_s: float | None = None
    freshness_p99_s: float | None = None
    freshness_max_s: float | None = None


@dataclass(frozen=True)
class TableStatus:
    """A Delta table of the lake: its rows and how far its stage got."""

    table: str
    state: TableState
    rows: int | None = None
    version: int | None = None
    applied_lsn: str | None = None  # silver: commit LSN of the last change merged
    applied_seq: int | None = None  # silver: its position in the transaction
    staged_end: str | None = None  # bronze: end LSN of the last staged file appended
    error: str | None = None
    dead_letters: int = 0  # silver: changes set aside in _state/dead_letters (warn, skip)
    dropped: Literal["following", "applied"] | None = None  # the source table was dropped


@dataclass(frozen=True)
class EndedTable:
    table: str
    why: str  # stopped by a signal, the table dropped, given up or read again after DDL


@dataclass(frozen=True)
class SnapshotStatus:
    id: str
    kind: str
    tables_done: int
    tables_total: int
    rows: int
    finished: bool
    paused: bool = False  # by a pause-snapshot signal: no chunk is read until resumed
    paused_s: int = 0  # Debezium's SnapshotPausedDurationInSeconds, the pause under way included
    stopped: bool = False  # by a stop-snapshot signal, or a lost position: nothing more is read
    ended: tuple[EndedTable, ...] = ()  # its tables done without their reads finished


@dataclass(frozen=True)
class PendingStatus:
    """Staged change files not yet in bronze."""

    files: int
    bytes: int


@dataclass(frozen=True)
class PipelineStatus:
    """Everything `cdc status` shows; `to_json()` keys are the stable machine interface."""

    pipeline: str
    env: str
    checked_at: str
    lake: str
    source: SourceStatus
    slot: SlotStatus
    last_batch: BatchStatus | None
    idle_s: float | None  # since the last batch ended
    stale_after_s: float
    bronze: TableStatus
    tables: tuple[TableStatus, ...]
    snapshots: tuple[SnapshotStatus, ...]
    pending: PendingStatus
    problems: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())
    retired: Retirement | None = None  # by cdc retire: no slot and no runs are expected
    running: str | None = None  # the run under way (its run lock's holder), if any
    progress_s: float | None = None  # since that run started or last saved snapshot progress

    @property
    def stale(self) -> bool:
        """No batch ended for `stale_after_s`, nor did a run under way make progress then (one
        batch of a long snapshot). A pipeline that never ran a batch is not stale."""
        if self.idle_s is None or self.idle_s <= self.stale_after_s:
            return False
        return self.progress_s is None or self.progress_s > self.stale_after_s

    @property
    def exit_code(self) -> int:
        if not self.source.reachable:  # the slot is unknown; the outage may explain the rest
            return EXIT_FAILURE if self.source.lasting else EXIT_TRANSIENT
        return EXIT_FAILURE if self.problems else EXIT_OK

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["tables"] = [asdict(t) for t in self.tables]
        data["snapshots"] = [asdict(s) for s in self.snapshots]
        data["problems"], data["warnings"] = list(self.problems), list(self.warnings)
        return {**data, "stale": self.stale, "healthy": self.exit_code == EXIT_OK,
                "exit_code": self.exit_code}  # fmt: skip


def gather_status(
    config: Config, *, stale_after_s: float = 3600.0, now: datetime | None = None
) -> PipelineStatus:
    """Read every part; a part that cannot be read becomes a problem line, never an exception."""
    now = now or datetime.now(timezone.utc)
    lake = Lake.of(config.pipeline.target.root, config.env.spark.conf)
    pipeline = captured(config, lake).pipeline
    source, slot = read_slot(pipeline.source.dsn, pipeline.source.slot)
    unreadable = lake.store_problem
    if unreadable is not None:  # each read would find nothing, or fail: none is made
        return _without_lake(config, now, stale_after_s, source, slot, why=str(unreadable))
    batch = read_last_batch(lake)
    bronze = table_status("bronze", lake.place(lake.bronze), BRONZE_WATERMARK)
    dead = read_dead_letters(lake)
    gone = _dropped(lake)
    shown = [*pipeline.source.tables, *(t for t in gone if t not in pipeline.source.tables)]
    tables = tuple(
        replace(
            table_status(str(t), lake.place(lake.silver(t)), SILVER_WATERMARK),
            dead_letters=dead.get(t.qualified, 0),
            dropped=gone.get(t),
        )
        for t in shown
    )
    snapshots, snapshot_problem = read_snapshots(lake)
    holder = read_holder(lake)
    holder = None if holder is None or holder.gone() else holder  # one left by a dead run: none
    status = PipelineStatus(
        pipeline.name, config.env_name, _iso(now), pipeline.target.root, source, slot, batch,
        idle_seconds(batch, now), stale_after_s, bronze, tables, snapshots,
        pending_files(lake, bronze.staged_end),
        running=holder.describe() if holder else None,
        progress_s=_progress_seconds(lake, holder, now) if holder else None,
    )  # fmt: skip
    damaged = damaged_documents(lake)  # each stops the next run
    try:
        check_owner(lake, pipeline.name)
    except CdcError as e:  # another pipeline's lake, or a damaged record of whose it is
        damaged += [str(e)] if str(e) not in damaged else []
    with contextlib.suppress(CdcError):  # retired.json damaged: one of those
        retired = retirement(lake)
        if retired is not None:
            problems = [*_retired_problems(status, retired), *damaged]
            return replace(status, retired=retired, problems=tuple(problems))
    try:
        stored: object = read_stream(lake)
    except CdcError as e:
        stored = DAMAGED
        damaged.insert(0, str(e))
    problems = [*_problems(status, stored), *damaged]
    forked = _forked(pipeline.source.dsn, lake, status.source)
    if forked is not None:
        problems.append(f"{forked}: the next run stops, or takes a new snapshot under "
                        "snapshot.mode when_needed; see docs/runbooks.md, runbook 3")  # fmt: skip
    if snapshot_problem:
        problems.append(snapshot_problem)
    warnings = _warnings(status)
    verdict = slot_verdict(pipeline.source, slot)
    if verdict is not None:
        (problems if verdict[0] == "fail" else warnings).append(verdict[1])
    return replace(status, problems=tuple(problems), warnings=tuple(warnings))


def _without_lake(
    config: Config, now: datetime, stale_after_s: float, source: SourceStatus, slot: SlotStatus,
    *, why: str,
) -> PipelineStatus:  # fmt: skip
    """The status of a pipeline whose lake cannot be read (its store down, its bucket missing):
    the source's part, and the lake's problem, which bronze's line carries."""
    status = PipelineStatus(
        config.pipeline.name, config.env_name, _iso(now), config.pipeline.target.root, source,
        slot, None, None, stale_after_s, TableStatus("bronze", "unreadable", error=why), (), (),
        PendingStatus(0, 0),
    )  # fmt: skip
    return replace(status, problems=tuple(_problems(status, None)))


def _dropped(lake: Lake) -> dict[TableName, Literal["following", "applied"]]:
    """The captured tables found dropped at the source (`cdc_core.dropped`), and whether their
    mirror holds their last changes; none when the record cannot be read."""
    try:
        found = dropped.recorded(lake)
    except (CdcError, OSError, ValueError, KeyError) as e:  # damaged: `damaged_documents` says so
        log.warning("_state/dropped.json not read: %s", e)
        return {}
    return {t: "applied" if d.applied else "following" for t, d in found.items()}


def captured(config: Config, lake: Lake) -> Config:
    """`config` with the tables it captures: a source without `source.tables` has them found
    in its catalog; when it cannot be read (the slot's line says why), the tables the last
    run's start captured."""
    try:
        return discover(config)
    except ConfigError:
        raise
    except (CdcError, psycopg.Error):
        try:
            known = read_json(known_tables_file(lake)) or []
        except CdcError:  # damaged: `damaged_documents` says so
            return config
        return with_tables(config, [TableName.parse(str(t)) for t in known]) if known else config


def read_slot(dsn: Dsn, name: str) -> tuple[SourceStatus, SlotStatus]:
    """The slot's row in `pg_replication_slots`; an unreachable source is a status, not an
    error."""
    try:
        with connect(dsn) as conn:
            row = conn.execute(_SLOT_QUERY, (name,)).fetchone()
            system, timeline = system_identifier(conn), current_timeline(conn)
            held_by = _held_by(conn, row)
    except TransientError as e:  # connect's names the server
        return SourceStatus(False, str(e)), SlotStatus(name)
    except CdcError as e:  # a login refused: the same next time, whoever retries
        return SourceStatus(False, str(e), lasting=True), SlotStatus(name)
    except psycopg.Error as e:
        reason = first_line(e)
        return SourceStatus(False, f"cannot read {dsn.redacted}: {reason}"), SlotStatus(name)
    if row is None:
        return SourceStatus(True, None, system, timeline), SlotStatus(name, exists=False)
    (active, pid, wal_status, confirmed, restart, retained, safe,
     kind, plugin, db, here, reader) = row  # fmt: skip
    info = SlotInfo(name, str(kind), _str(plugin), _str(db), _int(pid), _str(wal_status),
                    reader=_str(reader))  # fmt: skip
    return SourceStatus(True, None, system, timeline), SlotStatus(
        name, True, bool(active), _int(pid), _str(wal_status), _str(confirmed), _str(restart),
        _int(retained), _int(safe), ", ".join(info.unusable(str(here))) or None, info.reader,
        info.foreign_reader, held_by,
    )  # fmt: skip


HELD_BACK_BYTES = 16 * 1024 * 1024
"""A restart position this far behind the confirmed one (a WAL segment) is held back by a
transaction, not by the last few records decoding needs."""


def _held_by(conn: Connection, row: tuple[object, ...] | None) -> str | None:
    """`SlotStatus.held_by`: the oldest transaction in the database, when the slot's restart
    position is more than `HELD_BACK_BYTES` behind its confirmed one, and that gap is most of
    what it retains (a slot behind the source is the pipeline's to catch up)."""
    if row is None or row[3] is None or row[4] is None or row[5] is None:
        return None
    gap = Lsn.parse(str(row[3])).value - Lsn.parse(str(row[4])).value
    if gap <= HELD_BACK_BYTES or 2 * gap <= int(str(row[5])):
        return None
    oldest = waits.oldest_transaction(conn)
    return None if oldest is None else f"{oldest}: {oldest.way_out}"


def read_last_batch(lake: Lake) -> BatchStatus | None:
    """The newest line of `_state/batches.jsonl` (`cdc_core.metrics`); keys missing or of
    another type read as unknown, so an older or newer job's lines still show."""
    data = last_batch(lake)
    if data is None:
        return None
    return BatchStatus(
        _int(data.get("batch")), _str(data.get("started_at")), _str(data.get("ended_at")),
        _float(data.get("seconds")), _str(data.get("lsn_from")), _str(data.get("lsn_to")),
        _int(data.get("changes")), _int(data.get("transactions")),
        _float(data.get("freshness_p50_s")), _float(data.get("freshness_p99_s")),
        _float(data.get("freshness_max_s")),
    )  # fmt: skip


def idle_seconds(batch: BatchStatus | None, now: datetime) -> float | None:
    """Seconds since the last batch ended; None when that is not recorded."""
    if batch is None or batch.ended_at is None:
        return None
    try:  # before Python 3.11, fromisoformat does not take the Z suffix
        ended = datetime.fromisoformat(batch.ended_at.replace("Z", "+00:00"))
    except ValueError:
        return None
    if ended.tzinfo is None:
        ended = ended.replace(tzinfo=timezone.utc)  # the job writes UTC
    return max(0.0, (now - ended).total_seconds())


def _progress_seconds(lake: Lake, holder: Holder, now: datetime) -> float | None:
    """Seconds since the run under way started or last saved a snapshot job's progress (after
    each group it reads); None when neither is known."""
    times: list[float] = []
    with contextlib.suppress(ValueError):
        times.append(datetime.fromisoformat(holder.started_at).timestamp())
    folder = snapshots_dir(lake)
    for job in folder.glob("*.json") if folder.is_dir() else []:
        with contextlib.suppress(OSError):  # replaced while listed: the others still count
            times.append(job.stat().st_mtime)
    return max(0.0, now.timestamp() - max(times)) if times else None


def table_status(name: str, path: Location, watermark: str) -> TableStatus:
    """Rows and watermark of the Delta table at `path`, from its log alone."""
    try:
        state = delta_log.read_table(path)
        mark = delta_log.newest_metadata(path, watermark) if state else None
    except CdcError as e:
        return TableStatus(name, "unreadable", error=str(e))
    if state is None:
        return TableStatus(name, "not_created")
    value = None if mark is None else mark.get(watermark)
    if watermark == BRONZE_WATERMARK:
        return TableStatus(name, "created", state.rows, state.version,
                           staged_end=None if value is None else str(value))  # fmt: skip
    lsn, seq = _position(value)
    return TableStatus(name, "created", state.rows, state.version, lsn, seq)


def read_dead_letters(lake: Lake) -> dict[str, int]:
    """Changes set aside per table (`_state/dead_letters`, from its log); none when unreadable."""
    try:
        found = delta_log.rows_by_partition(lake.place(lake.dead_letters), "source_table")
    except CdcError:
        return {}
    return found or {}


def read_snapshots(lake: Lake) -> tuple[tuple[SnapshotStatus, ...], str | None]:
    """Every snapshot job's progress, oldest first, or why the jobs cannot be read."""
    try:
        jobs = load_jobs(lake)
    except (CdcError, KeyError, TypeError, ValueError) as e:
        return (), f"snapshot jobs under {lake.state / 'snapshots'} cannot be read: {e}"
    now = time.time_ns() // 1000
    found = [
        SnapshotStatus(job.id, job.kind, sum(t.done and not t.ended for t in job.tables),
                       len(job.tables), sum(t.rows for t in job.tables), job.finished,
                       job.paused, job.paused_seconds(now), job.stopped,
                       tuple(EndedTable(t.table.qualified, t.ended) for t in job.tables
                             if t.ended))
        for job in jobs
    ]  # fmt: skip
    return tuple(found), None


def pending_files(
    lake: Lake, staged_end: str | None, staged: Sequence[StagedFile] | None = None
) -> PendingStatus:
    """Staged files past bronze's watermark: captured, not yet in bronze. `staged`: the
    listing, when the caller has it already."""
    end = Lsn.parse(staged_end) if staged_end else ZERO
    listed = staged_files(lake.changes) if staged is None else staged
    files = [f for f in listed if f.end > end]
    size = 0
    for f in files:
        try:
            size += (lake.changes / str(f)).stat().st_size
        except FileNotFoundError:
            continue  # appended and removed by maintenance since the listing
    return PendingStatus(len(files), size)


def _forked(dsn: Dsn, lake: Lake, source: SourceStatus) -> str | None:
    """Why the lake's position is not in the source's WAL history (`forked_history`); None when
    it is, or when that cannot be read: a status never fails on it."""
    if not source.reachable:
        return None
    try:
        return forked_history(dsn, lake, source.timeline)
    except (CdcError, psycopg.Error) as e:
        log.debug("the source's timeline history could not be read: %s", e)
        return None


def _retired_problems(status: PipelineStatus, retired: Retirement) -> list[str]:
    """A retired pipeline has no slot and no runs: only a slot still there is a problem."""
    command = f"cdc retire --pipeline {status.pipeline} --yes"
    if not status.source.reachable:
        return [f"source unreachable: {status.source.error}"]
    if not retired.done:
        return [f"pipeline {status.pipeline} is {retired.describe()}"]
    if status.slot.exists:
        return [
            f"slot {status.slot.name} exists, though pipeline {status.pipeline} was "
            f"{retired.describe()}: it holds WAL no run reads; drop it: {command}"
        ]
    return []


DAMAGED = "damaged"  # `_state/stream.json` as `_problems` takes one that cannot be read


def _problems(status: PipelineStatus, stored: object) -> list[str]:
    """`stored`: `_state/stream.json` (None before the first run, `DAMAGED`)."""
    slot, problems, ran = status.slot, [], stored is not None
    elsewhere = other_cluster(stored, status.source.system_identifier)
    if not status.source.reachable:
        problems.append(f"source unreachable: {status.source.error}")
    elif elsewhere is not None:
        problems.append(
            f"the source is another database cluster (system identifier "
            f"{status.source.system_identifier}) than the one the pipeline read (the lake's "
            f"{elsewhere}): its slot cannot hold the lake's position; the next run stops, see "
            "docs/runbooks.md, runbooks 1 and 4"
        )  # fmt: skip
    elif slot.exists is False:
        problems.append(
            f"slot {slot.name} does not exist: the first run creates it" if not ran else
            f"slot {slot.name} does not exist (dropped?): changes since the last run are lost "
            "to the stream; with snapshot.mode when_needed (or always) the next run takes a "
            "new snapshot"
        )  # fmt: skip
    elif slot.unusable:
        problems.append(
            f"slot {slot.name} {slot.unusable}: every run stops on it; drop it (SELECT "
            f"pg_drop_replication_slot('{slot.name}')) or give source.slot another name"
        )
    elif slot.wal_status == "lost":
        problems.append(
            f"slot {slot.name} lost WAL it needed (wal_status lost): changes are missing; with "
            "snapshot.mode when_needed the next run starts a new slot and a new snapshot"
        )
    elif (ahead := _ahead(slot, stored)) is not None:
        problems.append(
            f"slot {slot.name} is confirmed up to {slot.confirmed_flush_lsn}, past the lake's "
            f"stored position {ahead}: changes between them never reached the lake (the lake was "
            "restored from a backup older than that, or the slot was recreated, or another "
            "reader confirmed them); the next run stops, or takes a new snapshot under "
            "snapshot.mode when_needed; see docs/runbooks.md, runbook 7"
        )  # fmt: skip
    if slot.foreign_reader:
        reader = repr(slot.reader) if slot.reader else "unknown"
        problems.append(
            f"slot {slot.name} is read now by another process (pid {slot.active_pid}, "
            f"application_name {reader}), not by a run of this pipeline: runs exit 75 until it "
            "lets go; stop that reader (a Debezium connector still attached?)"
        )  # fmt: skip
    if status.stale and status.progress_s is not None:
        problems.append(f"the run under way ({status.running}) has made no progress for "
                        f"{_duration(status.progress_s)}, and no batch ended for "
                        f"{_duration(status.idle_s)} (more than --stale-after "
                        f"{status.stale_after_s:g} s)")  # fmt: skip
    elif status.stale:
        problems.append(f"the pipeline has not run for {_duration(status.idle_s)} (more than "
                        f"--stale-after {status.stale_after_s:g} s)")  # fmt: skip
    for t in (status.bronze, *status.tables):
        if t.state == "unreadable":
            problems.append(f"{t.table}: {t.error}")
    return problems


def _ahead(slot: SlotStatus, stored: object) -> Lsn | None:
    """The stored position, when `slot` is confirmed past it (`start.holds_position`): the
    position is recorded before the slot is confirmed up to it, and the slot is read here
    before the record, so a run under way never looks ahead."""
    if not isinstance(stored, dict) or stored.get("slot") != slot.name:
        return None
    if slot.confirmed_flush_lsn is None:
        return None
    position = Lsn.parse(str(stored["confirmed"]))  # `read_stream` checked it
    return position if Lsn.parse(slot.confirmed_flush_lsn) > position else None


def slot_verdict(
    source: SourceConfig, slot: SlotStatus
) -> tuple[Literal["warn", "fail"], str] | None:
    """`retained_wal_verdict` of the slot against the pipeline's thresholds."""
    return retained_wal_verdict(
        slot.name, slot.retained_wal_bytes,
        warn=source.retained_wal_warn, fail=source.retained_wal_fail, held_by=slot.held_by,
    )  # fmt: skip


def retained_wal_verdict(
    slot: str, retained: int | None, *, warn: int, fail: int, held_by: str | None = None
) -> tuple[Literal["warn", "fail"], str] | None:
    """Whether the WAL the server keeps for `slot` passed source.retained_wal_warn or _fail
    (0: off), with what to do about it; None when below both or unknown. `held_by`: the open
    transaction that keeps it (`SlotStatus.held_by`), which running the pipeline does not end."""
    if retained is None:
        return None
    held = (
        "the pipeline confirmed it, but decoding must restart before the oldest transaction "
        f"open in the slot's database, which no run ends: {held_by}"
    )
    if fail and retained > fail:
        catch_up = "Let ingest catch up (run it now, more often, or --continuous)"
        return "fail", (
            f"slot {slot} retains {_bytes(retained)} of WAL, more than source.retained_wal_fail "
            f"({_bytes(fail)}): the source's disk is at risk. {held if held_by else catch_up}; "
            f"if it cannot, drop the slot (SELECT pg_drop_replication_slot('{slot}')) and take "
            "a new snapshot (snapshot.mode when_needed does so by itself)"
        )
    if warn and retained > warn:
        behind = "the pipeline is behind the source; run it more often"
        return "warn", (
            f"slot {slot} retains {_bytes(retained)} of WAL, more than source.retained_wal_warn "
            f"({_bytes(warn)}): {held if held_by else behind}"
        )
    return None


def _warnings(status: PipelineStatus) -> list[str]:
    if status.slot.wal_status == "unreserved":
        return [
            f"slot {status.slot.name} holds more WAL than max_slot_wal_keep_size (wal_status "
            "unreserved): run the pipeline before the next checkpoint removes it"
        ]
    return []


def format_json(status: PipelineStatus) -> str:
    return json.dumps(status.to_json(), indent=2)


def format_status(status: PipelineStatus) -> str:
    """Labelled lines, then one aligned row per table, then problems (or `ok`)."""
    lines = [f"pipeline {status.pipeline} (env {status.env}) at {status.checked_at}",
             *_labelled("lake", [status.lake]),
             *_labelled("retired", [status.retired.describe()] if status.retired else []),
             *_labelled("slot", _slot_lines(status)),
             *_labelled("last batch", _batch_lines(status)),
             *_labelled("run", [f"under way: {status.running}"] if status.running else []),
             *_labelled("bronze", [_bronze_line(status.bronze)]),
             *_labelled("pending", [_pending_line(status.pending)]),
             *_labelled("snapshots", _snapshot_lines(status.snapshots)),
             "", *_table_lines(status.tables), ""]  # fmt: skip
    lines += [f"problem: {p}" for p in status.problems]
    lines += [f"warning: {w}" for w in status.warnings]
    if not status.problems:
        lines.append("ok")
    return "\n".join(lines)


def _labelled(label: str, details: list[str]) -> list[str]:
    return [f"{(label if i == 0 else '').ljust(_LABEL)}{d}" for i, d in enumerate(details)]


def _slot_lines(status: PipelineStatus) -> list[str]:
    s = status.slot
    if not status.source.reachable:
        return [f"{s.name}: unknown, the source is unreachable"]
    if not s.exists:
        return [f"{s.name}: dropped (retired)" if status.retired else f"{s.name}: MISSING"]
    active = f"active (pid {s.active_pid})" if s.active else "inactive"
    return [f"{s.name}: {active}, wal_status {s.wal_status or 'unknown'}",
            f"confirmed {s.confirmed_flush_lsn or '-'}, restart {s.restart_lsn or '-'}, "
            f"retained WAL {_bytes(s.retained_wal_bytes)}"]  # fmt: skip


def _batch_lines(status: PipelineStatus) -> list[str]:
    b = status.last_batch
    if b is None:
        return ["none recorded"]
    ago = "" if status.idle_s is None else f" ({_duration(status.idle_s)} ago)"
    stale = ", STALE" if status.stale else ""
    span = f"{b.lsn_from or '?'}..{b.lsn_to or '?'}"
    p50, p99, most = b.freshness_p50_s, b.freshness_p99_s, b.freshness_max_s
    fresh = f"p50 {_secs(p50)}, p99 {_secs(p99)}, max {_secs(most)}"
    fresh = "unknown" if p50 is None and p99 is None and most is None else fresh
    return [f"#{_opt(b.batch)} ended {b.ended_at or '?'}{ago}{stale}",
            f"{span}: {_opt(b.changes)} changes in {_opt(b.transactions)} transactions, "
            f"{_secs(b.seconds)}", f"freshness {fresh}"]  # fmt: skip


def _bronze_line(t: TableStatus) -> str:
    if t.state != "created":
        return _absent(t)
    return f"{_opt(t.rows)} rows, staged up to {t.staged_end or 'nothing yet'}"


def _pending_line(p: PendingStatus) -> str:
    return f"{p.files} staged files ({_bytes(p.bytes)}) not yet in bronze"


RECENT_FINISHED = 5
"""Finished snapshots the table shows (the newest); `--json` lists every one."""


def _snapshot_lines(snapshots: tuple[SnapshotStatus, ...]) -> list[str]:
    """Every snapshot not finished, and the newest finished ones, oldest first."""
    if not snapshots:
        return ["none"]
    ended = [s for s in snapshots if s.finished]
    older = {s.id for s in ended[: max(0, len(ended) - RECENT_FINISHED)]}
    shown = [s for s in snapshots if s.id not in older]
    width = max(len(s.id) for s in shown)
    lines = [f"{s.id.ljust(width)}  {s.kind:<11}  {s.tables_done}/{s.tables_total} tables  "
             f"{s.rows} rows  {_snapshot_state(s)}" for s in shown]  # fmt: skip
    if older:
        lines.insert(0, f"{len(older)} older finished snapshots (--json lists every one)")
    return lines


def _snapshot_state(s: SnapshotStatus) -> str:
    ended = "".join(f"; {e.table} {e.why}" for e in s.ended)
    if s.stopped:
        return f"stopped, {s.tables_total - s.tables_done - len(s.ended)} tables unfinished{ended}"
    if s.finished:
        return f"finished{ended}"
    if s.paused:
        return f"paused ({s.paused_s} s in all; a resume-snapshot signal resumes it){ended}"
    return f"in progress{ended}"


def _table_lines(tables: tuple[TableStatus, ...]) -> list[str]:
    rows = [("table", "rows", "applied up to")]
    for t in tables:
        if t.state != "created":
            rows.append((t.table, "-", _absent(t)))
        else:
            dead = f"; {t.dead_letters} in _state/dead_letters" if t.dead_letters else ""
            gone = _DROPPED[t.dropped] if t.dropped else ""
            rows.append((t.table, _opt(t.rows), _applied(t) + dead + gone))
    name_w, rows_w = (max(len(r[i]) for r in rows) for i in (0, 1))
    return [f"{n.ljust(name_w)}  {r.rjust(rows_w)}  {a}".rstrip() for n, r, a in rows]


_DROPPED = {
    "following": "; dropped at the source, its last changes not all applied yet",
    "applied": "; dropped at the source, its last changes applied",
}


def _applied(t: TableStatus) -> str:
    """Commit LSN and the change's position in its transaction; a snapshot read has -1."""
    if t.applied_lsn is None:
        return "nothing yet"
    if t.applied_seq is not None and t.applied_seq < 0:
        return f"{t.applied_lsn} (snapshot read)"
    return f"{t.applied_lsn} #{t.applied_seq}"


def _absent(t: TableStatus) -> str:
    return "not yet created" if t.state == "not_created" else f"unreadable: {t.error}"


def _position(value: object) -> tuple[str | None, int | None]:
    """A silver watermark, [commit LSN, position]; nothing applied yet reads [-1, -1]."""
    if not (isinstance(value, list) and len(value) == 2):
        return None, None
    lsn, seq = value
    if not (isinstance(lsn, int) and isinstance(seq, int) and lsn >= 0):
        return None, None
    return str(Lsn(lsn)), seq


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _duration(seconds: float | None) -> str:
    s = int(seconds or 0)
    if seconds is None or s < 120:
        return "?" if seconds is None else f"{s} s"
    return f"{s // 60} min" if s < 7200 else f"{s // 3600} h {s % 3600 // 60} min"


def _bytes(n: int | None) -> str:
    return "?" if n is None else ByteSize(n).readable()


def _secs(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f} s"


def _opt(value: object) -> str:
    return "?" if value is None else str(value)


def _int(value: object) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(str(value))
    except ValueError:
        return None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _str(value: object) -> str | None:
    return None if value is None else str(value)
