"""The Delta metrics table catches up from the batch lines, once each, however often asked."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdc_core import metrics
from cdc_core.lake import Lake
from cdc_core.metrics import (
    batch_lines_after,
    flush_metrics_table,
    iso,
    metrics_table,
    record_batch,
)


def line(n: int) -> dict[str, object]:
    return {
        "pipeline": "orders", "batch": n, "changes": 10 * n, "seconds": 1.5,
        "started_at": "2026-11-21T20:00:00.000+00:00",
        "visible_at": "2026-11-21T20:00:01.250+00:00", "errors": [],
    }  # fmt: skip


def test_the_table_gets_each_batch_line_once(spark: SparkSession, tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    for n in (1, 2, 3):
        record_batch(lake, line(n))

    assert flush_metrics_table(spark, lake) == 3
    assert flush_metrics_table(spark, lake) == 0  # nothing new: no commit
    record_batch(lake, line(4))
    assert flush_metrics_table(spark, lake) == 1

    table = spark.read.format("delta").load(metrics_table(lake))
    rows = {r["batch"]: r for r in table.collect()}
    assert sorted(rows) == [1, 2, 3, 4]
    assert rows[4]["changes"] == 40
    assert str(rows[4]["visible_at"]).startswith("2026-11-21")
    versions = spark.sql(f"DESCRIBE HISTORY delta.`{metrics_table(lake)}`").count()
    assert versions == 2  # one commit per flush that had lines


def test_old_lines_go_once_the_table_holds_them(spark: SparkSession, tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    month_ago = iso(int((time.time() - 30 * 86_400) * 1e6))
    for n in (1, 2, 3):
        record_batch(lake, line(n) | {"ended_at": month_ago})
    record_batch(lake, line(4))  # a line without a readable end time never expires

    assert flush_metrics_table(spark, lake, keep_days=7) == 4
    assert [r["batch"] for r in batch_lines_after(lake, 0)] == [4]
    record_batch(lake, line(5) | {"ended_at": month_ago})  # after one that never expires: stays
    assert flush_metrics_table(spark, lake, keep_days=7) == 1
    assert [r["batch"] for r in batch_lines_after(lake, 0)] == [4, 5]
    table = spark.read.format("delta").load(metrics_table(lake))
    assert sorted(r["batch"] for r in table.collect()) == [1, 2, 3, 4, 5]


def test_lines_that_cannot_be_dropped_leave_the_batch_alone(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    def disk_full(*args: object, **kwargs: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(metrics, "prune_batch_lines", disk_full)
    lake = Lake(str(tmp_path))
    record_batch(lake, line(1))
    assert flush_metrics_table(spark, lake, keep_days=7) == 1
    assert "old batch lines not dropped this time" in caplog.text
    assert "No space left on device" in caplog.text


def test_a_table_of_the_previous_version_gets_the_new_columns(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    columns = metrics._TABLE_COLUMNS
    old = columns[: [name for name, _ in columns].index("SnapshotCompleted") + 1]
    monkeypatch.setattr(metrics, "_TABLE_COLUMNS", old)  # the table as the last version wrote it
    lake = Lake(str(tmp_path))
    record_batch(lake, line(1))
    assert flush_metrics_table(spark, lake) == 1
    monkeypatch.setattr(metrics, "_TABLE_COLUMNS", columns)
    position = {"lsn": "0/16B3748", "commit_lsn": "0/16B37A0"}
    record_batch(lake, line(2) | {"LastTransactionId": 745, "SourceEventPosition": position,
                                  "LastEvent": "2026-11-21T19:59:58.000+00:00",
                                  "CapturedTables": ["public.orders"], "SnapshotAborted": False})  # fmt: skip
    assert flush_metrics_table(spark, lake) == 1

    rows = {r["batch"]: r for r in spark.read.format("delta").load(metrics_table(lake)).collect()}
    assert rows[1]["LastTransactionId"] is None
    assert rows[1]["SourceEventPosition"] is None
    assert rows[2]["LastTransactionId"] == 745
    assert rows[2]["SourceEventPosition"] == position
    assert rows[2]["CapturedTables"] == ["public.orders"]
    assert str(rows[2]["LastEvent"]).startswith("2026-11-21")
    assert rows[2]["RemainingTableCount"] is None  # a key the line does not have
