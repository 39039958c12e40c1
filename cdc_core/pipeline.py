"""run(): the orchestrator. Decides, finishes pending work, snapshots, reads, stages, merges.

Order: `snapshot.mode` decides what the run does and the source is set up (publication, slot,
snapshot jobs); changes staged by an earlier run but not yet in bronze, and bronze rows not yet
merged, are applied; pending snapshot chunks are read into bronze; the slot is read up to the
WAL position seen then; bronze and silver take what was just staged (snapshot reads once the
stream has passed them); finished snapshots sweep what they did not find. Every step resumes
where the previous run stopped.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdc_core.capture import CaptureSummary, capture, heartbeat
from cdc_core.capture import catch_up as catch_up_stream
from cdc_core.config import Config
from cdc_core.errors import TerminalError, UsageError
from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.pg.connect import connect
from cdc_core.pg.doctor import run_doctor
from cdc_core.pg.slot import autoset_replica_identity
from cdc_core.start import start

log = logging.getLogger("cdc_core.pipeline")

if TYPE_CHECKING:  # the Spark side loads only when a run needs Spark (not --capture-only)
    from cdc_core.bronze import BronzeSummary
    from cdc_core.silver import TableResult


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
    """One run of a pipeline; raises `CdcError` subclasses whose type says whether to retry."""
    if options.continuous:
        raise UsageError("--continuous is not available in this version: run with --once")
    started = time.monotonic()
    pipeline = config.pipeline
    with connect(pipeline.source.dsn) as conn:  # unreachable server -> TransientError, exit 75
        rules = pipeline.source.replica_identity_autoset_values
        if rules:
            for change in autoset_replica_identity(conn, pipeline.source.tables, rules.for_table):
                log.info("replica.identity.autoset.values: %s", change)
    report = run_doctor(config)
    if not report.ok:
        failed = ", ".join(c.name for c in report.checks if c.status == "fail")
        raise TerminalError(
            f"pipeline {pipeline.name}: the source is not ready ({failed}); "
            f"run `cdc doctor --pipeline {pipeline.name}` for the fixes"
        )
    lake = Lake(pipeline.target.root)
    begun = start(config, lake)
    streaming = begun.decision.stream
    if options.capture_only:
        if begun.jobs:
            log.warning("snapshot %s waits for a run with Spark (--capture-only reads no snapshot)",
                        ", ".join(j.id for j in begun.jobs))  # fmt: skip
        if streaming:
            heartbeat(config, lake)
        captured = capture(config, lake) if streaming else None
        return RunSummary(pipeline.name, lake.root, captured, None, (), time.monotonic() - started)
    from cdc_core.apply import apply_staged, finish_snapshots
    from cdc_core.bronze import BronzeSummary
    from cdc_core.snapshot_read import read_jobs
    from cdc_core.spark import build_spark  # the JVM starts only once the source is known good

    spark = build_spark(config.env.spark, f"cdc-{pipeline.name}")
    # what an earlier run left goes in before snapshot reads; without reads, one pass does all
    pending = (
        apply_staged(spark, lake, config, streaming=streaming)
        if begun.jobs
        else (BronzeSummary(0, 0, None), [], None)
    )
    caught: list[CaptureSummary] = []

    def catch_up(position: Lsn) -> None:  # each snapshot read: stage the stream past it
        caught.append(catch_up_stream(config, lake, position))

    snap = pipeline.snapshot
    read = read_jobs(
        spark, lake, pipeline.source.dsn, begun.jobs, pipeline=pipeline.name,
        max_threads=snap.max_threads, fetch_size=snap.fetch_size,
        catch_up=catch_up if streaming else None,
        keys=pipeline.source.message_key_columns.for_table,
        rules=pipeline.source.column_rules(),
    )  # fmt: skip
    if streaming:
        heartbeat(config, lake)
        caught.append(capture(config, lake))
    captured = functools.reduce(CaptureSummary.plus, caught) if caught else None
    applied = apply_staged(spark, lake, config, streaming=streaming)
    merged = _merge_results(pending[1], applied[1])
    finished = finish_snapshots(
        spark, lake, config, begun.jobs, results=merged, frontier=applied[2]
    )
    bronze = BronzeSummary(
        pending[0].files + applied[0].files, pending[0].changes + applied[0].changes, applied[0].end
    )
    errors = [t.error for t in merged if t.error]
    if errors:
        raise TerminalError("; ".join(errors))
    return RunSummary(pipeline.name, lake.root, captured, bronze, tuple(merged),
                      time.monotonic() - started, read, tuple(finished))  # fmt: skip


def _merge_results(first: list[TableResult], second: list[TableResult]) -> list[TableResult]:
    from cdc_core.silver import TableResult

    totals: dict[str, TableResult] = {}
    for r in first + second:
        old = totals.get(r.table)
        changes = r.changes + (old.changes if old else 0)
        totals[r.table] = TableResult(r.table, changes, r.error or (old.error if old else None))
    return list(totals.values())
