"""Debezium's notifications of snapshot progress: a log line and/or a line in the lake.

`source.notification.enabled.channels` picks the channels: `log` (one `cdc_core.notifications`
log line per notification) and `sink` (Debezium's Kafka topic, here
`<root>/_state/<notification.sink.topic.name>.jsonl`, one JSON line per notification, appended
and fsynced; on an object store, which cannot append, a folder of one object per notification
named by its time). A notification has Debezium's fields and names: `id`, `aggregate_type`
("Initial Snapshot", or "Incremental Snapshot"), `type` (STARTED, IN_PROGRESS,
TABLE_SCAN_COMPLETED, COMPLETED, ABORTED; PAUSED and RESUMED for incremental snapshots),
`additional_data` (strings, as Debezium's Map<String,String>) and `timestamp` (epoch
milliseconds). The Delta table `_state/<topic>.delta` catches up from the sink's lines
(`flush_notifications_table`), for SQL.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.state import json_line, write_text
from cdc_core.storage import Location, ObjectPath

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdc_core.config.model import PipelineConfig
    from cdc_core.snapshot import SnapshotJob, TableSnapshot

log = logging.getLogger("cdc_core.notifications")

INITIAL_SNAPSHOT = "Initial Snapshot"
INCREMENTAL_SNAPSHOT = "Incremental Snapshot"


class NotificationType(Enum):
    """Debezium's snapshot statuses that this product sends."""

    STARTED = "STARTED"
    IN_PROGRESS = "IN_PROGRESS"
    TABLE_SCAN_COMPLETED = "TABLE_SCAN_COMPLETED"
    COMPLETED = "COMPLETED"
    ABORTED = "ABORTED"
    PAUSED = "PAUSED"  # by a pause-snapshot signal (incremental snapshots only)
    RESUMED = "RESUMED"  # by a resume-snapshot signal


class TableScanStatus(Enum):
    """How a table's scan ended (Debezium's `TableScanCompletionStatus` names)."""

    SUCCEEDED = "SUCCEEDED"
    EMPTY = "EMPTY"  # the table had no rows (to read)
    SKIPPED = "SKIPPED"  # the table was dropped while its snapshot ran


@dataclass(frozen=True)
class Notification:
    """One notification, in Debezium's format."""

    id: str
    aggregate_type: str
    type: NotificationType
    additional_data: Mapping[str, str]
    timestamp: int = field(default_factory=lambda: time.time_ns() // 1_000_000)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "aggregate_type": self.aggregate_type, "type": self.type.value,
            "additional_data": dict(self.additional_data), "timestamp": self.timestamp,
        }  # fmt: skip


def aggregate_type(job: SnapshotJob) -> str:
    """Debezium runs a blocking snapshot through its initial snapshot code, which reports it as
    "Initial Snapshot"; an incremental one is "Incremental Snapshot"."""
    return INCREMENTAL_SNAPSHOT if job.kind == "incremental" else INITIAL_SNAPSHOT


def of_job(
    connector: str, job: SnapshotJob, kind: NotificationType, part: TableSnapshot | None = None,
    *, status: TableScanStatus | None = None, collections: Sequence[TableName] | None = None,
) -> Notification:  # fmt: skip
    """The notification of `kind` about `job` (and its table `part`). The id is random for an
    initial snapshot, and, as in Debezium, the execute-snapshot signal's id for an incremental
    one asked by a signal (so all of a snapshot's notifications share it); other incremental
    snapshots (new tables, `cdc snapshot`) use the job's id."""
    data = {"connector_name": connector}
    if kind is NotificationType.ABORTED:  # as Debezium's: the tables a stop listed, if any
        listed = collections is not None
    else:  # COMPLETED carries none, nor does an initial snapshot's STARTED
        listed = kind is not NotificationType.COMPLETED and (
            kind is not NotificationType.STARTED or job.kind == "incremental"
        )
    if listed:
        tables = [t.table for t in job.tables] if collections is None else collections
        data["data_collections"] = ",".join(str(t) for t in tables)
    if part is not None and kind is NotificationType.IN_PROGRESS:
        data["current_collection_in_progress"] = str(part.table)
        data["total_rows_scanned"] = str(part.rows)  # so far; not in Debezium's IN_PROGRESS
    if part is not None and kind is NotificationType.TABLE_SCAN_COMPLETED:
        data["scanned_collection"] = str(part.table)
        data["total_rows_scanned"] = str(part.rows)
        data["status"] = (status or TableScanStatus.SUCCEEDED).value
    if job.kind in {"initial", "blocking"}:
        ident = str(uuid.uuid4())
    else:
        ident = job.origin.removeprefix("signal ") if job.origin.startswith("signal ") else job.id
    return Notification(ident, aggregate_type(job), kind, data)


