"""A pipeline that lists no tables captures those its include list matches, found in the
source's catalog at every run (Debezium's way): a table created later is snapshotted and
streamed as a newly added one; a table dropped is no longer captured, and its mirror keeps its
last rows, the changes made before the drop in."""

from __future__ import annotations

from pathlib import Path

import psycopg
from pyspark.sql import SparkSession

from cdc_core.config import load_pipeline
from cdc_core.identifiers import TableName
from cdc_core.metrics import Totals
from cdc_core.pipeline import batch
from cdc_core.snapshot import load_jobs
from tests.integration.conftest import PgServer
from tests.integration.harness import Pipeline, ingest_ok, make_pipeline, sql
from tests.integration.mirror import (
    assert_mirror_equals_source,
    shape_of,
    silver_rows,
    source_rows,
)

ORDERS, LINES, NOTES = (TableName("public", n) for n in ("orders", "OrderLines", "order_notes"))


def published(dsn: str, publication: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
            (publication,),
        ).fetchall()
    return {f"{s}.{t}" for s, t in rows}


def run_in_process(p: Pipeline, spark: SparkSession) -> None:
    """A run's batch in this process and its Spark session (a JVM less to start): the tables
    found first, as `ingest` finds them."""
    from cdc_core.dropped import found

    config = found(load_pipeline("p", "local", home=p.home), p.lake)
    batch(spark, config, p.lake, Totals())


def test_tables_the_include_list_matches_are_found_and_a_new_one_is_snapshotted_and_streamed(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn,
        "CREATE TABLE orders (id int PRIMARY KEY, v text)",
        'CREATE TABLE "OrderLines" (id int PRIMARY KEY, qty int)',
        "CREATE TABLE audit (id int PRIMARY KEY, note text)",
        "INSERT INTO orders SELECT g, 'o' || g FROM generate_series(1, 40) g",
        'INSERT INTO "OrderLines" SELECT g, g FROM generate_series(1, 30) g',
        "INSERT INTO audit VALUES (1, 'never captured')")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, [], snapshot="initial",
                      source_extra="table.include.list: 'public\\.order.*'\n")  # fmt: skip

    ingest_ok(p)
    assert published(dsn, f"pub_{p.slot}") == {"public.orders", "public.OrderLines"}
    sql(dsn,
        "UPDATE orders SET v = 'changed' WHERE id <= 5", 'DELETE FROM "OrderLines" WHERE id > 25',
        "CREATE TABLE order_notes (id int PRIMARY KEY, note text)",
        "INSERT INTO order_notes SELECT g, 'n' || g FROM generate_series(1, 20) g",
        "INSERT INTO audit VALUES (2, 'still not')")  # fmt: skip
    doctor = p.cdc("doctor", "--pipeline", "p")  # the commands find the tables as a run does
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "source.tables omitted: source.table.include.list lets 3 through" in doctor.stdout
    assert "table public.order_notes" in doctor.stdout
    refused = p.cdc("snapshot", "--pipeline", "p", "--table", "public.audit")
    assert refused.returncode == 2, refused.stderr
    assert "pipeline p does not capture public.audit (it captures public" in refused.stderr
    run_in_process(p, spark)  # finds order_notes: published, snapshotted as a table added later
    for table in (ORDERS, LINES, NOTES):
        assert_mirror_equals_source(spark, p.lake, dsn, table)
    sql(dsn,
        "INSERT INTO order_notes VALUES (21, 'streamed')", "UPDATE order_notes SET note = 'u' "
        "WHERE id = 1", "UPDATE orders SET v = 'again' WHERE id = 6",
        'UPDATE "OrderLines" SET qty = -qty WHERE id <= 3', 'INSERT INTO "OrderLines" VALUES (26, 0)')  # fmt: skip
    last = source_rows(dsn, shape_of(p.lake, LINES))  # its rows as it is dropped
    sql(dsn, 'DROP TABLE "OrderLines"')
    run_in_process(p, spark)  # OrderLines is gone: its last changes are applied, the run goes on

    assert published(dsn, f"pub_{p.slot}") == {"public.orders", "public.order_notes"}
    assert assert_mirror_equals_source(spark, p.lake, dsn, NOTES) == 21
    assert assert_mirror_equals_source(spark, p.lake, dsn, ORDERS) == 40
    assert silver_rows(spark, p.lake, shape_of(p.lake, LINES)) == last  # as the table last was
    assert sum(last.values()) == 26
    jobs = {j.origin: [t.table for t in j.tables] for j in load_jobs(p.lake)}
    assert jobs == {"snapshot.mode initial": [LINES, ORDERS], "new tables": [NOTES]}
    bronze = spark.read.format("delta").load(p.lake.bronze)
    assert "public.audit" not in {r[0] for r in bronze.select("source_table").distinct().collect()}
    assert not Path(p.lake.silver(TableName("public", "audit"))).exists()


def test_an_include_list_that_lets_no_table_through_stops_the_run_before_it_makes_anything(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """A typo in `table.include.list` is the only thing that tells a user the list is wrong:
    the run exits 2 with one line naming the key and the database, and makes neither slot
    nor publication."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE orders (id int PRIMARY KEY, v text)")
    p = make_pipeline(tmp_path, dsn, [], source_extra="table.include.list: 'public\\.ordres'\n")

    run = p.ingest()

    assert run.returncode == 2, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert "source.table.include.list: lets no table of database" in last, last
    assert repr(database) in last, last
    with psycopg.connect(dsn) as conn:
        slots = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                             (p.slot,)).fetchone()  # fmt: skip
        publications = conn.execute("SELECT count(*) FROM pg_publication").fetchone()
    assert slots == (0,)
    assert publications == (0,)
