"""run(): the orchestrator. Finishes pending work, then reads, stages, appends to bronze, merges.

Order: changes staged by an earlier run but not yet in bronze, and bronze rows not yet merged,
are applied first; then the slot is read up to the WAL position seen at start; then bronze and
silver take what was just staged. Every step resumes where the previous run stopped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdc_core.capture import CaptureSummary, capture
from cdc_core.config import Config
from cdc_core.errors import ConfigError, TerminalError, UsageError
from cdc_core.lake import Lake
from cdc_core.pg.connect import connect
from cdc_core.pg.doctor import run_doctor

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
    capture: CaptureSummary
    bronze: BronzeSummary | None  # None: --capture-only
    silver: tuple[TableResult, ...]
    seconds: float

    def describe(self) -> str:
        steps = [self.capture.describe()]
        if self.bronze is not None:
            merged = sum(t.changes for t in self.silver)
            steps += [self.bronze.describe(), f"silver: {merged} changes merged into "
                      f"{len(self.silver)} tables"]  # fmt: skip
        done = "; ".join(steps)
        return f"pipeline {self.pipeline}: {done}; lake {self.lake_root} ({self.seconds:.1f} s)"


def _check_supported(config: Config) -> None:
    mode = config.pipeline.snapshot.mode
    if mode != "no_data":
        raise ConfigError(
            config.pipeline_file, "snapshot.mode",
            f"{mode!r} needs snapshots, which this version does not have yet: set "
            "snapshot.mode: no_data (changes from the slot's creation on are mirrored)",
        )  # fmt: skip


def run(config: Config, options: RunOptions) -> RunSummary:
    """One run of a pipeline; raises `CdcError` subclasses whose type says whether to retry."""
    if options.continuous:
        raise UsageError("--continuous is not available in this version: run with --once")
    _check_supported(config)
    started = time.monotonic()
    pipeline = config.pipeline
    connect(pipeline.source.dsn).close()  # unreachable server -> TransientError, exit 75
    report = run_doctor(config)
    if not report.ok:
        failed = ", ".join(c.name for c in report.checks if c.status == "fail")
        raise TerminalError(
            f"pipeline {pipeline.name}: the source is not ready ({failed}); "
            f"run `cdc doctor --pipeline {pipeline.name}` for the fixes"
        )
    lake = Lake(pipeline.target.root)
    if options.capture_only:
        captured = capture(config, lake)
        return RunSummary(pipeline.name, lake.root, captured, None, (), time.monotonic() - started)
    from cdc_core.apply import apply_staged
    from cdc_core.bronze import BronzeSummary
    from cdc_core.spark import build_spark  # the JVM starts only once the source is known good

    spark = build_spark(config.env.spark, f"cdc-{pipeline.name}")
    pending = apply_staged(spark, lake, config)  # finish what an earlier run left
    captured = capture(config, lake)
    applied = apply_staged(spark, lake, config)
    bronze = BronzeSummary(
        pending[0].files + applied[0].files, pending[0].changes + applied[0].changes, applied[0].end
    )
    merged = _merge_results(pending[1], applied[1])
    errors = [t.error for t in merged if t.error]
    if errors:
        raise TerminalError("; ".join(errors))
    return RunSummary(pipeline.name, lake.root, captured, bronze, tuple(merged),
                      time.monotonic() - started)  # fmt: skip


def _merge_results(first: list[TableResult], second: list[TableResult]) -> list[TableResult]:
    from cdc_core.silver import TableResult

    totals: dict[str, TableResult] = {}
    for r in first + second:
        old = totals.get(r.table)
        changes = r.changes + (old.changes if old else 0)
        totals[r.table] = TableResult(r.table, changes, r.error or (old.error if old else None))
    return list(totals.values())