def sink_location(lake: Lake, topic: str) -> Location:
    """Where the sink channel writes: a JSON lines file, or a folder on an object store."""
    state = lake.state
    return state / f"{topic}.jsonl" if isinstance(state, Path) else state / topic


@dataclass(frozen=True)
class Notifier:
    """Sends notifications to the enabled channels; with none enabled it does nothing."""

    lake: Lake
    connector: str = ""
    log_channel: bool = False
    sink_topic: str | None = None  # the sink channel is enabled when this is set

    @classmethod
    def of(cls, pipeline: PipelineConfig, lake: Lake) -> Notifier:
        source = pipeline.source
        channels = source.notification_enabled_channels.names
        topic = source.notification_sink_topic_name if "sink" in channels else None
        return cls(lake, pipeline.name, "log" in channels, topic)

    @property
    def enabled(self) -> bool:
        return self.log_channel or self.sink_topic is not None

    def job(
        self, job: SnapshotJob, kind: NotificationType, part: TableSnapshot | None = None,
        *, status: TableScanStatus | None = None, collections: Sequence[TableName] | None = None,
    ) -> None:  # fmt: skip
        if self.enabled:
            self.send(
                of_job(self.connector, job, kind, part, status=status, collections=collections)
            )

    def send(self, notification: Notification) -> None:
        """Sink first, then log: a sink write that fails fails the run, as any lake write does
        (it is a record users rely on), and the log line then does not claim it went out."""
        line = json.dumps(notification.to_json(), sort_keys=True)
        if self.sink_topic is not None:
            _append(sink_location(self.lake, self.sink_topic), notification, line)
        if self.log_channel:
            log.info("notification %s", line)


