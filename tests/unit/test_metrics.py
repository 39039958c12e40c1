"""Batch lines: freshness quantiles, the newest line after a torn write, Prometheus text."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from cdc_core import metrics
from cdc_core.lake import Lake
from cdc_core.metrics import (
    Freshness,
    batch_lines_after,
    batches_file,
    last_batch,
    prometheus_text,
    prune_batch_lines,
    record_batch,
)

if TYPE_CHECKING:
    from cdc_core.snapshot import SnapshotJob

DAY = 86_400
NOW = 1_800_000_000.0


def line(n: int, days_ago: float) -> dict[str, object]:
    return {"batch": n, "ended_at": metrics.iso(int((NOW - days_ago * DAY) * 1e6))}


def test_freshness_over_the_changes_of_a_batch() -> None:
    visible = 100_000_000
    commits = pa.array([visible - 3_000_000] * 98 + [visible - 1_000_000, visible - 9_000_000])
    f = Freshness.of(commits, visible)
    assert (f.p50_s, f.p99_s, f.max_s, f.newest_s) == (3.0, 3.0, 9.0, 1.0)
    assert Freshness.of(pa.array([], pa.int64()), visible) == Freshness()


def test_freshness_over_changes_made_visible_at_two_moments() -> None:
    """Changes staged before the batch, taken by the pass before its snapshot reads, are
    visible when that pass ends; the batch's own at its end."""
    early, end = 50_000_000, 100_000_000
    staged_before = pa.array([early - 40_000_000, early - 30_000_000])  # 40 s, 30 s
    captured = pa.array([end - 2_000_000] * 3)  # 2 s
    f = Freshness.over([(captured, end), (staged_before, early), (pa.array([], pa.int64()), end)])
    assert (f.p50_s, f.max_s, f.newest_s) == (2.0, 40.0, 2.0)
    f = Freshness.over([(pa.array([], pa.int64()), end), (staged_before, early)])
    assert (f.p50_s, f.max_s, f.newest_s) == (30.0, 40.0, 30.0)


def test_the_newest_whole_line_is_the_last_batch(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    assert last_batch(lake) is None
    record_batch(lake, {"batch": 1})
    record_batch(lake, {"batch": 2})
    with batches_file(lake).open("a") as f:
        f.write('{"batch": 3, "chan')  # a crash in the middle of a line
    assert last_batch(lake) == {"batch": 2}
    record_batch(lake, {"batch": 3})  # the next line starts a line of its own
    assert last_batch(lake) == {"batch": 3}
    assert [r["batch"] for r in batch_lines_after(lake, 0)] == [1, 2, 3]


def test_a_batch_line_longer_than_a_chunk_is_still_the_last_batch(tmp_path: Path) -> None:
    """A batch of thousands of captured tables lists them all: a line of over 64 KiB."""
    lake = Lake(str(tmp_path))
    tables = [f"erp.a_table_with_a_rather_long_name_{n:05d}" for n in range(3000)]
    for n in (1, 2, 3):
        record_batch(lake, {"batch": n, "CapturedTables": tables})
    assert batches_file(lake).stat().st_size > 3 * metrics._TAIL_BYTES

    last = last_batch(lake)

    assert last is not None
    assert last["batch"] == 3
    assert last["CapturedTables"] == tables
    assert [r["batch"] for r in batch_lines_after(lake, 1)] == [2, 3]


def test_the_lines_after_a_batch_are_read_from_the_end_across_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "_TAIL_BYTES", 50)  # lines straddle every chunk boundary
    lake = Lake(str(tmp_path))
    assert batch_lines_after(lake, 0) == []
    for n in range(1, 41):
        record_batch(lake, {"batch": n, "pipeline": "orders", "changes": n * 1000})
    with batches_file(lake).open("a") as f:
        f.write('{"batch": 41, "chan')  # a crash in the middle of a line

    after = batch_lines_after(lake, 30)

    assert [r["batch"] for r in after] == list(range(31, 41))
    assert after[0] == {"batch": 31, "pipeline": "orders", "changes": 31000}
    assert [r["batch"] for r in batch_lines_after(lake, 0)] == list(range(1, 41))
    assert batch_lines_after(lake, 40) == []


