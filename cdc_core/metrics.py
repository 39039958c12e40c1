"""What each batch did, for `cdc status`, dashboards and alerts: one JSON line per batch.

`<root>/_state/batches.jsonl` gets a line when a batch ends (`--once` runs are one batch): when
it ran, the LSN range it staged, its changes and transactions, and its freshness: for every
change it made visible in silver, the time from the change's commit in PostgreSQL to the end of
the silver MERGE that applied it (p50, p99, max). Debezium's metric names are kept where they
carry over (`MilliSecondsBehindSource`: the newest change's lag; `TotalNumberOfEventsSeen` and
`NumberOfCommittedTransactions`: totals of this process; `SnapshotRunning`, `SnapshotPaused`,
`SnapshotPausedDurationInSeconds`, `RowsScanned`, the snapshot's table counts, duration and
abort; the last staged change's transaction, position and commit time; the tables captured;
`NumberOfErroneousEvents`: changes silver set aside as dead letters, and
`NumberOfEventsFiltered`: changes the reader received and dropped on purpose, totals of this
process).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.stager import reading_staged
from cdc_core.state import json_line, write_text
from cdc_core.storage import Location, ObjectPath, arrow, publish, temporary_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdc_core.snapshot import SnapshotJob

log = logging.getLogger("cdc_core.metrics")

_TAIL_BYTES = 64 << 10  # read from the end a chunk at a time
_DAY_S = 86_400.0


def batches_file(lake: Lake) -> Location:
    """One line per batch; on an object store (no appends) a folder of one object per batch."""
    state = lake.state
    return state / "batches.jsonl" if isinstance(state, Path) else state / "batches"


@dataclass(frozen=True)
class Freshness:
    """Seconds from source commit to visible in silver, over the changes of one batch."""

    p50_s: float | None = None
    p99_s: float | None = None
    max_s: float | None = None
    newest_s: float | None = None  # the most recently committed change's lag

    @classmethod
    def of(cls, commit_times_us: pa.Array, visible_us: int) -> Freshness:
        return cls.over([(commit_times_us, visible_us)])

    @classmethod
    def over(cls, parts: Sequence[tuple[pa.Array, int]]) -> Freshness:
        """Over changes made visible at different moments of a batch: (commit times, when)."""
        parts = [(times, visible) for times, visible in parts if len(times)]
        if not parts:
            return cls()
        lag = pa.chunked_array(
            [pc.divide(pc.subtract(pa.scalar(v, pa.int64()), t), 1e6) for t, v in parts],
            pa.float64(),
        )  # fmt: skip
        p50, p99 = pc.quantile(lag, q=[0.5, 0.99], interpolation="nearest").to_pylist()
        times, visible = max(parts, key=lambda part: pc.max(part[0]).as_py())
        newest = (visible - pc.max(times).as_py()) / 1e6
        return cls(p50, p99, pc.max(lag).as_py(), newest)


@dataclass(frozen=True)
class LastChange:
    """The newest change a batch staged (the highest commit LSN, then position), for Debezium's
    SourceEventPosition and LastEvent, and the transaction id of the newest change inside a
    transaction, for LastTransactionId (a lone logical message has none)."""

    lsn: int
    commit_lsn: int
    commit_time_us: int
    xid: int | None

    @classmethod
    def of(cls, table: pa.Table) -> LastChange | None:
        """The newest change of staged rows (commit_lsn, seq, lsn, xid, commit_time_us)."""
        if not table.num_rows:
            return None
        order = [("commit_lsn", "descending"), ("seq", "descending")]
        row = table.take(pc.sort_indices(table, sort_keys=order)[:1]).to_pylist()[0]
        in_transaction = table.filter(pc.not_equal(table["xid"], 0))
        xid = None
        if in_transaction.num_rows:
            newest = pc.sort_indices(in_transaction, sort_keys=order)[:1]
            xid = int(in_transaction.take(newest)["xid"][0].as_py())
        return cls(int(row["lsn"]), int(row["commit_lsn"]), int(row["commit_time_us"]), xid)


@dataclass(frozen=True)
class StagedFacts:
    """What a batch's metrics need of its staged files, read from their small columns."""

    commit_times_us: pa.Array  # one per change: its transaction's commit time
    ops: dict[str, int]  # changes per envelope op (c, u, d, t, m)
    last: LastChange | None = None  # None: the batch staged nothing (or its files are gone)