def _append(where: Location, notification: Notification, line: str) -> None:
    if not isinstance(where, Path):  # no appends on an object store: one object each
        write_text(where / f"{notification.timestamp:013d}-{uuid.uuid4().hex}.json", line)
        return
    where.parent.mkdir(parents=True, exist_ok=True)
    with where.open("a+b") as f:
        if f.tell() > 0:  # a line cut by a crash mid-write is ended first, not run into
            f.seek(f.tell() - 1)
            cut = f.read(1) != b"\n"
            f.seek(0, os.SEEK_END)
            if cut:
                f.write(b"\n")
        f.write(line.encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


def sink_records(lake: Lake, topic: str) -> list[dict[str, Any]]:
    """The notifications the sink channel wrote, oldest first (a line cut by a crash mid-write
    is left out)."""
    where = sink_location(lake, topic)
    if isinstance(where, Path):
        try:
            lines = where.read_bytes().splitlines()
        except FileNotFoundError:
            return []
    else:
        lines = [p.read_bytes() for p in sorted(where.glob("*.json"), key=lambda p: p.name)]
    return [r for r in map(json_line, lines) if r is not None]


NOTIFICATIONS_APP = "cdc-notifications"
NOTIFICATIONS_WATERMARK = "notifications_held"  # how many of the sink's notifications it holds
_AFTER = "notifications_after"  # where the next one starts (`SinkPosition.after`)
_TABLE_SCHEMA = (
    "pipeline string, seq bigint, id string, aggregate_type string, type string, "
    "additional_data map<string,string>, timestamp bigint"
)


def notifications_table(lake: Lake, topic: str) -> str:
    """The Delta table of the sink's notifications, beside its lines: `_state/<topic>.delta`.
    Not `_state/<topic>`: on an object store that is the sink's own folder of objects, and a
    topic may be named like another `_state` entry (`metrics`, `snapshots`)."""
    return f"{lake.root}/_state/{topic}.delta"


@dataclass(frozen=True)
class SinkPosition:
    """How far into the sink a reader got: `held` notifications, and where the next one starts
    (`after`: a byte offset in the lines file, or on an object store the newest object's name;
    None: past the first `held`). Nothing rewrites or prunes the lines, so both stay valid."""

    held: int = 0
    after: int | str | None = None


def sink_records_after(
    lake: Lake, topic: str, position: SinkPosition
) -> tuple[list[dict[str, Any]], SinkPosition]:
    """The notifications the sink wrote after `position`, oldest first, and the position after
    them. Only whole lines are taken: one still without its end (a crash mid-write, or a write
    under way) waits, and a cut one is left out as `sink_records` leaves it out."""
    where = sink_location(lake, topic)
    if isinstance(where, ObjectPath):
        return _objects_after(where, position)
    try:
        f = where.open("rb")
    except FileNotFoundError:
        return [], position
    with f:
        size = f.seek(0, os.SEEK_END)
        start, skip = 0, position.held
        if isinstance(position.after, int) and _line_starts_at(f, position.after, size):
            start, skip = position.after, 0
        elif position.after is not None:
            log.warning("%s changed since the notifications table read it: its notifications "
                        "are counted from its start again", where)  # fmt: skip
        f.seek(start)
        data = f.read()
    end = data.rfind(b"\n") + 1
    records = [r for r in map(json_line, data[:end].split(b"\n")) if r is not None]
    fresh = records[skip:]
    return fresh, SinkPosition(position.held + len(fresh), start + end)


def _line_starts_at(f: BinaryIO, offset: int, size: int) -> bool:
    """Whether a held position still ends a line (the file was not cut or replaced)."""
    if offset == 0:
        return True
    if offset > size:
        return False
    f.seek(offset - 1)
    return f.read(1) == b"\n"


def _objects_after(
    folder: ObjectPath, position: SinkPosition
) -> tuple[list[dict[str, Any]], SinkPosition]:
    """Objects are named by their notification's time, so the new ones sort after the newest
    held (only ingest writes them, and the table catches up after its writes)."""
    names = sorted(p.name for p in folder.glob("*.json"))
    after = position.after
    fresh = [n for n in names if n > after] if isinstance(after, str) else names[position.held :]
    records = [r for r in (json_line((folder / n).read_bytes()) for n in fresh) if r is not None]
    return records, SinkPosition(position.held + len(records), fresh[-1] if fresh else after)


def table_row(seq: int, record: Mapping[str, Any]) -> tuple[object, ...]:
    """A sink record as a row of the notifications table (`_TABLE_SCHEMA`); `seq` is its place
    in the sink, from 1. `pipeline` is the record's `connector_name`."""
    data = record.get("additional_data")
    extra = {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    stamp = record.get("timestamp")

    def text(key: str) -> str | None:
        value = record.get(key)
        return None if value is None else str(value)

    return (extra.get("connector_name"), seq, text("id"), text("aggregate_type"), text("type"),
            extra, int(stamp) if isinstance(stamp, int | float) else None)  # fmt: skip


def flush_notifications_table(spark: SparkSession, lake: Lake, topic: str) -> int:
    """Append to the Delta table `notifications_table` the sink's notifications it does not
    hold yet, in one commit; returns how many. The lines are the record and the table catches
    up from them, when the metrics table does. The commit records how many notifications it
    holds and where the next one starts, so the rows and that position land together or not at
    all, and Delta's txnAppId/txnVersion (that count) keep a retried append from doubling
    them: a crash anywhere loses none and repeats none. `sent_at` is `timestamp` as a time."""
    from pyspark.sql import functions as F

    from cdc_core.lake_state import committing, read_watermark

    if not sink_location(lake, topic).exists():
        return 0
    path = notifications_table(lake, topic)
    mark = read_watermark(spark, path, NOTIFICATIONS_WATERMARK)
    if mark is None:
        held = SinkPosition(_newest_seq_in(spark, path))
    else:
        after = mark.get(_AFTER)
        held = SinkPosition(int(str(mark[NOTIFICATIONS_WATERMARK])),
                            after if isinstance(after, int | str) else None)  # fmt: skip
    records, position = sink_records_after(lake, topic, held)
    if not records:
        return 0
    rows = [table_row(held.held + i, r) for i, r in enumerate(records, 1)]
    table = spark.createDataFrame(rows, _TABLE_SCHEMA)
    table = table.withColumn("sent_at", F.timestamp_millis("timestamp"))
    metadata = {NOTIFICATIONS_WATERMARK: position.held, _AFTER: position.after}
    with committing(spark, metadata, app_id=NOTIFICATIONS_APP, version=position.held):
        table.write.format("delta").mode("append").save(path)
    return len(records)


def _newest_seq_in(spark: SparkSession, path: str) -> int:
    """How many notifications a table holds whose position is not among its last commits (its
    largest `seq`; 0: no table)."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return 0
    row = spark.read.format("delta").load(path).selectExpr("max(seq)").first()
    return int(row[0]) if row and row[0] is not None else 0
