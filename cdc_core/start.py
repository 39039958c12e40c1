"""What a run starts with: snapshot.mode's decision, the source set up, and new snapshot jobs.

Before any data moves, a run works out where it stands (a stored stream position? an
unfinished snapshot? does the slot still have the position?), lets `snapshot.mode` decide,
prepares the publication and slot (a new slot when the old position is gone and the mode
allows it), and turns the initial snapshot, newly configured tables, Debezium signals and
`cdc snapshot` requests into snapshot jobs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path

import psycopg
from psycopg import sql

from cdc_core import lost_position
from cdc_core.config import Config, SourceConfig
from cdc_core.drift import CatalogEntry, Drift, catalog_entries, drifts
from cdc_core.errors import TerminalError
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.notifications import NotificationType, Notifier
from cdc_core.pg.catalog import own_rows, publication_info, table_info
from cdc_core.pg.connect import connect
from cdc_core.pg.history import current_timeline
from cdc_core.pg.identity import partition_problem, table_identity_problem
from cdc_core.pg.slot import (
    SlotState,
    ensure_publication,
    ensure_slot,
    slot_state,
    system_identifier,
)
from cdc_core.reset_marker import RESET_PREFIX, ResetMarker
from cdc_core.signal_file import FileSignal
from cdc_core.signal_file import take_signals as take_file_signals
from cdc_core.signals import (
    PauseRequest,
    SignalProblem,
    SignalRow,
    SnapshotRequest,
    StopRequest,
    parse_signal,
    processed_keys,
    read_signals,
    sort_out,
)
from cdc_core.snapshot import (
    SnapshotJob,
    archive_finished,
    condition_problem,
    finished_initial,
    load_current,
    plan_job,
    set_paused,
)
from cdc_core.snapshot_modes import Decision, StartState, decide
from cdc_core.stale_reads import replan_stale_reads
from cdc_core.start_publication import left_publication, record_memberships
from cdc_core.state import (
    catalog_file,
    known_tables_file,
    other_cluster,
    read_json,
    read_stream,
    record_confirmed,
    schema_history,
    signal_batch_file,
    signals_file,
    stream_file,
    write_json,
)
from cdc_core.storage import Location

log = logging.getLogger("cdc_core.start")

Conn = psycopg.Connection[tuple[object, ...]]


@dataclass(frozen=True)
class RunStart:
    """The decision and the snapshot jobs a run goes on with."""

    decision: Decision
    jobs: tuple[SnapshotJob, ...]  # unfinished jobs, oldest first
    reset: bool = False  # a mirror starts over (a recreated table): every mirror is looked at
    aborted: tuple[str, ...] = ()  # jobs this start stopped (a stop-snapshot signal, a lost slot)


def requests_dir(lake: Lake) -> Location:
    return lake.state / "requests"


def start(config: Config, lake: Lake) -> RunStart:
    """Decide, set the source up, plan jobs; raises TerminalError when the run cannot go on."""
    source = config.pipeline.source
    jobs = _end_left_out(config, lake, load_current(lake))
    stopped = {j.id for j in jobs if j.stopped}
    earlier = {j.id for j in jobs}
    with connect(source.dsn, values=True) as conn:
        system, timeline = system_identifier(conn), current_timeline(conn)
        forked = lost_position.forked_history(source.dsn, lake, timeline)
        _refuse_another_slots_lake(conn, config, lake, system)
        state = _start_state(conn, config, lake, jobs, system, forked=forked)
        asked = lost_position.requested(lake)
        if asked is not None:
            state = _accept_request(conn, config, lake, state, asked, forked=forked)
        decision = decide(config.pipeline.snapshot.mode, state)
        stored = read_stream(lake)  # after the request: accepting removes it
        if decision.new_slot and isinstance(stored, dict):  # a new snapshot's positions must
            position = Lsn.parse(str(stored["confirmed"]))  # sort after the lake's
            why = f"{forked}; " if forked else ""
            lost_position.refuse_wal_behind(conn, config.pipeline.name, position, why)
        if decision.fail and forked:  # no drain makes it right: accept-lost-position refuses
            raise TerminalError(
                f"pipeline {config.pipeline.name}: {forked}; Set snapshot.mode: "
                "when_needed to take a new snapshot automatically, or always"
            )
        if decision.fail:
            why = _slot_trouble(slot_state(conn, source.slot), source.slot, stored, system)
            raise TerminalError(f"pipeline {config.pipeline.name}: {why}{decision.fail}")
        slot, left = None, []
        if decision.stream or decision.new_slot:
            pub = publication_info(conn, source.publication)
            left = left_publication(conn, config, lake, decision, state, existing=pub)
            jobs += [_save(lake, job) for job in left]  # before it is back: a run that dies in
            ensure_publication(  # between still snapshots it
                conn, source.publication, source.tables, source.publication_autocreate_mode
            )
            record_memberships(conn, config, lake, pub)  # after: one that dies first plans again
            _check_identities(conn, config)
            if decision.new_slot:
                _new_slot(conn, config, lake)
            adopted = slot_state(conn, source.slot) if not state.stored_position else None
            slot = ensure_slot(conn, source.slot, source.dsn, failover=source.slot_failover)
            if adopted is not None:
                _warn_adopted(config, lake, adopted)
        jobs = _plan(conn, config, lake, decision, state=state, jobs=jobs)
        resumed = [j for j in jobs if j.id in earlier]  # planned by runs before this one
        reads = decision.stream or decision.snapshot
        again = replan_stale_reads(conn, config, lake, resumed) if reads else []
        jobs += again
        drifted = _drifted(conn, config, lake, decision, state, read=left + again)
        jobs += drifted.jobs
        if slot is not None:
            _record_source(lake, slot, system, timeline)
    reset = any(d.reset for d in drifted.found)
    aborted = tuple(j.id for j in jobs if j.stopped and j.id not in stopped)
    archive_finished(lake, jobs)  # after the signals: their keys were looked for in these
    return RunStart(decision, tuple(j for j in jobs if not j.finished), reset, aborted)


def _end_left_out(config: Config, lake: Lake, jobs: list[SnapshotJob]) -> list[SnapshotJob]:
    """End the unfinished reads of tables no longer captured (left out of `source.tables`, or
    of what the include lists let through): their stream changes are filtered out now, so rows
    read later would sit in bronze beside changes that never come. A table added back is a new
    table again, snapshotted as `snapshot.mode` says."""
    source = config.pipeline.source
    captured = set(source.tables)
    for job in jobs:
        left = [p for p in job.tables if not p.done and p.table not in captured]
        for part in left:
            job.end(part, f"left out of {source.tables_key}")
            log.warning("snapshot %s: %s is no longer captured (%s): its read ends",
                        job.id, part.table, source.tables_key)  # fmt: skip
        if left:
            job.save(lake)
    return jobs


def _refuse_another_slots_lake(conn: Conn, config: Config, lake: Lake, system: str | None) -> None:
    """Stop a run whose lake's stored position was read through another slot that still exists:
    most likely the lake of another pipeline of the same name (another checkout, another
    environment) with the same root. Taken for a lost position, it would be snapshotted into
    that lake, and each pipeline would then find the other's position stored there."""
    stored = read_stream(lake)
    if not isinstance(stored, dict) or other_cluster(stored, system) is not None:
        return
    old, slot = stored.get("slot"), config.pipeline.source.slot
    if not isinstance(old, str) or old == slot or slot_state(conn, old) is None:
        return
    raise TerminalError(
        f"pipeline {config.pipeline.name}: target.root {lake.root} holds a lake read through "
        f"replication slot {old}, which is still on the source, and source.slot is {slot}. If "
        "another pipeline of this name (another checkout or environment) writes to this root, "
        "give each a target.root of its own. If source.slot was renamed on purpose, set it "
        f"back, or drop slot {old} (SELECT pg_drop_replication_slot('{old}')) and run again: "
        "the changes it holds are then lost to this lake, and snapshot.mode decides what follows"
    )


