"""run(): the orchestrator. Decides, finishes pending work, snapshots, reads, stages, merges.

Order: `snapshot.mode` decides what the run does and the source is set up (publication, slot,
snapshot jobs); changes staged by an earlier run but not yet in bronze, and bronze rows not yet
merged, are applied; pending snapshot chunks are read into bronze; the slot is read up to the
WAL position seen then; bronze and silver take what was just staged (snapshot reads once the
stream has passed them); finished snapshots sweep what they did not find. Every step resumes
where the previous run stopped.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cdc_core import dropped, faults
from cdc_core.capture import CaptureSummary, capture, heartbeat
from cdc_core.capture import catch_up as catch_up_stream
from cdc_core.config import Config
from cdc_core.config.model import Dsn, PipelineConfig, SourceConfig
from cdc_core.errors import CdcError, TerminalError, TransientError, UsageError
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.metrics import (
    OP_COUNTERS,
    Freshness,
    StagedFacts,
    Totals,
    flush_metrics_table,
    iso,
    last_batch,
    last_change_fields,
    metrics_table_age,
    now_us,
    record_batch,
    snapshot_fields,
    staged_facts,
    write_prometheus,
)
from cdc_core.notifications import Notifier, flush_notifications_table
from cdc_core.pg.catalog import TableInfo, table_info
from cdc_core.pg.connect import connect
from cdc_core.pg.discover import describe
from cdc_core.pg.doctor import Check, run_doctor
from cdc_core.pg.identity import table_identity_problem
from cdc_core.pg.slot import autoset_replica_identity
from cdc_core.run_lock import run_lock
from cdc_core.stager import StagedFile
from cdc_core.start import start, take_signals
from cdc_core.state import check_owner, refuse_retired
from cdc_core.transient import transient_failures

log = logging.getLogger("cdc_core.pipeline")

if TYPE_CHECKING:  # the Spark side loads only when a run needs Spark (not --capture-only)
    from pyspark.sql import SparkSession

    from cdc_core.bronze import BronzeSummary
    from cdc_core.silver import CaughtUp, TableResult
    from cdc_core.snapshot import SnapshotJob
    from cdc_core.spark import Spark


@dataclass(frozen=True)
class RunOptions:
    """How one `ingest` invocation runs."""

    continuous: bool = False
    max_batches: int | None = None
    capture_only: bool = False  # stage without starting Spark


@dataclass(frozen=True)
class RunSummary:
    """What a run did, printed by the job entry."""

    pipeline: str
    lake_root: str
    capture: CaptureSummary | None  # None: the pipeline does not stream (initial_only)
    bronze: BronzeSummary | None  # None: --capture-only
    silver: tuple[TableResult, ...]
    seconds: float
    snapshot_rows: int = 0
    snapshots_finished: tuple[str, ...] = ()

    def describe(self) -> str:
        steps = []
        if self.snapshot_rows or self.snapshots_finished:
            done = ", ".join(self.snapshots_finished) or "none yet"
            steps.append(f"snapshot: {self.snapshot_rows} rows read, tables done: {done}")
        steps.append(
            self.capture.describe() if self.capture else "stream: not read (snapshot only)"
        )
        if self.bronze is not None:
            merged = sum(t.changes for t in self.silver)
            steps += [self.bronze.describe(), f"silver: {merged} changes merged into "
                      f"{len(self.silver)} tables"]  # fmt: skip
        done = "; ".join(steps)
        return f"pipeline {self.pipeline}: {done}; lake {self.lake_root} ({self.seconds:.1f} s)"


def run(config: Config, options: RunOptions) -> RunSummary:
    """A run of a pipeline: one batch, or (`--continuous`) batches until SIGTERM or SIGINT.
    Raises `CdcError` subclasses whose type says whether to retry; `RunLockedError` (exit 75)
    when another run of the pipeline is under way."""
    lake = Lake.of(config.pipeline.target.root, config.env.spark.conf)
    with run_lock(lake, config.pipeline.name):  # held to the end, released even on failure
        check_owner(lake, config.pipeline.name, claim=True)
        refuse_retired(lake, config.pipeline.name)
        return _run(config, lake, options)


def _run(loaded: Config, lake: Lake, options: RunOptions) -> RunSummary:
    started = time.monotonic()
    config = dropped.found(loaded, lake)  # tables omitted: found in the catalog
    if config.pipeline.source.discovered:
        log.info("%s", describe(config))
    pipeline = config.pipeline
    _check_source(config)
    if options.capture_only:
        if options.continuous:
            raise UsageError("--capture-only runs once: drop --continuous")
        begun = start(config, lake)
        if begun.jobs:
            log.warning("snapshot %s waits for a run with Spark (--capture-only reads no snapshot)",
                        ", ".join(j.id for j in begun.jobs))  # fmt: skip
        captured = None
        if begun.decision.stream:
            heartbeat(config, lake)
            captured = capture(config, lake)
        return RunSummary(pipeline.name, lake.root, captured, None, (), time.monotonic() - started)
    from cdc_core.spark import SessionStarting  # the JVM starts once the source is known good

    spark = SessionStarting(config.env.spark, f"cdc-{pipeline.name}", root=lake.root)  # meanwhile
    totals = Totals()
    if not options.continuous:
        return batch(spark, config, lake, totals)
    return _continuous(spark, config, lake, options, totals, loaded=loaded)


def _check_source(config: Config) -> None:
    pipeline = config.pipeline
    with connect(pipeline.source.dsn) as conn:  # unreachable server -> TransientError, exit 75
        rules = pipeline.source.replica_identity_autoset_values
        if rules:
            for change in autoset_replica_identity(conn, pipeline.source.tables, rules.for_table):
                log.info("replica.identity.autoset.values: %s", change)
    report = run_doctor(config)
    for c in report.checks:
        if c.status == "warn":
            log.warning("%s: %s (%s)", c.name, c.detail, c.fix)
    # a publication lacking tables the product may not add: start stops the run, and forgets
    # them, so the run that finds them published again snapshots them
    failures = [c for c in report.checks if c.status == "fail" and not c.left_to_start]
    late = _published_without_key(pipeline.source, failures)
    for c in late:  # refusing to run no longer spares the source: its mirror stops alone
        log.error("%s: %s, and the table is published already: its mirror stops until fixed, "
                  "other tables go on (%s)", c.name, c.detail, c.fix)  # fmt: skip
    if stopping := [c for c in failures if c not in late]:
        failed = "; ".join(f"{c.name}: {c.detail}" for c in stopping)
        error = TransientError if all(c.passing for c in stopping) else TerminalError
        raise error(
            f"pipeline {pipeline.name}: the source is not ready ({failed}); "
            f"run `cdc doctor --pipeline {pipeline.name}` for the fixes"
        )


def _published_without_key(source: SourceConfig, failures: list[Check]) -> list[Check]:
    """The replica identity failures of tables already in the publication whose identity carries
    no key. The doctor refuses such a table before publishing it would break the source's UPDATE
    and DELETE; once published (its key dropped since), that has happened, and silver stops its
    mirror. An identity that leaves the key out of deletes the source allows still stops the run
    (`identity_problem`): the mirror would keep deleted rows."""
    prefix = "replica_identity "
    candidates = {
        c: TableName.parse(c.name.removeprefix(prefix))
        for c in failures
        if c.name.startswith(prefix)
    }
    if not candidates:
        return []
    with connect(source.dsn) as conn:
        rows = conn.execute(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables "
            "WHERE pubname = %s",
            (source.publication,),
        ).fetchall()
        infos = table_info(conn, list(candidates.values()))
    published = {TableName(str(s), str(t)) for s, t in rows}
    return [
        c for c, t in candidates.items()
        if t in published and not _leaves_key_out(infos[t], source)
    ]  # fmt: skip


def _leaves_key_out(info: TableInfo | None, source: SourceConfig) -> bool:
    if info is None:
        return False
    key = source.message_key_columns.for_table(info.name, info.columns)
    return table_identity_problem(info, key) is not None


def _continuous(
    spark: Spark, config: Config, lake: Lake, options: RunOptions, totals: Totals, *,
    loaded: Config,
) -> RunSummary:  # fmt: skip
    """Batches every `capture.trigger_interval_s` until SIGTERM/SIGINT (the batch in hand
    finishes) or `--max-batches`; transient failures are retried with backoff. `loaded`: the
    configuration as loaded, whose tables are found again before every batch after the first
    (created since, for a source without `source.tables`, or dropped)."""
    stop = threading.Event()

    def stopping(signum: int, _frame: object) -> None:
        log.info("%s: finishing the batch in hand, then stopping", signal.Signals(signum).name)
        stop.set()

    settings = config.pipeline.capture
    if config.pipeline.snapshot.mode == "initial_only":
        raise UsageError("snapshot.mode initial_only does not stream: run it without --continuous")
    from cdc_core.silver import CaughtUp
    from cdc_core.spark import session_of

    previous = {s: signal.signal(s, stopping) for s in (signal.SIGTERM, signal.SIGINT)}
    mirrors = CaughtUp.load(lake)
    last: RunSummary | None = None
    failed: TransientError | None = None  # the failure a retry waits on
    failures = 0
    try:
        while not stop.is_set():
            began = time.monotonic()
            try:
                with transient_failures():  # a lost server or a timeout from any step
                    if last is not None:  # tables created or dropped meanwhile
                        config = _rediscovered(loaded, config, lake)
                    last = batch(spark, config, lake, totals, mirrors)
            except TransientError as e:
                failed = e
                failures += 1
                _say_connected(lake, config.pipeline.name, _reachable(config.pipeline.source.dsn))
                if settings.gives_up(failures):
                    raise
                wait = min(settings.retry_backoff_s * 2 ** min(failures - 1, 16), 30.0)
                budget = "no limit" if settings.retries < 0 else f"of {settings.retries}"
                log.warning("batch failed (%s); retry %d (%s) in %.0f s",
                            e, failures, budget, wait)  # fmt: skip
                stop.wait(wait)
                continue
            failures, failed = 0, None
            config = _after_first_batch(config)
            log.info("batch %d: %s", totals.batches, last.describe())
            if options.max_batches is not None and totals.batches >= options.max_batches:
                break
            stop.wait(max(0.0, settings.trigger_interval_s - (time.monotonic() - began)))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if last is None and failed is not None:  # stopped while a retry waited: exit 75, not 1
        raise TransientError(f"stopped while waiting to retry the first batch: {failed}")
    if last is None:
        raise TerminalError("stopped before the first batch finished")
    from cdc_core.apply import driver_died_in_batch, if_driver_dies

    with if_driver_dies(spark, lambda: driver_died_in_batch(config)):
        _flush_tables(session_of(spark), lake, config.pipeline)  # what came since the last append
    return last


def _reachable(dsn: Dsn) -> bool:
    """Whether a session on the source can be opened now (after a batch failed)."""
    try:
        with connect(dsn):
            return True
    except CdcError:  # connect's TransientError (unreachable), LoginError, TerminalError
        return False


def _say_connected(lake: Lake, pipeline: str, reachable: bool) -> None:
    """Prometheus' cdc_connected after a failed batch: the last batch line's values with
    whether the source can be reached now, so an alert need not wait for the batches to
    stop coming (the next batch that runs writes 1 again)."""
    try:
        record = last_batch(lake) or {"pipeline": pipeline}
        write_prometheus(lake, record, connected=reachable)
    except OSError as e:  # the lake may be unreachable too: the retry goes on regardless
        log.warning("cdc_connected not written: %s", e)


def _rediscovered(loaded: Config, config: Config, lake: Lake) -> Config:
    """The captured tables, found again between two batches (a source without `source.tables`
    finds them in the catalog); a changed set is checked as a run's start checks it (the doctor)
    before a batch reads it. A table dropped meanwhile is followed until its last changes are
    applied."""
    found = _after_first_batch(dropped.found(loaded, lake))
    if found.pipeline.source.tables != config.pipeline.source.tables:
        log.info("%s", describe(found))
        _check_source(found)
    return found


def _after_first_batch(config: Config) -> Config:
    """snapshot.mode always snapshots once per run, not once per batch."""
    snap = config.pipeline.snapshot
    if snap.mode != "always":
        return config
    pipeline = dataclasses.replace(
        config.pipeline, snapshot=dataclasses.replace(snap, mode="initial")
    )
    return dataclasses.replace(config, pipeline=pipeline)


def batch(
    spark: Spark, config: Config, lake: Lake, totals: Totals,
    mirrors: CaughtUp | None = None,
) -> RunSummary:  # fmt: skip
    """One batch: decide, finish pending work, read snapshots, capture, bronze, silver; records
    the batch's line in `_state/batches.jsonl`. `mirrors`: what earlier batches know of the
    mirrors (lets silver skip tables nothing new came for; read from the lake when None,
    `CaughtUp.load`). `spark` may still be
    starting: a batch with no snapshot work reads the slot before it waits for it. The driver's
    JVM dying anywhere in it is a `DriverDiedError` saying the remedy."""
    from cdc_core.apply import driver_died_in_batch, if_driver_dies

    with if_driver_dies(spark, lambda: driver_died_in_batch(config)):
        return _batch(spark, config, lake, totals, mirrors)


def _batch(
    spark: Spark, config: Config, lake: Lake, totals: Totals, mirrors: CaughtUp | None
) -> RunSummary:
    from cdc_core.apply import apply_staged, driver_died_reading, finish_snapshots, if_driver_dies
    from cdc_core.bronze import BronzeSummary
    from cdc_core.snapshot_read import read_jobs
    from cdc_core.spark import session_of

    started, started_us = time.monotonic(), now_us()
    pipeline = config.pipeline
    begun = start(config, lake)
    streaming = begun.decision.stream
    visible = _Visible(lake)
    # what an earlier run left goes in before snapshot reads; without reads, one pass does all
    pending = (
        apply_staged(spark, lake, config, streaming=streaming, before_append=visible.staged_before)
        if begun.jobs
        else (BronzeSummary(0, 0, None), [], None)
    )
    visible.passed()
    caught: list[CaptureSummary] = []

    def catch_up(position: Lsn) -> None:  # each snapshot read: stage the stream past it
        caught.append(catch_up_stream(config, lake, position))

    snap = pipeline.snapshot
    with if_driver_dies(spark, lambda: driver_died_reading(config, begun.jobs)):
        read = read_jobs(
            session_of(spark), lake, pipeline.source.dsn, begun.jobs, pipeline=pipeline.name,
            max_threads=snap.max_threads, fetch_size=snap.fetch_size,
            lock_timeout_ms=snap.lock_timeout_ms, catch_up=catch_up if streaming else None,
            keys=pipeline.source.message_key_columns,
            rules=pipeline.source.column_rules(), skipped=pipeline.source.skipped_operations.codes,
            notify=Notifier.of(pipeline, lake),
            signals=(lambda: take_signals(config, lake, list(begun.jobs))) if streaming else None,
        ) if begun.jobs else 0  # fmt: skip
    if streaming:
        heartbeat(config, lake)
        caught.append(capture(config, lake))
    captured = functools.reduce(CaptureSummary.plus, caught) if caught else None
    staged = staged_facts([lake.changes / str(f) for f in captured.files] if captured else [])
    visible.captured = frozenset(captured.files if captured else ())
    if mirrors is None:
        from cdc_core.silver import CaughtUp

        mirrors = CaughtUp.load(lake)
    if begun.jobs or begun.reset:
        mirrors.versions.clear()  # snapshot reads may wait behind the frontier: check them all
        mirrors.save(lake)
    known = None if begun.jobs or begun.reset else mirrors  # a reset is in no table's files
    applied = apply_staged(
        spark, lake, config, streaming=streaming, caught=known, before_append=visible.staged_before
    )
    if known is not None:
        known.save(lake)
    visible_us = now_us()
    merged = _merge_results(pending[1], applied[1])
    finished = finish_snapshots(
        session_of(spark), lake, config, begun.jobs, results=merged, frontier=applied[2]
    ) if begun.jobs else []  # fmt: skip
    bronze = BronzeSummary(
        pending[0].files + applied[0].files, pending[0].changes + applied[0].changes, applied[0].end
    )
    summary = RunSummary(pipeline.name, lake.root, captured, bronze, tuple(merged),
                         time.monotonic() - started, read, tuple(finished))  # fmt: skip
    retained_wal = _check_retained_wal(config) if streaming else None
    faults.point("batch.before_record")
    fresh = visible.freshness(staged.commit_times_us, visible_us)
    record = _record(lake, summary, totals, fresh, started_us=started_us, visible_us=visible_us,
                     snapshots=begun.jobs, retained_wal=retained_wal, staged=staged,
                     aborted=bool(begun.aborted), tables=pipeline.source.tables)  # fmt: skip
    write_prometheus(lake, record)
    capture_settings = config.pipeline.capture
    if _metrics_table_due(lake, totals, capture_settings.metrics_table_interval_s):
        _flush_tables(
            session_of(spark), lake, pipeline, keep_days=capture_settings.batch_lines_retention_days
        )
        totals.table_flushed = time.monotonic()
    errors = [t.error for t in merged if t.error]
    if errors:
        raise TerminalError("; ".join(errors))
    return summary


class _Visible:
    """What a batch makes visible in silver, for its freshness: the changes it captured, and
    those staged before it (by `--capture-only`, or a run that failed after its capture), read
    as a silver pass takes them (maintenance may remove a file once bronze has it) and visible
    when that pass ends."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.captured: frozenset[StagedFile] = frozenset()  # this batch's own files
        self.parts: list[tuple[pa.Array, int | None]] = []  # commit times, visible (None: not yet)

    def staged_before(self, files: Sequence[StagedFile]) -> None:
        others = [self.lake.changes / str(f) for f in files if f not in self.captured]
        self.parts.append((staged_facts(others).commit_times_us, None))

    def passed(self) -> None:
        """A silver pass ended: what it took is visible now."""
        now = now_us()
        self.parts = [(times, now if at is None else at) for times, at in self.parts]

    def freshness(self, captured_times_us: pa.Array, visible_us: int) -> Freshness:
        """`visible_us`: when the last pass ended."""
        parts = [(times, visible_us if at is None else at) for times, at in self.parts]
        return Freshness.over([(captured_times_us, visible_us), *parts])