def test_prometheus_text_names_and_labels() -> None:
    record = {
        "pipeline": 'or"ders', "batch": 7, "seconds": 2.5, "changes": 10,
        "ended_at": "2026-11-21T20:00:00.000+00:00", "MilliSecondsBehindSource": 1200,
        "TotalNumberOfEventsSeen": 70, "NumberOfCommittedTransactions": 9,
        "SnapshotRunning": False, "RowsScanned": 0,
        "freshness_p50_s": 1.5, "freshness_p99_s": 2.0, "freshness_max_s": None,
        "retained_wal_bytes": 4096, "TotalNumberOfDeleteEventsSeen": 3,
        "SnapshotCompleted": True, "NumberOfErroneousEvents": 2, "NumberOfEventsFiltered": 5,
    }  # fmt: skip
    text = prometheus_text(record)
    assert 'cdc_number_of_events_filtered{pipeline="or\\"ders"} 5.0' in text
    assert "# TYPE cdc_number_of_events_filtered counter" in text
    assert 'cdc_number_of_erroneous_events{pipeline="or\\"ders"} 2.0' in text
    assert "# TYPE cdc_number_of_erroneous_events counter" in text
    assert 'cdc_snapshot_completed{pipeline="or\\"ders"} 1.0' in text
    assert "# TYPE cdc_snapshot_completed gauge" in text
    assert 'cdc_slot_retained_wal_bytes{pipeline="or\\"ders"} 4096.0' in text
    assert "# TYPE cdc_slot_retained_wal_bytes gauge" in text
    assert 'cdc_total_number_of_delete_events_seen{pipeline="or\\"ders"} 3.0' in text
    assert "# TYPE cdc_total_number_of_delete_events_seen counter" in text
    assert "cdc_slot_retained_wal_bytes" not in prometheus_text(
        record | {"retained_wal_bytes": None}
    )
    assert 'cdc_milliseconds_behind_source{pipeline="or\\"ders"} 1200.0' in text
    assert "# TYPE cdc_total_number_of_events_seen counter" in text
    assert 'cdc_freshness_seconds{pipeline="or\\"ders",quantile="0.99"} 2.0' in text
    assert 'quantile="1"' not in text  # unknown values are left out, not written as 0
    assert 'cdc_last_batch_timestamp_seconds{pipeline="or\\"ders"} 1795291200.0' in text
    assert text.endswith("\n")


def test_the_metrics_table_is_appended_to_once_per_interval_across_runs(tmp_path: Path) -> None:
    import os
    import time

    from cdc_core.metrics import Totals
    from cdc_core.pipeline import _metrics_table_due

    lake = Lake(str(tmp_path / "lake"))
    assert _metrics_table_due(lake, Totals(), 60)  # no table yet
    log = Path(metrics.metrics_table(lake)) / "_delta_log"
    log.mkdir(parents=True)
    commit = log / f"{0:020d}.json"
    commit.write_text("{}\n")
    assert not _metrics_table_due(lake, Totals(), 60)  # a run a moment ago appended
    assert _metrics_table_due(lake, Totals(), 0)  # 0: every batch
    old = time.time() - 120
    os.utime(commit, (old, old))
    assert _metrics_table_due(lake, Totals(), 60)
    (log / f"{1:020d}.json").write_text("{}\n")  # the newest commit is what counts
    assert not _metrics_table_due(lake, Totals(), 60)
    assert _metrics_table_due(lake, Totals(table_flushed=time.monotonic() - 61), 60)
    assert not _metrics_table_due(lake, Totals(table_flushed=time.monotonic()), 60)


