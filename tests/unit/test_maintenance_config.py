"""The `maintenance:` section: safe defaults, and bad values stopped at load time by key."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cdc_core.config import load_pipeline
from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.maintenance import remove_applied_staged, remove_archived_jobs
from cdc_core.snapshot import archive_finished, finished_initial, load_jobs, searched_from
from cdc_core.stager import StagedFile
from cdc_core.state import finished_dir
from tests.unit.test_config import CONTRACT, load_error, write_home
from tests.unit.test_snapshot_pause import job


def test_maintenance_defaults_keep_bronze_and_delta_s_safety_retention(tmp_path: Path) -> None:
    config = load_pipeline("orders", "local", home=write_home(tmp_path), environ={})
    m = config.pipeline.maintenance
    assert (m.optimize, m.vacuum, m.vacuum_retention_check) == (True, True, True)
    assert (m.vacuum_retention_hours, m.staged_retention_hours) == (168, 24)
    assert m.bronze_retention_days is None  # keep bronze forever
    assert m.snapshot_jobs_retention_days == 30


def test_finished_snapshot_jobs_are_kept_when_their_retention_is_unset(tmp_path: Path) -> None:
    home = write_home(tmp_path, CONTRACT + "maintenance:\n  snapshot_jobs_retention_days: null\n")
    config = load_pipeline("orders", "local", home=home, environ={})
    assert config.pipeline.maintenance.snapshot_jobs_retention_days is None


@pytest.mark.parametrize(
    "key",
    [
        "vacuum_retention_hours",
        "staged_retention_hours",
        "bronze_retention_days",
        "snapshot_jobs_retention_days",
    ],
)
def test_negative_retention_fails_at_load_naming_the_key(tmp_path: Path, key: str) -> None:
    message = load_error(tmp_path, CONTRACT + f"maintenance:\n  {key}: -1\n")
    assert message == (f"pipelines/orders.yaml: maintenance.{key}: -1 is negative: give 0 or more")


@pytest.mark.parametrize(
    ("key", "most", "way_out"),
    [
        ("vacuum_retention_hours", 876_600, ""),
        ("staged_retention_hours", 876_600, ""),
        ("bronze_retention_days", 36_525, ", or leave it unset to keep bronze whole"),
        ("snapshot_jobs_retention_days", 36_525, ""),
    ],
)
def test_a_retention_past_a_century_fails_at_load_naming_the_key(
    tmp_path: Path, key: str, most: int, way_out: str
) -> None:
    """Maintenance's cutoff, in milliseconds, must fit 64 bits (Spark's JVM failed on it)."""
    message = load_error(tmp_path, CONTRACT + f"maintenance:\n  {key}: 100000000000000000000\n")
    assert message == (
        f"pipelines/orders.yaml: maintenance.{key}: 100000000000000000000 is more than a century: "
        f"give at most {most}{way_out}"
    )
    home = write_home(tmp_path, CONTRACT + f"maintenance:\n  {key}: {most}\n")
    config = load_pipeline("orders", "local", home=home, environ={})
    assert getattr(config.pipeline.maintenance, key) == most


def test_vacuum_below_delta_s_safety_minimum_needs_the_check_turned_off(tmp_path: Path) -> None:
    short = CONTRACT + "maintenance:\n  vacuum_retention_hours: 24\n"
    message = load_error(tmp_path, short)
    assert message.startswith(
        "pipelines/orders.yaml: maintenance.vacuum_retention_hours: 24 is below Delta's safety "
        "minimum of 168 hours"
    )
    assert "vacuum_retention_check: false" in message
    home = write_home(tmp_path, short + "  vacuum_retention_check: false\n")
    config = load_pipeline("orders", "local", home=home, environ={})
    assert config.pipeline.maintenance.vacuum_retention_hours == 24


def _staged(lake: Lake, start: int, end: int, age_s: float) -> StagedFile:
    f = StagedFile(Lsn(start), Lsn(end))
    path = lake.changes / str(f)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return f


def test_only_old_staged_files_bronze_holds_are_removed_and_never_the_newest(
    tmp_path: Path,
) -> None:
    lake = Lake(str(tmp_path))
    old = _staged(lake, 0x10, 0x20, 7200)
    young = _staged(lake, 0x20, 0x30, 60)
    newest_applied = _staged(lake, 0x30, 0x40, 7200)
    report = remove_applied_staged(lake, Lsn(0x40), retention_hours=1)
    assert (report.removed, report.recent, report.pending) == (1, 2, 0)
    assert not (lake.changes / str(old)).exists()
    assert (lake.changes / str(young)).exists(), "younger than the retention"
    assert (lake.changes / str(newest_applied)).exists(), "capture resumes after the newest"
    waiting = _staged(lake, 0x40, 0x50, 7200)
    report = remove_applied_staged(lake, Lsn(0x40), retention_hours=0)
    assert (report.removed, report.recent, report.pending) == (2, 0, 1)
    assert (lake.changes / str(waiting)).exists(), "not yet in bronze"


def test_staged_files_a_snapshot_under_way_still_searches_are_kept(tmp_path: Path) -> None:
    """A paused snapshot's later groups search the stream from its first read on for rows key
    changes took out of their chunks: maintenance keeps those files past the retention."""
    lake = Lake(str(tmp_path))
    before = _staged(lake, 0x10, 0x20, 7200)
    during = [_staged(lake, 0x20, 0x30, 7200), _staged(lake, 0x30, 0x40, 7200)]
    newest = _staged(lake, 0x40, 0x50, 7200)
    first = job()  # read its first group at 0x20: the file ending there holds nothing after
    first.tables[0].first = 0x20
    later = job(ident="job-2")  # read from 0x30 on
    later.tables[0].first = 0x30
    for j in (first, later):
        j.save(lake)
    assert searched_from(lake) == 0x20

    report = remove_applied_staged(lake, Lsn(0x50), retention_hours=0, held_from=0x20)
    assert (report.removed, report.held, report.recent, report.pending) == (1, 2, 1, 0)
    assert not (lake.changes / str(before)).exists()
    assert all((lake.changes / str(f)).exists() for f in [*during, newest])
    assert "2 kept for a snapshot under way" in report.describe()


@pytest.mark.parametrize("done", ["stopped", "last group read", "no group read"])
def test_a_snapshot_that_reads_no_more_holds_no_staged_file(tmp_path: Path, done: str) -> None:
    lake = Lake(str(tmp_path))
    j = job()
    j.tables[0].first = 0x20
    if done == "stopped":
        j.stopped = True
    elif done == "last group read":
        j.tables[0].last = 0x60
    else:
        j.tables[0].first = None
    j.save(lake)
    assert searched_from(lake) is None


def _archived(lake: Lake, ident: str, kind: str, age_days: float) -> None:
    finished = job(kind, ident=ident)
    finished.tables[0].done = True
    archive_finished(lake, [finished])
    then = time.time() - age_days * 86_400
    os.utime(finished_dir(lake) / f"{ident}.json", (then, then))


def test_finished_snapshot_jobs_past_their_retention_are_removed_but_the_newest_initial(
    tmp_path: Path,
) -> None:
    """`cdc status` parses every archived job: a pipeline that snapshots every run or on a
    signal a day would grow that without end. The newest finished initial snapshot stays, since
    snapshot.mode's decision (`finished_initial`) looks for it."""
    lake = Lake(str(tmp_path))
    _archived(lake, "20260101T000000-initial-aaaaaa", "initial", 90)
    _archived(lake, "20260201T000000-initial-bbbbbb", "initial", 60)
    _archived(lake, "20260202T000000-incremental-cccccc", "incremental", 59)
    _archived(lake, "20260301T000000-incremental-dddddd", "incremental", 2)
    report = remove_archived_jobs(lake, time.time() - 30 * 86_400)
    assert (report.removed, report.kept) == (2, 2)
    assert [j.id for j in load_jobs(lake)] == [
        "20260201T000000-initial-bbbbbb",
        "20260301T000000-incremental-dddddd",
    ]
    assert finished_initial(lake)
    assert "2 removed" in report.describe()
    assert "2 kept" in report.describe()
    report = remove_archived_jobs(lake, time.time())  # a retention of 0 days
    assert (report.removed, report.kept) == (1, 1)
    assert finished_initial(lake), "the newest finished initial snapshot always stays"
    assert remove_archived_jobs(Lake(str(tmp_path / "new")), time.time()).kept == 0
