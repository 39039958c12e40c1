"""run(): the orchestrator. Checks the source, then runs each stage in the order data flows.

Capture, staging, bronze and silver plug in here stage by stage; today a run checks the
source the way `cdc doctor` does, builds the Spark session with Delta, and prepares the lake.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from cdc_core.config import Config
from cdc_core.errors import TerminalError, UsageError
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
    source: str
    lake_root: str
    seconds: float
    spark_version: str

    def describe(self) -> str:
        return (
            f"pipeline {self.pipeline}: source {self.source} ready, Spark {self.spark_version} "
            f"with Delta ready, lake at {self.lake_root} ({self.seconds:.1f} s)"
        )


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
    from cdc_core.spark import build_spark  # the JVM starts only once the source is known good

    spark = build_spark(config.env.spark, f"cdc-{pipeline.name}")
    root = pipeline.target.root
    if "://" not in root:
        for folder in ("_staging", "_state"):
            (Path(root) / folder).mkdir(parents=True, exist_ok=True)
    return RunSummary(
        pipeline=pipeline.name,
        source=pipeline.source.dsn.redacted,
        lake_root=root,
        seconds=time.monotonic() - started,
        spark_version=spark.version,
    )
