"""Beside the stages: compaction and VACUUM of every Delta table, applied staged files, retention.

Safe while ingest runs on a local or mounted lake (on an object store it takes the run lock,
see `maintain`). Each change to a Delta table is one Delta transaction, so a reader sees
the table before or after it; when a concurrent ingest commit conflicts, the loser fails whole
(an ingest stage resumes on its next run, maintenance reports the table and exits 75). Outside
Delta it removes only staged files bronze already holds. Bronze retention deletes a table's
rows only up to its silver watermark, a position that only moves forward.

Its commits record `{"maintenance": <run>}` and no stage's watermark, so the stages skip them
when they look for their progress in the last `HISTORY_DEPTH` commits (`cdc_core.lake_state`).
A run makes few (per table at most a DELETE, an OPTIMIZE and a VACUUM's START and END, none when
there is nothing to do), and leaves alone a table whose watermark is already deep in its history.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from delta.exceptions.captured import (  # its import makes PySpark raise these, not Py4JJavaError
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
    ProtocolChangedException,
)
from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_core.bronze import TRANSACTIONS_WATERMARK, applied_end
from cdc_core.bronze import WATERMARK as BRONZE_WATERMARK
from cdc_core.config import Config, with_tables
from cdc_core.config.model import MaintenanceConfig
from cdc_core.envelope import MESSAGES_TABLE
from cdc_core.errors import TransientError
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.lake_state import HISTORY_DEPTH, committing, read_watermark, watermark_depth
from cdc_core.lsn import Lsn
from cdc_core.metrics import METRICS_WATERMARK, metrics_table
from cdc_core.notifications import NOTIFICATIONS_WATERMARK, Notifier, notifications_table
from cdc_core.reset_marker import RESET_PREFIX
from cdc_core.run_lock import run_lock
from cdc_core.silver import WATERMARK as SILVER_WATERMARK
from cdc_core.silver import reset_marker
from cdc_core.silver_batch import after_position
from cdc_core.silver_table import sql_name
from cdc_core.snapshot import searched_from
from cdc_core.spark import build_spark
from cdc_core.stager import staged_files
from cdc_core.state import check_owner, finished_dir, known_tables_file, read_json, record_pruned
from cdc_core.storage import Location, is_local

log = logging.getLogger("cdc_core.maintenance")

RUN_KEY = "maintenance"  # the userMetadata key of maintenance commits
COMMITS_PER_TABLE = 4  # at most, per run: DELETE (bronze), OPTIMIZE, VACUUM START and END
HEADROOM = 50  # of the commits the stages search, kept for their own commits without watermark
RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
# VACUUM commits its START and END (files deleted) only where Delta's log store shows partial
# writes (local, HDFS) unless told to: on S3 the count read 0 and the table kept no record
VACUUM_LOGGING = "spark.databricks.delta.vacuum.logging.enabled"
# Delta 4 ignores `RETAIN n HOURS` unless n is 0 (the table's deletedFileRetentionDuration,
# 7 days, applies instead) while this is on, its default.
RETENTION_WINDOW_IGNORED = "spark.databricks.delta.vacuum.retentionWindowIgnore.enabled"
CONFLICTS = (
    DeltaConcurrentModificationException, ConcurrentWriteException, MetadataChangedException,
    ProtocolChangedException, ConcurrentAppendException, ConcurrentDeleteReadException,
    ConcurrentDeleteDeleteException, ConcurrentTransactionException,
)  # fmt: skip
_MS_PER_DAY = 86_400_000


@dataclass(frozen=True)
class RunSettings:
    """How one maintenance run treats every table."""

    config: MaintenanceConfig
    commit: Mapping[str, object]  # the userMetadata of its commits
    vacuum_conf: Mapping[str, str]  # session settings while VACUUM runs

    @classmethod
    def of(cls, spark: SparkSession, config: Config) -> RunSettings:
        """VACUUM lists files with Spark's partition-discovery parallelism (10,000 tasks by
        default, a minute for a small table on two cores): the cluster's parallelism instead,
        unless the environment sets it. VACUUM keeps files for `vacuum_retention_hours`, which
        Delta would otherwise ignore for its 7 days; its retention check goes off only when
        the user turned it off. VACUUM records what it deleted in the table's log on every
        store."""
        settings = config.pipeline.maintenance
        conf = {RETENTION_WINDOW_IGNORED: "false", VACUUM_LOGGING: "true"}
        if LISTING_PARALLELISM not in config.env.spark.conf:
            conf[LISTING_PARALLELISM] = str(spark.sparkContext.defaultParallelism)
        if not settings.vacuum_retention_check:
            conf[RETENTION_CHECK] = "false"
        return cls(settings, {RUN_KEY: uuid.uuid4().hex[:12]}, conf)


@dataclass(frozen=True)
class TableReport:
    """What maintenance did to one Delta table; None: that step did not run."""

    name: str
    deleted_rows: int | None = None  # bronze retention
    compacted: tuple[int, int] | None = None  # files removed, files added by OPTIMIZE
    vacuumed: int | None = None  # files VACUUM deleted
    skipped: str | None = None  # why the table was left alone
    conflict: str | None = None  # a concurrent commit won; the next run tries again

    def describe(self) -> str:
        if self.skipped:
            return f"{self.name}: left alone ({self.skipped})"
        steps = []
        if self.deleted_rows is not None:
            steps.append(f"{self.deleted_rows} rows past the retention deleted")
        if self.compacted is not None:
            removed, added = self.compacted
            steps.append(
                f"{removed} files compacted into {added}" if removed else "nothing to compact"
            )
        if self.vacuumed is not None:
            steps.append(f"vacuum removed {self.vacuumed} files")
        if self.conflict:
            steps.append(f"stopped by a concurrent commit ({self.conflict})")
        return f"{self.name}: " + (", ".join(steps) or "nothing to do")


@dataclass(frozen=True)
class StagedReport:
    """Staged change files removed, and those kept."""

    removed: int
    pending: int  # not yet in bronze: never removed
    recent: int  # in bronze, but younger than the retention or the newest file
    held: int = 0  # in bronze and past the retention, but a snapshot under way searches them

    def describe(self) -> str:
        held = f", {self.held} kept for a snapshot under way" if self.held else ""
        return (
            f"staged files: {self.removed} removed (in bronze and past the retention), "
            f"{self.recent} in bronze kept{held}, {self.pending} not yet in bronze kept"
        )


@dataclass(frozen=True)
class JobsReport:
    """Finished snapshot jobs removed from the archive, and those kept."""

    removed: int
    kept: int

    def describe(self) -> str:
        return (f"finished snapshot jobs: {self.removed} removed (archived longer ago than the "
                f"retention), {self.kept} kept")  # fmt: skip


@dataclass(frozen=True)
class MaintenanceSummary:
    """What a run did, a line per table; `conflicts` name the tables to run again."""

    pipeline: str
    lake_root: str
    staged: StagedReport
    tables: tuple[TableReport, ...]
    seconds: float
    jobs: JobsReport | None = None  # None: maintenance.snapshot_jobs_retention_days unset

    @property
    def conflicts(self) -> list[str]:
        return [t.name for t in self.tables if t.conflict]

    def describe(self) -> str:
        head = f"maintenance of pipeline {self.pipeline}: lake {self.lake_root} "
        head += f"({self.seconds:.1f} s)"
        jobs = [self.jobs.describe()] if self.jobs is not None else []
        return "\n".join([head, self.staged.describe(), *jobs,
                          *(t.describe() for t in self.tables)])  # fmt: skip


def maintain(config: Config) -> MaintenanceSummary:
    """Staged files, then bronze (retention, compaction, VACUUM), each silver mirror, the
    transactions table and the metrics, notifications and dead-letter tables (compaction,
    VACUUM). On an
    object store it holds the pipeline's run lock: Delta's S3 log store is safe for one
    writing process only, so maintenance waits for ingest to finish (exit 75 while it runs)
    rather than racing its commits."""
    lake = Lake.of(config.pipeline.target.root, config.env.spark.conf)
    check_owner(lake, config.pipeline.name)
    if is_local(lake.state):
        return _maintain(config, lake)
    with run_lock(lake, config.pipeline.name):
        return _maintain(config, lake)


def _maintain(config: Config, lake: Lake) -> MaintenanceSummary:
    started = time.monotonic()
    config = _captured(config, lake)
    pipeline, settings = config.pipeline, config.pipeline.maintenance
    spark = build_spark(config.env.spark, f"cdc-maintain-{pipeline.name}", root=lake.root)
    run = RunSettings.of(spark, config)
    staged = remove_applied_staged(lake, applied_end(spark, lake), settings.staged_retention_hours,
                                   held_from=searched_from(lake))  # fmt: skip
    jobs = None
    if settings.snapshot_jobs_retention_days is not None:
        days = settings.snapshot_jobs_retention_days
        jobs = remove_archived_jobs(lake, time.time() - days * _MS_PER_DAY / 1000)
    retention = None
    if settings.bronze_retention_days is not None:
        merged = silver_positions(spark, lake, pipeline.source.tables)
        cutoff_ms = time.time_ns() // 1_000_000 - settings.bronze_retention_days * _MS_PER_DAY
        retention = retention_condition(merged, cutoff_ms)
    targets: list[tuple[str, str, str | None]] = [("bronze", lake.bronze, BRONZE_WATERMARK)]
    targets += [(f"silver {t.qualified}", lake.silver(t), SILVER_WATERMARK)
                for t in pipeline.source.tables]  # fmt: skip
    targets += [(f"silver {t.qualified} (not captured now)", lake.silver(t), SILVER_WATERMARK)
                for t in uncaptured_mirrors(lake, pipeline.source.tables)]  # fmt: skip
    if pipeline.source.provide_transaction_metadata or DeltaTable.isDeltaTable(
        spark, lake.transactions
    ):
        targets.append(("transactions", lake.transactions, TRANSACTIONS_WATERMARK))
    targets += control_tables(spark, lake, Notifier.of(pipeline, lake).sink_topic)
    reports = []
    noted = functools.partial(note_pruned, lake)
    for name, path, key in targets:
        if not DeltaTable.isDeltaTable(spark, path):
            reports.append(TableReport(name, skipped="not created yet"))
            continue
        delete = retention if path == lake.bronze else None
        reports.append(maintain_table(spark, name, path, key, run, delete=delete,
                                      before_delete=noted))  # fmt: skip
    return MaintenanceSummary(pipeline.name, lake.root, staged, tuple(reports),
                              time.monotonic() - started, jobs)  # fmt: skip


def control_tables(
    spark: SparkSession, lake: Lake, sink_topic: str | None
) -> list[tuple[str, str, str | None]]:
    """The Delta tables under `_state` that grow with every run: the metrics table (a commit a
    minute under `--continuous`, a small file each), with the notification sink on the
    notifications table, and the dead-letter table (a commit per mirror and batch that sets
    changes aside; no watermark: its MERGE inserts what it does not hold). Only those that
    exist: none is created by maintenance."""
    tables: list[tuple[str, str, str | None]] = [
        ("metrics", metrics_table(lake), METRICS_WATERMARK)
    ]
    if sink_topic is not None:
        tables.append(("notifications", notifications_table(lake, sink_topic),
                       NOTIFICATIONS_WATERMARK))  # fmt: skip
    tables.append(("dead_letters", lake.dead_letters, None))
    return [t for t in tables if DeltaTable.isDeltaTable(spark, t[1])]


def uncaptured_mirrors(lake: Lake, captured: tuple[TableName, ...]) -> list[TableName]:
    """Mirrors in the lake of tables the pipeline captures no longer (left out of its tables,
    say): nothing writes them now, but users still query them, and their files from before
    stay until a VACUUM removes them."""
    known = set(captured)
    return [
        name
        for schema in _folders(lake.home / "silver")
        for table in _folders(schema)
        if (name := TableName(schema.name, table.name)) not in known
        and (table / "_delta_log").is_dir()
    ]


def _folders(path: Location) -> list[Location]:
    """The folders right under `path`, by name (none when it is not one)."""
    return sorted((p for p in path.iterdir() if p.is_dir()), key=str) if path.is_dir() else []


def check(summary: MaintenanceSummary) -> None:
    """Raise TransientError (exit 75: run it again) when a concurrent commit stopped a table."""
    if summary.conflicts:
        raise TransientError(
            f"maintenance of pipeline {summary.pipeline}: a concurrent commit (an ingest run) "
            f"won on {', '.join(summary.conflicts)}; nothing was lost, run maintenance again"
        )


def maintain_table(
    spark: SparkSession, name: str, path: str, key: str | None, run: RunSettings, *,
    delete: Column | None = None, before_delete: Callable[[DataFrame], None] | None = None,
) -> TableReport:  # fmt: skip
    """DELETE `delete` (if given; `before_delete` sees the rows it is about to take), OPTIMIZE,
    VACUUM; each its own Delta transaction. Left alone while the stage's newest watermark
    (`key`; None: the table has none) is deep enough in the history that these commits could
    push it out of reach."""
    depth = watermark_depth(spark, path, key) if key is not None else None
    if depth is not None and depth + COMMITS_PER_TABLE > HISTORY_DEPTH - HEADROOM:
        return TableReport(name, skipped=f"its newest {key} watermark is {depth} commits back; "
                           "maintenance waits until the next ingest commit to it")  # fmt: skip
    table = DeltaTable.forPath(spark, path)
    deleted = compacted = vacuumed = None
    try:
        with committing(spark, run.commit):
            if delete is not None:
                if before_delete is not None:
                    before_delete(table.toDF().where(delete))
                deleted = delete_rows(table, delete)
            if run.config.optimize:
                compacted = compact(table)
            if run.config.vacuum:
                vacuumed = vacuum(spark, table, path, run)
    except CONFLICTS as e:
        log.warning("%s: a concurrent commit won (%s); the next run tries again", name, e)
        return TableReport(name, deleted, compacted, vacuumed, conflict=type(e).__name__)
    report = TableReport(name, deleted, compacted, vacuumed)
    log.info("%s", report.describe())
    return report


def delete_rows(table: DeltaTable, condition: Column) -> int:
    """Rows `condition` deleted (no commit when none match)."""
    before = _version(table)
    table.delete(condition)
    return int(_metric(table, before, "DELETE", "numDeletedRows"))


def compact(table: DeltaTable) -> tuple[int, int]:
    """OPTIMIZE: (files removed, files added); no commit when there is nothing to compact."""
    row = table.optimize().executeCompaction().first()
    metrics = row["metrics"] if row else None
    if metrics is None:
        return 0, 0
    return int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])


def vacuum(spark: SparkSession, table: DeltaTable, path: str, run: RunSettings) -> int:
    """VACUUM with the configured retention: files deleted. A dry run first, so that a table
    with nothing to delete gets no commits (a VACUUM always writes a START and an END)."""
    hours = run.config.vacuum_retention_hours
    with _session_conf(spark, run.vacuum_conf):
        dry = spark.sql(f"VACUUM {sql_name(path)} RETAIN {hours} HOURS DRY RUN")
        if not dry.limit(1).count():
            return 0
        before = _version(table)
        table.vacuum(float(hours))
    return int(_metric(table, before, "VACUUM END", "numDeletedFiles"))


@contextlib.contextmanager
def _session_conf(spark: SparkSession, conf: Mapping[str, str]) -> Iterator[None]:
    """`conf` set on the session inside the block only."""
    previous: dict[str, str | None] = {key: spark.conf.get(key, None) for key in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in previous.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


def _version(table: DeltaTable) -> int:
    row = table.history(1).select("version").first()
    return int(row[0]) if row else -1


def _metric(table: DeltaTable, after: int, operation: str, metric: str) -> int:
    """`metric` of the newest `operation` committed after version `after` (0: none)."""
    rows = (
        table.history(HISTORY_DEPTH)
        .where((F.col("version") > after) & (F.col("operation") == operation))
        .orderBy(F.col("version").desc())
        .select("operationMetrics")
        .collect()
    )
    metrics = (rows[0]["operationMetrics"] or {}) if rows else {}
    return int(metrics.get(metric, 0))


def _captured(config: Config, lake: Lake) -> Config:
    """A source without `source.tables` is maintained for the tables the last ingest run's
    start captured (`_state`), without reading the source: maintenance never connects to it."""
    if not config.pipeline.source.awaits_discovery:
        return config
    known = [TableName.parse(str(t)) for t in read_json(known_tables_file(lake)) or []]
    return with_tables(config, known) if known else config


def silver_positions(
    spark: SparkSession, lake: Lake, tables: tuple[TableName, ...]
) -> dict[str, tuple[int, int]]:
    """The position up to which silver has merged each table (tables without a mirror or a
    watermark are left out: none of their rows counts as merged)."""
    out = {}
    for table in tables:
        mark = read_watermark(spark, lake.silver(table), SILVER_WATERMARK)
        value = mark.get(SILVER_WATERMARK) if mark else None
        if isinstance(value, list) and len(value) == 2:
            out[table.qualified] = (int(value[0]), int(value[1]))
    return out


def note_pruned(lake: Lake, rows: DataFrame) -> None:
    """Record, before bronze retention deletes `rows`, the newest position it takes of each
    table: a mirror dropped later cannot be rebuilt from bronze alone (`silver.apply_table`
    refuses to, and names the snapshot that can). Recorded first, so that no crash leaves
    rows deleted and unrecorded."""
    ends = (
        rows.where(F.col("source_table") != MESSAGES_TABLE)
        .groupBy("source_table")
        .agg(F.max(F.struct("commit_lsn", "seq")).alias("end"))
        .collect()
    )
    record_pruned(lake, {r["source_table"]: (int(r["end"][0]), int(r["end"][1])) for r in ends})


def retention_condition(merged: Mapping[str, tuple[int, int]], cutoff_ms: int) -> Column:
    """Bronze rows committed before `cutoff_ms` that nothing still needs: a table's rows at or
    before its silver position (its reset markers too: silver applies them as a TRUNCATE), and
    the other logical decoding messages (nothing merges them). Rows of other tables, and rows
    with a missing position or time (NULL), never match."""
    committed = F.coalesce(F.col("source.ts_ms"), F.col("ts_ms"))
    message = F.col("source_table") == F.lit(MESSAGES_TABLE)
    reset = message & (F.col("message.prefix") == F.lit(RESET_PREFIX))  # silver applies these
    done = message & ~reset
    for table, (lsn, seq) in merged.items():
        own = (F.col("source_table") == F.lit(table)) | reset_marker(
            table, None
        )  # a table's reset marker is one of its rows: kept until its mirror has merged it
        done = done | (own & ~after_position(lsn, seq))
    return (committed < F.lit(cutoff_ms)) & done


def remove_applied_staged(
    lake: Lake, applied: Lsn, retention_hours: int, *, held_from: int | None = None
) -> StagedReport:
    """Remove staged files bronze holds (end at or before `applied`) and older than the
    retention, by modification time. The newest file stays: capture resumes after it and
    recognises by it the transactions a restarted slot sends again. So does every file that
    ends after `held_from`, where a snapshot under way still searches the stream
    (`snapshot.searched_from`): without them its later reads would miss the key changes that
    took rows out of their chunks, and those rows would keep in the mirror no value for what
    the changes did not resend."""
    files = staged_files(lake.changes)
    cutoff = time.time() - retention_hours * 3600
    removed = recent = held = 0
    for f in files:
        if f.end > applied:
            continue
        path = lake.changes / str(f)
        if f == files[-1] or not _older(path, cutoff):
            recent += 1
            continue
        if held_from is not None and f.end.value > held_from:
            held += 1
            continue
        path.unlink(missing_ok=True)
        removed += 1
    pending = sum(1 for f in files if f.end > applied)
    return StagedReport(removed, pending, recent, held)


def remove_archived_jobs(lake: Lake, cutoff: float) -> JobsReport:
    """Remove the finished snapshot jobs archived before `cutoff` (seconds since the epoch, by
    the file's modification time: when `snapshot.archive_finished` wrote it), so that the
    archive does not grow for as long as the pipeline lives (`snapshot.mode: always`, a signal
    a day). The newest finished initial snapshot always stays: `snapshot.finished_initial`
    answers snapshot.mode's question by it."""
    folder = finished_dir(lake)
    if not folder.is_dir():
        return JobsReport(0, 0)
    archived: list[Location] = list(folder.glob("*.json"))
    archived.sort(key=lambda p: p.name)  # a job's id begins with its time
    initial = [p.name for p in archived if "-initial-" in p.name]
    removed = 0
    for path in archived:
        if (initial and path.name == initial[-1]) or not _older(path, cutoff):
            continue
        path.unlink(missing_ok=True)
        removed += 1
    return JobsReport(removed, len(archived) - removed)


def _older(path: Location, cutoff: float) -> bool:
    try:
        return path.stat().st_mtime < cutoff
    except FileNotFoundError:
        return False  # removed by someone else since the listing
