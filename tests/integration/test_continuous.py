"""`ingest --continuous`: micro-batches under a running workload, a clean stop on SIGTERM, and a
line per batch with its freshness."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from cdc_core import faults
from cdc_core.errors import TransientError
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.metrics import OP_COUNTERS, batches_file, metrics_table, prometheus_file
from tests.integration.conftest import PgServer
from tests.integration.harness import ingest_ok, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source


def _workload(dsn: str, stop: threading.Event, written: list[int]) -> None:
    """Small transactions of inserts, updates and deletes until `stop`."""
    rng = random.Random(7)
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            with conn.transaction():
                conn.execute("INSERT INTO events (v) SELECT md5(random()::text) FROM "
                             "generate_series(1, %s)", (rng.randint(1, 20),))  # fmt: skip
                conn.execute("UPDATE events SET v = 'u' || v WHERE id %% 17 = %s",
                             (rng.randint(0, 16),))  # fmt: skip
                conn.execute("DELETE FROM events WHERE id %% 31 = %s", (rng.randint(0, 30),))
            written[0] += 1
            time.sleep(0.02)


def test_continuous_batches_stop_cleanly_on_sigterm(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE events (id bigserial PRIMARY KEY, v text)",
        "INSERT INTO events (v) SELECT 'seed' FROM generate_series(1, 500)")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.events"], snapshot="initial",
                      source_extra="retained_wal_warn: 1KB\n",
                      extra="capture:\n  trigger_interval_s: 1\n")  # fmt: skip
    stop, written = threading.Event(), [0]
    writer = threading.Thread(target=_workload, args=(dsn, stop, written), daemon=True)
    writer.start()
    run = p.start_ingest("--continuous")
    try:
        deadline = time.monotonic() + 600
        while p.batches() < 3 and time.monotonic() < deadline and run.poll() is None:
            time.sleep(1)
        assert run.poll() is None, run.communicate()[1][-3000:]
        assert p.batches() >= 3, "fewer than 3 batches in 10 minutes"
        run.send_signal(signal.SIGTERM)  # mid-batch or between batches: the batch in hand ends
        out, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
        stop.set()
        writer.join()
    assert run.returncode == 0, err[-3000:]
    assert "finishing the batch in hand" in err
    assert "pipeline p:" in out
    assert written[0] > 0
    lines = [json.loads(x) for x in batches_file(p.lake).read_text().splitlines()]
    assert [x["batch"] for x in lines] == list(range(1, len(lines) + 1))
    streamed = [x for x in lines if x["changes"]]
    assert streamed, "no batch staged changes while the workload ran"
    for x in streamed:  # each change's lag from commit to silver: positive, ordered
        assert 0 < x["freshness_p50_s"] <= x["freshness_p99_s"] <= x["freshness_max_s"]
        assert x["MilliSecondsBehindSource"] <= x["freshness_max_s"] * 1000
    assert lines[-1]["TotalNumberOfEventsSeen"] == sum(x["changes"] for x in lines)
    bronze = spark.read.format("delta").load(p.lake.bronze).where("op IN ('c', 'u', 'd')")
    in_bronze = {r["op"]: r["count"] for r in bronze.groupBy("op").count().collect()}
    counters = {op: lines[-1][name] for op, name in OP_COUNTERS}
    assert counters == in_bronze, (counters, in_bronze)  # each kind of change, as staged
    assert min(counters.values()) > 0
    assert all(x["retained_wal_bytes"] >= 0 for x in lines[1:])  # streaming batches
    assert "more than source.retained_wal_warn (1000 B)" in err  # a guardrail set very low
    prom = prometheus_file(p.lake).read_text()
    assert f'cdc_batch_number{{pipeline="p"}} {float(len(lines))}' in prom
    table = spark.read.format("delta").load(metrics_table(p.lake))
    assert sorted(r["batch"] for r in table.select("batch").collect()) == [
        x["batch"] for x in lines
    ]
    newest = table.orderBy("batch").collect()[-1]
    assert newest["changes"] == lines[-1]["changes"]
    assert newest["ended_at"] is not None
    assert newest["TotalNumberOfDeleteEventsSeen"] == counters["d"]
    assert newest["CapturedTables"] == ["public.events"]
    assert lines[0]["TotalTableCount"] == 1  # the initial snapshot's one table
    with psycopg.connect(dsn) as conn:  # the last transaction: after the workload's
        conn.execute("INSERT INTO events (v) VALUES ('last')")
        row = conn.execute("SELECT pg_current_xact_id()::text::bigint % 4294967296, "
                           "pg_current_wal_insert_lsn()::text").fetchone()  # fmt: skip
    assert row is not None
    ingest_ok(p)  # a final --once run takes what the workload wrote after the stop
    last = json.loads(batches_file(p.lake).read_text().splitlines()[-1])
    assert last["LastTransactionId"] == int(row[0])  # PostgreSQL's xid of that transaction
    position = {k: Lsn.parse(v) for k, v in last["SourceEventPosition"].items()}
    assert position["lsn"] < Lsn.parse(row[1]) <= position["commit_lsn"]  # its INSERT, its commit
    assert 0 <= last["MilliSecondsSinceLastEvent"] < 600_000
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "events")) > 0


@pytest.mark.slow
def test_batches_skip_the_mirrors_nothing_new_came_for(
    pg: PgServer,
    database: str,
    tmp_path: Path,
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cdc_core import silver
    from cdc_core.config import load_pipeline
    from cdc_core.metrics import Totals
    from cdc_core.pipeline import batch
    from cdc_core.silver import CaughtUp

    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE a (id int PRIMARY KEY, v text)",
        "CREATE TABLE b (id int PRIMARY KEY, v text)")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.a", "public.b"])
    ingest_ok(p)  # creates the slot: what follows streams
    config = load_pipeline("p", "local", home=tmp_path)
    merged: list[str] = []
    apply_table = silver.apply_table

    def spy(spark: SparkSession, lake: Lake, table: TableName, *args: object, **kw: object):  # type: ignore[no-untyped-def]
        merged.append(table.name)
        return apply_table(spark, lake, table, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(silver, "apply_table", spy)
    totals, mirrors = Totals(), CaughtUp()

    def run_batch() -> list[str]:
        merged.clear()
        batch(spark, config, p.lake, totals, mirrors)
        return sorted(merged)

    sql(dsn, "INSERT INTO a SELECT g, 'a' || g FROM generate_series(1, 20) g",
        "INSERT INTO b SELECT g, 'b' || g FROM generate_series(1, 20) g")  # fmt: skip
    assert run_batch() == ["a", "b"]  # nothing known yet: every table is looked at
    sql(dsn, "UPDATE a SET v = 'again' WHERE id = 3")
    assert run_batch() == ["a"]
    assert run_batch() == []  # an idle batch merges nothing and looks at nothing
    spark.sql(f"UPDATE delta.`{p.lake.silver(TableName('public', 'b'))}` SET v = 'x' WHERE id = 1")
    assert run_batch() == ["b"]  # the mirror changed behind the process's back: looked at again
    sql(dsn, "UPDATE b SET v = 'fixed' WHERE id = 1", "DELETE FROM a WHERE id = 4")
    assert run_batch() == ["a", "b"]
    for name in ("a", "b"):
        assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", name)) == 19 + (
            name == "b"
        )
    # a new run (a scheduled --once) knows the same from _state/silver_caught.json
    merged.clear()
    batch(spark, config, p.lake, Totals())
    assert merged == []
    sql(dsn, "UPDATE b SET v = 'later' WHERE id = 5")
    merged.clear()
    batch(spark, config, p.lake, Totals())
    assert merged == ["b"]
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "b")) == 20


def test_a_continuous_batch_that_fails_transiently_is_retried_and_one_that_keeps_failing_exits_75(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """A batch that fails with a transient error after its bronze commit (a Delta commit lost
    to a concurrent writer, say) is tried again after a wait, from where it stood: nothing
    twice, nothing lost. Past `capture.retries` failures in a row the run exits 75. Run in this
    process (no signal is sent), with the failure raised at the silver MERGE."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE events (id bigserial PRIMARY KEY, v text)")
    p = make_pipeline(tmp_path, dsn, ["public.events"],
                      extra="capture:\n  trigger_interval_s: 0\n  retries: 2\n"
                            "  retry_backoff_s: 0.1\n")  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0
    sql(dsn, "INSERT INTO events (v) SELECT 'a' FROM generate_series(1, 30)",
        "UPDATE events SET v = 'b' WHERE id <= 10", "DELETE FROM events WHERE id > 25")  # fmt: skip
    failures = [0]

    def lose(times: int) -> None:
        if failures[0] < times:
            failures[0] += 1
            raise TransientError("a concurrent writer committed to the same Delta table first")

    with faults.hooked("silver.before_merge", lambda: lose(2)):
        run = p.ingest_here("--continuous", "--max-batches", "2")
    assert run.returncode == 0, run.stderr[-3000:]
    assert failures[0] == 2
    assert "retry 1 (of 2)" in run.stderr
    assert "retry 2 (of 2)" in run.stderr
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "events")) == 25
    bronze = spark.read.format("delta").load(p.lake.bronze).where("op IN ('c', 'u', 'd')")
    assert bronze.count() == 30 + 10 + 5  # each change once, though the batch ran three times

    sql(dsn, "UPDATE events SET v = 'c' WHERE id = 1")
    failures[0] = 0
    with faults.hooked("silver.before_merge", lambda: lose(3)):
        run = p.ingest_here("--continuous", "--max-batches", "2")
    assert run.returncode == 75, run.stderr[-3000:]
    assert failures[0] == 3  # the first try and two retries
    assert "retry 2 (of 2)" in run.stderr

    def stopped_while_failing() -> None:  # SIGTERM (a supervisor) while the retry waits
        os.kill(os.getpid(), signal.SIGTERM)
        raise TransientError("server restarting")

    with faults.hooked("silver.before_merge", stopped_while_failing):
        run = p.ingest_here("--continuous")
    assert run.returncode == 75, run.stderr[-3000:]  # no batch done, the last try transient
    assert "stopped while waiting to retry the first batch: server restarting" in run.stderr
    ingest_ok(p)  # the next run takes it from there
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "events")) == 25
