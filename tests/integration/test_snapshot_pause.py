"""Pausing an incremental snapshot through the signal table, end to end: while paused, runs
stream but read no chunk (across a restart); resumed, the snapshot goes on with the chunk after
the last one read, none read twice, none skipped, and the mirror equals the source."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc_core import faults
from cdc_core.identifiers import TableName
from cdc_core.notifications import sink_records
from cdc_core.signals import signal_table_ddl
from cdc_core.snapshot import SnapshotJob, load_jobs
from cdc_core.status import read_snapshots
from tests.integration.conftest import PgServer
from tests.integration.harness import Pipeline, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source

SIGNALS = TableName("public", "cdc_signal")
ITEMS = TableName("public", "items")
READ = re.compile(r"snapshot \S+: \S+ group (\d+) of \d+ read")


def send(dsn: str, signal_id: str, type_: str, data: str | None = None) -> None:
    sql(dsn, f"INSERT INTO {SIGNALS} VALUES ('{signal_id}', '{type_}', "
             f"{'NULL' if data is None else repr(data)})")  # fmt: skip


def ingest(p: Pipeline) -> str:
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-4000:]
    return run.stderr


def only_job(p: Pipeline) -> SnapshotJob:
    [job] = load_jobs(p.lake)
    return job


@pytest.mark.slow
def test_a_paused_incremental_snapshot_streams_and_resumes_with_its_next_chunk(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(
        dsn,
        "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 1000) g",
        signal_table_ddl(SIGNALS),
    )
    p = make_pipeline(
        tmp_path, dsn, [ITEMS.qualified], snapshot="no_data",
        source_extra="notification.enabled.channels: sink\n"
                     "notification.sink.topic.name: notifications\n",
        snapshot_extra=f"chunk.size: 100\nmax.threads: 1\nsignal.data.collection: {SIGNALS}\n",
    )  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0  # the slot: rows before it need a snapshot
    send(dsn, "snap-1", "execute-snapshot", '{"data-collections": ["public.items"]}')
    killed = p.ingest_with_fault("snapshot.chunk_done@3")  # read three groups, then died
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    groups = len(only_job(p).tables[0].groups(1))
    assert only_job(p).tables[0].groups_done == 3
    assert groups > 5

    send(dsn, "pause-1", "pause-snapshot")
    sql(dsn, "INSERT INTO items VALUES (5000, 'streamed')", "UPDATE items SET v = 'u' WHERE id = 2")
    for _ in range(2):  # paused across runs: streamed, no chunk read
        logged = ingest(p)
        assert READ.findall(logged) == [], logged[-6000:]
        job = only_job(p)
        assert job.paused
        assert job.tables[0].groups_done == 3
    silver = spark.read.format("delta").load(p.lake.silver(ITEMS))
    assert [tuple(r) for r in silver.where("id IN (2, 5000)").orderBy("id").select("id", "v").collect()] == [
        (2, "u"), (5000, "streamed")
    ]  # fmt: skip
    [status], _ = read_snapshots(p.lake)
    assert status.paused

    send(dsn, "resume-1", "resume-snapshot")
    logged = ingest(p)
    assert [int(n) for n in READ.findall(logged)] == list(range(4, groups + 1))
    ingest(p)  # silver takes the last read once the stream is past it
    job = only_job(p)
    assert job.finished, job.to_json()
    assert not job.paused

    assert assert_mirror_equals_source(spark, p.lake, dsn, ITEMS) == 1001
    reads = spark.read.format("delta").load(p.lake.bronze).where(F.col("op") == "r")
    assert reads.groupBy("key").count().where("count > 1").count() == 0, "a row read twice"
    types = [n["type"] for n in sink_records(p.lake, "notifications")]
    assert types.count("PAUSED") == types.count("RESUMED") == 1
    assert types.index("PAUSED") < types.index("RESUMED") < types.index("COMPLETED")


def test_a_pause_sent_while_a_run_reads_stops_it_before_its_next_group(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """Signals are taken between two reads, as Debezium takes them between chunks: a run
    already reading a snapshot does not read it to its end once paused."""
    dsn = pg.dsn(database)
    sql(
        dsn,
        "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 2000) g",
        signal_table_ddl(SIGNALS),
    )
    p = make_pipeline(
        tmp_path, dsn, [ITEMS.qualified], snapshot="no_data",
        snapshot_extra=f"chunk.size: 100\nmax.threads: 1\nsignal.data.collection: {SIGNALS}\n",
    )  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0
    send(dsn, "snap-1", "execute-snapshot", '{"data-collections": ["public.items"]}')
    proc = p.start_ingest()
    try:
        seen = _wait_for_groups(p, proc, at_least=2)
        send(dsn, "pause-1", "pause-snapshot")
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-4000:]
    job = only_job(p)
    assert job.paused
    part = job.tables[0]
    # the group in flight ends, and at most one more if it began before the signal committed
    assert seen <= part.groups_done <= seen + 2 < len(part.groups(1)), err[-4000:]
    assert f"snapshot {job.id} paused by signal pause-1" in err


def _wait_for_groups(p: Pipeline, proc: subprocess.Popen[str], *, at_least: int) -> int:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"ingest ended early: {proc.communicate()[1][-3000:]}"
        jobs = load_jobs(p.lake)
        if jobs and jobs[0].tables[0].groups_done >= at_least:
            return jobs[0].tables[0].groups_done
        time.sleep(0.05)
    raise AssertionError("the snapshot did not progress")


def _first_group_read(dsn: str, tmp_path: Path, snapshot: str, extra: str = "") -> Pipeline:
    """`items` (ids and surrogate keys 1-100, row 60 with a value stored out of line, which an
    update that does not touch it does not resend) in two chunks of 50; a run reads the first
    group of the snapshot `snapshot` (an execute-snapshot payload) asks for, then dies."""
    sql(
        dsn,
        "CREATE TABLE items (id int PRIMARY KEY, sk int UNIQUE, v text, big text)",
        "ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL",
        "INSERT INTO items SELECT g, g, 'v' || g, NULL FROM generate_series(1, 100) g",
        f"UPDATE items SET big = '{'x' * 20000}' WHERE id = 60",
        signal_table_ddl(SIGNALS),
    )
    p = make_pipeline(
        tmp_path, dsn, [ITEMS.qualified], snapshot="no_data", extra=extra,
        snapshot_extra=f"chunk.size: 50\nmax.threads: 1\nsignal.data.collection: {SIGNALS}\n",
    )  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0
    send(dsn, "snap-1", "execute-snapshot", snapshot)
    killed = p.ingest_with_fault("snapshot.chunk_done@1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert only_job(p).tables[0].groups_done == 1
    return p


def test_maintenance_keeps_the_stream_a_paused_snapshot_still_searches(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Paused after its first group, a snapshot's second group has yet to look in the stream
    for rows key changes took out of its chunk to keys the first read had passed. Maintenance
    with no staged retention runs meanwhile: it must keep the files since the first read, or
    the row moved without its out-of-line value is never read whole."""
    dsn = pg.dsn(database)
    p = _first_group_read(dsn, tmp_path, '{"data-collections": ["public.items"]}',
                          extra="maintenance:\n  staged_retention_hours: 0\n")  # fmt: skip
    send(dsn, "pause-1", "pause-snapshot")
    sql(dsn, "UPDATE items SET id = -60 WHERE id = 60")  # from the unread chunk to the read one
    ingest(p)  # streamed into bronze, paused
    sql(dsn, "UPDATE items SET v = 'later' WHERE id = 1")
    ingest(p)  # the move's file is no longer the newest
    done = p.maintain()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "kept for a snapshot under way" in done.stdout + done.stderr

    send(dsn, "resume-1", "resume-snapshot")
    ingest(p)
    ingest(p)
    assert only_job(p).finished
    assert assert_mirror_equals_source(spark, p.lake, dsn, ITEMS) == 100


