"""`cdc validate`: proves each silver mirror equals its source, then checks its data quality.

A round pins every silver table at one Delta version, then opens one REPEATABLE READ snapshot
of the source, so everything in the pinned versions was committed before the snapshot. Each
table is compared: row counts, hashes over ranges of key hashes, then the differing keys
(`cdc_core.validate_ranges`). A table with differing keys is then classified:

- `differs`: nothing that happened before the snapshot is missing from the pinned version:
  the lake holds no change of the table past it (none in bronze after silver's watermark, none
  staged but not in bronze, no unfinished snapshot of it), and the WAL up to the snapshot holds
  none the slot has not confirmed (when the slot is behind the snapshot and idle, a peek bounded
  by the snapshot's position, which moves nothing, reads that WAL). The mirror is wrong there.
- `pending`: such a change exists: the difference may be lag (run ingest, validate again).
- `unverified`: the slot is behind the snapshot and in use by a running ingest, so that WAL
  cannot be read without disturbing it.

With `--settle S`, tables whose keys are pending or unverified are compared again (those keys
only, a new version and a new snapshot) until they settle or S seconds have passed: for
pipelines that run `--continuous` while validating.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Literal

from delta.tables import DeltaTable
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_core.apply import silver_settings
from cdc_core.bronze import pending_files
from cdc_core.config import Config
from cdc_core.errors import EXIT_FAILURE, EXIT_OK, first_line
from cdc_core.events import RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.lake_state import HISTORY_DEPTH
from cdc_core.lsn import Lsn
from cdc_core.silver import WATERMARK
from cdc_core.silver_batch import after_position
from cdc_core.silver_shape import SilverColumn, TableShape, column_type, table_shape
from cdc_core.snapshot import load_current
from cdc_core.stager import relations_of
from cdc_core.state import check_owner, schema_history
from cdc_core.storage import Location
from cdc_core.validate_encoding import money_digits, pg_form, text_steps
from cdc_core.validate_pg import (
    Conn,
    Snapshot,
    SourceColumn,
    SourceTable,
    count_rows,
    describe_source,
    source_snapshot,
    uncaptured_changes,
)
from cdc_core.validate_quality import (
    QualityReport,
    Suite,
    build_suite,
    check_patterns,
    run_quality,
)
from cdc_core.validate_ranges import FETCH_ROWS, DiffKind, KeyDiff, compare, recheck
from cdc_core.validate_spark import SilverTable, live_rows, read_version

log = logging.getLogger("cdc_core.validate")
Status = Literal["differs", "pending", "unverified"]
Verdict = Literal["equal", "differs", "behind", "not mirrored", "error"]
POLL_S = 5.0
_sleep = time.sleep  # the wait between rounds (a test runs ingest there instead)


@dataclass(frozen=True)
class Options:
    tables: tuple[TableName, ...] = ()  # empty: every captured table
    settle_s: float = 0.0
    max_keys: int = 100  # keys listed per table
    fetch_rows: int = FETCH_ROWS
    quality: bool = True


@dataclass(frozen=True)
class KeyReport:
    kind: DiffKind  # missing (in silver), extra (in silver), differs (values)
    key: dict[str, str | None]  # key column -> value text; without a key, the whole row
    columns: tuple[str, ...]  # differs: the columns whose values differ
    copies: int
    status: Status


@dataclass
class TableReport:
    table: str
    verdict: Verdict = "equal"
    source_rows: int | None = None
    silver_rows: int | None = None
    ranges: int = 0
    mismatching: int = 0
    exact: bool = True  # False: `mismatching` is a lower bound
    keys: list[KeyReport] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)  # "column: why"
    silver_version: int | None = None
    silver_applied: str | None = None  # the watermark of that version: commit LSN/position
    pending: list[str] = field(default_factory=list)  # lake work the version lacks
    seconds: float = 0.0
    error: str | None = None


@dataclass
class Report:
    pipeline: str
    env: str
    lake: str
    snapshot_lsn: str | None = None
    confirmed_lsn: str | None = None
    rounds: int = 1
    tables: list[TableReport] = field(default_factory=list)
    quality: QualityReport | None = None
    seconds: float = 0.0

    @property
    def equal(self) -> bool:
        return all(t.verdict == "equal" for t in self.tables)

    @property
    def exit_code(self) -> int:
        quality_ok = self.quality is None or not self.quality.failed
        return EXIT_OK if self.equal and quality_ok else EXIT_FAILURE


@dataclass
class _Run:
    """One table across rounds: what is compared and what still differs."""

    table: TableName
    report: TableReport
    shape: TableShape | None = None
    pin: int = -1
    applied: tuple[int, int] | None = None
    diffs: list[KeyDiff] = field(default_factory=list)
    names: tuple[str, ...] = ()
    columns: tuple[SilverColumn, ...] = ()  # silver's side of the compared columns
    whole: bool = False  # compare every key again (what silver wrote since is unknown)
    oid: int = 0  # the source table's, for the WAL the slot has not confirmed
    status: Status = "differs"

    @property
    def key(self) -> tuple[str, ...]:
        """The columns rows are matched by: the mirror's key, unless a key column is not
        compared (a transform SQL cannot repeat): then none, rows are a multiset of the
        columns compared."""
        key = self.shape.key if self.shape is not None else ()
        compared = {c.name for c in self.columns}
        return key if all(k in compared for k in key) else ()


def validate(config: Config, spark: SparkSession, options: Options) -> Report:
    started = time.monotonic()
    pipeline = config.pipeline
    lake = Lake.of(pipeline.target.root, config.env.spark.conf)
    check_owner(lake, pipeline.name)
    report = Report(pipeline.name, config.env_name, pipeline.target.root)
    runs = [_Run(t, TableReport(t.qualified)) for t in options.tables or pipeline.source.tables]
    for run in runs:
        _pin(spark, lake, config, run)
    if options.quality:  # bad expectations stop first
        check_patterns(spark, list(enumerate(pipeline.validate.expectations)), config.pipeline_file)
    suites = _suites(config, runs) if options.quality else []
    snapshot = _round(spark, config, lake, runs, options, first=True)
    deadline = started + options.settle_s
    while _unsettled(runs) and time.monotonic() < deadline:
        _sleep(max(0.0, min(POLL_S, deadline - time.monotonic())))
        waiting = _unsettled(runs)
        for run in waiting:
            before = run.pin
            _pin(spark, lake, config, run)
            _changed_since(spark, lake, run, before)
        snapshot = _round(spark, config, lake, waiting, options, first=False)
        report.rounds += 1
    report.snapshot_lsn, report.confirmed_lsn = str(snapshot.lsn), _text(snapshot.confirmed)
    report.tables = [run.report for run in runs]
    if options.quality:
        report.quality = _quality(spark, lake, suites, silver_settings(config).soft_delete)
    report.seconds = time.monotonic() - started
    return report


def _unsettled(runs: list[_Run]) -> list[_Run]:
    return [r for r in runs if r.diffs and r.status != "differs"]


def _text(lsn: Lsn | None) -> str | None:
    return None if lsn is None else str(lsn)


def _pin(spark: SparkSession, lake: Lake, config: Config, run: _Run) -> None:
    """The table's shape, newest version and that version's watermark."""
    history = schema_history(lake, run.table.qualified)
    path = lake.silver(run.table)
    if not history or not DeltaTable.isDeltaTable(spark, path):
        run.shape = None
        return
    settings = silver_settings(config)
    run.shape = table_shape(history, settings.modes, settings.propagates)
    commits = DeltaTable.forPath(spark, path).history(HISTORY_DEPTH)
    rows = sorted(commits.select("version", "userMetadata").collect(), key=lambda r: -r[0])
    run.pin = int(rows[0]["version"])
    run.applied = next((p for p in (_watermark(r["userMetadata"]) for r in rows) if p), None)
    run.report.silver_version = run.pin
    if run.applied:
        run.report.silver_applied = f"{Lsn(run.applied[0])}/{run.applied[1]}"


def _changed_since(spark: SparkSession, lake: Lake, run: _Run, version: int) -> None:
    """Add to the keys compared again every key silver wrote after `version`, the one compared
    whole (its Change Data Feed): the other keys are as that round found them, and a write
    between two rounds (a bad MERGE, a hand's) is compared before the newer version counts."""
    if run.shape is None or run.pin <= version or version < 0:
        return
    changes = (
        spark.read.format("delta").option("readChangeFeed", "true")
        .option("startingVersion", version + 1).option("endingVersion", run.pin)
        .load(lake.silver(run.table))
    )  # fmt: skip
    side = None
    try:
        side = SilverTable(changes, run.columns, run.key, soft_delete=False,
                           keyed=bool(run.shape.key))  # fmt: skip
        written = side.key_hashes()
    except CapturedException as e:  # no feed of them: off, or versions before a type widened
        # in place (Delta reads them with today's schema, and refuses): every key again
        log.info("%s: no change data feed after version %d (%s): every key compared again",
                 run.table, version, first_line(e))  # fmt: skip
        run.whole = True
        return
    finally:
        if side is not None:
            side.close()
    known = {d.key_hash for d in run.diffs}
    run.diffs += [KeyDiff("differs", h, ()) for h in written if h not in known]


def _watermark(metadata: str | None) -> tuple[int, int] | None:
    try:
        data = json.loads(metadata or "")
    except ValueError:
        return None
    mark = data.get(WATERMARK) if isinstance(data, dict) else None
    return (int(mark[0]), int(mark[1])) if isinstance(mark, list) and len(mark) == 2 else None


def _round(
    spark: SparkSession, config: Config, lake: Lake, runs: list[_Run], options: Options, *,
    first: bool,
) -> Snapshot:  # fmt: skip
    """Compare every run's pinned version with one source snapshot, then classify."""
    source = config.pipeline.source
    with source_snapshot(source.dsn, source.slot) as (conn, snapshot):
        for run in runs:
            began = time.monotonic()
            try:
                whole, run.whole = first or run.whole, False
                _compare(spark, config, lake, conn, run, fetch_rows=options.fetch_rows, first=whole)
            finally:
                run.report.seconds += time.monotonic() - began
            r = run.report
            log.info("%s: %s source rows, %s silver rows (version %s), %d ranges, %d differing "
                     "keys (%.1f s)", r.table, r.source_rows, r.silver_rows, r.silver_version,
                     r.ranges, len(run.diffs), time.monotonic() - began)  # fmt: skip
    for run in runs:
        _classify(spark, config, lake, run, snapshot, max_keys=options.max_keys)
    return snapshot


def _compare(
    spark: SparkSession, config: Config, lake: Lake, conn: Conn, run: _Run, *, fetch_rows: int,
    first: bool,
) -> None:  # fmt: skip
    report = run.report
    live = describe_source(conn, run.table)
    if live is None:
        report.verdict, report.error = "error", f"table {run.table} does not exist in the source"
        return
    run.oid = live.oid
    if run.shape is None:
        report.verdict = "not mirrored"
        report.source_rows, report.silver_rows = count_rows(conn, run.table), 0
        return
    silver_columns, source_columns, report.not_compared = _columns(config, run.shape, live)
    run.columns = tuple(silver_columns)
    run.names = tuple(c.name for c in silver_columns)
    key = run.key
    if run.shape.key and not key:
        report.not_compared.append(
            f"key {', '.join(run.shape.key)}: a key column is not compared, so rows are matched "
            "by the columns compared, as a multiset"
        )
    select = config.pipeline.snapshot.select_for(run.table)
    if select:
        report.not_compared.append(
            "the source side is what snapshot.select.statement.overrides selects; a row silver "
            "holds that it does not select (a change since the snapshot brings any row in) is "
            "compared with the table's row of its key"
        )
    ours = SourceTable(conn, run.table, source_columns, key, select=select)
    theirs = SilverTable(read_version(spark, lake.silver(run.table), run.pin), silver_columns, key,
                         soft_delete=silver_settings(config).soft_delete,
                         keyed=bool(run.shape.key))  # fmt: skip
    try:
        if first:
            result = compare(ours, theirs, run.names, keyed=bool(key), fetch_rows=fetch_rows)
            report.source_rows, report.silver_rows = result.source_rows, result.silver_rows
            report.ranges, report.exact = result.ranges_checked, result.exact
            report.mismatching, run.diffs = result.mismatching, result.diffs
        else:
            still = recheck(ours, theirs, run.diffs, run.names, keyed=bool(key))
            if report.exact:
                report.mismatching = sum(d.copies for d in still)
            run.diffs = still
        if select:
            _outside_select(conn, run, source_columns, theirs)
        _skipped(config, run)
    finally:
        theirs.close()


# What a mirror keeps by design when the pipeline skips an operation (skipped.operations)
_SKIPPED: dict[str, tuple[str, str]] = {
    "c": ("missing", "rows inserted are not mirrored (skipped.operations c): rows silver lacks"),
    "u": ("differs", "updates are not mirrored (skipped.operations u): values that differ"),
    "d": ("extra", "deletes are not mirrored (skipped.operations d): rows only silver holds"),
    "t": ("extra", "truncates are not mirrored (skipped.operations t): rows only silver holds"),
}


def _skipped(config: Config, run: _Run) -> None:
    """Differences a skipped operation leaves by design are not counted; the report says so."""
    codes = config.pipeline.source.skipped_operations.codes
    kinds = {_SKIPPED[c][0] for c in codes if c in _SKIPPED}
    if not kinds:
        return
    run.report.not_compared += [f"{why} are not counted" for c, (_, why) in sorted(
        _SKIPPED.items()) if c in codes]  # fmt: skip
    dropped = sum(d.copies for d in run.diffs if d.kind in kinds)
    run.diffs = [d for d in run.diffs if d.kind not in kinds]
    run.report.mismatching = max(0, run.report.mismatching - dropped)


def _outside_select(
    conn: Conn, run: _Run, columns: list[SourceColumn], silver: SilverTable
) -> None:
    """A row silver holds that the snapshot's SELECT does not return came in with a change
    (or is wrong): compared with the whole table, it differs only if the table lacks it or
    holds other values. The count of differences keeps what unchecked ranges added to it."""
    extras = [d for d in run.diffs if d.kind == "extra"]
    if not extras:
        return
    assert run.shape is not None
    whole = SourceTable(conn, run.table, columns, run.key)
    outside = recheck(whole, silver, extras, run.names, keyed=bool(run.key))
    run.diffs = [d for d in run.diffs if d.kind != "extra"] + outside
    resolved = sum(d.copies for d in extras) - sum(d.copies for d in outside)
    run.report.mismatching = max(0, run.report.mismatching - resolved)


def _columns(
    config: Config, shape: TableShape, live: RelationDescriptor
) -> tuple[list[SilverColumn], list[SourceColumn], list[str]]:
    """The columns both sides have (silver's and the source's views of each), and why the
    others are not compared."""
    modes = silver_settings(config).modes
    rules = config.pipeline.source.column_rules().rules
    now = {c.name: c for c in live.columns}
    silver, source, skipped = [], [], []
    for c in shape.columns:
        found = now.get(c.name)
        if found is None:
            skipped.append(f"{c.name}: not in the source any more (silver keeps dropped columns)")
            continue
        pg = column_type(found)
        steps, why_not = text_steps(rules, f"{shape.qualified}.{c.name}", pg)
        if why_not:
            skipped.append(f"{c.name}: transformed by {why_not}")
            continue
        silver.append(c)
        source.append(SourceColumn(c.name, pg, pg_form(pg, modes), steps, money_digits(modes)))
    known = {c.name for c in shape.columns}
    skipped += [f"{n}: not in silver (a column filter leaves it out, or no change carried it yet)"
                for n in now if n not in known]  # fmt: skip
    return silver, source, skipped


def _classify(
    spark: SparkSession, config: Config, lake: Lake, run: _Run, snapshot: Snapshot, *,
    max_keys: int,
) -> None:  # fmt: skip
    """Whether the differences of one table can be lag, and the table's verdict."""
    report = run.report
    if report.verdict in ("not mirrored", "error"):
        if report.verdict == "not mirrored" and not report.source_rows:
            report.verdict = "equal"  # nothing captured yet, and nothing to capture
        return
    if not run.diffs and report.mismatching == 0:
        report.verdict, report.keys, report.pending, run.status = "equal", [], [], "differs"
        return
    report.pending = _pending_work(spark, lake, run)
    run.status = "pending" if report.pending else "differs"
    if not report.pending and (snapshot.confirmed is None or snapshot.confirmed < snapshot.lsn):
        source = config.pipeline.source
        waiting = uncaptured_changes(source.dsn, source.slot, source.publication, run.oid,
                                     snapshot.lsn)  # fmt: skip
        if waiting is None:
            run.status = "unverified"
        elif waiting:
            run.status = "pending"
            report.pending.append(f"{waiting} changes of the table in the WAL the slot has not "
                                  "confirmed yet")  # fmt: skip
    names = list(run.key) if run.key else list(run.names)
    listed = sorted(run.diffs, key=lambda d: (d.kind, [_natural(v) for v in d.shown]))
    report.keys = [
        KeyReport(d.kind, dict(zip(names, d.shown, strict=False)), d.columns, d.copies, run.status)
        for d in listed[:max_keys]
    ]
    report.verdict = "differs" if run.status == "differs" else "behind"


def _natural(value: str | None) -> tuple[int, int, str]:
    """Numbers in number order, before text; NULL first."""
    if value is None:
        return (0, 0, "")
    try:
        return (1, int(value), "")
    except ValueError:
        return (2, 0, value)


def _pending_work(spark: SparkSession, lake: Lake, run: _Run) -> list[str]:
    """What the lake holds for the table that its pinned silver version lacks."""
    reasons = []
    qualified = run.table.qualified
    if DeltaTable.isDeltaTable(spark, lake.bronze):
        rows = spark.read.format("delta").load(lake.bronze).where(
            (F.col("source_table") == qualified) & F.col("op").isin("c", "u", "d", "r", "t")
        )  # fmt: skip
        if run.applied is not None:
            rows = rows.where(after_position(*run.applied))
        waiting = rows.count()
        if waiting:
            reasons.append(f"{waiting} changes in bronze not yet merged into silver")
    staged = [
        f for f in pending_files(spark, lake)
        if any(f"{d.schema}.{d.table}" == qualified for d in _relations(lake.changes / str(f)))
    ]  # fmt: skip
    if staged:
        reasons.append(f"{len(staged)} staged change files not yet in bronze")
    for job in load_current(lake):
        if not job.stopped and any(p.table == run.table and not p.done for p in job.tables):
            reasons.append(f"snapshot {job.id} of the table not finished")
    return reasons


def _relations(staged: Location) -> list[RelationDescriptor]:
    """The tables of a staged file; none when the file is gone: ingest put it in bronze and
    maintenance removed it since it was listed as pending."""
    try:
        return list(relations_of(staged).values())
    except FileNotFoundError:
        return []


def _suites(config: Config, runs: list[_Run]) -> list[tuple[_Run, Suite]]:
    asked = list(enumerate(config.pipeline.validate.expectations))
    return [
        (run, build_suite(run.table, run.shape, [(i, e) for i, e in asked if e.table == run.table],
                          config.pipeline_file))
        for run in runs if run.shape is not None
    ]  # fmt: skip


def _quality(
    spark: SparkSession,
    lake: Lake,
    suites: list[tuple[_Run, Suite]],
    soft_delete: bool,
) -> QualityReport:
    """Each suite on the live rows of the version parity compared (the last round's)."""
    frames: list[tuple[Suite, DataFrame]] = []
    for run, suite in suites:
        if run.report.verdict == "error":
            continue
        silver = read_version(spark, lake.silver(run.table), run.pin)
        frame = live_rows(silver, bool(run.shape and run.shape.key), soft_delete).drop("_w")
        frames.append((suite, frame.cache()))
    try:
        return run_quality(frames, lake)
    finally:
        for _, frame in frames:
            frame.unpersist()