def _flush_tables(
    spark: SparkSession, lake: Lake, pipeline: PipelineConfig, *, keep_days: int | None = None
) -> None:
    """Catch the Delta tables up from their JSON lines: the metrics table, and with the sink
    channel on, the notifications table, at the same moments."""
    flush_metrics_table(spark, lake, keep_days=keep_days)
    topic = Notifier.of(pipeline, lake).sink_topic
    if topic is not None:
        flush_notifications_table(spark, lake, topic)


def _metrics_table_due(lake: Lake, totals: Totals, interval: float) -> bool:
    """Whether this batch appends to the Delta metrics table: every `interval` seconds, across
    runs too (a run's first batch goes by the table's last commit). The JSON lines are the
    record; the table catches up from them at the next append."""
    if totals.table_flushed is not None:
        return time.monotonic() - totals.table_flushed >= interval
    age = metrics_table_age(lake)
    return age is None or age >= interval


def _check_retained_wal(config: Config) -> int | None:
    """The WAL the server keeps for the slot; past source.retained_wal_warn a warning, past
    retained_wal_fail an error line naming the way out (the batch goes on: consuming is what
    frees WAL)."""
    from cdc_core.status import read_slot, slot_verdict

    source = config.pipeline.source
    _, slot = read_slot(source.dsn, source.slot)
    verdict = slot_verdict(source, slot)
    if verdict is not None:
        (log.error if verdict[0] == "fail" else log.warning)("%s", verdict[1])
    return slot.retained_wal_bytes


