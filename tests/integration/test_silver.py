"""Bronze and silver end to end: every silver table equals its source after every run."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc_core.bronze import append_staged
from cdc_core.cli import main
from cdc_core.identifiers import TableName
from cdc_core.sample.shop import create_schema, load_shop
from cdc_core.sample.workload import WorkloadSpec, run_workload
from cdc_core.silver import SilverSettings, merge_changes
from cdc_core.stager import staged_files
from tests.integration.conftest import PgServer
from tests.integration.harness import Pipeline, make_pipeline, sql
from tests.integration.harness import ingest_ok as ingest
from tests.integration.mirror import assert_mirror_equals_source, shape_of

SHOP = [TableName("public", t) for t in ("customers", "orders", "order_items")]


@pytest.fixture
def shop(pg: PgServer, database: str, tmp_path: Path) -> Pipeline:
    """An empty shop whose slot exists before any row: every row arrives through the stream."""
    dsn = pg.dsn(database)
    create_schema(dsn)
    p = make_pipeline(tmp_path, dsn, [t.qualified for t in SHOP])
    first = p.ingest("--capture-only")
    assert first.returncode == 0, first.stderr
    return p


def assert_all_mirrors_equal(spark: SparkSession, p: Pipeline) -> dict[str, int]:
    return {t.name: assert_mirror_equals_source(spark, p.lake, p.dsn, t) for t in SHOP}


def test_every_mirror_equals_its_source_after_each_run(shop: Pipeline, spark: SparkSession) -> None:
    load_shop(shop.dsn, customers=300)
    ingest(shop)
    counts = assert_all_mirrors_equal(spark, shop)
    assert counts["order_items"] == 2700
    for seed in (1, 2):
        stats = run_workload(shop.dsn, WorkloadSpec(changes=6000, concurrency=4, seed=seed))
        assert stats.pk_changes > 0
        assert stats.per_table["customers"].updates > 0
        out = ingest(shop)
        assert "silver:" in out
        assert_all_mirrors_equal(spark, shop)
    bronze = spark.read.format("delta").load(shop.lake.bronze)
    ops = {r["op"] for r in bronze.select("op").distinct().collect()}
    assert ops == {"c", "u", "d"}
    toast = bronze.where(F.array_contains("unchanged", "notes")).count()
    assert toast > 0, "the workload's TOAST-untouched updates reached bronze as unchanged"


def test_replaying_bronze_and_silver_changes_nothing(shop: Pipeline, spark: SparkSession) -> None:
    load_shop(shop.dsn, customers=100)
    run_workload(shop.dsn, WorkloadSpec(changes=3000, concurrency=3, seed=7))
    ingest(shop)
    bronze = spark.read.format("delta").load(shop.lake.bronze)
    rows_before = bronze.count()
    silver_before = {t.name: _snapshot(spark, shop, t) for t in SHOP}

    append_staged(spark, shop.lake, staged_files(shop.lake.changes))  # every file, again
    assert spark.read.format("delta").load(shop.lake.bronze).count() == rows_before
    for t in SHOP:  # every bronze row of the table, merged again, behind the guard alone
        shape = shape_of(shop.lake, t)
        rows = bronze.where((F.col("source_table") == t.qualified) & (F.col("op") != "m"))
        merge_changes(spark, shop.lake.silver(t), shape, rows, SilverSettings())
        assert _snapshot(spark, shop, t) == silver_before[t.name]
    assert_all_mirrors_equal(spark, shop)


def _snapshot(spark: SparkSession, p: Pipeline, t: TableName) -> list[tuple[object, ...]]:
    df = spark.read.format("delta").load(p.lake.silver(t))
    return sorted(tuple(r) for r in df.drop("_cdc_raw").collect())


def test_a_second_run_with_nothing_new_changes_nothing(shop: Pipeline, spark: SparkSession) -> None:
    load_shop(shop.dsn, customers=50)
    ingest(shop)
    versions = {t.name: _version(spark, shop, t) for t in SHOP}
    out = ingest(shop)
    assert "captured 0 transactions" in out
    assert {t.name: _version(spark, shop, t) for t in SHOP} == versions


def _version(spark: SparkSession, p: Pipeline, t: TableName) -> int:
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(spark, p.lake.silver(t)).history(1).first()["version"])  # type: ignore[index]


def test_truncate_empties_the_mirror_and_later_rows_survive(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    p = make_pipeline(tmp_path, dsn, ["public.t"])
    assert p.ingest("--capture-only").returncode == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 10) g")
    ingest(p)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (11, 'b')")
        conn.execute("BEGIN; TRUNCATE t; INSERT INTO t VALUES (1, 'after'); COMMIT")
        conn.execute("INSERT INTO t VALUES (2, 'later')")
    ingest(p)
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "t")) == 2


def test_an_update_of_a_row_whose_key_is_toasted_is_not_a_key_change(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """A key value stored out of line and left alone comes as `u` (unchanged) in the new row;
    the server sends the old key with it, which holds the value. It is one update, not a
    delete of the row and an insert of one keyed by the placeholder."""
    dsn = pg.dsn(database)
    table = TableName("public", "docs")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE docs (id text PRIMARY KEY, note text)")
        conn.execute("ALTER TABLE docs ALTER COLUMN id SET STORAGE EXTERNAL")  # out of line
    p = make_pipeline(tmp_path, dsn, [table.qualified])
    assert p.ingest("--capture-only").returncode == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO docs SELECT repeat(chr(97 + g), 2400), 'first' "
                     "FROM generate_series(0, 2) g")  # fmt: skip
        toasted = conn.execute(
            "SELECT pg_relation_size(reltoastrelid) > 0 FROM pg_class WHERE relname = 'docs'"
        ).fetchone()
        assert toasted == (True,), "the keys are stored out of line"
        conn.execute("UPDATE docs SET note = 'second' WHERE id LIKE 'a%' OR id LIKE 'b%'")
    ingest(p)
    assert assert_mirror_equals_source(spark, p.lake, dsn, table) == 3
    bronze = (
        spark.read.format("delta")
        .load(p.lake.bronze)
        .where(F.col("source_table") == table.qualified)
    )
    assert sorted(r["op"] for r in bronze.select("op").collect()) == ["c", "c", "c", "u", "u"]


def test_a_row_whose_key_changed_keeps_its_out_of_line_value_through_later_updates(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """The server resends no out-of-line value an UPDATE leaves alone (`u`), after a key change
    either: every change of a moved row until one sets the value again lacks it. Row 1 moved
    and then updated in one run, row 2 moved onto a key deleted in that run (whose stored row
    holds another value), row 3 moved twice: each mirror row has its value."""
    dsn = pg.dsn(database)
    table = TableName("public", "docs")
    sql(dsn, "CREATE TABLE docs (id int PRIMARY KEY, note text, body text)",
        "ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, [table.qualified])
    assert p.ingest("--capture-only").returncode == 0
    sql(dsn, "INSERT INTO docs SELECT g, 'first', repeat(md5(g::text), 100) "
             "FROM generate_series(1, 4) g")  # fmt: skip
    ingest(p)
    sql(dsn, "UPDATE docs SET id = -1 WHERE id = 1", "UPDATE docs SET note = 'second' WHERE id = -1",
        "DELETE FROM docs WHERE id = 4", "UPDATE docs SET id = 4 WHERE id = 2",
        "UPDATE docs SET note = 'second' WHERE id = 4",
        "UPDATE docs SET id = 5 WHERE id = 3", "UPDATE docs SET note = 'second' WHERE id = 5",
        "UPDATE docs SET id = 6 WHERE id = 5")  # fmt: skip
    ingest(p)
    assert assert_mirror_equals_source(spark, p.lake, dsn, table) == 3
    mirror = spark.read.format("delta").load(p.lake.silver(table))
    assert mirror.where(F.size("_cdc_unavailable") > 0).count() == 0


@pytest.mark.slow
def test_switching_soft_delete_off_removes_the_rows_it_left_marked_once(  # noqa: PLR0917 - fixtures
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Users of a mirror without soft_delete do not filter `_cdc_deleted`: the rows an earlier
    soft_delete left marked go at the next run, though nothing new came for the tables."""
    dsn = pg.dsn(database)
    tables = [TableName("public", "kept"), TableName("public", "bag")]
    sql(dsn, "CREATE TABLE kept (id int PRIMARY KEY, v text)", "CREATE TABLE bag (v text)",
        "ALTER TABLE bag REPLICA IDENTITY FULL")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, [t.qualified for t in tables],
                      extra="silver:\n  soft_delete: true\n")  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0
    sql(dsn, "INSERT INTO kept SELECT g, 'v' || g FROM generate_series(1, 10) g",
        "INSERT INTO bag VALUES ('a'), ('a'), ('b')")  # fmt: skip
    ingest(p)
    sql(dsn, "DELETE FROM kept WHERE id <= 3", "DELETE FROM bag WHERE v = 'b'")
    ingest(p)

    def marked() -> dict[str, int]:
        return {
            t.name: spark.read.format("delta").load(p.lake.silver(t)).where("_cdc_deleted").count()
            for t in tables
        }

    assert marked() == {"kept": 3, "bag": 1}
    p.edit("soft_delete: true", "soft_delete: false")
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]

    assert marked() == {"kept": 0, "bag": 0}
    assert assert_mirror_equals_source(spark, p.lake, dsn, tables[0]) == 7
    assert assert_mirror_equals_source(spark, p.lake, dsn, tables[1]) == 2
    assert "3 rows marked _cdc_deleted removed from its mirror" in run.stderr
    monkeypatch.setenv("CDC_HOME", str(p.home))
    capsys.readouterr()
    code = main(["validate", "--pipeline", "p", "--json", "--no-quality"])
    report = json.loads(capsys.readouterr().out)
    assert (code, report["equal"]) == (0, True), report
    versions = {t.name: _version(spark, p, t) for t in tables}
    again = p.ingest()
    assert again.returncode == 0, again.stderr[-3000:]
    assert "_cdc_deleted removed" not in again.stderr
    assert {t.name: _version(spark, p, t) for t in tables} == versions  # looked at once


def test_a_float_key_updated_from_0_to_minus_0_keeps_its_row(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """0 and -0 are stored differently, so PostgreSQL sends the update as a key change (a d
    and a c at one position); silver types both to one key, and the row was deleted."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE f (id float8 PRIMARY KEY, v text)",
        "CREATE TABLE f4 (id real PRIMARY KEY, v text)")  # fmt: skip
    tables = [TableName("public", "f"), TableName("public", "f4")]
    p = make_pipeline(tmp_path, dsn, [t.qualified for t in tables])
    ingest(p)
    sql(dsn, "INSERT INTO f VALUES (0, 'zero'), (1, 'one')",
        "INSERT INTO f4 VALUES ('-0', 'zero'), (1, 'one')")  # fmt: skip
    ingest(p)
    sql(dsn, "UPDATE f SET id = '-0' WHERE id = 0", "UPDATE f4 SET id = 0 WHERE id = 0")
    ingest(p)
    assert [assert_mirror_equals_source(spark, p.lake, dsn, t) for t in tables] == [2, 2]