def _record_source(lake: Lake, slot: SlotState, system: str | None, timeline: int | None) -> None:
    """The stored position as the run goes on with it: the slot's, where none is stored (a
    first run, a new slot, an accepted loss), after planning, so that a run that dies first
    starts over; the source's system identifier (an older version's record lacks it) and
    timeline (a new one after a failover that kept the position in its history) kept with it."""
    stored = read_stream(lake)
    if stored is None:
        record_confirmed(lake, slot.name, slot.confirmed_flush, system, timeline)
        lost_position.done(lake)  # an accepted loss: the slot's position is the lake's now
    elif isinstance(stored, dict):
        known = {"system": system or stored.get("system"), "timeline": timeline}
        if any(v is not None and stored.get(k) != v for k, v in known.items()):
            write_json(stream_file(lake), stored | {k: v for k, v in known.items() if v})


def _start_state(
    conn: Conn, config: Config, lake: Lake, jobs: list[SnapshotJob], system: str | None, *,
    forked: str | None,
) -> StartState:  # fmt: skip
    stored = read_stream(lake)
    initial = [j for j in jobs if j.kind == "initial"]
    slot = slot_state(conn, config.pipeline.source.slot)
    return StartState(
        stored_position=(
            stored is not None or any(j.finished for j in initial) or finished_initial(lake)
        ),
        snapshot_unfinished=any(not j.finished for j in initial),
        position_available=forked is None and holds_position(slot, stored, system),
    )


