"""run(): the orchestrator. Checks the source, then runs each stage in the order data flows.

Today a run captures: it reads the slot up to the WAL position seen at start, stages whole
transactions as durable change files and confirms the slot past them. Bronze and silver plug
in after staging.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cdc_core.capture import CaptureSummary, capture
from cdc_core.config import Config
from cdc_core.errors import TerminalError, UsageError
from cdc_core.lake import Lake
from cdc_core.pg.connect import connect
from cdc_core.pg.doctor import run_doctor


@dataclass(frozen=True)
class RunOptions:
    """How one `ingest` invocation runs."""

    continuous: bool = False
    max_batches: int | None = None


@dataclass(frozen=True)
class RunSummary:
    """What a run did, printed by the job entry."""

    pipeline: str
    lake_root: str
    capture: CaptureSummary
    seconds: float

    def describe(self) -> str:
        return f"pipeline {self.pipeline}: {self.capture.describe()}; lake {self.lake_root}"


def run(config: Config, options: RunOptions) -> RunSummary:
    """One run of a pipeline; raises `CdcError` subclasses whose type says whether to retry."""
    if options.continuous:
        raise UsageError("--continuous is not available in this version: run with --once")
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
    summary = capture(config, lake)
    return RunSummary(pipeline.name, lake.root, summary, time.monotonic() - started)
