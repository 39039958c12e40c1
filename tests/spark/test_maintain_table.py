"""Maintenance of one Delta table beside the stages that write it: a commit of ingest that wins
over a maintenance commit stops that table, changes nothing and makes the run exit 75; a table
whose stage watermark is deep in its history is left alone, so maintenance's own commits never
push the watermark out of the stages' reach."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_core.config.model import MaintenanceConfig
from cdc_core.errors import EXIT_TRANSIENT, TransientError
from cdc_core.lake_state import HISTORY_DEPTH
from cdc_core.maintenance import (
    COMMITS_PER_TABLE,
    HEADROOM,
    MaintenanceSummary,
    RunSettings,
    StagedReport,
    check,
    maintain_table,
)

RUN = RunSettings(
    MaintenanceConfig(vacuum_retention_hours=0, vacuum_retention_check=False),
    {"maintenance": "t"},
    {
        "spark.databricks.delta.retentionDurationCheck.enabled": "false",
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
    },  # as RunSettings.of sets them
)
WATERMARK = "silver"


def _version(spark: SparkSession, path: str) -> int:
    return int(DeltaTable.forPath(spark, path).history(1).first()["version"])


def test_a_commit_that_wins_over_maintenance_stops_the_table_and_the_run_exits_75(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Bronze retention's DELETE scans the table; while it does, ingest appends rows (a batch
    landing). Delta refuses the DELETE's commit: maintenance reports the table and the run
    exits 75, and the appended rows and the old ones are all there."""
    path = str(tmp_path / "bronze")
    spark.range(10).withColumn("batch", F.lit(1)).coalesce(1).write.format("delta").save(path)
    started, go = tmp_path / "scan-started", tmp_path / "go"

    @F.udf(T.BooleanType())  # type: ignore[misc]
    def retired(batch: int) -> bool:
        """The DELETE's condition: it says the scan started, then waits for the rival commit
        (a minute at most)."""
        started.touch()
        for _ in range(1200):
            if go.exists():
                break
            time.sleep(0.05)
        return batch == 1

    reports = []
    worker = threading.Thread(
        target=lambda: reports.append(
            maintain_table(spark, "bronze", path, None, RUN, delete=retired(F.col("batch")))
        )
    )
    worker.start()
    try:
        for _ in range(1200):
            if started.exists():
                break
            time.sleep(0.05)
        assert started.exists(), "the DELETE never scanned the table"
        before = _version(spark, path)
        spark.range(10, 15).withColumn("batch", F.lit(2)).write.format("delta").mode("append").save(
            path
        )  # ingest's batch wins the race
    finally:
        go.touch()
        worker.join(timeout=300)
    (report,) = reports

    assert report.conflict is not None
    assert "Concurrent" in report.conflict, report
    assert (report.deleted_rows, report.compacted, report.vacuumed) == (None, None, None)
    assert "stopped by a concurrent commit" in report.describe()
    assert _version(spark, path) == before + 1  # only the append committed
    rows = spark.read.format("delta").load(path).groupBy("batch").count().collect()
    assert {r["batch"]: r["count"] for r in rows} == {1: 10, 2: 5}

    summary = MaintenanceSummary("orders", str(tmp_path), StagedReport(0, 0, 0), (report,), 1.0)
    with pytest.raises(TransientError, match="won on bronze; nothing was lost, run maintenance"):
        check(summary)
    assert TransientError.exit_code == EXIT_TRANSIENT


def _commit(log: Path, version: int, metadata: dict[str, object] | None) -> None:
    """A commit of no data, as an ingest stage's that found nothing to write."""
    info: dict[str, object] = {"timestamp": int(time.time() * 1000), "operation": "WRITE"}
    if metadata is not None:
        info["userMetadata"] = json.dumps(metadata)
    (log / f"{version:020d}.json").write_text(json.dumps({"commitInfo": info}) + "\n")


@pytest.mark.parametrize(
    ("depth", "left_alone"),
    [
        (HISTORY_DEPTH - HEADROOM - COMMITS_PER_TABLE, False),
        (HISTORY_DEPTH - HEADROOM - COMMITS_PER_TABLE + 1, True),
    ],
)
def test_a_table_whose_watermark_is_deep_in_its_history_is_left_alone(
    spark: SparkSession, tmp_path: Path, depth: int, left_alone: bool
) -> None:
    """A stage finds its position in the newest commit that records its watermark, among the
    last HISTORY_DEPTH commits. After `depth` commits without one (a quiet table's batches
    that write nothing to it, and earlier maintenance), this run's commits could push the
    watermark out of reach: maintenance waits for the stage's next commit instead."""
    path = tmp_path / "mirror"
    spark.range(1, 9).repartition(4).write.format("delta").save(str(path))  # 4 small files
    log = path / "_delta_log"
    _commit(log, 1, {WATERMARK: {"lsn": "0/16B3748"}})
    for version in range(2, depth + 2):  # commits that record no watermark
        _commit(log, version, {"other": 1} if version % 2 else None)
    newest = depth + 1

    report = maintain_table(spark, "public.items", str(path), WATERMARK, RUN)

    if left_alone:
        assert report.skipped == (
            f"its newest {WATERMARK} watermark is {depth} commits back; maintenance waits "
            "until the next ingest commit to it"
        )
        assert report.describe().startswith("public.items: left alone (")
        assert _version(spark, str(path)) == newest  # not one commit
    else:
        assert report.skipped is None
        assert report.compacted is not None
        assert report.compacted[0] == 4
        assert newest < _version(spark, str(path)) <= newest + COMMITS_PER_TABLE