def holds_position(slot: SlotState | None, stored: object, system: str | None) -> bool:
    """Whether `slot` still has the stored position (`_state/stream.json`, None before the
    first one): it exists, has its WAL, is on the cluster the position was recorded on
    (`system`, the source's system identifier), and is not ahead of it (a slot ahead of what
    this pipeline confirmed was recreated, or another reader confirmed changes it never read).
    On another cluster a slot's positions are another history: one behind the stored position
    would pass the last test, and the changes between would be taken as staged already."""
    if slot is None or slot.wal_status == "lost":
        return False
    if not isinstance(stored, dict):
        return True
    return (
        stored.get("slot") == slot.name
        and not other_cluster(stored, system)
        and slot.confirmed_flush <= Lsn.parse(str(stored["confirmed"]))
    )


def _accept_request(
    conn: Conn, config: Config, lake: Lake, state: StartState, asked: Lsn, *, forked: str | None
) -> StartState:
    """An `accept-lost-position` request made for `asked`: applied when that is the stored
    position and it is gone, removed unused otherwise (never applied to another loss). Refused
    when the source's history forked before the lake's position (`forked`): the lake holds
    changes the server never had, and the server's own after the fork would be skipped."""
    stored = lost_position.stored_position(lake)
    if forked is not None and stored == asked:
        lost_position.done(lake)  # refused for good: a later run must not meet it again
        raise TerminalError(
            f"pipeline {config.pipeline.name}: cdc accept-lost-position: {forked}; going on "
            "without a snapshot cannot bring the lake in line: set snapshot.mode: when_needed "
            "and run again"
        )
    if stored != asked:
        log.info("an accept-lost-position request for %s does not apply to the stored position "
                 "%s; removed", asked, stored)  # fmt: skip
    elif state.stored_position and not state.position_available:  # the operator's word
        lost_position.forgo(conn, config.pipeline.name, config.pipeline.source.slot, lake, asked)
        return StartState(True, state.snapshot_unfinished, position_available=True)
    else:
        log.info("the stored position %s is still available: the accept-lost-position request "
                 "has nothing to accept; removed", stored)  # fmt: skip
    lost_position.done(lake)
    return state


