"""Batch lines: freshness quantiles, the newest line after a torn write, Prometheus text."""

from __future__ import annotations

from pathlib import Path

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


def test_the_newest_whole_line_is_the_last_batch(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    assert last_batch(lake) is None
    record_batch(lake, {"batch": 1})
    record_batch(lake, {"batch": 2})
    with batches_file(lake).open("a") as f:
        f.write('{"batch": 3, "chan')  # a crash in the middle of a line
    assert last_batch(lake) == {"batch": 2}


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
        "SnapshotCompleted": True,
    }  # fmt: skip
    text = prometheus_text(record)
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


def test_staged_facts_leave_out_a_staged_file_maintenance_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Maintenance removes staged files bronze holds, next to a running ingest: a batch's
    freshness is computed from the files it can still read instead of failing the batch (the
    times are read before bronze takes the files, so this is only the fallback)."""
    import pyarrow.parquet as pq

    kept, gone = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(pa.table({"commit_time_us": pa.array([1_000_000, 3_000_000], pa.int64()),
                             "op": ["c", "u"]}), kept)  # fmt: skip
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
        times = pa.array(range(len(ops)), pa.int64())
        pq.write_table(pa.table({"commit_time_us": times, "op": ops}), path)
    assert metrics.staged_facts(files).ops == {"c": 3, "u": 2, "m": 1, "d": 1, "t": 1}
