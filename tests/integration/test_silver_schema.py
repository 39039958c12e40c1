"""Schema changes without DDL events, and tables without a key, mirrored end to end."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from cdc_core.identifiers import TableName
from tests.integration.conftest import PgServer
from tests.integration.harness import make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source

T1, T2 = TableName("public", "t1"), TableName("public", "t2")


def test_schema_changes_are_followed_or_stop_only_their_table(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE t1 (id int PRIMARY KEY, v int, s varchar(10), n numeric(6,2), w varchar(5))",
        "CREATE TABLE t2 (id int PRIMARY KEY, x text)")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.t1", "public.t2"])
    assert p.ingest("--capture-only").returncode == 0
    sql(dsn, "INSERT INTO t1 SELECT g, g, 's' || g, g / 10.0, 'w' FROM generate_series(1, 20) g",
        "INSERT INTO t2 VALUES (1, 'a')")  # fmt: skip
    assert p.ingest().returncode == 0

    # every change silver can follow, in one run: added, dropped, widened columns
    sql(dsn, "ALTER TABLE t1 ADD COLUMN added text",
        "ALTER TABLE t1 DROP COLUMN s",
        "ALTER TABLE t1 ALTER COLUMN v TYPE bigint",
        "ALTER TABLE t1 ALTER COLUMN n TYPE numeric(12,2)",
        "ALTER TABLE t1 ALTER COLUMN w TYPE text",
        "UPDATE t1 SET added = 'new', v = v + 4000000000, n = n + 1000000, w = repeat('w', 50) WHERE id <= 10",
        "INSERT INTO t1 (id, v, n, w, added) VALUES (100, 9000000000, 1234567890.12, 'long text', 'x')")  # fmt: skip
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-2000:]
    assert_mirror_equals_source(spark, p.lake, dsn, T1, skip=("s",))
    silver = spark.read.format("delta").load(p.lake.silver(T1))
    types = {f.name: f.dataType for f in silver.schema.fields}
    assert (types["v"], types["n"], types["w"], types["added"]) == (
        T.LongType(), T.DecimalType(12, 2), T.StringType(), T.StringType(),
    )  # fmt: skip
    dropped = {r["id"]: r["s"] for r in silver.select("id", "s").collect()}
    assert dropped[15] == "s15"  # untouched since the drop: the value it had
    assert dropped[5] is None  # changed after it: NULL from then on
    assert dropped[100] is None

    # a change silver cannot follow stops t1 alone, naming the column, both types and the way out
    sql(dsn, "ALTER TABLE t1 ALTER COLUMN v TYPE text", "UPDATE t1 SET v = 'not a number' WHERE id = 1",
        "INSERT INTO t2 VALUES (2, 'b')")  # fmt: skip
    t1_before = (
        silver.count(),
        spark.read.format("delta").load(p.lake.silver(T1)).where("id = 1").first(),
    )
    run = p.ingest()
    assert run.returncode == 1
    error = run.stderr.strip().splitlines()[-1]
    assert "table public.t1: column v changed type from bigint to text" in error
    assert "drop the silver table and take a new snapshot" in error
    assert_mirror_equals_source(spark, p.lake, dsn, T2)  # the other table went on
    after = spark.read.format("delta").load(p.lake.silver(T1))
    assert (after.count(), after.where("id = 1").first()) == t1_before  # nothing landed is damaged
    assert "cdc snapshot --table public.t1" in error

    # the way out the error names works: the mirror, rebuilt from a new snapshot on, takes text
    shutil.rmtree(p.lake.silver(T1))
    requested = p.cdc("snapshot", "--pipeline", "p", "--table", "public.t1")
    assert requested.returncode == 0, requested.stderr
    sql(dsn, "UPDATE t1 SET v = 'after' WHERE id = 2", "DELETE FROM t1 WHERE id = 3")
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]
    assert "table public.t1 has no silver mirror: it is rebuilt from this snapshot on" in run.stderr
    assert_mirror_equals_source(spark, p.lake, dsn, T1, skip=("s",))
    rebuilt = spark.read.format("delta").load(p.lake.silver(T1))
    assert dict(rebuilt.dtypes)["v"] == "string"
    assert rebuilt.where("id = 3").count() == 0  # deleted before the rebuild: not resurrected
    sql(dsn, "UPDATE t1 SET v = 'later' WHERE id = 4")  # and it goes on from there
    assert p.ingest().returncode == 0
    assert_mirror_equals_source(spark, p.lake, dsn, T1, skip=("s",))


@pytest.mark.slow
def test_a_table_without_key_is_mirrored_as_a_multiset(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE bag (a int, b text)", "ALTER TABLE bag REPLICA IDENTITY FULL")
    p = make_pipeline(tmp_path, dsn, ["public.bag"])
    assert p.ingest("--capture-only").returncode == 0
    sql(dsn, "INSERT INTO bag VALUES (1, 'x'), (1, 'x'), (1, 'x'), (2, 'y'), (3, NULL), (3, NULL)",
        "UPDATE bag SET b = 'z' WHERE ctid = (SELECT ctid FROM bag WHERE a = 1 LIMIT 1)",
        "DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE a = 3 LIMIT 1)")  # fmt: skip
    assert p.ingest().returncode == 0
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "bag")) == 5
    sql(dsn, "DELETE FROM bag WHERE a = 1", "INSERT INTO bag VALUES (2, 'y')")
    assert p.ingest().returncode == 0
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "bag")) == 3


@pytest.mark.slow
def test_a_generated_column_is_left_out_of_the_mirror(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """pgoutput sends neither a generated column nor its values (PostgreSQL 15): the snapshot
    leaves it out too, so the mirror holds the columns the stream keeps up to date."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE priced (id int PRIMARY KEY, net numeric, "
             "gross numeric GENERATED ALWAYS AS (net * 1.2) STORED)",
        "INSERT INTO priced (id, net) VALUES (1, 10), (2, 20)")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.priced"], snapshot="initial")
    assert p.ingest().returncode == 0
    sql(
        dsn, "UPDATE priced SET net = 30 WHERE id = 2", "INSERT INTO priced (id, net) VALUES (3, 5)"
    )
    assert p.ingest().returncode == 0
    mirror = spark.read.format("delta").load(p.lake.silver(TableName("public", "priced")))
    assert [c for c in mirror.columns if not c.startswith("_cdc_")] == ["id", "net"]
    assert sorted((r["id"], int(r["net"])) for r in mirror.collect()) == [(1, 10), (2, 30), (3, 5)]