def _slot_trouble(slot: SlotState | None, name: str, stored: object, system: str | None) -> str:
    """What happened to the slot, for the error that stops the run."""
    recorded = other_cluster(stored, system)
    if recorded is not None:
        return (f"the source is another database cluster than the one the stored position was "
                f"read from (system identifier {system}, the lake's {recorded}): pg_upgrade, a "
                "restored dump or a new server make a new cluster, whose WAL positions are a "
                f"history of their own, so slot {name} there cannot hold the lake's "
                "position; ")  # fmt: skip
    if slot is None:
        return f"replication slot {name} does not exist; "
    if slot.wal_status == "lost":
        return (f"replication slot {name} is lost (wal_status = lost: the server removed WAL "
                "it still needed, see max_slot_wal_keep_size); ")  # fmt: skip
    return (f"replication slot {name} is ahead of this pipeline's stored position (it was "
            "recreated, or another pipeline or connector reads the same slot and confirmed "
            "changes this one never read: give each its own source.slot; or the lake was "
            "restored from a backup older than the slot's position, runbook 7); ")  # fmt: skip


def _warn_adopted(config: Config, lake: Lake, slot: SlotState) -> None:
    """A first run that finds its slot already there reads from the slot's confirmed position,
    as Debezium does (a DBA may have created it). A slot delivers each change once, so a slot
    another pipeline reads too would split the changes between them: say so while it is cheap."""
    log.warning(
        "replication slot %s exists already and pipeline %s (lake %s) has no stored position: "
        "it reads on from the slot's confirmed position %s. A slot delivers each change once: "
        "if another pipeline or connector reads this slot too, each loses the changes the "
        "other reads; give every pipeline its own source.slot",
        slot.name, config.pipeline.name, lake.root, slot.confirmed_flush,
    )  # fmt: skip


def slot_missing(config: Config) -> TerminalError:
    """The error for a slot found missing after `start` (dropped mid-run, between snapshot
    reads, say): the changes since it was last read are gone, and the way out is what the next
    run's start decides under `snapshot.mode`. A capture that created a new slot instead would
    record the new slot's positions as this pipeline's, and hide the gap from the next start."""
    pipeline = config.pipeline
    gone = decide(
        pipeline.snapshot.mode,
        StartState(stored_position=True, snapshot_unfinished=False, position_available=False),
    )
    way_out = gone.fail or (
        "changes are missing; the next run starts a new slot and takes a new snapshot "
        f"(snapshot.mode {pipeline.snapshot.mode})"
    )
    why = _slot_trouble(None, pipeline.source.slot, None, None)
    return TerminalError(f"pipeline {pipeline.name}: {why}{way_out}")


def _check_identities(conn: Conn, config: Config) -> None:
    """Every captured table's deletes carry the key its mirror matches them by
    (`identity_problem`); a message.key.columns column a matching table lacks is named in a
    warning (Debezium ignores it, and so does the key)."""
    source = config.pipeline.source
    infos = table_info(conn, source.tables)
    captured = {info.oid: t for t, info in infos.items() if info is not None}
    for table, info in infos.items():
        if info is None:
            continue  # the doctor names missing tables
        keys = source.message_key_columns
        where = f"{config.pipeline_file}: source.message.key.columns"
        unmatched = keys.unmatched(table, info.columns)
        if unmatched:
            log.warning(
                "%s: %s has no column %s (its columns: %s); ignored, as Debezium ignores it",
                where, table, ", ".join(unmatched), ", ".join(info.columns),
            )  # fmt: skip
        key = keys.for_table(table, info.columns)
        partition = partition_problem(info, key or info.primary_key, captured)
        if partition:
            raise TerminalError(f"pipeline {config.pipeline.name}: {partition}")
        problem = table_identity_problem(info, key)
        if problem:
            where = where if key else f"pipeline {config.pipeline.name}"
            raise TerminalError(f"{where}: {problem}")


def _new_slot(conn: Conn, config: Config, lake: Lake) -> None:
    slot = config.pipeline.source.slot
    log.warning("slot %s lost the stored position: starting a new slot and a new snapshot", slot)
    if slot_state(conn, slot) is not None:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    stream_file(lake).unlink(missing_ok=True)