_FACT_COLUMNS = ["commit_time_us", "op", "commit_lsn", "seq", "lsn", "xid"]


def staged_facts(staged: Sequence[Location]) -> StagedFacts:
    """The commit times (for the changes' freshness once silver shows them, `Freshness.of`),
    the operations and the newest change of the changes in `staged` files. Read before bronze
    takes the files: maintenance removes a staged file bronze holds, at any time; a file
    already gone is left out, with a warning."""
    tables = []
    for p in staged:
        where, fs = arrow(p)
        try:
            with reading_staged(p):
                tables.append(pq.read_table(where, columns=_FACT_COLUMNS, filesystem=fs))
        except FileNotFoundError:
            log.warning("freshness leaves out %s: it was removed (maintenance)", p)
    if not tables:
        return StagedFacts(pa.array([], pa.int64()), {})
    rows = pa.concat_tables(tables)
    counts = pc.value_counts(rows["op"]).to_pylist()
    return StagedFacts(
        rows["commit_time_us"].combine_chunks(),
        {str(c["values"]): int(c["counts"]) for c in counts},
        LastChange.of(rows),
    )


@dataclass
class Totals:
    """Counters over the batches of one process (Debezium's are per connector task)."""

    events: int = 0
    transactions: int = 0
    ops: dict[str, int] = field(default_factory=dict)  # changes per envelope op
    snapshot_completed: bool = False  # a snapshot read to its end since, and none begun after
    snapshot_aborted: bool = False  # a snapshot stopped since, and none under way after
    snapshot_seconds: int | None = None  # how long the last snapshot ran (or has been running)
    erroneous: int = 0  # changes silver set aside (dead letters, under warn or skip)
    filtered: int = 0  # changes the reader dropped: tables not captured, skipped.operations, ...
    batches: int = 0
    table_flushed: float | None = None  # monotonic time of the last metrics-table append


def now_us() -> int:
    return int(datetime.now(timezone.utc).timestamp() * 1_000_000)


def iso(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, timezone.utc).isoformat(timespec="milliseconds")


_LAST_CHANGE_KEYS = ("LastTransactionId", "SourceEventPosition", "LastEvent")


def last_change_fields(
    last: LastChange | None, previous: dict[str, Any] | None, now: int
) -> dict[str, Any]:
    """Debezium's LastTransactionId, SourceEventPosition, LastEvent (here the commit time of the
    newest change staged) and MilliSecondsSinceLastEvent (from that commit time to `now`): of
    the newest change this batch staged; a batch that staged none keeps the previous batch
    line's, so the time since the last event grows while the source is quiet."""
    before = previous or {}
    fields = {key: before.get(key) for key in _LAST_CHANGE_KEYS}
    if last is not None:
        position = {"lsn": str(Lsn(last.lsn)), "commit_lsn": str(Lsn(last.commit_lsn))}
        fields["SourceEventPosition"] = position
        fields["LastEvent"] = iso(last.commit_time_us)
        if last.xid is not None:  # else a lone logical message: the last transaction stands
            fields["LastTransactionId"] = last.xid
    event, since = fields["LastEvent"], None
    if event is not None:
        since = (now - int(datetime.fromisoformat(str(event)).timestamp() * 1e6)) // 1000
    return fields | {"MilliSecondsSinceLastEvent": since}


def snapshot_fields(
    totals: Totals, jobs: Sequence[SnapshotJob], *, aborted: bool, now: int
) -> dict[str, Any]:
    """Debezium's TotalTableCount and RemainingTableCount (the tables of the snapshot jobs this
    batch ran; a stopped job has none left), SnapshotAborted (`aborted`: a job stopped by a
    stop-snapshot signal or because the slot lost its WAL; true until a snapshot runs again)
    and SnapshotDurationInSeconds (since the oldest of them was created, paused time included,
    to the end of the batch that finished or stopped it: that value stays)."""
    if aborted:
        totals.snapshot_aborted = True
    elif any(not j.stopped for j in jobs):
        totals.snapshot_aborted = False
    if jobs:
        totals.snapshot_seconds = max(0, now - min(j.created_us for j in jobs)) // 1_000_000
    return {
        "TotalTableCount": sum(len(j.tables) for j in jobs),
        "RemainingTableCount": sum(
            1 for j in jobs if not j.stopped for part in j.tables if not part.done
        ),
        "SnapshotAborted": totals.snapshot_aborted,
        "SnapshotDurationInSeconds": totals.snapshot_seconds,
    }