def test_old_batch_lines_the_metrics_table_holds_are_dropped(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    assert prune_batch_lines(lake, 0, 7, now_s=NOW) == 0  # no file yet
    # batches 1-6 ended 9.9 to 5 days ago, 7-8 a day ago; a crash cut a line after batch 2
    for n, days in [(1, 9.9), (2, 9.5)]:
        record_batch(lake, line(n, days))
    with batches_file(lake).open("a") as f:
        f.write('{"batch": 3, "chan\n')
    for n, days in [(3, 9), (4, 7.9), (5, 7.5), (6, 5), (7, 1), (8, 1)]:
        record_batch(lake, line(n, days))

    # the oldest line is not yet a day past the cutoff: nothing is rewritten
    assert prune_batch_lines(lake, 8, 9, now_s=NOW) == 0
    assert [r["batch"] for r in batch_lines_after(lake, 0)] == [1, 2, 3, 4, 5, 6, 7, 8]
    # the metrics table holds batches up to 3 only: older lines it does not hold stay
    assert prune_batch_lines(lake, 3, 7, now_s=NOW) == 3
    assert [r["batch"] for r in batch_lines_after(lake, 0)] == [4, 5, 6, 7, 8]
    # held up to 8, kept 7 days: the oldest line left (batch 4, 7.9 days) is less than a day
    # past the cutoff, so the file waits; kept 6 days, batches 4 and 5 go
    assert prune_batch_lines(lake, 8, 7, now_s=NOW) == 0
    assert prune_batch_lines(lake, 8, 6, now_s=NOW) == 2
    assert [r["batch"] for r in batch_lines_after(lake, 0)] == [6, 7, 8]
    assert batches_file(lake).read_text().count("\n") == 3
    assert [p.name for p in tmp_path.rglob("*.tmp")] == []


def test_the_newest_batch_line_always_stays(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    for n in (1, 2, 3):
        record_batch(lake, line(n, 30))
    assert prune_batch_lines(lake, 3, 7, now_s=NOW) == 2
    assert last_batch(lake) == line(3, 30)  # the next batch is numbered 4
    assert prune_batch_lines(lake, 3, 7, now_s=NOW) == 0
    record_batch(lake, line(4, 0))
    assert [r["batch"] for r in batch_lines_after(lake, 0)] == [3, 4]


def staged_rows(ops: list[str], **columns: list[int]) -> pa.Table:
    """Staged rows with the columns the batch metrics read; unset ones count from 0."""
    n = len(ops)
    made = {name: pa.array(columns.get(name, range(n)), pa.int64())
            for name in ("commit_time_us", "commit_lsn", "lsn", "xid")}  # fmt: skip
    return pa.table({**made, "seq": pa.array(columns.get("seq", range(n)), pa.int32()), "op": ops})


def test_staged_facts_leave_out_a_staged_file_maintenance_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Maintenance removes staged files bronze holds, next to a running ingest: a batch's
    freshness is computed from the files it can still read instead of failing the batch (the
    times are read before bronze takes the files, so this is only the fallback)."""
    import pyarrow.parquet as pq

    kept, gone = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(staged_rows(["c", "u"], commit_time_us=[1_000_000, 3_000_000]), kept)
    facts = metrics.staged_facts([kept, gone])
    assert facts.commit_times_us.to_pylist() == [1_000_000, 3_000_000]
    assert facts.ops == {"c": 1, "u": 1}
    assert f"freshness leaves out {gone}: it was removed" in caplog.text
    fresh = metrics.Freshness.of(facts.commit_times_us, 5_000_000)
    assert (fresh.max_s, fresh.newest_s) == (4.0, 2.0)
    nothing = metrics.staged_facts([])
    assert metrics.Freshness.of(nothing.commit_times_us, 5_000_000) == metrics.Freshness()
    assert nothing.ops == {}


def test_staged_facts_count_each_operation_over_the_files(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    files = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    for path, ops in zip(files, (["c", "c", "u", "m"], ["d", "u", "c", "t"]), strict=True):
        pq.write_table(staged_rows(ops), path)
    assert metrics.staged_facts(files).ops == {"c": 3, "u": 2, "m": 1, "d": 1, "t": 1}


def test_the_last_change_is_the_newest_commit_then_position_across_files(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(staged_rows(["c", "u"], commit_lsn=[100, 100], lsn=[90, 95], xid=[7, 7],
                               commit_time_us=[5, 5]), first)  # fmt: skip
    # the newest transaction (xid 9, commit 300) has two changes; a lone message (xid 0) at
    # 200 is older than it
    pq.write_table(staged_rows(["m", "d", "c"], commit_lsn=[200, 300, 300], lsn=[200, 290, 280],
                               xid=[0, 9, 9], seq=[0, 1, 0], commit_time_us=[6, 8, 8]),
                   second)  # fmt: skip
    last = metrics.staged_facts([first, second]).last
    assert last == metrics.LastChange(lsn=290, commit_lsn=300, commit_time_us=8, xid=9)
    assert metrics.staged_facts([]).last is None


def test_a_lone_message_last_keeps_the_last_transaction_id() -> None:
    rows = staged_rows(["c", "m"], commit_lsn=[100, 200], lsn=[90, 200], xid=[7, 0])
    assert metrics.LastChange.of(rows) == metrics.LastChange(200, 200, 1, 7)
    alone = staged_rows(["m"], commit_lsn=[200], lsn=[200], xid=[0])
    assert metrics.LastChange.of(alone) == metrics.LastChange(200, 200, 0, None)


def test_last_change_fields_of_a_batch_and_of_a_quiet_batch_after_it() -> None:
    commit = int(NOW * 1e6)
    last = metrics.LastChange(lsn=0x16B3748, commit_lsn=0x100000016B37A0, commit_time_us=commit,
                              xid=745)  # fmt: skip
    fields = metrics.last_change_fields(last, None, commit + 2_500_000)
    assert fields == {
        "LastTransactionId": 745,
        "SourceEventPosition": {"lsn": "0/16B3748", "commit_lsn": "100000/16B37A0"},
        "LastEvent": metrics.iso(commit),
        "MilliSecondsSinceLastEvent": 2500,
    }
    quiet = metrics.last_change_fields(None, fields | {"batch": 3}, commit + 60_000_000)
    assert quiet == fields | {"MilliSecondsSinceLastEvent": 60_000}  # the time since grows
    lone = metrics.LastChange(lsn=0x2000000, commit_lsn=0x2000000, commit_time_us=commit, xid=None)
    assert metrics.last_change_fields(lone, fields, commit)["LastTransactionId"] == 745
    nothing = metrics.last_change_fields(None, None, commit)  # nothing staged yet, or an old line
    assert set(nothing.values()) == {None}


def job(created_us: int, done: list[bool], *, stopped: bool = False) -> SnapshotJob:
    from cdc_core.identifiers import TableName
    from cdc_core.snapshot import SnapshotJob, TableSnapshot

    parts = [TableSnapshot(TableName("public", f"t{i}"), None, (), done=d)
             for i, d in enumerate(done)]  # fmt: skip
    return SnapshotJob("j", "initial", "test", parts, created_us=created_us, stopped=stopped)


def test_snapshot_fields_count_tables_and_time_of_the_jobs_run() -> None:
    totals, now = metrics.Totals(), 10_000_000_000
    assert metrics.snapshot_fields(totals, [], aborted=False, now=now) == {
        "TotalTableCount": 0, "RemainingTableCount": 0, "SnapshotAborted": False,
        "SnapshotDurationInSeconds": None,
    }  # fmt: skip
    running = [job(now - 90_500_000, [True, False, False]), job(now - 5_000_000, [False])]
    fields = metrics.snapshot_fields(totals, running, aborted=False, now=now)
    assert fields == {
        "TotalTableCount": 4, "RemainingTableCount": 3, "SnapshotAborted": False,
        "SnapshotDurationInSeconds": 90,  # since the oldest job began
    }  # fmt: skip
    later = metrics.snapshot_fields(totals, [], aborted=False, now=now + 600_000_000)
    assert later["SnapshotDurationInSeconds"] == 90  # the last snapshot's, once it is over


def test_snapshot_aborted_stays_until_a_snapshot_runs_again() -> None:
    totals, now = metrics.Totals(), 10_000_000_000
    stopped = [job(now - 3_000_000, [True, False], stopped=True)]
    fields = metrics.snapshot_fields(totals, stopped, aborted=True, now=now)
    assert (fields["SnapshotAborted"], fields["RemainingTableCount"]) == (True, 0)
    assert fields["TotalTableCount"] == 2
    assert metrics.snapshot_fields(totals, [], aborted=False, now=now)["SnapshotAborted"]
    # a lost slot stops the old jobs at start and begins a new snapshot in the same batch
    again = [job(now, [False])]
    assert metrics.snapshot_fields(totals, again, aborted=True, now=now)["SnapshotAborted"]
    assert not metrics.snapshot_fields(totals, again, aborted=False, now=now)["SnapshotAborted"]


def test_prometheus_text_of_the_position_the_tables_and_the_connection() -> None:
    record = {
        "pipeline": "orders", "ended_at": "2026-11-21T20:00:00.000+00:00",
        "LastTransactionId": 745, "MilliSecondsSinceLastEvent": 2500,
        "LastEvent": "2026-11-21T19:59:58.000+00:00",
        "SourceEventPosition": {"lsn": "0/16B3748", "commit_lsn": "1/0"},
        "CapturedTables": ["public.orders", 'odd."name'], "TotalTableCount": 2,
        "RemainingTableCount": 1, "SnapshotAborted": False, "SnapshotDurationInSeconds": 90,
    }  # fmt: skip
    text = prometheus_text(record)
    for expected in (
        'cdc_connected{pipeline="orders"} 1.0',
        'cdc_last_transaction_id{pipeline="orders"} 745.0',
        'cdc_milliseconds_since_last_event{pipeline="orders"} 2500.0',
        'cdc_last_event_timestamp_seconds{pipeline="orders"} 1795291198.0',
        f'cdc_source_event_position_lsn{{pipeline="orders"}} {float(0x16B3748)}',
        f'cdc_source_event_position_commit_lsn{{pipeline="orders"}} {float(1 << 32)}',
        'cdc_captured_table{pipeline="orders",table="public.orders"} 1.0',
        'cdc_captured_table{pipeline="orders",table="odd.\\"name"} 1.0',
        'cdc_total_table_count{pipeline="orders"} 2.0',
        'cdc_remaining_table_count{pipeline="orders"} 1.0',
        'cdc_snapshot_aborted{pipeline="orders"} 0.0',
        'cdc_snapshot_duration_in_seconds{pipeline="orders"} 90.0',
        "# TYPE cdc_connected gauge",
        "# TYPE cdc_captured_table gauge",
    ):
        assert expected in text, expected
    assert text.count("# TYPE cdc_captured_table gauge") == 1
    assert 'cdc_connected{pipeline="orders"} 0.0' in prometheus_text(record, connected=False)
    quiet = prometheus_text({"pipeline": "orders"}, connected=False)  # no batch line yet
    assert "cdc_last_transaction_id" not in quiet
    assert "cdc_source_event_position" not in quiet
    assert "cdc_last_batch_timestamp_seconds" not in quiet


def test_a_source_that_cannot_be_reached_says_cdc_connected_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--continuous, after a batch failed: the last batch line's values with cdc_connected
    0 while the source cannot be reached, 1 when it can; the next batch that runs says 1."""
    from cdc_core import pipeline
    from cdc_core.errors import TransientError

    def unreachable(dsn: object) -> object:
        raise TransientError("cannot connect to PostgreSQL at host=db: Connection refused")

    lake = Lake(str(tmp_path))
    text = metrics.prometheus_file(lake)
    pipeline._say_connected(lake, "orders", reachable=False)  # no batch line yet
    assert text.read_text().startswith(
        "# HELP cdc_connected 1 when the last batch reached the source, 0 while it cannot\n"
        '# TYPE cdc_connected gauge\ncdc_connected{pipeline="orders"} 0.0\n'
    )
    record_batch(lake, line(4, 0) | {"pipeline": "orders", "TotalNumberOfEventsSeen": 12})
    monkeypatch.setattr(pipeline, "connect", unreachable)
    pipeline._say_connected(lake, "orders", pipeline._reachable(None))
    said = text.read_text()
    assert 'cdc_connected{pipeline="orders"} 0.0' in said
    assert 'cdc_total_number_of_events_seen{pipeline="orders"} 12.0' in said
    assert 'cdc_batch_number{pipeline="orders"} 4.0' in said
    monkeypatch.setattr(pipeline, "connect", lambda dsn: contextlib.nullcontext())
    pipeline._say_connected(lake, "orders", pipeline._reachable(None))
    assert 'cdc_connected{pipeline="orders"} 1.0' in text.read_text()
