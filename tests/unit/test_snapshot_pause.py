"""Pausing incremental snapshots: the state kept with the job, what a pause and a resume
change, and what they report (notifications, `cdc status`, the batch metrics)."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import pytest

from cdc_core import status as st
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.metrics import prometheus_text
from cdc_core.notifications import Notifier, sink_records
from cdc_core.signals import PauseRequest, StopRequest
from cdc_core.snapshot import SnapshotJob, TableSnapshot, load_jobs, set_paused
from cdc_core.snapshot_plan import Chunk, ChunkPlan
from cdc_core.start import _pause, _stop

SECOND_US = 1_000_000


def job(kind: str = "incremental", origin: str = "signal s-1", ident: str = "job-1") -> SnapshotJob:
    table = TableName("public", "orders")
    plan = ChunkPlan(
        table, ("id",), ("bigint",), (Chunk(0, None, ("10",)), Chunk(1, ("10",), None)), 20
    )
    part = TableSnapshot(table, plan, ("id", "v"), groups_done=1, rows=10)
    return SnapshotJob(ident, kind, origin, [part])  # type: ignore[arg-type]


def test_a_pause_pauses_unfinished_incremental_jobs_only() -> None:
    running, initial, blocking, done = job(), job("initial"), job("blocking"), job()
    done.tables[0].done = True
    changed = set_paused([running, initial, blocking, done], paused=True, now_us=5 * SECOND_US)
    assert changed == [running]
    assert running.paused_us == 5 * SECOND_US
    assert [j.paused for j in (running, initial, blocking, done)] == [True, False, False, False]


def test_pausing_a_paused_job_or_resuming_a_running_one_changes_nothing() -> None:
    j = job()
    assert set_paused([j], paused=False, now_us=1) == []
    set_paused([j], paused=True, now_us=2 * SECOND_US)
    assert set_paused([j], paused=True, now_us=9 * SECOND_US) == []
    assert j.paused_us == 2 * SECOND_US  # the first pause's start is kept


def test_a_resume_adds_the_pause_to_the_paused_time() -> None:
    j = job()
    set_paused([j], paused=True, now_us=10 * SECOND_US)
    assert j.paused_seconds(13 * SECOND_US) == 3  # the pause under way counts
    assert set_paused([j], paused=False, now_us=14 * SECOND_US) == [j]
    assert (j.paused, j.paused_us, j.paused_total_us) == (False, None, 4 * SECOND_US)
    set_paused([j], paused=True, now_us=20 * SECOND_US)
    assert j.paused_seconds(22 * SECOND_US) == 6


def test_the_paused_state_survives_a_restart(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    j = job()
    set_paused([j], paused=True, now_us=7 * SECOND_US)
    j.paused_total_us = 3 * SECOND_US
    j.save(lake)
    [loaded] = load_jobs(lake)
    assert loaded.paused
    assert (loaded.paused_us, loaded.paused_total_us) == (7 * SECOND_US, 3 * SECOND_US)
    assert loaded.tables[0].groups_done == 1  # resumed, it reads the next chunk


def test_a_job_saved_before_pauses_existed_loads_running() -> None:
    data = job().to_json()
    del data["paused_us"], data["paused_total_us"]
    loaded = SnapshotJob.from_json(data)
    assert (loaded.paused, loaded.paused_total_us) == (False, 0)


def test_a_finished_job_is_not_paused() -> None:
    j = job()
    set_paused([j], paused=True, now_us=1)
    j.stopped = True
    assert not j.paused


def test_pause_and_resume_signals_send_paused_and_resumed(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    notifier = Notifier(lake, "orders", sink_topic="n")
    running, initial = job(), job("initial", "snapshot.mode initial", "job-2")
    running.started = True  # it read a group
    _pause(lake, [running, initial], PauseRequest("p-1"), notifier)
    _pause(lake, [running, initial], PauseRequest("p-2"), notifier)  # already paused: no note
    assert [j.paused for j in load_jobs(lake)] == [True]  # saved, the initial one untouched
    _pause(lake, [running, initial], PauseRequest("r-1", resume=True), notifier)
    records = sink_records(lake, "n")
    assert [r["type"] for r in records] == ["PAUSED", "RESUMED"]
    assert {r["id"] for r in records} == {"s-1"}  # the execute-snapshot signal's id
    assert {r["aggregate_type"] for r in records} == {"Incremental Snapshot"}
    assert records[0]["additional_data"]["data_collections"] == "public.orders"
    assert not load_jobs(lake)[0].paused


def test_a_pause_before_the_first_read_sends_started_first_and_once(tmp_path: Path) -> None:
    """Debezium sends STARTED as it takes the execute-snapshot signal, so a consumer sees it
    before PAUSED; the read after the resume does not send it again."""
    lake = Lake(str(tmp_path))
    notifier = Notifier(lake, "orders", sink_topic="n")
    waiting = job()
    waiting.tables[0].groups_done = 0
    _pause(lake, [waiting], PauseRequest("p-1"), notifier)
    _pause(lake, [waiting], PauseRequest("r-1", resume=True), notifier)
    assert [r["type"] for r in sink_records(lake, "n")] == ["STARTED", "PAUSED", "RESUMED"]
    assert load_jobs(lake)[0].started  # saved: the read sends no second STARTED


def test_a_job_saved_before_started_was_kept_started_if_it_read_a_group() -> None:
    data = job().to_json()
    del data["started"]
    assert SnapshotJob.from_json(data).started
    data["tables"][0]["groups_done"] = 0  # type: ignore[index]
    assert not SnapshotJob.from_json(data).started


def test_a_pause_with_no_incremental_snapshot_running_is_logged_and_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lake = Lake(str(tmp_path))
    blocking = job("blocking", "signal b-1")
    with caplog.at_level(logging.INFO, logger="cdc_core.start"):
        _pause(lake, [blocking], PauseRequest("p-1"), Notifier(lake, "orders", sink_topic="n"))
    assert "signal p-1: no incremental snapshot to pause; ignored" in caplog.text
    assert "blocking snapshots cannot be paused: job-1" in caplog.text
    assert sink_records(lake, "n") == []
    assert load_jobs(lake) == []  # nothing saved


def test_cdc_status_shows_a_paused_snapshot_as_paused(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    j = job()
    set_paused([j], paused=True, now_us=1)
    j.save(lake)
    [snapshot], problem = st.read_snapshots(lake)
    assert problem is None
    assert snapshot.paused
    assert snapshot.paused_s > 0
    [line] = st._snapshot_lines((snapshot,))
    assert line.endswith("s in all; a resume-snapshot signal resumes it)")
    assert "10 rows  paused (" in line


def test_the_batch_metrics_have_debeziums_paused_names() -> None:
    record = {
        "pipeline": "orders", "ended_at": "2026-11-21T20:00:00.000+00:00",
        "SnapshotRunning": True, "SnapshotPaused": True, "SnapshotPausedDurationInSeconds": 42,
    }  # fmt: skip
    text = prometheus_text(record)
    assert 'cdc_snapshot_paused{pipeline="orders"} 1.0' in text
    assert 'cdc_snapshot_paused_duration_in_seconds{pipeline="orders"} 42.0' in text


def test_a_job_with_no_chunk_left_to_read_is_not_paused() -> None:
    j = job()
    j.tables[0].last = 123  # read to its end; silver has not taken it yet
    assert set_paused([j], paused=True, now_us=1) == []


def two_tables(ident: str = "job-1") -> SnapshotJob:
    j = job(ident=ident)
    other = TableName("public", "items")
    j.tables.append(TableSnapshot(other, dataclasses.replace(j.tables[0].plan, table=other),
                                  ("id", "v"), groups_done=1, rows=5))  # fmt: skip
    return j


def test_cdc_status_shows_a_stopped_snapshot_as_stopped_and_its_paused_time_no_longer_grows(
    tmp_path: Path,
) -> None:
    lake = Lake(str(tmp_path))
    notifier = Notifier(lake, "orders", sink_topic="n")
    whole, one = two_tables(), two_tables("job-2")
    set_paused([whole, one], paused=True, now_us=time.time_ns() // 1000 - 30 * SECOND_US)
    _stop(lake, [whole], StopRequest("s-9", None), notifier)
    _stop(lake, [one], StopRequest("s-10", (TableName("public", "items"),)), notifier)
    stopped, partly = load_jobs(lake)
    assert (stopped.paused_us, stopped.paused_seconds(time.time_ns() // 1000 + 3600 * SECOND_US))\
        == (None, 30)  # fmt: skip
    assert partly.paused  # one table left to read: the pause goes on
    [a, b], problem = st.read_snapshots(lake)
    assert problem is None
    assert (a.stopped, a.finished, a.paused, a.tables_done) == (True, True, False, 0)
    assert (b.stopped, b.finished, b.tables_done) == (False, False, 0)
    assert b.ended == (st.EndedTable("public.items", "stopped by signal s-10"),)
    first, second = st._snapshot_lines((a, b))
    assert first.endswith("0/2 tables  15 rows  stopped, 2 tables unfinished")
    assert second.endswith("s in all; a resume-snapshot signal resumes it); "
                           "public.items stopped by signal s-10")  # fmt: skip
    _stop(lake, [partly], StopRequest("s-11", (TableName("public", "orders"),)), notifier)
    [_, b] = st.read_snapshots(lake)[0]
    assert (b.finished, b.paused, b.paused_s, b.tables_done) == (True, False, 30, 0)
    assert st._snapshot_lines((b,))[0].endswith(
        "0/2 tables  15 rows  finished; public.orders stopped by signal s-11; "
        "public.items stopped by signal s-10"
    )
    assert dataclasses.asdict(b)["ended"][0] == {"table": "public.orders",
                                                 "why": "stopped by signal s-11"}  # fmt: skip


def test_a_job_saved_before_ended_tables_were_recorded_loads_without_them(tmp_path: Path) -> None:
    saved = job().to_json()
    del saved["tables"][0]["ended"]  # type: ignore[index]
    assert SnapshotJob.from_json(saved).tables[0].ended is None
