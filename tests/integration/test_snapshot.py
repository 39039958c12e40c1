"""Snapshots end to end: initial, incremental (signal, `cdc snapshot`), resumed after a kill,
a lost position re-snapshotted, keys of every kind; the mirror equals the source every time.

Workloads run while snapshots read, so the reads and the stream really interleave; each test
checks that they did (stream changes committed inside the snapshot's read window).
"""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc_core.config import Dsn
from cdc_core.errors import TerminalError
from cdc_core.identifiers import TableName
from cdc_core.notifications import notifications_table, sink_records
from cdc_core.pg.connect import VALUE_SETTINGS
from cdc_core.sample.shop import create_schema, load_shop
from cdc_core.sample.workload import WorkloadSpec, WorkloadStats, run_workload
from cdc_core.signals import signal_table_ddl
from cdc_core.snapshot import SnapshotJob, load_current, load_jobs
from cdc_core.snapshot_read import _import_snapshot, shared_snapshot
from cdc_core.state import stream_file
from tests.integration.conftest import PgServer
from tests.integration.harness import ROOT, Pipeline, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source

SHOP = [TableName("public", t) for t in ("customers", "orders", "order_items")]
SIGNALS = TableName("public", "cdc_signal")


def ingest(p: Pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    run = p.ingest(*args)
    assert run.returncode == 0, run.stderr[-4000:]
    return run


def assert_shop_equal(spark: SparkSession, p: Pipeline) -> dict[str, int]:
    return {t.name: assert_mirror_equals_source(spark, p.lake, p.dsn, t) for t in SHOP}


@contextmanager
def workload(dsn: str, *, rate: float = 150, seed: int = 3) -> Iterator[list[WorkloadStats]]:
    """Traffic on the shop for as long as the block runs; the stats once it is over."""
    stop = threading.Event()
    out: list[WorkloadStats] = []
    spec = WorkloadSpec(changes=None, duration_s=3600, rate=rate, concurrency=3, seed=seed)
    thread = threading.Thread(target=lambda: out.append(run_workload(dsn, spec, stop=stop)))
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join(timeout=60)
    assert out, "the workload thread failed"


def only_job(p: Pipeline) -> SnapshotJob:
    jobs = load_jobs(p.lake)
    assert len(jobs) == 1, [j.id for j in jobs]
    return jobs[0]


def stream_changes_inside(spark: SparkSession, p: Pipeline, job: SnapshotJob) -> int:
    """Stream changes committed while the job was reading (between its first and last read)."""
    bronze = spark.read.format("delta").load(p.lake.bronze)
    total = 0
    for part in job.tables:
        assert part.first is not None
        assert part.last is not None
        total += bronze.where(
            (F.col("source_table") == part.table.qualified) & (F.col("op") != "r")
            & F.col("commit_lsn").between(part.first, part.last)
        ).count()  # fmt: skip
    return total


def assert_bronze_replays_to_source(spark: SparkSession, p: Pipeline, table: TableName) -> None:
    """A Debezium consumer's view: bronze's events of `table` applied in order (the last event
    of a key wins, a delete removes it, an unsent TOASTed value keeps the one before) give
    the source's rows, value for value. Snapshot reads included: DBLog's guarantee."""
    rows = (
        spark.read.format("delta").load(p.lake.bronze)
        .where((F.col("source_table") == table.qualified) & F.col("op").isin("r", "c", "u", "d"))
        .orderBy("commit_lsn", "seq")
        .select("op", "key", "after", "unchanged", "headers").collect()
    )  # fmt: skip
    state: dict[str, dict[str, object]] = {}
    gone: dict[str, dict[str, object]] = {}
    for r in rows:
        if r["op"] == "d":
            gone[r["key"]] = state.pop(r["key"], {})
            continue
        values = json.loads(r["after"])
        earlier = state.get(r["key"]) or gone.get((r["headers"] or {}).get("__debezium.oldkey"), {})
        for name in r["unchanged"] or ():
            values[name] = earlier.get(name, "<unknown>")
        state[r["key"]] = values
    with psycopg.connect(p.dsn) as conn:
        for name, value in VALUE_SETTINGS.items():
            conn.execute("SELECT set_config(%s, %s, false)", (name, value))
        columns = [c for c, in conn.execute(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum", (table.qualified,))]  # fmt: skip
        texts = ", ".join(
            f"CASE WHEN {c}::text IS NULL THEN NULL ELSE format('%s', {c}) END" for c in columns
        )
        source = [dict(zip(columns, row, strict=True))
                  for row in conn.execute(f"SELECT {texts} FROM {table.qualified}")]  # fmt: skip
    replayed = sorted(json.dumps(v, sort_keys=True) for v in state.values())
    expected = sorted(json.dumps(v, sort_keys=True) for v in source)
    assert len(replayed) == len(expected), (
        f"{table}: {len(replayed)} rows replayed, {len(expected)} in the source"
    )
    diff = set(replayed) ^ set(expected)
    assert not diff, f"{table}: bronze replays to other rows than the source: {sorted(diff)[:2]}"


def test_initial_snapshot_under_workload_equals_source(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    create_schema(dsn)
    loaded = load_shop(dsn, customers=400)
    p = make_pipeline(tmp_path, dsn, [t.qualified for t in SHOP], snapshot="initial",
                      snapshot_extra="chunk.size: 150\nmax.threads: 2\n",
                      source_extra="notification.enabled.channels: log,sink\n"
                                   "notification.sink.topic.name: notifications\n")  # fmt: skip
    with workload(dsn) as stats:
        first = ingest(p)
    assert stats[0].rows_changed_committed > 0
    job = only_job(p)
    assert job.kind == "initial", job.to_json()
    assert job.finished, job.to_json()
    assert {t.table for t in job.tables} == set(SHOP)
    assert all(len(t.plan.chunks) > 2 for t in job.tables)  # chunked, several groups
    assert "snapshot: " in first.stdout
    assert_snapshot_notifications(p, job, logged=first.stderr)
    assert_notifications_table_equals_lines(spark, p)  # the run's end caught the table up
    assert stream_changes_inside(spark, p, job) > 0, "the workload did not overlap the reads"

    bronze = spark.read.format("delta").load(p.lake.bronze)
    reads = bronze.where(F.col("op") == "r")
    assert reads.count() == sum(t.rows for t in job.tables)
    assert reads.where(F.col("source.snapshot") != "true").count() == 0
    per_key = reads.groupBy("source_table", "key").count().where("count > 1").count()
    assert per_key == 0, "a row was read twice"
    assert job.tables[0].rows >= loaded.customers

    notes = sink_records(p.lake, "notifications")
    ingest(p)  # the changes made after the first run's end
    assert_shop_equal(spark, p)
    for t in SHOP:
        assert_bronze_replays_to_source(spark, p, t)
    assert len(load_jobs(p.lake)) == 1, "a finished initial snapshot is not taken again"
    assert load_current(p.lake) == [], "archived: a batch no longer reads it"
    assert len(sink_records(p.lake, "notifications")) == len(notes), "no snapshot, no notes"
    assert_notifications_table_equals_lines(spark, p)
    stream_file(p.lake).unlink()  # the archived snapshot is a stored position still
    ingest(p)
    assert len(load_jobs(p.lake)) == 1
    assert stream_file(p.lake).exists()


def assert_notifications_table_equals_lines(spark: SparkSession, p: Pipeline) -> None:
    """The Delta table of the sink holds each line once, in order, with Debezium's fields."""
    table = spark.read.format("delta").load(notifications_table(p.lake, "notifications"))
    rows = [r.asDict() for r in table.orderBy("seq").collect()]
    keys = ("id", "aggregate_type", "type", "additional_data", "timestamp")
    assert [{k: r[k] for k in keys} for r in rows] == sink_records(p.lake, "notifications")
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    assert {r["pipeline"] for r in rows} == {"p"}


def assert_snapshot_notifications(p: Pipeline, job: SnapshotJob, *, logged: str) -> None:
    """Debezium's STARTED, IN_PROGRESS per group, TABLE_SCAN_COMPLETED per table, COMPLETED,
    in order, in the sink and in the log; rows scanned as the job counted them."""
    notes = sink_records(p.lake, "notifications")
    assert {n["aggregate_type"] for n in notes} == {"Initial Snapshot"}
    types = [n["type"] for n in notes]
    groups = sum(t.groups_done for t in job.tables)
    assert types[0] == "STARTED"
    assert types[-1] == "COMPLETED"
    assert types.count("IN_PROGRESS") == groups
    assert types.count("STARTED") == types.count("COMPLETED") == 1
    scanned = {
        n["additional_data"]["scanned_collection"]: n["additional_data"]
        for n in notes if n["type"] == "TABLE_SCAN_COMPLETED"
    }  # fmt: skip
    assert scanned == {
        str(t.table): {
            "connector_name": "p", "data_collections": ",".join(str(u) for u in SHOP),
            "scanned_collection": str(t.table), "total_rows_scanned": str(t.rows),
            "status": "SUCCEEDED",
        }
        for t in job.tables
    }  # fmt: skip
    for t in job.tables:  # rows so far grow to the table's total
        progress = [
            int(n["additional_data"]["total_rows_scanned"]) for n in notes
            if n["type"] == "IN_PROGRESS"
            and n["additional_data"]["current_collection_in_progress"] == str(t.table)
        ]  # fmt: skip
        assert progress == sorted(progress)
        assert progress[-1] == t.rows
    stamps = [n["timestamp"] for n in notes]
    assert stamps == sorted(stamps)
    lines = [line for line in logged.splitlines() if "cdc_core.notifications" in line]
    assert sum("IN_PROGRESS" in line for line in lines) == groups, logged[-2000:]


def test_killed_snapshot_rereads_at_most_the_group_in_flight(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    create_schema(dsn)
    load_shop(dsn, customers=500)
    p = make_pipeline(tmp_path, dsn, [t.qualified for t in SHOP], snapshot="initial",
                      source_extra="notification.enabled.channels: sink\n"
                                   "notification.sink.topic.name: notifications\n",
                      snapshot_extra="chunk.size: 150\nmax.threads: 2\n")  # fmt: skip
    proc = p.start_ingest()
    try:
        _wait_for_groups(p, proc, at_least=4)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    persisted = {t.table.qualified: t.groups_done for t in only_job(p).tables}
    total = {t.table.qualified: len(t.groups(2)) for t in only_job(p).tables}
    committed = _committed_groups(spark, p)
    assert sum(persisted.values()) < sum(total.values()), "killed too late: nothing left to read"
    lost = sum(len(committed.get(t, set())) - n for t, n in persisted.items())
    assert 0 <= lost <= 1, (committed, persisted)  # at most the group in flight

    with workload(dsn, seed=11):
        rerun = ingest(p)
    reads = re.findall(r"snapshot \S+: (\S+) group (\d+) of \d+ read", rerun.stderr)
    expected = sum(total[t] - persisted[t] for t in total)
    assert len(reads) == expected, (reads, persisted, total)
    assert all(int(n) > persisted[t.replace('"', "")] for t, n in reads)

    ingest(p)
    assert_shop_equal(spark, p)
    reads_df = spark.read.format("delta").load(p.lake.bronze).where(F.col("op") == "r")
    assert reads_df.groupBy("source_table", "key").count().where("count > 1").count() == 0
    # notifications across the kill: STARTED once (the rerun resumes the job), a group's
    # IN_PROGRESS at least once (the one in flight may be sent again: it is written before
    # the progress it reports is saved), and the Delta table holds each line once
    types = [n["type"] for n in sink_records(p.lake, "notifications")]
    groups = sum(total.values())
    assert (types[0], types[-1]) == ("STARTED", "COMPLETED")
    assert (types.count("STARTED"), types.count("COMPLETED")) == (1, 1)
    assert types.count("TABLE_SCAN_COMPLETED") == len(SHOP)
    assert groups <= types.count("IN_PROGRESS") <= groups + 1, types
    assert_notifications_table_equals_lines(spark, p)


def test_a_group_read_again_after_its_commit_keeps_the_read_that_landed(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Killed after a group reached bronze and before the job noted it: the rerun reads the
    group again and Delta skips that commit, so bronze keeps the first read. The job must keep
    the first read's place too, or the sweep deletes the rows streamed between the two reads
    (the loss `make crash` seed 20261124 found)."""
    dsn = pg.dsn(database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t_reread (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t_reread SELECT i * 10, 'r' || i FROM generate_series(1, 300) i")
    table = TableName("public", "t_reread")
    p = make_pipeline(
        tmp_path,
        dsn,
        [table.qualified],
        snapshot="initial",
        snapshot_extra="chunk.size: 100\nmax.threads: 8\n",
    )  # one group
    killed = p.ingest_with_fault("snapshot.chunk_read@1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert only_job(p).tables[0].groups_done == 0
    assert _committed_groups(spark, p) == {table.qualified: {0}}  # landed, not noted
    (landed,) = [
        json.loads(r["userMetadata"]) for r in DeltaTable.forPath(spark, p.lake.bronze).history()
        .select("userMetadata").collect() if "snapshot" in (r["userMetadata"] or "")
    ]  # fmt: skip
    with psycopg.connect(dsn, autocommit=True) as conn:  # between the two reads
        conn.execute("INSERT INTO t_reread SELECT i * 10 + 5, 'late' FROM generate_series(1, 20) i")
        conn.execute("UPDATE t_reread SET v = 'changed' WHERE id <= 100")

    ingest(p)
    ingest(p)
    job = only_job(p)
    assert job.finished, job.to_json()
    assert job.tables[0].first == landed["unseen_from"] <= landed["before"]  # the landed read's
    assert assert_mirror_equals_source(spark, p.lake, dsn, table) == 320
    reads = spark.read.format("delta").load(p.lake.bronze).where(F.col("op") == "r")
    assert reads.count() == 300  # the first read's rows, once


def _wait_for_groups(p: Pipeline, proc: subprocess.Popen[str], *, at_least: int) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"ingest ended before the kill: {proc.communicate()[1][-3000:]}"
        jobs = load_jobs(p.lake)
        if jobs and sum(t.groups_done for t in jobs[0].tables) >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError("the snapshot did not progress")


def _committed_groups(spark: SparkSession, p: Pipeline) -> dict[str, set[int]]:
    """Snapshot groups bronze's history says were appended, per table."""
    out: dict[str, set[int]] = {}
    history = DeltaTable.forPath(spark, p.lake.bronze).history().select("userMetadata").collect()
    for row in history:
        meta = json.loads(row["userMetadata"]) if row["userMetadata"] else {}
        if "snapshot" in meta:
            out.setdefault(meta["table"], set()).add(int(meta["group"]))
    return out


KEYED = {
    "t_text": "code text PRIMARY KEY, v int",
    "t_uuid": "id uuid PRIMARY KEY, v text",
    "t_comp": "a int, b text, v numeric(10,2), PRIMARY KEY (a, b)",
    "t_keyless": "x int, y text",
}


def test_text_uuid_composite_and_keyless_tables_snapshot_exactly(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, columns in KEYED.items():
            conn.execute(f"CREATE TABLE {name} ({columns})")
        conn.execute("ALTER TABLE t_keyless REPLICA IDENTITY FULL")
        conn.execute(
            "INSERT INTO t_text SELECT chr(65 + i % 26) || ' ''q\"' || i || 'é', i "
            "FROM generate_series(1, 1000) i"
        )
        conn.execute(
            "INSERT INTO t_uuid SELECT md5(i::text)::uuid, repeat('x', i % 7) "
            "FROM generate_series(1, 1000) i"
        )
        conn.execute(
            "INSERT INTO t_comp SELECT i % 37, 'b' || (i / 37), i * 1.5 FROM generate_series(1, 1000) i"
        )
        conn.execute("INSERT INTO t_keyless SELECT i % 50, 'dup' FROM generate_series(1, 1000) i")
    tables = [TableName("public", n) for n in KEYED]
    p = make_pipeline(tmp_path, dsn, [t.qualified for t in tables], snapshot="initial",
                      snapshot_extra="chunk.size: 97\nmax.threads: 3\n")  # fmt: skip
    ingest(p)
    job = only_job(p)
    assert job.finished
    plans = {t.table.name: t.plan for t in job.tables}
    assert plans["t_comp"].key == ("a", "b")
    assert len(plans["t_comp"].chunks) > 5
    assert plans["t_text"].key == ("code",)
    assert len(plans["t_text"].chunks) > 5
    assert plans["t_keyless"].key == ()  # block ranges, all read under one snapshot
    for t in tables:
        assert assert_mirror_equals_source(spark, p.lake, dsn, t) == 1000

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE t_text SET v = -v WHERE v % 3 = 0")
        conn.execute("DELETE FROM t_uuid WHERE v = ''")
        conn.execute("UPDATE t_comp SET b = b || '!' WHERE a = 5")
        conn.execute(
            "DELETE FROM t_keyless WHERE ctid IN (SELECT ctid FROM t_keyless WHERE x = 7 LIMIT 3)"
        )
        conn.execute("INSERT INTO t_keyless VALUES (7, 'dup'), (1000, NULL)")
    ingest(p)
    for t in tables:
        assert_mirror_equals_source(spark, p.lake, dsn, t)


def test_incremental_snapshot_by_signal_under_workload(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    create_schema(dsn)
    load_shop(dsn, customers=300)  # before the slot: only a snapshot brings these rows
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(signal_table_ddl(SIGNALS))
    p = make_pipeline(
        tmp_path, dsn, [t.qualified for t in SHOP], snapshot="no_data",
        snapshot_extra=f"chunk.size: 250\nmax.threads: 2\nsignal.data.collection: {SIGNALS}\n",
    )  # fmt: skip
    ingest(p, "--capture-only")
    with workload(dsn, seed=5) as stats:
        time.sleep(1)  # silver has stream changes of rows it never saw inserted
        ingest(p)
        collections = json.dumps({"data-collections": [t.qualified for t in SHOP]})
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                f"INSERT INTO {SIGNALS} VALUES ('snap-1', 'execute-snapshot', %s)", (collections,)
            )
        ingest(p)
    assert stats[0].deletes > 0
    assert stats[0].updates > 0
    job = only_job(p)
    assert job.kind == "incremental"
    assert job.origin == "signal snap-1"
    assert job.finished
    assert stream_changes_inside(spark, p, job) > 0, "the workload did not overlap the reads"
    reads = spark.read.format("delta").load(p.lake.bronze).where(F.col("op") == "r")
    assert {r[0] for r in reads.select("source.snapshot").distinct().collect()} == {"incremental"}

    ingest(p)
    assert_shop_equal(spark, p)
    for t in SHOP:  # rows deleted or updated inside a read's window were dropped or updated
        assert_bronze_replays_to_source(spark, p, t)
    assert len(load_jobs(p.lake)) == 1, "a processed signal is not carried out twice"


@pytest.mark.slow
def test_columns_added_dropped_and_widened_in_the_middle_of_an_incremental_snapshot(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Debezium's `incremental.snapshot.allow.schema.changes`, always on here: each window reads
    the columns the table has under its lock, so DDL while a snapshot runs (it waits for the
    window in hand, or that window gives way to it and starts again) changes what the next read
    finds, and the stream carries the new shape."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, a text, b int, c text)",
        "INSERT INTO items SELECT g, 'a' || g, g, 'c' || g FROM generate_series(1, 1200) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.items"], snapshot="no_data",
                      snapshot_extra="chunk.size: 200\nmax.threads: 1\n")  # fmt: skip
    ingest(p, "--capture-only")
    asked = p.cdc("snapshot", "--pipeline", "p", "--table", "public.items")
    assert asked.returncode == 0, asked.stderr
    proc = p.start_ingest()
    try:
        _wait_for_groups(p, proc, at_least=2)  # of 6
        sql(dsn,
            "ALTER TABLE items ADD COLUMN d int",
            "UPDATE items SET d = id WHERE id % 7 = 0",  # rows read already, and rows not yet
            "ALTER TABLE items DROP COLUMN c",
            "ALTER TABLE items ALTER COLUMN b TYPE bigint",  # a rewrite: a new relfilenode
            "UPDATE items SET b = b + 10000000000 WHERE id % 11 = 0",
            "DELETE FROM items WHERE id % 13 = 0",
            "INSERT INTO items SELECT g, 'new', g, g FROM generate_series(1201, 1300) g")  # fmt: skip
        done_at_ddl = sum(t.groups_done for t in only_job(p).tables)
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-4000:]
    job = only_job(p)
    assert job.finished
    total = sum(len(t.groups(1)) for t in job.tables)
    assert done_at_ddl < total, "the snapshot ended before the DDL: nothing was read after it"

    ingest(p)
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "items"),
                                       skip=("c",)) == 1300 - 1200 // 13  # fmt: skip
    reads = spark.read.format("delta").load(p.lake.bronze).where(F.col("op") == "r")
    with_d = reads.where(F.get_json_object("after", "$.d").isNotNull()).count()
    without_c = reads.where(~F.col("after").contains('"c":')).count()
    assert with_d > 0, "no window read the added column"
    assert without_c > 0, "no window read after the drop"


@pytest.mark.slow
def test_lost_position_fails_initial_and_when_needed_resnapshots(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    create_schema(dsn)
    load_shop(dsn, customers=150)
    p = make_pipeline(tmp_path, dsn, [t.qualified for t in SHOP], snapshot="initial")
    ingest(p)
    assert_shop_equal(spark, p)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (p.slot,))
        conn.execute("DELETE FROM orders WHERE id % 4 = 0")  # missed: there is no slot
        conn.execute("UPDATE customers SET full_name = full_name || ' (moved)' WHERE id % 3 = 0")
    failed = p.ingest()
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert "no longer has the stored position" in failed.stderr
    assert "when_needed" in failed.stderr

    p.edit("mode: initial", "mode: when_needed")
    ingest(p)
    jobs = load_jobs(p.lake)
    assert len(jobs) == 2
    assert all(j.finished for j in jobs)
    assert_shop_equal(spark, p)  # the deleted orders are swept, the renamed customers read
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM customers WHERE id < 20")
    ingest(p)  # the new slot streams on
    assert_shop_equal(spark, p)


@pytest.mark.slow
def test_two_pipelines_on_one_slot_are_named_not_taken_for_a_recreated_slot(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """A slot delivers each change once: a second pipeline (another lake) configured with the
    first one's slot takes changes the first never sees. The second is warned when it adopts
    the slot; the first, finding the slot past its stored position, says why that may be."""
    dsn = pg.dsn(database)
    create_schema(dsn)
    load_shop(dsn, customers=20)
    first = make_pipeline(tmp_path / "first", dsn, ["public.customers"], snapshot="initial")
    ingest(first)
    second = make_pipeline(tmp_path / "second", dsn, ["public.customers"], snapshot="initial")
    second.edit(f"pub_{second.slot}", f"pub_{first.slot}")  # a copied pipeline file
    second.edit(f"slot: {second.slot}", f"slot: {first.slot}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE customers SET tier = 'gold' WHERE id = 1")
    adopted = ingest(second)
    assert f"replication slot {first.slot} exists already and pipeline p" in adopted.stderr
    assert "give every pipeline its own source.slot" in adopted.stderr
    failed = first.ingest()
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert f"replication slot {first.slot} is ahead of this pipeline's stored position" in (
        failed.stderr
    )
    assert "another pipeline or connector reads the same slot" in failed.stderr
    assert "exists already and pipeline p" not in ingest(second).stderr  # its own position now


def test_a_table_left_out_of_the_pipeline_ends_its_read_and_one_taken_back_is_named(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """A read carried on for a table no longer captured put its rows in bronze beside stream
    changes that were filtered out; a table captured again under no_data missed the changes
    made meanwhile, and nothing said so."""
    dsn = pg.dsn(database)
    sql(dsn, *(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)" for t in "ab"))
    both = "tables: ['public.a', 'public.b']"
    p = make_pipeline(tmp_path, dsn, ["public.a", "public.b"], snapshot="no_data")
    ingest(p, "--capture-only")
    sql(dsn, *(f"INSERT INTO {t} SELECT g, 'v' FROM generate_series(1, 10) g" for t in "ab"))
    ingest(p)
    assert p.cdc("snapshot", "--pipeline", "p", "--table", "public.b").returncode == 0
    ingest(p, "--capture-only")  # planned, nothing read
    assert p.cdc("snapshot", "--pipeline", "p", "--table", "public.b").returncode == 0  # queued
    p.edit(both, "tables: ['public.a']")
    sql(dsn, "DELETE FROM b WHERE id <= 3")
    left = ingest(p)
    assert "public.b is no longer captured (source.tables): its read ends" in left.stderr
    assert ("cdc snapshot of public.b dropped: the table is no longer captured "
            "(source.tables)") in left.stderr  # fmt: skip
    bronze = spark.read.format("delta").load(p.lake.bronze)
    assert not bronze.where((F.col("source_table") == "public.b") & (F.col("op") == "r")).count()
    [job] = [j for j in load_jobs(p.lake) if j.kind == "incremental"]
    assert job.finished
    assert job.tables[0].ended == "left out of source.tables"
    p.edit("tables: ['public.a']", both)
    back = ingest(p)
    assert ("public.b captured again under snapshot.mode no_data: their mirrors missed the "
            "changes made while they were left out") in back.stderr  # fmt: skip
    assert "captured again" not in ingest(p).stderr  # said once, when it came back


def test_snapshot_command_reads_a_filtered_table(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    create_schema(dsn)
    load_shop(dsn, customers=100)
    sql(dsn, signal_table_ddl(SIGNALS), "CREATE TABLE victim (id int)")
    p = make_pipeline(tmp_path, dsn, [t.qualified for t in SHOP], snapshot="no_data",
                      snapshot_extra=f"signal.data.collection: {SIGNALS}\n")  # fmt: skip
    ingest(p, "--capture-only")

    def cdc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cdc_core.cli", "snapshot", "--pipeline", "p", *args],
            env=p.env() | {"PYTHONPATH": str(ROOT)}, cwd=p.home, capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip

    unknown = cdc("--table", "public.nope")
    assert unknown.returncode == 2
    assert "does not capture public.nope" in unknown.stderr
    bad = cdc("--table", "public.orders", "--where", "totl > 100")
    assert bad.returncode == 2, bad.stderr
    assert 'column "totl" does not exist' in bad.stderr
    # a condition is one condition: checking it ran what followed a `;` (as a read would)
    evil = "true); COMMIT; DROP TABLE victim; --"
    refused = cdc("--table", "public.orders", "--where", evil)
    assert refused.returncode == 2, refused.stderr
    assert "is refused: a ')' at character 5 that closes more than" in refused.stderr
    filters = [{"data-collection": "public.orders", "filter": evil}]
    with psycopg.connect(dsn, autocommit=True) as conn:  # the same from the signal table
        conn.execute(f"INSERT INTO {SIGNALS} VALUES ('evil', 'execute-snapshot', %s)",
                     (json.dumps({"data-collections": ["public.orders"],
                                  "additional-conditions": filters}),))  # fmt: skip
    # jsonb's ? is a parameter mark to the JDBC driver unless doubled; the one quoted is not;
    # a comment at the end does not take the read's closing parenthesis with it
    where = "id % 3 = 0 AND shipping ? 'tracking' AND status::text <> 'what?' -- tracked)"
    good = cdc("--table", "public.orders", "--where", where)
    assert good.returncode == 0, good.stderr
    run = ingest(p)
    assert "signal evil not carried out: the condition 'true); COMMIT;" in run.stderr
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regclass('victim') IS NOT NULL").fetchone() == (True,)
    job = only_job(p)
    assert job.origin == "cdc snapshot"
    assert job.finished
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM orders WHERE {where}\n").fetchone()
        everything = conn.execute("SELECT count(*) FROM orders WHERE id % 3 = 0").fetchone()
    assert row is not None
    assert everything is not None
    assert 0 < row[0] < everything[0] < 300  # some orders have no shipping document
    silver = spark.read.format("delta").load(p.lake.silver(SHOP[1]))
    assert silver.count() == row[0]
    assert silver.where("id % 3 <> 0 OR shipping IS NULL").count() == 0


def test_initial_only_snapshots_without_a_slot(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    create_schema(dsn)
    load_shop(dsn, customers=120)
    p = make_pipeline(tmp_path, dsn, [t.qualified for t in SHOP], snapshot="initial_only")
    out = ingest(p).stdout
    assert "stream: not read" in out
    assert_shop_equal(spark, p)
    with psycopg.connect(dsn) as conn:
        slots = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                             (p.slot,)).fetchone()  # fmt: skip
    assert slots == (0,)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM orders")
    ingest(p)  # done already: neither a snapshot nor a stream
    assert spark.read.format("delta").load(p.lake.silver(SHOP[1])).count() == 360


ACCOUNTS, MOVES = TableName("public", "accounts"), TableName("public", "moves")
TOTAL = 1_000 * 1_000


def _transfers(dsn: str, stop: threading.Event, done: list[int]) -> None:
    """Transactions that keep two invariants every consistent state of the source holds: the
    balances sum to TOTAL, and the accounts' `moved` counts sum to the rows of `moves`. One in
    four also moves an account to a new key past every other (a delete and an insert for a
    snapshot's chunks). `done[0]` counts the committed ones."""
    rng = random.Random(7)
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            ids = [int(str(r[0])) for r in conn.execute(
                "SELECT id FROM accounts TABLESAMPLE BERNOULLI (1) LIMIT 2").fetchall()]  # fmt: skip
            if len(ids) < 2:
                continue
            a, b = ids
            with conn.transaction():
                conn.execute("UPDATE accounts SET balance = balance - 7, moved = moved + 1 "
                             "WHERE id = %s", (a,))  # fmt: skip
                conn.execute("UPDATE accounts SET balance = balance + 7 WHERE id = %s", (b,))
                conn.execute("INSERT INTO moves (amount) VALUES (7)")
                if rng.random() < 0.25:
                    conn.execute("UPDATE accounts SET id = (SELECT max(id) + 1 FROM accounts) "
                                 "WHERE id = %s", (rng.choice(ids),))  # fmt: skip
            done[0] += 1
            stop.wait(0.02)  # about 40 a second: the machine's two cores are the reads' too


@pytest.mark.slow
def test_initial_only_is_one_consistent_snapshot_of_every_table_while_the_source_is_written(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """initial_only has no stream to reconcile its reads with, so every group of every table is
    read under one MVCC snapshot: the mirrors are the source at one moment, which invariants
    that hold across chunks and across tables show."""
    dsn = pg.dsn(database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint, moved int)")
        conn.execute("INSERT INTO accounts SELECT g, 1000, 0 FROM generate_series(1, 1000) g")
        conn.execute("CREATE TABLE moves (id bigserial PRIMARY KEY, amount int)")
    p = make_pipeline(tmp_path, dsn, ["public.accounts", "public.moves"], snapshot="initial_only",
                      snapshot_extra="chunk.size: 100\nmax.threads: 1\n")  # fmt: skip
    stop, done, seen = threading.Event(), [0], {}
    writer = threading.Thread(target=_transfers, args=(dsn, stop, done))
    writer.start()
    try:
        proc = p.start_ingest()
        assert proc.stderr is not None
        for line in proc.stderr:  # how many transfers committed while the groups were read
            for n in (1, 10):
                if f"public.accounts group {n} of 10 read" in line:
                    seen[n] = done[0]
        assert proc.wait(timeout=900) == 0
    finally:
        stop.set()
        writer.join(timeout=60)

    assert seen[10] - seen[1] >= 10, seen  # the source was written all through the reads
    accounts = spark.read.format("delta").load(p.lake.silver(ACCOUNTS))
    moves = spark.read.format("delta").load(p.lake.silver(MOVES))
    row = accounts.agg(
        F.count("*"), F.countDistinct("id"), F.sum("balance"), F.sum("moved")
    ).first()
    assert row is not None
    assert tuple(row) == (1000, 1000, TOTAL, moves.count())


def test_a_table_emptied_or_rewritten_after_the_shared_snapshot_was_taken_is_not_read_under_it(
    pg: PgServer, database: str
) -> None:
    """TRUNCATE and table rewrites are not MVCC-safe: under a snapshot taken before them the
    table reads empty. A group that imports the shared snapshot refuses such a table (a
    partition of it too) instead of landing nothing for it."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE kept (id int PRIMARY KEY)", "CREATE TABLE emptied (id int PRIMARY KEY)",
        "CREATE TABLE parted (id int PRIMARY KEY) PARTITION BY RANGE (id)",
        "CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100)",
        "INSERT INTO kept VALUES (1)", "INSERT INTO emptied VALUES (1)",
        "INSERT INTO parted VALUES (1)")  # fmt: skip
    kept, emptied, parted = (TableName("public", t) for t in ("kept", "emptied", "parted"))
    with shared_snapshot(Dsn(dsn)) as shared:
        sql(dsn, "TRUNCATE emptied", "TRUNCATE parted_1", "INSERT INTO kept VALUES (2)")
        for table, refused in ((kept, False), (emptied, True), (parted, True)):
            with psycopg.connect(dsn, autocommit=True) as conn:
                if refused:
                    with pytest.raises(TerminalError, match=f"snapshot of {table}: the table was"):
                        _import_snapshot(conn, shared, table, 1000)
                    continue
                assert _import_snapshot(conn, shared, table, 1000) == shared.name
                assert conn.execute("SELECT count(*) FROM kept").fetchone() == (1,)  # as of then


def test_new_table_and_blocking_signal_read_only_what_they_name(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    create_schema(dsn)
    load_shop(dsn, customers=120)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(signal_table_ddl(SIGNALS))
    p = make_pipeline(tmp_path, dsn, ["public.customers"], snapshot="initial",
                      snapshot_extra=f"signal.data.collection: {SIGNALS}\n")  # fmt: skip
    ingest(p)
    p.edit("tables: ['public.customers']", "tables: ['public.customers', 'public.orders']")
    blocking = json.dumps({
        "type": "blocking", "data-collections": ["public.customers"],
        "additional-conditions": [{"data-collection": "public.customers",
                                   "filter": "SELECT * FROM public.customers WHERE id <= 50"}],
    })  # fmt: skip
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {SIGNALS} VALUES ('b-1', 'execute-snapshot', %s)", (blocking,))
        conn.execute("UPDATE customers SET tier = 'gold' WHERE id % 5 = 0")
    ingest(p)
    jobs = {j.origin: j for j in load_jobs(p.lake)}
    assert set(jobs) == {"snapshot.mode initial", "new tables", "signal b-1"}
    assert [t.table.name for t in jobs["new tables"].tables] == ["orders"]
    assert jobs["signal b-1"].kind == "blocking"
    assert all(j.finished for j in jobs.values())
    reads = spark.read.format("delta").load(p.lake.bronze).where(F.col("op") == "r")
    by_job: dict[tuple[str, str], int] = {}  # staged_file of a read: snapshot:<job>:<group>
    for r in reads.groupBy("staged_file", "source_table").count().collect():
        key = (r["staged_file"].split(":")[1], r["source_table"])
        by_job[key] = by_job.get(key, 0) + r["count"]
    assert by_job[(jobs["signal b-1"].id, "public.customers")] == 50
    assert by_job[(jobs["new tables"].id, "public.orders")] == 360
    assert (jobs["new tables"].id, "public.customers") not in by_job  # not read again
    blocking_reads = reads.where(
        F.col("staged_file").startswith(f"snapshot:{jobs['signal b-1'].id}")
    )
    assert {r[0] for r in blocking_reads.select("source.snapshot").distinct().collect()} == {"true"}
    for t in SHOP[:2]:
        assert_mirror_equals_source(spark, p.lake, dsn, t)


@pytest.mark.slow
def test_snapshot_include_collection_list_limits_what_the_initial_snapshot_reads(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Debezium's snapshot.include.collection.list: the initial snapshot (and a table added
    later) reads only the tables it names; the others start empty and take their changes."""
    dsn = pg.dsn(database)
    create_schema(dsn)
    load_shop(dsn, customers=40)
    p = make_pipeline(tmp_path, dsn, ["public.customers", "public.orders"], snapshot="initial",
                      snapshot_extra="include.collection.list: 'public\\.cust.*'\n")  # fmt: skip
    ingest(p)
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = conn.execute("SELECT min(id) FROM orders").fetchone()
        conn.execute("UPDATE orders SET status = 'cancelled' WHERE id = %s", first)
        conn.execute("UPDATE customers SET tier = 'gold' WHERE id % 5 = 0")
    ingest(p)
    p.edit("tables: ['public.customers', 'public.orders']",
           "tables: ['public.customers', 'public.orders', 'public.order_items']")  # fmt: skip
    ingest(p)  # a table added later: not named, so not snapshotted either
    reads = spark.read.format("delta").load(p.lake.bronze).where(F.col("op") == "r")
    read_tables = {r[0] for r in reads.select("source_table").distinct().collect()}
    assert read_tables == {"public.customers"}
    assert_mirror_equals_source(spark, p.lake, dsn, SHOP[0])
    orders = spark.read.format("delta").load(p.lake.silver(SHOP[1]))
    assert [tuple(r) for r in orders.select("id", "status").collect()] == [(*first, "cancelled")]
    jobs = load_jobs(p.lake)
    assert [[t.table.name for t in j.tables] for j in jobs] == [["customers"]]


@pytest.mark.slow
def test_a_blocking_snapshot_command_with_where_reads_the_rows_it_names(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """`cdc snapshot --blocking --where COND`: the condition becomes the query a blocking
    snapshot reads (it was planned as a query of its own: `FROM (COND) AS ...`, invalid SQL),
    in the table's key ranges; the rows it does not name stay as they are in the mirror."""
    dsn = pg.dsn(database)
    notes = TableName("public", "Field Notes")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute('CREATE TABLE "Field Notes" (id serial PRIMARY KEY, v int, note text)')
        conn.execute("""INSERT INTO "Field Notes" (v, note) SELECT g % 150, 'n' || g
                        FROM generate_series(1, 600) g""")  # fmt: skip
        conn.execute('ANALYZE "Field Notes"')  # the plan's estimate: several chunks
    p = make_pipeline(tmp_path, dsn, [str(notes)], snapshot="initial",
                      snapshot_extra="chunk.size: 100\n")  # fmt: skip
    ingest(p)
    assert len(only_job(p).tables[0].plan.chunks) > 1
    with psycopg.connect(dsn, autocommit=True) as conn:  # the mirror drifts from its source
        conn.execute("""INSERT INTO "Field Notes" (v, note) VALUES (7, 'extra'), (140, 'extra')""")
        conn.execute("""UPDATE "Field Notes" SET note = 'drifted' WHERE v = 3""")
    ingest(p, "--capture-only")  # the stream has the drift; only the reads say it again
    requested = p.cdc("snapshot", "--pipeline", "p", "--table", str(notes), "--blocking",
                      "--where", "v < 10")  # fmt: skip
    assert requested.returncode == 0, requested.stderr
    ingest(p)
    job = next(j for j in load_jobs(p.lake) if j.origin == "cdc snapshot")
    assert job.kind == "blocking"
    assert job.finished
    reads = (
        spark.read.format("delta")
        .load(p.lake.bronze)
        .where(F.col("staged_file").startswith(f"snapshot:{job.id}"))
    )
    assert reads.count() == 41  # v 0..9: 4 rows each, and the new (7, 'extra')
    assert_mirror_equals_source(spark, p.lake, dsn, notes)  # the rows not read stay


def test_a_table_without_a_key_is_snapshotted_whole_and_once_whatever_asks(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """A table without a primary key is a multiset in silver, which its snapshot replaces:
    - a condition (`cdc snapshot --where`, a signal's `additional-conditions`) is refused, as
      the read would replace the mirror with the rows it names (it kept 180 of 600);
    - a signal's `surrogate-key` does not cut its read into groups under several snapshots;
    - two jobs reading it in one run replace the mirror once (each row counted twice before)."""
    dsn = pg.dsn(database)
    table = TableName("public", "tally")
    sql(dsn, "CREATE TABLE tally (s int NOT NULL, v int, note text)",
        "ALTER TABLE tally REPLICA IDENTITY FULL",
        "INSERT INTO tally SELECT g, g % 10, 'n' || g FROM generate_series(1, 600) g",
        "ANALYZE tally", signal_table_ddl(SIGNALS))  # fmt: skip
    p = make_pipeline(tmp_path, dsn, [str(table)], snapshot="initial",
                      snapshot_extra=f"chunk.size: 100\nsignal.data.collection: {SIGNALS}\n")  # fmt: skip
    ingest(p)

    for where, why in [("v < 3", "has no primary key (nor message.key.columns): its mirror "
                        "is a multiset of rows that a snapshot replaces whole"),
                       ("", "--where needs a condition")]:  # fmt: skip
        refused = p.cdc("snapshot", "--pipeline", "p", "--table", str(table), "--where", where)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert why in refused.stderr
    conditions = {"data-collections": [str(table)],
                  "additional-conditions": [{"data-collection": str(table), "filter": "v < 3"}]}  # fmt: skip
    whole = {"data-collections": [str(table)], "surrogate-key": "s"}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for sid, data in [("part", conditions), ("whole", whole)]:
            conn.execute(f"INSERT INTO {SIGNALS} VALUES (%s, 'execute-snapshot', %s)",
                         (sid, json.dumps(data)))  # fmt: skip
    assert p.cdc("snapshot", "--pipeline", "p", "--table", str(table)).returncode == 0
    sql(dsn, "UPDATE tally SET note = 'later' WHERE s <= 5", "DELETE FROM tally WHERE s > 590",
        "INSERT INTO tally VALUES (601, 1, 'new'), (601, 1, 'new')")  # fmt: skip
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]
    assert "signal part not carried out: public.tally has no primary key" in run.stderr

    jobs = [j for j in load_jobs(p.lake) if j.origin in ("signal whole", "cdc snapshot")]
    assert len(jobs) == 2
    assert all(j.finished for j in jobs)
    for job in jobs:
        (part,) = job.tables
        assert (part.plan.key, len(part.groups(2))) == ((), 1)  # block ranges, one snapshot
        assert len(part.plan.chunks) > 1
    assert not [j for j in load_jobs(p.lake) if j.origin == "signal part"]
    assert assert_mirror_equals_source(spark, p.lake, dsn, table) == 592


@pytest.mark.slow
def test_a_partitioned_table_is_mirrored_from_the_snapshot_and_the_stream(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """A partitioned table is read whole, and its partitions' changes stream as its own: the
    publication publishes them via the root (without it they came under the partitions' names,
    which the pipeline dropped)."""
    dsn = pg.dsn(database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE readings (id int, at date, v text, PRIMARY KEY (id, at))"
            " PARTITION BY RANGE (at)"
        )
        conn.execute(
            "CREATE TABLE readings_1 PARTITION OF readings FOR VALUES FROM (MINVALUE) TO ('2024-07-01')"
        )
        conn.execute(
            "CREATE TABLE readings_2 PARTITION OF readings FOR VALUES FROM ('2024-07-01') TO (MAXVALUE)"
        )
        conn.execute(
            "INSERT INTO readings SELECT g, date '2024-01-01' + g, 'v' || g"
            " FROM generate_series(1, 300) g"
        )
    table = TableName("public", "readings")
    p = make_pipeline(tmp_path, dsn, [table.qualified], snapshot="initial",
                      snapshot_extra="chunk.size: 100\n")  # fmt: skip
    ingest(p)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO readings VALUES (1001, '2024-02-01', 'a'), (1002, '2024-09-01', 'b')"
        )
        conn.execute("UPDATE readings SET v = 'changed' WHERE id % 7 = 0")
        conn.execute("UPDATE readings SET at = at + 200 WHERE id BETWEEN 100 AND 120")  # moves
        conn.execute("DELETE FROM readings WHERE id % 11 = 0")
    ingest(p)
    deleted = 28  # 27 of 1..300, and 1001
    assert assert_mirror_equals_source(spark, p.lake, dsn, table) == 302 - deleted
    checked = p.cdc("validate", "--pipeline", "p")
    assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]


@pytest.mark.slow
def test_a_parent_table_mirrors_its_own_rows_not_its_inheritance_childrens(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """A table with inheritance children: its mirror holds its own rows, as the stream does
    (a child's changes come as the child's). The snapshot read the children's rows too, which
    the stream never changed after; for a keyless parent, its block ranges cut the children."""
    dsn = pg.dsn(database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE animals (id int PRIMARY KEY, name text)")
        conn.execute("CREATE TABLE dogs (breed text) INHERITS (animals)")
        conn.execute("CREATE TABLE log (at int, line text)")
        conn.execute("ALTER TABLE log REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE log_old () INHERITS (log)")
        conn.execute("INSERT INTO animals SELECT g, 'a' || g FROM generate_series(1, 300) g")
        conn.execute("INSERT INTO dogs SELECT g, 'd' || g, 'b' FROM generate_series(1, 200) g")
        conn.execute("INSERT INTO log SELECT g, 'l' FROM generate_series(1, 300) g")
        conn.execute("INSERT INTO log_old SELECT g, 'o' FROM generate_series(1, 300) g")
        conn.execute("ANALYZE animals, dogs, log, log_old")
    tables = [TableName("public", "animals"), TableName("public", "log")]
    p = make_pipeline(tmp_path, dsn, [t.qualified for t in tables], snapshot="initial",
                      snapshot_extra="chunk.size: 50\n")  # fmt: skip
    ingest(p)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE dogs SET name = 'renamed' WHERE id <= 100")
        conn.execute("DELETE FROM dogs WHERE id > 150")
        conn.execute("UPDATE animals SET name = 'changed' WHERE id <= 10")
        conn.execute("DELETE FROM log_old WHERE at <= 100")
        conn.execute("INSERT INTO log VALUES (301, 'l')")
    ingest(p)
    assert assert_mirror_equals_source(spark, p.lake, dsn, tables[0]) == 300
    assert assert_mirror_equals_source(spark, p.lake, dsn, tables[1]) == 301
    checked = p.cdc("validate", "--pipeline", "p")
    assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
