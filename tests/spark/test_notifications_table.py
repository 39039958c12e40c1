"""The Delta notifications table catches up from the sink's lines, once each, however often asked."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdc_core import notifications
from cdc_core.lake import Lake
from cdc_core.notifications import (
    INCREMENTAL_SNAPSHOT,
    Notification,
    NotificationType,
    Notifier,
    flush_notifications_table,
    notifications_table,
    sink_location,
    sink_records,
)

TOPIC = "notes"


def send(lake: Lake, n: int) -> None:
    kinds = [NotificationType.STARTED, NotificationType.IN_PROGRESS, NotificationType.COMPLETED]
    data = {"connector_name": "orders", "data_collections": "public.orders"}
    note = Notification(f"job-{n}", INCREMENTAL_SNAPSHOT, kinds[n % 3], data, 1_795_000_000_000 + n)
    Notifier(lake, "orders", sink_topic=TOPIC).send(note)


def table_rows(spark: SparkSession, lake: Lake) -> list[dict[str, object]]:
    table = spark.read.format("delta").load(notifications_table(lake, TOPIC))
    return [r.asDict() for r in table.orderBy("seq").collect()]


def as_lines(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    keys = ("id", "aggregate_type", "type", "additional_data", "timestamp")
    return [{k: r[k] for k in keys} for r in rows]


def test_the_table_gets_each_notification_once(spark: SparkSession, tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    for n in (1, 2, 3):
        send(lake, n)

    assert flush_notifications_table(spark, lake, TOPIC) == 3
    assert flush_notifications_table(spark, lake, TOPIC) == 0  # nothing new: no commit
    send(lake, 4)
    assert flush_notifications_table(spark, lake, TOPIC) == 1

    rows = table_rows(spark, lake)
    assert as_lines(rows) == sink_records(lake, TOPIC)
    assert [r["seq"] for r in rows] == [1, 2, 3, 4]
    assert {r["pipeline"] for r in rows} == {"orders"}
    assert str(rows[0]["sent_at"]).startswith("2026-11-18")
    history = spark.sql(f"DESCRIBE HISTORY delta.`{notifications_table(lake, TOPIC)}`")
    assert history.count() == 2  # one commit per flush that had notifications


def test_a_retried_append_of_held_notifications_adds_nothing(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As if the commit landed but its position was not seen: Delta's txnVersion skips it."""
    lake = Lake(str(tmp_path))
    for n in (1, 2):
        send(lake, n)
    assert flush_notifications_table(spark, lake, TOPIC) == 2

    monkeypatch.setattr("cdc_core.lake_state.read_watermark", lambda *args: None)
    monkeypatch.setattr(notifications, "_newest_seq_in", lambda *args: 0)
    flush_notifications_table(spark, lake, TOPIC)
    assert [r["seq"] for r in table_rows(spark, lake)] == [1, 2]


def test_a_line_cut_by_a_crash_is_left_out_and_the_next_ones_go_in(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = Lake(str(tmp_path))
    send(lake, 1)
    sink = sink_location(lake, TOPIC)
    assert isinstance(sink, Path)
    with sink.open("ab") as f:
        f.write(b'{"aggregate_type": "Incremental Snap')  # the run died mid-write
    assert flush_notifications_table(spark, lake, TOPIC) == 1
    send(lake, 2)  # ends the cut line first
    send(lake, 3)
    assert flush_notifications_table(spark, lake, TOPIC) == 2

    rows = table_rows(spark, lake)
    assert as_lines(rows) == sink_records(lake, TOPIC)
    assert [(r["seq"], r["id"]) for r in rows] == [(1, "job-1"), (2, "job-2"), (3, "job-3")]