def test_a_row_a_surrogate_key_change_moved_into_a_chunk_read_before_is_named_and_read_again(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Chunked by a surrogate key, a snapshot cannot follow a row whose surrogate key changed
    from a chunk not yet read to one read before, without resending an out-of-line value: the
    update carries no old surrogate key to tell where the row came from. No read finds the row
    whole, and the mirror has it only from the stream, without that value. The snapshot's end
    says so, with the row; the remedy it names makes the mirror equal the source."""
    dsn = pg.dsn(database)
    p = _first_group_read(
        dsn, tmp_path, '{"data-collections": ["public.items"], "surrogate-key": "sk"}'
    )
    sql(dsn, "UPDATE items SET sk = -60 WHERE id = 60")  # from the unread chunk to the read one
    logged = ingest(p) + ingest(p)
    assert only_job(p).finished
    assert "1 mirror rows lack values no read brought" in logged, logged[-6000:]
    assert "e.g. (sk=-60: big)" in logged
    assert "cdc snapshot --pipeline p --table public.items" in logged
    row = spark.read.format("delta").load(p.lake.silver(ITEMS)).where("id = 60").first()
    assert row is not None
    assert (row["big"], row["_cdc_unavailable"]) == (None, ["big"])

    requested = p.cdc(
        "snapshot", "--pipeline", "p", "--table", ITEMS.qualified, "--where", "sk = -60"
    )
    assert requested.returncode == 0, requested.stderr
    logged = ingest(p) + ingest(p)
    assert "lack values" not in logged
    assert assert_mirror_equals_source(spark, p.lake, dsn, ITEMS) == 100


def _continuous_items(dsn: str, tmp_path: Path, rows: int, *, snapshot: str) -> Pipeline:
    """Table items of `rows` rows, read in chunks of 100 one at a time, with the signal table."""
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        f"INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, {rows}) g",
        signal_table_ddl(SIGNALS))  # fmt: skip
    return make_pipeline(
        tmp_path, dsn, [ITEMS.qualified], snapshot=snapshot,
        snapshot_extra=f"chunk.size: 100\nmax.threads: 1\nsignal.data.collection: {SIGNALS}\n",
        extra="capture:\n  trigger_interval_s: 0\n  retry_backoff_s: 0.2\n",
    )  # fmt: skip


def test_a_snapshot_asked_for_and_stopped_during_a_table_s_first_read_leaves_that_read_whole(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Between two reads of a table's initial snapshot (its mirror not made yet: silver makes
    it once the batch's reads are in), an execute-snapshot of the table, then a stop-snapshot
    of it. The new snapshot took the missing mirror for one dropped to rebuild it: its reset
    marker emptied the 200 rows read so far, and with it stopped nothing read them again."""
    dsn = pg.dsn(database)
    p = _continuous_items(dsn, tmp_path, 600, snapshot="initial")
    reads = [0]

    def signal_after_the_second_read() -> None:
        reads[0] += 1
        if reads[0] == 2:
            send(dsn, "snap-1", "execute-snapshot", '{"data-collections": ["public.items"]}')
            send(dsn, "stop-1", "stop-snapshot",
                 '{"data-collections": ["public.items"], "type": "incremental"}')  # fmt: skip

    with faults.hooked("snapshot.chunk_done", signal_after_the_second_read):
        run = p.ingest_here("--continuous", "--max-batches", "3")

    assert run.returncode == 0, run.stderr[-3000:]
    assert "has no silver mirror" not in run.stderr
    assert p.ingest().returncode == 0
    initial, asked = load_jobs(p.lake)
    assert (initial.kind, initial.finished, initial.stopped) == ("initial", True, False)
    assert (asked.kind, asked.finished, asked.tables[0].ended) == (
        "incremental",
        True,
        "stopped by signal stop-1",
    )
    [first, second], _ = read_snapshots(p.lake)
    assert (first.tables_done, first.ended, second.tables_done) == (1, (), 0)
    assert assert_mirror_equals_source(spark, p.lake, dsn, ITEMS) == 600


def test_a_group_whose_exported_snapshot_is_lost_before_its_readers_import_it_is_retried(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """The session holding a group's exported snapshot ends (a server restart, a terminated
    backend) before the executors import it: `invalid snapshot identifier`, which exited 1 as
    an unexpected Py4J error. It is transient: the continuous run reads the group again."""
    dsn = pg.dsn(database)
    p = _continuous_items(dsn, tmp_path, 300, snapshot="no_data")
    assert p.ingest("--capture-only").returncode == 0
    send(dsn, "snap-1", "execute-snapshot", '{"data-collections": ["public.items"]}')
    windows = [0]

    def end_the_exporting_session() -> None:
        windows[0] += 1
        if windows[0] == 2:
            sql(dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                     "current_database() AND state = 'idle in transaction'")  # fmt: skip

    with faults.hooked("window.high_watermark", end_the_exporting_session):
        run = p.ingest_here("--continuous", "--max-batches", "3")

    assert run.returncode == 0, run.stderr[-3000:]
    assert "the session holding the read's snapshot was lost" in run.stderr
    assert "invalid snapshot identifier" in run.stderr
    assert p.ingest().returncode == 0
    assert all(j.finished for j in load_jobs(p.lake))
    assert assert_mirror_equals_source(spark, p.lake, dsn, ITEMS) == 300