def _plan(
    conn: Conn, config: Config, lake: Lake, decision: Decision, *, state: StartState,
    jobs: list[SnapshotJob],
) -> list[SnapshotJob]:  # fmt: skip
    settings = config.pipeline.snapshot
    tables = list(config.pipeline.source.tables)
    if decision.new_slot:  # what unfinished jobs read is older than the gap: a new snapshot
        notify = Notifier.of(config.pipeline, lake)
        for job in jobs:
            if not job.finished:
                job.stop(time.time_ns() // 1000)
                notify.job(job, NotificationType.ABORTED)
                job.save(lake)
    first = [t for t in tables if settings.reads_first(t)]  # snapshot.include.collection.list
    if len(first) < len(tables):
        log.info("snapshot.include.collection.list: %s start empty and stream, not snapshotted",
                 ", ".join(str(t) for t in tables if t not in first))  # fmt: skip
    unfinished_initial = any(j.kind == "initial" and not j.finished for j in jobs)
    if decision.snapshot and not unfinished_initial:
        origin = f"snapshot.mode {settings.mode}"
        job = plan_job(conn, "initial", origin, first, chunk_size=settings.chunk_size,
                       overrides=settings.select_for,
                       order=settings.tables_order_by_row_count)  # fmt: skip
        jobs.append(_save(lake, job))
    known = set(read_json(known_tables_file(lake)) or [])
    new = [t for t in first if str(t) not in known]
    if new and state.stored_position and decision.stream and settings.mode != "no_data":
        job = plan_job(conn, "incremental", "new tables", new, chunk_size=settings.chunk_size,
                       overrides=settings.select_for)  # fmt: skip
        jobs.append(_save(lake, job))
    elif again := [t for t in new if state.stored_position and decision.stream
                   and schema_history(lake, t.qualified)]:  # fmt: skip  # no_data: none read
        log.warning(
            "%s captured again under snapshot.mode no_data: their mirrors missed the changes "
            "made while they were left out, and nothing reads them again; run `cdc snapshot "
            "--table T` for each", ", ".join(str(t) for t in again),
        )  # fmt: skip
    write_json(known_tables_file(lake), sorted(str(t) for t in tables))
    if decision.stream:  # signals arrive through the stream's source, as in Debezium
        jobs += _from_signals(conn, config, lake, jobs)
        jobs += _from_signal_file(conn, config, lake, jobs)
    jobs += _from_requests(conn, config, lake)
    return jobs


def _multisets(source: SourceConfig, now: dict[TableName, CatalogEntry]) -> list[TableName]:
    """The tables mirrored without a key: no primary key, none in message.key.columns."""
    keys = source.message_key_columns
    return [
        t for t, e in now.items()
        if not e.primary_key and keys.for_table(t, list(e.columns.values())) is None
    ]  # fmt: skip


@dataclass(frozen=True)
class _Drifted:
    found: list[Drift]
    jobs: list[SnapshotJob]


def _drifted(
    conn: Conn, config: Config, lake: Lake, decision: Decision, state: StartState, *,
    read: list[SnapshotJob],
) -> _Drifted:  # fmt: skip
    """Compare the captured tables' catalog with the last run's record, heal what drifted
    (`_heal`; `read`: jobs this run planned before), and record the catalog as it is now."""
    if not (decision.stream or decision.snapshot):
        return _Drifted([], [])
    source = config.pipeline.source
    rules = source.column_rules()
    now = {t: replace(e, rules=rules.applied(t, e.columns.values()))
           for t, e in catalog_entries(conn, list(source.tables)).items()}  # fmt: skip
    recorded = read_json(catalog_file(lake)) or {}
    found: list[Drift] = []
    jobs: list[SnapshotJob] = []
    if decision.stream and state.stored_position and not decision.snapshot:
        found = drifts(recorded, now, _multisets(source, now))
        covered = {t.table for job in read for t in job.tables if t.full}  # after any marker
        jobs = _heal(conn, config, lake, found, read=covered)
    entries = recorded | {str(t): e.to_json() for t, e in now.items()}
    write_json(catalog_file(lake), entries)  # after healing: a run that dies first heals
    return _Drifted(found, jobs)


def _heal(
    conn: Conn, config: Config, lake: Lake, found: list[Drift], *, read: Collection[TableName]
) -> list[SnapshotJob]:
    """Tables changed in ways the stream does not carry (`cdc_core.drift`): a reset marker for
    each recreated one, then an incremental snapshot of them all but those a job this run
    planned reads anyway (`read`: a recreated table has left the publication too)."""
    planned = []
    for d in found:
        if d.reset:  # in the WAL before the snapshot's windows: silver empties the mirror here
            _write_reset(conn, config, d.table)
            log.warning("table %s %s: its mirror starts over from here", d.table, d.reason)
        else:
            log.warning("table %s: %s, which no change carried", d.table, d.reason)
    settings = config.pipeline.snapshot
    if found and settings.mode == "no_data":
        log.warning("snapshot.mode no_data: %s not read again; run `cdc snapshot` to fill them in",
                    ", ".join(str(d.table) for d in found))  # fmt: skip
    elif todo := [d.table for d in found if d.table not in read]:
        job = plan_job(conn, "incremental", "schema change", todo,
                       chunk_size=settings.chunk_size, overrides=settings.select_for)  # fmt: skip
        planned.append(_save(lake, job))
    return planned


def _write_reset(conn: Conn, config: Config, table: TableName) -> None:
    """A reset marker for this pipeline's mirror of `table` (`cdc_core.reset_marker`)."""
    marker = ResetMarker(table.qualified, config.pipeline.source.slot)
    conn.execute("SELECT pg_logical_emit_message(true, %s, %s)", (RESET_PREFIX, marker.encode()))


def _rebuild_if_dropped(conn: Conn, config: Config, lake: Lake, table: TableName) -> None:
    """A whole-table snapshot of a table bronze holds changes of but whose silver mirror is
    gone (dropped to rebuild it, as a stopped mirror's error says): a reset marker before the
    snapshot's windows, so the mirror is built from the snapshot on, not from every change
    bronze ever held (whose older shapes it may no longer be able to take). Not when all bronze
    holds of the table is a read still under way (its mirror was never made: silver makes it
    once a batch's reads are in): the marker would empty what that read took so far, and only
    the new snapshot would bring it back (stopped, never)."""
    if (lake.place(lake.silver(table)) / "_delta_log").is_dir():
        return
    history = schema_history(lake, table.qualified)
    reading = [p.first for j in load_current(lake) if not j.finished for p in j.tables
               if p.table == table and not p.done and p.first is not None]  # fmt: skip
    if not history or (reading and history[0][0] >= min(reading)):
        return  # all bronze holds of it is a first read under way: no mirror was ever made
    _write_reset(conn, config, table)
    log.warning("table %s has no silver mirror: it is rebuilt from this snapshot on", table)


def _save(lake: Lake, job: SnapshotJob) -> SnapshotJob:
    job.save(lake)
    log.info(
        "snapshot %s planned: %s",
        job.id,
        ", ".join(f"{t.table} ({len(t.plan.chunks)} chunks)" for t in job.tables),
    )
    return job


def take_signals(config: Config, lake: Lake, running: list[SnapshotJob]) -> None:
    """The signals sent since the run started, taken between two snapshot reads: stops and
    pauses apply to `running` (the jobs being read), a snapshot asked for is planned and saved
    for the next run to read."""
    settings = config.pipeline.snapshot
    channels = settings.signal_enabled_channels
    table = settings.signal_data_collection is not None and "source" in channels
    if not table and "file" not in channels:
        return
    ids = {j.id for j in running}
    jobs = running + [j for j in load_current(lake) if j.id not in ids]
    with connect(config.pipeline.source.dsn, values=True) as conn:
        planned = _from_signals(conn, config, lake, jobs)
        _from_signal_file(conn, config, lake, jobs + planned)


def _from_signals(
    conn: Conn, config: Config, lake: Lake, jobs: list[SnapshotJob]
) -> list[SnapshotJob]:
    """Carry out the signal rows not processed yet, oldest first, each marked processed (by
    its key, `SignalRow.key`) once carried out; keys of rows gone from the table are dropped."""
    table = config.pipeline.snapshot.signal_data_collection
    if table is None or "source" not in config.pipeline.snapshot.signal_enabled_channels:
        return []
    stored = read_json(signals_file(lake))
    rows = read_signals(conn, table, processed_keys(stored))
    pending, processed = sort_out(rows, stored, {j.signal for j in jobs if j.signal})
    if stored != {"processed": processed}:
        write_json(signals_file(lake), {"processed": processed})
    planned: list[SnapshotJob] = []
    for row in pending:
        job = _carry_out(conn, config, lake, row, jobs + planned)
        if job is not None:  # saved with the row's key: a run that dies now does not plan it twice
            planned.append(job)
        processed.append(row.key)
        write_json(signals_file(lake), {"processed": processed})
    return planned


def _from_signal_file(
    conn: Conn, config: Config, lake: Lake, jobs: list[SnapshotJob]
) -> list[SnapshotJob]:
    """Carry out the lines of `signal.file`, oldest first, each once (`cdc_core.signal_file`)."""
    settings = config.pipeline.snapshot
    if "file" not in settings.signal_enabled_channels:
        return []
    planned: list[SnapshotJob] = []

    def carry_out(signal: FileSignal) -> None:
        job = _carry_out(conn, config, lake, signal, jobs + planned)
        if job is not None:
            planned.append(job)

    saved = {j.signal for j in jobs if j.signal}
    take_file_signals(Path(settings.signal_file), signal_batch_file(lake), saved, carry_out)
    return planned


def _carry_out(
    conn: Conn, config: Config, lake: Lake, row: SignalRow | FileSignal, jobs: list[SnapshotJob]
) -> SnapshotJob | None:
    """One signal: a planned (and saved) snapshot job, a stop or pause applied to `jobs`, or a
    log line."""
    signal = parse_signal(row.id, row.type, row.data, list(config.pipeline.source.tables))
    if isinstance(signal, SnapshotRequest):
        keys = config.pipeline.source.message_key_columns
        problems = [
            problem for t, c in signal.conditions.items()
            if (problem := condition_problem(conn, t, c, keys,
                                             select=signal.kind == "blocking"))
        ]  # fmt: skip
        if problems:
            signal = SignalProblem(row.id, "; ".join(problems))
    if isinstance(signal, SnapshotRequest):
        for t in signal.tables:
            if t not in signal.conditions:
                _rebuild_if_dropped(conn, config, lake, t)
        job = plan_job(
            conn, signal.kind, f"signal {row.id}", signal.tables,
            chunk_size=config.pipeline.snapshot.chunk_size,
            conditions=dict(signal.conditions), surrogate_key=signal.surrogate_key,
            keys=config.pipeline.source.message_key_columns,
            overrides=config.pipeline.snapshot.select_for if signal.kind == "blocking" else None,
            order=config.pipeline.snapshot.tables_order_by_row_count
            if signal.kind == "blocking" else "disabled",
        )  # fmt: skip
        job.signal = row.key
        return _save(lake, job)
    if isinstance(signal, StopRequest):
        _stop(lake, jobs, signal, Notifier.of(config.pipeline, lake))
    elif isinstance(signal, PauseRequest):
        _pause(lake, jobs, signal, Notifier.of(config.pipeline, lake))
    elif isinstance(signal, SignalProblem):
        log.warning("signal %s not carried out: %s", signal.signal_id, signal.reason)
    return None


def _stop(lake: Lake, jobs: list[SnapshotJob], signal: StopRequest, notify: Notifier) -> None:
    for job in jobs:
        if job.kind != "incremental" or job.finished:
            continue
        stopped = [
            t.table for t in job.tables
            if not t.done and (signal.tables is None or t.table in signal.tables)
        ]  # fmt: skip
        if signal.tables is None:
            job.stop(time.time_ns() // 1000)
        else:
            for part in job.tables:
                if part.table in signal.tables and not part.done:
                    job.end(part, f"stopped by signal {signal.signal_id}")
        if stopped:  # Debezium's ABORTED names the data collections a signal listed
            notify.job(job, NotificationType.ABORTED,
                       collections=None if signal.tables is None else stopped)  # fmt: skip
        job.save(lake)
        log.info("snapshot %s stopped by signal %s", job.id, signal.signal_id)


def _pause(lake: Lake, jobs: list[SnapshotJob], signal: PauseRequest, notify: Notifier) -> None:
    """Pause or resume the unfinished incremental jobs, each saved with its state (a paused one
    stays paused across runs until a resume-snapshot signal)."""
    what = "resume" if signal.resume else "pause"
    changed = set_paused(jobs, paused=not signal.resume, now_us=time.time_ns() // 1000)
    for job in changed:
        if not job.started:  # Debezium's STARTED comes as the signal is taken, before a pause
            notify.job(job, NotificationType.STARTED)
            job.started = True
        notify.job(job, NotificationType.RESUMED if signal.resume else NotificationType.PAUSED)
        job.save(lake)
        log.info("snapshot %s %sd by signal %s", job.id, what, signal.signal_id)
    if not changed:  # Debezium too does nothing then, beyond logging the request
        others = [j.id for j in jobs if not j.finished and j.kind != "incremental"]
        log.info(
            "signal %s: no incremental snapshot to %s; ignored%s", signal.signal_id, what,
            f" (initial and blocking snapshots cannot be paused: {', '.join(others)})"
            if others and not signal.resume else "",
        )  # fmt: skip


def request_snapshot(lake: Lake, table: TableName, where: str | None, blocking: bool) -> Location:
    """Queue a snapshot of `table` for the pipeline's next run (`cdc snapshot`)."""
    path = requests_dir(lake) / f"{time.time_ns()}.json"
    write_json(path, {"table": str(table), "where": where, "blocking": blocking})
    return path


def _from_requests(conn: Conn, config: Config, lake: Lake) -> list[SnapshotJob]:
    folder = requests_dir(lake)
    planned = []
    paths: list[Location] = list(folder.glob("*.json")) if folder.is_dir() else []
    for path in sorted(paths, key=lambda p: p.name):  # time_ns names: oldest first
        request = read_json(path)
        table = TableName.parse(str(request["table"]))
        if table not in config.pipeline.source.tables:  # left out since `cdc snapshot` queued it
            log.warning("cdc snapshot of %s dropped: the table is no longer captured (%s)",
                        table, config.pipeline.source.tables_key)  # fmt: skip
            path.unlink()
            continue
        kind = "blocking" if request.get("blocking") else "incremental"
        where = str(request["where"]) if request.get("where") else None
        if where is not None and kind == "blocking":  # a blocking snapshot's filter is a query
            query = sql.SQL("SELECT * FROM {} WHERE (\n{}\n)").format(
                own_rows(conn, table),
                sql.SQL(where),
            )
            where = query.as_string(conn)
        conditions = {table: where} if where is not None else None
        if conditions is None:
            _rebuild_if_dropped(conn, config, lake, table)
        settings = config.pipeline.snapshot
        overrides = settings.select_for if kind == "blocking" else None
        job = plan_job(conn, kind, "cdc snapshot", [table], conditions=conditions,  # type: ignore[arg-type]
                       chunk_size=settings.chunk_size, overrides=overrides)  # fmt: skip
        planned.append(_save(lake, job))
        path.unlink()
    return planned