def last_batch(lake: Lake) -> dict[str, Any] | None:
    """The newest batch line, or None."""
    path = batches_file(lake)
    if isinstance(path, ObjectPath):
        return _BatchObjects(path).last()
    return next(_newest_first(path), None)


def _newest_first(path: Path) -> Iterator[dict[str, Any]]:
    """The file's batch lines, newest first, read from its end a chunk at a time (a line may
    be longer than a chunk: a batch of thousands of tables lists them all). Lines that do not
    parse (cut by a crash mid-write) are passed over."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return
    with f:
        end = f.seek(0, os.SEEK_END)
        tail = b""
        while end > 0:
            start = max(0, end - _TAIL_BYTES)
            f.seek(start)
            lines = (f.read(end - start) + tail).split(b"\n")
            tail = lines.pop(0) if start > 0 else b""  # a line cut by the chunk boundary
            for line in reversed(lines):
                record = json_line(line)
                if record is not None:
                    yield record
            end = start


def record_batch(lake: Lake, record: dict[str, Any]) -> None:
    """Append one batch line, durably."""
    path = batches_file(lake)
    if isinstance(path, ObjectPath):
        _BatchObjects(path).record(record)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    with path.open("a+b") as f:  # writes go to the end, wherever reads seek
        end = f.seek(0, os.SEEK_END)
        if end:
            f.seek(end - 1)
            if f.read(1) != b"\n":  # the last line was cut by a crash mid-write: end it
                line = b"\n" + line
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


OP_COUNTERS = (  # Debezium's streaming counters of one kind of change, by envelope op
    ("c", "TotalNumberOfCreateEventsSeen"),
    ("u", "TotalNumberOfUpdateEventsSeen"),
    ("d", "TotalNumberOfDeleteEventsSeen"),
)

_PROMETHEUS = (  # (metric, batch-line key, type, help)
    ("cdc_milliseconds_behind_source", "MilliSecondsBehindSource", "gauge",
     "lag of the newest change of the last batch, commit to visible in silver"),
    ("cdc_total_number_of_events_seen", "TotalNumberOfEventsSeen", "counter",
     "changes staged by this process"),
    ("cdc_number_of_committed_transactions", "NumberOfCommittedTransactions", "counter",
     "transactions staged by this process"),
    ("cdc_total_number_of_create_events_seen", "TotalNumberOfCreateEventsSeen", "counter",
     "inserts staged by this process"),
    ("cdc_total_number_of_update_events_seen", "TotalNumberOfUpdateEventsSeen", "counter",
     "updates staged by this process"),
    ("cdc_total_number_of_delete_events_seen", "TotalNumberOfDeleteEventsSeen", "counter",
     "deletes staged by this process"),
    ("cdc_number_of_erroneous_events", "NumberOfErroneousEvents", "counter",
     "changes silver set aside in _state/dead_letters by this process (failure handling warn, "
     "skip)"),
    ("cdc_number_of_events_filtered", "NumberOfEventsFiltered", "counter",
     "changes read from the slot and dropped by this process: tables not captured, "
     "skipped.operations, logical messages filtered out or not ours"),
    ("cdc_snapshot_running", "SnapshotRunning", "gauge", "1 while a snapshot is being read"),
    ("cdc_snapshot_completed", "SnapshotCompleted", "gauge",
     "1 once this process has read a snapshot to its end (0 again while a new one runs)"),
    ("cdc_snapshot_paused", "SnapshotPaused", "gauge",
     "1 while an incremental snapshot is paused (pause-snapshot signal)"),
    ("cdc_snapshot_paused_duration_in_seconds", "SnapshotPausedDurationInSeconds", "gauge",
     "time the running incremental snapshot has been paused"),
    ("cdc_rows_scanned", "RowsScanned", "gauge", "snapshot rows read by the last batch"),
    ("cdc_snapshot_aborted", "SnapshotAborted", "gauge",
     "1 once a snapshot was stopped (stop-snapshot signal, lost slot), until one runs again"),
    ("cdc_snapshot_duration_in_seconds", "SnapshotDurationInSeconds", "gauge",
     "time the running (or last) snapshot has taken since it began, paused time included"),
    ("cdc_total_table_count", "TotalTableCount", "gauge",
     "tables of the snapshots the last batch ran"),
    ("cdc_remaining_table_count", "RemainingTableCount", "gauge",
     "tables of the snapshots the last batch ran that are not done yet"),
    ("cdc_last_transaction_id", "LastTransactionId", "gauge",
     "transaction id (32-bit xid) of the last transaction staged"),
    ("cdc_milliseconds_since_last_event", "MilliSecondsSinceLastEvent", "gauge",
     "time from the commit of the last change staged to the end of the last batch"),
    ("cdc_slot_retained_wal_bytes", "retained_wal_bytes", "gauge",
     "WAL the source keeps for the pipeline's slot (current WAL position - restart_lsn): "
     "alert on it before the source's disk fills"),
    ("cdc_batch_seconds", "seconds", "gauge", "duration of the last batch"),
    ("cdc_batch_changes", "changes", "gauge", "changes staged by the last batch"),
    ("cdc_batch_number", "batch", "counter", "batches run by the pipeline"),
)  # fmt: skip


def prometheus_text(record: dict[str, Any], *, connected: bool = True) -> str:
    """The batch line in Prometheus' text exposition format (for node_exporter's textfile
    collector): Debezium's metric names in snake case, labelled by pipeline. `connected`:
    whether the source could be reached (a batch that ran did reach it)."""
    label = f'{{pipeline="{_escape(record["pipeline"])}"}}'
    lines = ["# HELP cdc_connected 1 when the last batch reached the source, 0 while it cannot",
             "# TYPE cdc_connected gauge", f"cdc_connected{label} {float(connected)}"]  # fmt: skip
    for name, key, kind, text in _PROMETHEUS:
        value = record.get(key)
        if value is None:
            continue
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name}{label} {float(value)}"]
    position = record.get("SourceEventPosition") or {}
    for part in ("lsn", "commit_lsn"):  # bytes, as Debezium's offsets give LSNs
        if position.get(part) is not None:
            name, lsn = f"cdc_source_event_position_{part}", Lsn.parse(str(position[part]))
            lines += [f"# HELP {name} {part} of the last change staged, in bytes",
                      f"# TYPE {name} gauge", f"{name}{label} {float(lsn.value)}"]  # fmt: skip
    tables = record.get("CapturedTables")
    if tables is not None:
        lines += ["# HELP cdc_captured_table 1 for each table the last batch captured",
                  "# TYPE cdc_captured_table gauge"]  # fmt: skip
        lines += [f'cdc_captured_table{label[:-1]},table="{_escape(t)}"}} 1.0' for t in tables]
    lines += ["# HELP cdc_freshness_seconds commit to visible in silver, changes of the last batch",
              "# TYPE cdc_freshness_seconds gauge"]  # fmt: skip
    for q, key in (
        ("0.5", "freshness_p50_s"),
        ("0.99", "freshness_p99_s"),
        ("1", "freshness_max_s"),
    ):
        if record.get(key) is not None:
            lines.append(f'cdc_freshness_seconds{label[:-1]},quantile="{q}"}} {record[key]}')
    for name, key, text in (
        ("cdc_last_batch_timestamp_seconds", "ended_at", "when the last batch ended"),
        ("cdc_last_event_timestamp_seconds", "LastEvent", "commit time of the last change staged"),
    ):
        if record.get(key) is not None:
            seconds = datetime.fromisoformat(str(record[key])).timestamp()
            lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name}{label} {seconds}"]
    return "\n".join(lines) + "\n"


def _escape(value: object) -> str:
    """A label value in the text format."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_file(lake: Lake) -> Location:
    return lake.state / "metrics.prom"


