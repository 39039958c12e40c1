"""Where snapshot jobs are kept: those a batch goes on with, and the finished ones archived
out of its way, which `cdc status` still reports."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cdc_core import status as st
from cdc_core.lake import Lake
from cdc_core.snapshot import (
    archive_finished,
    finished_initial,
    load_current,
    load_jobs,
    searched_from,
)
from cdc_core.state import finished_dir, snapshots_dir
from tests.unit.test_snapshot_pause import job


def test_finished_jobs_are_archived_out_of_what_a_batch_reads(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    done = job("initial", "snapshot.mode initial", "20261201T100000-initial-ab12cd")
    done.tables[0].done = True
    done.created_us = 1
    stopped = job(ident="20261201T110000-incremental-cd34ef")
    stopped.stopped, stopped.created_us = True, 2
    running = job(ident="20261201T120000-incremental-ef56ab")
    running.created_us = 3
    for j in (done, stopped, running):
        j.save(lake)
    assert [j.id for j in load_current(lake)] == [done.id, stopped.id, running.id]
    assert not finished_initial(lake)

    archive_finished(lake, load_current(lake))
    assert [j.id for j in load_current(lake)] == [running.id]
    assert sorted(p.name for p in snapshots_dir(lake).glob("*.json")) == [f"{running.id}.json"]
    assert [j.id for j in load_jobs(lake)] == [done.id, stopped.id, running.id]
    assert load_jobs(lake)[0] == done  # archived whole
    assert finished_initial(lake), "a finished initial snapshot counts as a stored position"


def test_a_job_a_crash_left_in_both_places_counts_once_and_is_moved_again(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    done = job(ident="20261201T100000-incremental-ab12cd")
    done.tables[0].done = True
    done.save(lake)
    archive_finished(lake, [done])
    done.save(lake)  # as if the crash came between the archive's write and its removal
    assert [j.id for j in load_jobs(lake)] == [done.id]
    assert [j.id for j in load_current(lake)] == [done.id]
    archive_finished(lake, load_current(lake))
    assert load_current(lake) == []
    assert [p.name for p in finished_dir(lake).glob("*.json")] == [f"{done.id}.json"]


def test_a_table_whose_read_ended_holds_no_staged_file(tmp_path: Path) -> None:
    """A table dropped (or left out) after some of its groups were read: no later group
    searches the stream, so maintenance may remove what that search would have needed."""
    lake = Lake(str(tmp_path))
    j = job()
    j.tables[0].first = 0x20
    j.end(j.tables[0], "the table was dropped")
    j.save(lake)
    assert searched_from(lake) is None


def test_the_table_shows_unfinished_snapshots_and_the_newest_finished_ones() -> None:
    def status(n: int, *, finished: bool) -> st.SnapshotStatus:
        return st.SnapshotStatus(f"2026120{n}T100000-incremental-ab12cd", "incremental", 1, 1,
                                 10, finished, False, 0, False, ())  # fmt: skip

    older = [status(n, finished=True) for n in range(1, 4)]
    running = status(4, finished=False)
    newer = [status(n, finished=True) for n in range(5, 10)]
    lines = st._snapshot_lines((*older, running, *newer))
    assert lines[0] == "3 older finished snapshots (--json lists every one)"
    assert [line.split()[0] for line in lines[1:]] == [s.id for s in (running, *newer)]
    assert len(st._snapshot_lines((running, *newer))) == 6  # all shown: nothing more to say
    shown = st._snapshot_lines((dataclasses.replace(running, finished=True),))
    assert shown[0].endswith("finished")
