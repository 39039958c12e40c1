"""jobs/maintain.py compacts and vacuums the control tables that grow with every run: the
metrics table and the notifications table (their catch-up still appends each line once after),
and the dead-letter table."""

from __future__ import annotations

from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from cdc_core import dead_letters
from cdc_core.config.model import MaintenanceConfig
from cdc_core.lake import Lake
from cdc_core.maintenance import RunSettings, control_tables, maintain_table
from cdc_core.metrics import flush_metrics_table, metrics_table, record_batch
from cdc_core.notifications import (
    INCREMENTAL_SNAPSHOT,
    Notification,
    NotificationType,
    Notifier,
    flush_notifications_table,
    notifications_table,
)

TOPIC = "notes"


def batch(lake: Lake, n: int) -> None:
    record_batch(lake, {
        "pipeline": "orders", "batch": n, "changes": n, "seconds": 1.0,
        "started_at": "2026-11-27T06:00:00.000+00:00",
        "visible_at": "2026-11-27T06:00:01.000+00:00", "errors": [],
    })  # fmt: skip


def note(lake: Lake, n: int) -> None:
    data = {"connector_name": "orders", "data_collections": "public.orders"}
    Notifier(lake, "orders", sink_topic=TOPIC).send(
        Notification(f"job-{n}", INCREMENTAL_SNAPSHOT, NotificationType.IN_PROGRESS, data, n)
    )


def files(spark: SparkSession, path: str) -> int:
    return int(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["numFiles"])


def test_the_control_tables_are_compacted_and_vacuumed_and_catch_up_once_after(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = Lake(str(tmp_path))
    assert control_tables(spark, lake, TOPIC) == []  # neither exists yet: nothing to maintain
    for n in range(1, 4):  # a commit, and a small file, per catch-up: as a minute of batches
        batch(lake, n)
        note(lake, n)
        assert flush_metrics_table(spark, lake) == 1
        assert flush_notifications_table(spark, lake, TOPIC) == 1
    paths = {"metrics": metrics_table(lake), "notifications": notifications_table(lake, TOPIC)}
    assert [(name, path) for name, path, _ in control_tables(spark, lake, TOPIC)] == list(
        paths.items()
    )
    assert [name for name, _, _ in control_tables(spark, lake, None)] == ["metrics"]
    assert {name: files(spark, path) for name, path in paths.items()} == {
        "metrics": 3, "notifications": 3,
    }  # fmt: skip

    settings = MaintenanceConfig(vacuum_retention_hours=0, vacuum_retention_check=False)
    run = RunSettings(settings, {"maintenance": "t"}, {
        "spark.databricks.delta.retentionDurationCheck.enabled": "false",
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
    })  # fmt: skip  # as RunSettings.of sets them
    reports = [maintain_table(spark, name, path, key, run)
               for name, path, key in control_tables(spark, lake, TOPIC)]  # fmt: skip

    assert [(r.name, r.compacted, r.conflict) for r in reports] == [
        ("metrics", (3, 1), None), ("notifications", (3, 1), None),
    ]  # fmt: skip
    assert all(r.vacuumed for r in reports), [r.describe() for r in reports]
    for path in paths.values():
        assert files(spark, path) == 1
        ops = [h["operation"] for h in DeltaTable.forPath(spark, path).history().collect()]
        assert "OPTIMIZE" in ops, ops
        assert "VACUUM END" in ops, ops
    # the watermarks the catch-ups resume from survive maintenance's commits
    assert flush_metrics_table(spark, lake) == 0
    assert flush_notifications_table(spark, lake, TOPIC) == 0
    batch(lake, 5)
    note(lake, 5)
    assert flush_metrics_table(spark, lake) == 1
    assert flush_notifications_table(spark, lake, TOPIC) == 1
    metrics_rows = spark.read.format("delta").load(paths["metrics"]).select("batch").collect()
    assert sorted(r[0] for r in metrics_rows) == [1, 2, 3, 5]
    seqs = spark.read.format("delta").load(paths["notifications"]).select("seq").collect()
    assert sorted(r[0] for r in seqs) == [1, 2, 3, 4]


def test_the_dead_letter_table_is_compacted_and_vacuumed_once_it_exists(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = Lake(str(tmp_path))
    assert control_tables(spark, lake, None) == []  # no change set aside yet: nothing to maintain
    letter = {
        "source_table": "public.periods", "op": "c", "seq": 0, "lsn": 1, "tx_id": 7,
        "commit_ts": None, "old_key": None, "values": {"id": "2"}, "reason": "a reason",
        "change_hash": "h", "recorded_at": None,
    }  # fmt: skip
    for n in range(1, 4):  # a MERGE, and a small file, per batch that sets changes aside
        rows = spark.createDataFrame([letter | {"commit_lsn": n}], dead_letters.SCHEMA)
        assert dead_letters.record(spark, lake, rows, "public.periods") == 1
    assert control_tables(spark, lake, None) == [("dead_letters", lake.dead_letters, None)]
    assert files(spark, lake.dead_letters) == 3

    settings = MaintenanceConfig(vacuum_retention_hours=0, vacuum_retention_check=False)
    run = RunSettings(settings, {"maintenance": "t"}, {
        "spark.databricks.delta.retentionDurationCheck.enabled": "false",
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
    })  # fmt: skip
    report = maintain_table(spark, "dead_letters", lake.dead_letters, None, run)

    assert (report.compacted, report.conflict, report.skipped) == ((3, 1), None, None)
    assert report.vacuumed, report.describe()
    assert files(spark, lake.dead_letters) == 1
    ops = [h["operation"] for h in DeltaTable.forPath(spark, lake.dead_letters).history().collect()]
    assert {"OPTIMIZE", "VACUUM END"} <= set(ops), ops
    stored = spark.read.format("delta").load(lake.dead_letters).select("commit_lsn").collect()
    assert sorted(r[0] for r in stored) == [1, 2, 3]
    again = spark.createDataFrame([letter | {"commit_lsn": 2}], dead_letters.SCHEMA)
    assert dead_letters.record(spark, lake, again, "public.periods") == 0  # still held once