def write_prometheus(lake: Lake, record: dict[str, Any], *, connected: bool = True) -> None:
    """Replace the textfile in one step: a scrape sees the old batch or the new one."""
    write_text(prometheus_file(lake), prometheus_text(record, connected=connected))


_TABLE_COLUMNS = (  # the Delta metrics table: the batch line's keys, typed
    ("pipeline", "string"), ("batch", "bigint"), ("started_at", "timestamp"),
    ("visible_at", "timestamp"), ("ended_at", "timestamp"), ("seconds", "double"),
    ("lsn_from", "string"), ("lsn_to", "string"), ("confirmed", "string"), ("changes", "bigint"),
    ("transactions", "bigint"), ("bronze_changes", "bigint"), ("silver_changes", "bigint"),
    ("freshness_p50_s", "double"), ("freshness_p99_s", "double"), ("freshness_max_s", "double"),
    ("MilliSecondsBehindSource", "bigint"), ("TotalNumberOfEventsSeen", "bigint"),
    ("NumberOfCommittedTransactions", "bigint"), ("SnapshotRunning", "boolean"),
    ("RowsScanned", "bigint"), ("errors", "array<string>"), ("SnapshotPaused", "boolean"),
    ("SnapshotPausedDurationInSeconds", "bigint"), ("retained_wal_bytes", "bigint"),
    ("TotalNumberOfCreateEventsSeen", "bigint"), ("TotalNumberOfUpdateEventsSeen", "bigint"),
    ("TotalNumberOfDeleteEventsSeen", "bigint"), ("SnapshotCompleted", "boolean"),
    ("LastTransactionId", "bigint"), ("SourceEventPosition", "map<string,string>"),
    ("LastEvent", "timestamp"), ("MilliSecondsSinceLastEvent", "bigint"),
    ("CapturedTables", "array<string>"), ("TotalTableCount", "bigint"),
    ("RemainingTableCount", "bigint"), ("SnapshotAborted", "boolean"),
    ("SnapshotDurationInSeconds", "bigint"), ("NumberOfErroneousEvents", "bigint"),
    ("NumberOfEventsFiltered", "bigint"),
)  # fmt: skip
METRICS_APP = "cdc-metrics"
METRICS_WATERMARK = "metrics_batch"  # the newest batch line the table holds


