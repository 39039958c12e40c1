"""Snapshot notifications: the channels' configuration and Debezium's record format."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from cdc_core.config import load_pipeline
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.notifications import (
    NotificationType,
    Notifier,
    SinkPosition,
    TableScanStatus,
    sink_records,
    sink_records_after,
    table_row,
)
from cdc_core.snapshot import SnapshotJob, TableSnapshot
from cdc_core.snapshot_plan import Chunk, ChunkPlan
from tests.unit.test_config import _with_source, load_error, write_home


def _load(tmp_path: Path, lines: str) -> Notifier:
    pipeline = _with_source(lines)
    config = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    return Notifier.of(config.pipeline, Lake(str(tmp_path / "lake")))


def test_no_channel_is_enabled_by_default(tmp_path: Path) -> None:
    notifier = _load(tmp_path, "")
    assert not notifier.enabled


def test_log_and_sink_channels_load_with_the_topic_name(tmp_path: Path) -> None:
    notifier = _load(
        tmp_path,
        "  notification.enabled.channels: log, sink\n  notification.sink.topic.name: notes\n",
    )
    assert notifier.log_channel
    assert notifier.sink_topic == "notes"


def test_channels_are_taken_in_any_case(tmp_path: Path) -> None:
    notifier = _load(tmp_path, "  notification.enabled.channels: LOG,Sink\n"
                               "  notification.sink.topic.name: notes\n")  # fmt: skip
    assert notifier.log_channel
    assert notifier.sink_topic == "notes"
    assert not _load(tmp_path, "  notification.enabled.channels: NONE\n").enabled


def test_a_yaml_list_of_channels_loads(tmp_path: Path) -> None:
    notifier = _load(tmp_path, "  notification.enabled.channels: [log]\n")
    assert notifier.log_channel
    assert notifier.sink_topic is None


@pytest.mark.parametrize(
    ("lines", "key", "fragment"),
    [
        ("  notification.enabled.channels: sink\n", "source.notification.sink.topic.name",
         "is required when notification.enabled.channels includes sink"),
        ("  notification.enabled.channels: log,jmx\n", "source.notification.enabled.channels",
         "jmx is not available"),
        ("  notification.enabled.channels: lgo\n", "source.notification.enabled.channels",
         "did you mean 'log'?"),
        ("  notification.enabled.channels: sink\n  notification.sink.topic.name: a/b\n",
         "source.notification.sink.topic.name", "is not a topic name"),
    ],
)  # fmt: skip
def test_bad_notification_settings_fail_at_load_naming_the_key(
    tmp_path: Path, lines: str, key: str, fragment: str
) -> None:
    message = load_error(tmp_path, _with_source(lines))
    assert key in message
    assert fragment in message


def _job(kind: str = "initial", origin: str = "snapshot.mode initial") -> SnapshotJob:
    tables = []
    for name in ("orders", "customers"):
        table = TableName("public", name)
        plan = ChunkPlan(table, ("id",), ("bigint",), (Chunk(0, None, None),), 10)
        tables.append(TableSnapshot(table, plan, ("id",)))
    return SnapshotJob("job-1", kind, origin, tables)  # type: ignore[arg-type]


def test_sink_records_have_debeziums_fields_in_order(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    notifier = Notifier(lake, "orders", sink_topic="notifications")
    job = _job()
    part = job.tables[0]
    part.rows, part.groups_done = 7, 1
    notifier.job(job, NotificationType.STARTED)
    notifier.job(job, NotificationType.IN_PROGRESS, part)
    notifier.job(job, NotificationType.TABLE_SCAN_COMPLETED, part)
    notifier.job(job, NotificationType.COMPLETED)
    assert (tmp_path / "_state" / "notifications.jsonl").is_file()
    records = sink_records(lake, "notifications")
    assert [r["type"] for r in records] == [
        "STARTED", "IN_PROGRESS", "TABLE_SCAN_COMPLETED", "COMPLETED"
    ]  # fmt: skip
    for r in records:
        assert set(r) == {"id", "aggregate_type", "type", "additional_data", "timestamp"}
        assert r["aggregate_type"] == "Initial Snapshot"
        assert r["additional_data"]["connector_name"] == "orders"
        assert isinstance(r["timestamp"], int)
        assert all(isinstance(v, str) for v in r["additional_data"].values())
    assert records[0]["additional_data"] == {"connector_name": "orders"}
    assert records[1]["additional_data"] == {
        "connector_name": "orders", "data_collections": "public.orders,public.customers",
        "current_collection_in_progress": "public.orders", "total_rows_scanned": "7",
    }  # fmt: skip
    assert records[2]["additional_data"] == {
        "connector_name": "orders", "data_collections": "public.orders,public.customers",
        "scanned_collection": "public.orders", "total_rows_scanned": "7", "status": "SUCCEEDED",
    }  # fmt: skip
    assert records[3]["additional_data"] == {"connector_name": "orders"}  # as Debezium's
    assert len({r["id"] for r in records}) == 4  # random per notification, as in Debezium


def test_incremental_notifications_carry_the_signal_id(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    notifier = Notifier(lake, "orders", sink_topic="n")
    job = _job("incremental", "signal ad-hoc-1")
    notifier.job(job, NotificationType.STARTED)
    notifier.job(
        job, NotificationType.TABLE_SCAN_COMPLETED, job.tables[1], status=TableScanStatus.EMPTY
    )
    notifier.job(job, NotificationType.ABORTED)
    records = sink_records(lake, "n")
    assert {r["id"] for r in records} == {"ad-hoc-1"}
    assert {r["aggregate_type"] for r in records} == {"Incremental Snapshot"}
    assert records[0]["additional_data"]["data_collections"] == "public.orders,public.customers"
    assert records[1]["additional_data"]["status"] == "EMPTY"
    assert records[2]["type"] == "ABORTED"
    assert records[2]["additional_data"] == {"connector_name": "orders"}  # no list: the whole


def test_the_log_channel_writes_one_line_per_notification(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = Notifier(Lake(str(tmp_path)), "orders", log_channel=True)
    with caplog.at_level(logging.INFO, logger="cdc_core.notifications"):
        notifier.job(_job("blocking"), NotificationType.COMPLETED)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "cdc_core.notifications"]
    record = json.loads(line.removeprefix("notification "))
    assert record["type"] == "COMPLETED"
    assert record["aggregate_type"] == "Initial Snapshot"
    assert not (tmp_path / "_state").exists()  # the sink is off


def test_a_stop_snapshot_signal_sends_aborted_naming_the_tables_it_stops(tmp_path: Path) -> None:
    from cdc_core.signals import StopRequest
    from cdc_core.start import _stop

    lake = Lake(str(tmp_path))
    notifier = Notifier(lake, "orders", sink_topic="n")
    running, initial = _job("incremental", "signal s-1"), _job()
    _stop(
        lake, [running, initial], StopRequest("stop-1", (TableName("public", "orders"),)), notifier
    )
    (record,) = sink_records(lake, "n")
    assert record["type"] == "ABORTED"
    assert record["id"] == "s-1"
    assert record["additional_data"]["data_collections"] == "public.orders"
    assert not initial.finished  # only incremental snapshots are stopped


def test_a_stop_snapshot_signal_without_tables_sends_aborted_without_them(tmp_path: Path) -> None:
    """Debezium's notifyAborted without a list: only the connector's name."""
    from cdc_core.signals import StopRequest
    from cdc_core.start import _stop

    lake = Lake(str(tmp_path))
    notifier = Notifier(lake, "orders", sink_topic="n")
    running = _job("incremental", "signal s-1")
    _stop(lake, [running], StopRequest("stop-1", None), notifier)
    (record,) = sink_records(lake, "n")
    assert (record["type"], record["additional_data"]) == ("ABORTED", {"connector_name": "orders"})
    assert running.stopped


def test_a_line_cut_by_a_crash_is_ended_not_run_into(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    notifier = Notifier(lake, "orders", sink_topic="n")
    notifier.job(_job(), NotificationType.STARTED)
    sink = tmp_path / "_state" / "n.jsonl"
    sink.write_bytes(sink.read_bytes() + b'{"id": "cut off mid-wr')
    notifier.job(_job(), NotificationType.COMPLETED)
    assert [r["type"] for r in sink_records(lake, "n")] == ["STARTED", "COMPLETED"]


def test_reading_after_a_position_takes_only_the_newer_whole_lines(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    notifier = Notifier(lake, "orders", sink_topic="n")
    notifier.job(_job(), NotificationType.STARTED)
    records, position = sink_records_after(lake, "n", SinkPosition())
    assert [r["type"] for r in records] == ["STARTED"]
    sink = tmp_path / "_state" / "n.jsonl"
    assert position == SinkPosition(1, sink.stat().st_size)
    sink.write_bytes(sink.read_bytes() + b'{"id": "still being wr')  # no line end yet
    assert sink_records_after(lake, "n", position) == ([], position)
    notifier.job(_job(), NotificationType.COMPLETED)
    records, after = sink_records_after(lake, "n", position)
    assert [r["type"] for r in records] == ["COMPLETED"]
    assert after == SinkPosition(2, sink.stat().st_size)


def test_a_changed_lines_file_is_counted_from_its_start_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lake = Lake(str(tmp_path))
    notifier = Notifier(lake, "orders", sink_topic="n")
    for kind in (NotificationType.STARTED, NotificationType.IN_PROGRESS):
        notifier.job(_job(), kind)
    records, _ = sink_records_after(lake, "n", SinkPosition(1, 10_000))  # past its end
    assert [r["type"] for r in records] == ["IN_PROGRESS"]
    assert "changed since the notifications table read it" in caplog.text


def test_a_table_row_has_debeziums_fields_typed_and_the_pipeline() -> None:
    record = {"id": "s-1", "aggregate_type": "Incremental Snapshot", "type": "COMPLETED",
              "additional_data": {"connector_name": "orders"}, "timestamp": 1_795_000_000_000}  # fmt: skip
    assert table_row(7, record) == (
        "orders", 7, "s-1", "Incremental Snapshot", "COMPLETED", {"connector_name": "orders"},
        1_795_000_000_000,
    )  # fmt: skip