def test_a_key_value_silver_cannot_hold_stops_only_its_table(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """A date key of 'infinity' is NULL in silver: it would match no later change of its row
    (an update would add a row, a delete remove nothing). The mirror stops instead, naming the
    table, the column, the value and the ways out; the other tables go on."""
    dsn = pg.dsn(database)
    periods = TableName("public", "periods")
    sql(dsn, "CREATE TABLE periods (id int, valid_to date, note text, PRIMARY KEY (id, valid_to))",
        "CREATE TABLE t2 (id int PRIMARY KEY, x text)")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, [periods.qualified, T2.qualified])
    assert p.ingest("--capture-only").returncode == 0
    sql(dsn, "INSERT INTO periods VALUES (1, '2024-01-01', 'closed')",
        "INSERT INTO t2 VALUES (1, 'a')")  # fmt: skip
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-2000:]
    assert assert_mirror_equals_source(spark, p.lake, dsn, periods) == 1
    sql(dsn, "INSERT INTO periods VALUES (1, 'infinity', 'open')",
        "UPDATE t2 SET x = 'b' WHERE id = 1")  # fmt: skip
    run = p.ingest()
    assert run.returncode == 1
    error = run.stderr.strip().splitlines()[-1]
    assert ("table public.periods: key column valid_to holds 'infinity', which its silver type "
            "(date) cannot hold") in error  # fmt: skip
    assert "message.key.columns" in error
    assert assert_mirror_equals_source(spark, p.lake, dsn, T2) == 1  # the other table went on
    mirror = spark.read.format("delta").load(p.lake.silver(periods))
    assert [(r["id"], str(r["valid_to"])) for r in mirror.collect()] == [(1, "2024-01-01")]