def metrics_table(lake: Lake) -> str:
    return f"{lake.root}/_state/metrics"


def metrics_table_age(lake: Lake) -> float | None:
    """Seconds since the metrics table's newest commit (its log read directly, on a local file
    system or an object store); None when it has none (then an append is due)."""
    from cdc_core import delta_log

    table = lake.place(metrics_table(lake))
    version = delta_log.newest_version(table)
    if version is None:
        return None
    try:
        return time.time() - (table / "_delta_log" / f"{version:020d}.json").stat().st_mtime
    except FileNotFoundError:
        return None


def flush_metrics_table(spark: SparkSession, lake: Lake, *, keep_days: int | None = None) -> int:
    """Append to the Delta table `_state/metrics` (SQL over the history) the batch lines it
    does not hold yet, in one commit; returns how many. The JSON lines are written first and
    are the record; the table catches up from them, so `--continuous` appends every
    `capture.metrics_table_interval_s` rather than paying a Delta commit per batch. The commit
    records the newest batch it holds, and Delta's txnAppId/txnVersion (that batch number)
    keep a retried append from doubling it. Then, with `keep_days`, the lines older than that
    which the table holds are dropped (`prune_batch_lines`)."""
    from pyspark.sql import functions as F

    from cdc_core.lake_state import committing, read_watermark

    path = metrics_table(lake)
    mark = read_watermark(spark, path, METRICS_WATERMARK)
    held = int(str(mark[METRICS_WATERMARK])) if mark else _newest_batch_in(spark, path)
    lines = batch_lines_after(lake, held)
    if lines:
        newest = int(lines[-1]["batch"])
        text = spark.createDataFrame([(json.dumps(r),) for r in lines], "line string")
        schema = ", ".join(f"`{name}` {kind}" for name, kind in _TABLE_COLUMNS)
        times = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"}
        rows = text.select(F.from_json("line", schema, times).alias("m")).select("m.*")
        with committing(spark, {METRICS_WATERMARK: newest}, app_id=METRICS_APP, version=newest):
            rows.write.format("delta").mode("append").option("mergeSchema", "true").save(path)
        held = newest
    if keep_days is not None:
        try:
            prune_batch_lines(lake, held, keep_days)
        except OSError as e:  # housekeeping: the batch and its line are already durable
            log.warning("old batch lines not dropped this time: %s", e)
    return len(lines)


def _newest_batch_in(spark: SparkSession, path: str) -> int:
    """The newest batch of a metrics table written before it recorded a watermark (0: none)."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return 0
    row = spark.read.format("delta").load(path).selectExpr("max(batch)").first()
    return int(row[0]) if row and row[0] is not None else 0


def batch_lines_after(lake: Lake, batch: int) -> list[dict[str, Any]]:
    """The batch lines numbered above `batch`, oldest first; reads the file from its end, so a
    long-lived pipeline's history is not read again."""
    path = batches_file(lake)
    if isinstance(path, ObjectPath):
        return _BatchObjects(path).after(batch)
    found: list[dict[str, Any]] = []
    for record in _newest_first(path):
        if int(record.get("batch", 0)) <= batch:
            break
        found.append(record)
    return found[::-1]


