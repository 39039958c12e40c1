"""Debezium's notifications of snapshot progress: a log line and/or a line in the lake.

`source.notification.enabled.channels` picks the channels: `log` (one `cdc_core.notifications`
log line per notification) and `sink` (Debezium's Kafka topic, here
`<root>/_state/<notification.sink.topic.name>.jsonl`, one JSON line per notification, appended
and fsynced; on an object store, which cannot append, a folder of one object per notification
named by its time). A notification has Debezium's fields and names: `id`, `aggregate_type`
("Initial Snapshot", or "Incremental Snapshot"), `type` (STARTED, IN_PROGRESS,
TABLE_SCAN_COMPLETED, COMPLETED, ABORTED; PAUSED and RESUMED for incremental snapshots),
`additional_data` (strings, as Debezium's Map<String,String>) and `timestamp` (epoch
milliseconds).
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
from typing import TYPE_CHECKING, Any

from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.state import write_text
from cdc_core.storage import Location

if TYPE_CHECKING:
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
    if kind is not NotificationType.STARTED or job.kind == "incremental":
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
    records = []
    for line in lines:
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            records.append(data)
    return records