def _record(
    lake: Lake, summary: RunSummary, totals: Totals, fresh: Freshness, *, started_us: int,
    visible_us: int, snapshots: Sequence[SnapshotJob], retained_wal: int | None,
    staged: StagedFacts, aborted: bool, tables: Sequence[TableName],
) -> dict[str, Any]:  # fmt: skip
    captured = summary.capture
    files = captured.files if captured else ()
    changes = captured.changes if captured else 0
    transactions = captured.transactions if captured else 0
    totals.batches += 1
    totals.events += changes
    totals.transactions += transactions
    for op, n in staged.ops.items():
        totals.ops[op] = totals.ops.get(op, 0) + n
    totals.erroneous += sum(t.dead_letters for t in summary.silver)
    totals.filtered += captured.filtered if captured else 0
    left = {p.table.qualified for j in snapshots if not j.stopped for p in j.tables if not p.done}
    if snapshots:  # Debezium's: true once this process has read a snapshot to its end
        totals.snapshot_completed = not (left - set(summary.snapshots_finished))
    previous = last_batch(lake)
    number = int(previous.get("batch", 0)) + 1 if previous else 1
    now = now_us()
    record = {
        "pipeline": summary.pipeline, "batch": number,
        "started_at": iso(started_us), "visible_at": iso(visible_us), "ended_at": iso(now),
        "seconds": round(summary.seconds, 3),
        "lsn_from": str(files[0].start) if files else None,
        "lsn_to": str(files[-1].end) if files else None,
        "confirmed": str(captured.confirmed) if captured else None,
        "changes": changes, "transactions": transactions,
        "bronze_changes": summary.bronze.changes if summary.bronze else 0,
        "silver_changes": sum(t.changes for t in summary.silver),
        "freshness_p50_s": fresh.p50_s, "freshness_p99_s": fresh.p99_s,
        "freshness_max_s": fresh.max_s,
        "MilliSecondsBehindSource": None if fresh.newest_s is None else int(fresh.newest_s * 1000),
        "TotalNumberOfEventsSeen": totals.events,
        "NumberOfCommittedTransactions": totals.transactions,
        **{name: totals.ops.get(op, 0) for op, name in OP_COUNTERS},
        "NumberOfErroneousEvents": totals.erroneous, "NumberOfEventsFiltered": totals.filtered,
        "SnapshotRunning": bool(snapshots), "RowsScanned": summary.snapshot_rows,
        "SnapshotCompleted": totals.snapshot_completed,
        "errors": [t.error for t in summary.silver if t.error],
        "retained_wal_bytes": retained_wal,
        "SnapshotPaused": any(j.paused for j in snapshots),
        "SnapshotPausedDurationInSeconds": max(
            (j.paused_seconds(now) for j in snapshots), default=0
        ),
        **snapshot_fields(totals, snapshots, now=now,
                          aborted=aborted or any(j.stopped for j in snapshots)),
        **last_change_fields(staged.last, previous, now),
        "CapturedTables": [t.qualified for t in tables],
    }  # fmt: skip
    record_batch(lake, record)
    return record


def _merge_results(first: list[TableResult], second: list[TableResult]) -> list[TableResult]:
    """Two silver passes of one batch: changes add up; a table stopped by the first pass that
    the second applied (what the batch captured fixed it: a key put back) is not stopped."""
    from cdc_core.silver import TableResult

    totals: dict[str, TableResult] = {}
    for r in first + second:
        old = totals.get(r.table)
        changes = r.changes + (old.changes if old else 0)
        dead = r.dead_letters + (old.dead_letters if old else 0)
        totals[r.table] = TableResult(r.table, changes, r.error, dead)  # the later's verdict
    return list(totals.values())