def prune_batch_lines(lake: Lake, held: int, keep_days: int, *, now_s: float | None = None) -> int:
    """Drop the batch lines that ended more than `keep_days` days ago and that the metrics table
    holds (numbered `held` or below); returns how many went. The newest line always stays: the
    next batch is numbered from it. Only ingest writes the lines, under the run lock, and the
    file is replaced in one step (a reader sees the old or the new one). Nothing is rewritten
    until the oldest line is a day past the cutoff, so that happens about once a day; only the
    lines up to the first one kept are parsed, the rest is copied as it is."""
    cutoff = (time.time() if now_s is None else now_s) - keep_days * _DAY_S
    path = batches_file(lake)
    if isinstance(path, ObjectPath):
        return _BatchObjects(path).prune(held, cutoff)

    def goes(record: dict[str, Any]) -> bool:
        return int(record.get("batch", 0)) <= held and _ended_s(record) < cutoff

    try:
        f = path.open("rb")
    except FileNotFoundError:
        return 0
    with f:
        oldest = next(filter(None, map(json_line, f)), None)
        if oldest is None or _ended_s(oldest) >= cutoff - _DAY_S or not goes(oldest):
            return 0
        f.seek(0)
        tmp = temporary_for(path)
        dropped, held_back = 0, None  # held back: a line that goes unless it is the newest
        with tmp.open("wb") as out:
            for line in f:
                record = json_line(line)
                if record is None:
                    continue  # a line cut by a crash
                dropped += held_back is not None
                held_back = line.rstrip(b"\n") + b"\n"
                if not goes(record):  # lines are in batch and time order: the rest all stay
                    break
            if held_back is not None:
                out.write(held_back)
                shutil.copyfileobj(f, out)
    publish(tmp, path)
    return dropped


def _ended_s(record: dict[str, Any]) -> float:
    """When a batch line's batch ended; a line without a readable time never expires."""
    try:
        return datetime.fromisoformat(str(record["ended_at"])).timestamp()
    except (KeyError, ValueError):
        return float("inf")


@dataclass(frozen=True)
class _BatchObjects:
    """The batch lines on an object store, which cannot append: `<batch>.json` per batch (batch
    numbers follow each other) and `latest.json` naming the newest. Objects are probed by name
    from the pointer on, so a crash between a batch object and the pointer heals, and nothing
    lists a long history."""

    folder: ObjectPath

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            data = json.loads((self.folder / name).read_bytes())
        except FileNotFoundError:
            return None
        return data if isinstance(data, dict) else None

    def _newest(self) -> int:
        pointer = self._read("latest.json")
        n = int(pointer["batch"]) if pointer else 0
        while (self.folder / f"{n + 1:012d}.json").exists():
            n += 1
        return n

    def last(self) -> dict[str, Any] | None:
        n = self._newest()
        return self._read(f"{n:012d}.json") if n else None

    def record(self, record: dict[str, Any]) -> None:
        n = int(record["batch"])
        write_text(self.folder / f"{n:012d}.json", json.dumps(record, sort_keys=True))
        write_text(self.folder / "latest.json", json.dumps({"batch": n}))

    def prune(self, held: int, cutoff: float) -> int:
        """Delete the batch objects from the oldest on while they ended before `cutoff` and
        the metrics table holds them, never the newest; `oldest.json` says where the next
        pruning starts (a crash before it is written leaves objects already deleted, which
        are skipped)."""
        pointer = self._read("oldest.json")
        n = int(pointer["batch"]) if pointer else 1
        newest, deleted = self._newest(), 0
        while n < min(newest, held + 1):
            record = self._read(f"{n:012d}.json")
            if record is not None:
                if _ended_s(record) >= cutoff:
                    break
                (self.folder / f"{n:012d}.json").unlink(missing_ok=True)
                deleted += 1
            n += 1
        if deleted:
            write_text(self.folder / "oldest.json", json.dumps({"batch": n}))
        return deleted

    def after(self, batch: int) -> list[dict[str, Any]]:
        found = []
        for n in range(batch + 1, self._newest() + 1):
            record = self._read(f"{n:012d}.json")
            if record is not None:
                found.append(record)
        return found
