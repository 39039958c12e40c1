"""One run of a pipeline at a time: a second run is refused naming the holder, the lock of a
killed run is taken over; two pipelines on one server and one lake directory do not meet."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdc_core.config import load_pipeline
from cdc_core.errors import EXIT_TRANSIENT
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.metrics import Totals
from cdc_core.pipeline import batch
from cdc_core.run_lock import holder_file, lock_file, read_holder
from cdc_core.state import stream_file
from tests.integration.conftest import PgServer
from tests.integration.harness import ROOT, Pipeline, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source

EVENTS = TableName("public", "events")


def _wait_for(
    what: str, ready: Callable[[], bool], run: subprocess.Popen[str], timeout: float = 600
) -> None:
    """Poll `ready()` while `run` lives."""
    deadline = time.monotonic() + timeout
    while not ready():
        if run.poll() is not None:
            pytest.fail(f"the run ended before {what}: {run.communicate()[1][-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} in {timeout:.0f} s")
        time.sleep(0.2)


def _holds(lake: Lake, run: subprocess.Popen[str]) -> bool:
    holder = read_holder(lake)
    return holder is not None and holder.pid == run.pid


def _stop(run: subprocess.Popen[str]) -> None:
    if run.poll() is None:
        run.kill()
    run.communicate()


@pytest.fixture
def events(pg: PgServer, database: str, tmp_path: Path) -> Pipeline:
    """A pipeline of an empty table, streaming only (what is inserted after its slot)."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE events (id bigserial PRIMARY KEY, v text)")
    return make_pipeline(tmp_path, dsn, [str(EVENTS)], extra="capture:\n  trigger_interval_s: 1\n")


def test_a_second_run_is_refused_and_the_lock_of_a_killed_run_is_taken_over(
    events: Pipeline, spark: SparkSession
) -> None:
    p = events
    first = p.start_ingest("--continuous")
    try:
        _wait_for("slot", stream_file(p.lake).exists, first)  # what follows is streamed
        assert _holds(p.lake, first)
        sql(p.dsn, "INSERT INTO events (v) SELECT 'v' || g FROM generate_series(1, 300) g")
        second = p.ingest("--once", timeout=300)
        assert second.returncode == EXIT_TRANSIENT, second.stderr[-3000:]
        assert f"pid {first.pid} on host {socket.gethostname()}, started" in second.stderr
        assert "pipeline p is already running" in second.stderr
        assert str(lock_file(p.lake)) in second.stderr
        assert second.stdout == ""  # it did nothing
        assert first.poll() is None
        assert _holds(p.lake, first)
        first.send_signal(signal.SIGKILL)  # mid-run: nothing runs on the way out
        first.wait()
    finally:
        _stop(first)
    assert _holds(p.lake, first)  # the holder file stays; the kernel freed the lock
    sql(p.dsn, "UPDATE events SET v = 'u' WHERE id % 7 = 0", "DELETE FROM events WHERE id % 5 = 0")
    run = p.ingest("--capture-only")  # the next run: takes over, stages what the killed one left
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"stale lock of pid {first.pid} on host {socket.gethostname()}" in run.stderr
    assert not holder_file(p.lake).exists()  # released on the way out
    _bronze_and_silver(p.home, "p", p.lake, spark)
    assert assert_mirror_equals_source(spark, p.lake, p.dsn, EVENTS) == 240


def _bronze_and_silver(home: Path, name: str, lake: Lake, spark: SparkSession) -> None:
    """What a run with Spark adds to `--capture-only`, in this process's Spark: an ingest JVM
    costs half a minute or more on the 2-core machine."""
    batch(spark, load_pipeline(name, "local", home=home), lake, Totals())


def _add_pipeline(p: Pipeline, name: str, tables: list[str], root: Path) -> None:
    """pipelines/NAME.yaml next to p's: the same source server, its own slot, publication and
    root."""
    text = (p.home / "pipelines" / "p.yaml").read_text()
    old_tables = text.split("tables: ")[1].splitlines()[0]
    old_root = text.split("root: ")[1].splitlines()[0]
    text = (text.replace("name: p\n", f"name: {name}\n")
            .replace(p.slot, f"{p.slot[:55]}_{name}")
            .replace(f"tables: {old_tables}", f"tables: [{', '.join(tables)}]")
            .replace(f"root: {old_root}", f"root: {root}"))  # fmt: skip
    (p.home / "pipelines" / f"{name}.yaml").write_text(text)


def _start(p: Pipeline, name: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "jobs" / "ingest.py"), "--pipeline", name, *args],
        env=p.env(), cwd=p.home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _together(p: Pipeline, *args: str) -> None:
    """Pipelines one and two at the same time; both must succeed, neither sees a lock."""
    runs = [_start(p, name, *args) for name in ("one", "two")]
    try:
        for run in runs:
            _, err = run.communicate(timeout=900)
            assert run.returncode == 0, err[-3000:]
            assert "stale lock" not in err
    finally:
        for run in runs:
            _stop(run)


def test_two_pipelines_on_one_server_and_one_lake_directory_run_together(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    p = make_pipeline(tmp_path, dsn, ["public.items"])
    lakes = tmp_path / "lakes"  # what LAKE_ROOT is to conf: one directory, a root per pipeline
    for name in ("one", "two"):  # the same table: two slots, two publications, two mirrors
        _add_pipeline(p, name, ["public.items"], lakes / name)
    _together(p, "--capture-only")  # slots and publications
    sql(dsn, "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 200) g",
        "UPDATE items SET v = 'u' WHERE id % 3 = 0", "DELETE FROM items WHERE id % 10 = 0")  # fmt: skip
    _together(p, "--capture-only")  # both read the same WAL, each from its own slot
    for name in ("one", "two"):
        lake = Lake(str(lakes / name))
        assert not holder_file(lake).exists()
        _bronze_and_silver(p.home, name, lake, spark)
        items = TableName("public", "items")
        assert assert_mirror_equals_source(spark, lake, dsn, items) == 180
