"""`snapshot.select.statement.overrides` against a real server: the initial snapshot reads the
user's SELECT in chunks (a table without a key in one), changes then stream for every row, a
blocking snapshot reads the SELECT again and sweeps what it no longer returns, `cdc validate`
compares the mirror with what the SELECT returns, and the doctor refuses a SELECT that does not
run or leaves a column out."""

from __future__ import annotations

from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc_core.config import load_pipeline
from cdc_core.identifiers import TableName
from cdc_core.metrics import Totals
from cdc_core.pipeline import batch
from cdc_core.snapshot import load_jobs
from tests.integration.conftest import PgServer
from tests.integration.harness import Pipeline, make_pipeline, sql
from tests.integration.test_validate import by_table, run_validate

ORDERS, NOTES = TableName("public", "orders"), TableName("public", "notes")
LIVE = "SELECT * FROM public.orders WHERE status <> 'archived'"
OVERRIDES = f"""\
chunk.size: 20
select.statement.overrides:
  public.orders: "{LIVE}"
  public.notes: SELECT * FROM public.notes WHERE id > 5
"""


def run_in_process(p: Pipeline, spark: SparkSession) -> None:
    batch(spark, load_pipeline("p", "local", home=p.home), p.lake, Totals())


def silver(spark: SparkSession, p: Pipeline, table: TableName) -> dict[int, tuple[object, ...]]:
    rows = spark.read.format("delta").load(p.lake.silver(table)).collect()
    return {r["id"]: tuple(r[c] for c in r.asDict() if not c.startswith("_")) for r in rows}


def source(dsn: str, query: str) -> dict[int, tuple[object, ...]]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return {r[0]: tuple(r) for r in conn.execute(query).fetchall()}


def test_the_snapshot_reads_the_select_then_every_row_streams(  # noqa: PLR0917 - fixtures
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    dsn = pg.dsn(database)
    sql(dsn,
        "CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, amount int)",
        "INSERT INTO orders SELECT g, CASE WHEN g % 3 = 0 THEN 'archived' ELSE 'open' END, g "
        "FROM generate_series(1, 100) g",
        "CREATE TABLE notes (id int, note text)", "ALTER TABLE notes REPLICA IDENTITY FULL",
        "INSERT INTO notes SELECT g, 'n' || g FROM generate_series(1, 10) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.orders", "public.notes"], snapshot="initial",
                      snapshot_extra=OVERRIDES)  # fmt: skip

    run_in_process(p, spark)

    (job,) = load_jobs(p.lake)
    part = {str(t.table): t for t in job.tables}
    assert part["public.orders"].override == LIVE
    assert len(part["public.orders"].plan.chunks) > 1  # chunked by the key over the SELECT
    assert len(part["public.notes"].plan.chunks) == 1  # no key, no ctid: one read
    live = "SELECT id, status, amount FROM orders WHERE status <> 'archived'"
    assert silver(spark, p, ORDERS) == source(dsn, live)
    assert len(silver(spark, p, ORDERS)) == 67
    assert set(silver(spark, p, NOTES)) == set(range(6, 11))

    # changes stream for every row, those the SELECT left out included
    sql(dsn, "UPDATE orders SET amount = -3 WHERE id = 3", "DELETE FROM orders WHERE id = 4",
        "INSERT INTO orders VALUES (101, 'archived', 101)", "UPDATE notes SET note = 'x' WHERE id = 1")  # fmt: skip
    run_in_process(p, spark)
    mirror = silver(spark, p, ORDERS)
    assert mirror[3] == (3, "archived", -3)
    assert mirror[101] == (101, "archived", 101)
    assert 4 not in mirror
    assert len(mirror) == 68  # 67 - 1 deleted + 2 that came in with a change
    assert silver(spark, p, NOTES)[1] == (1, "x")

    # validate compares with what the SELECT returns: equal, though the table has more rows
    code, report = run_validate(p, monkeypatch, capsys, "--no-quality", "--table", "public.orders")
    assert code == 0, report
    orders = by_table(report)["public.orders"]
    assert orders["verdict"] == "equal"
    assert orders["source_rows"] == 66  # 101 rows, 35 of them archived
    assert any("select.statement.overrides" in n for n in orders["not_compared"])

    # a row the SELECT returns that silver lacks is still found
    sql(dsn, "ALTER PUBLICATION " + f"pub_{p.slot} DROP TABLE orders",
        "UPDATE orders SET status = 'open' WHERE id = 6",  # comes into the SELECT, not streamed
        "ALTER PUBLICATION " + f"pub_{p.slot} ADD TABLE orders")  # fmt: skip
    code, report = run_validate(p, monkeypatch, capsys, "--no-quality", "--table", "public.orders")
    assert code == 1
    (key,) = by_table(report)["public.orders"]["keys"]
    assert (key["kind"], key["key"]) == ("missing", {"id": "6"})

    # a row silver holds that the SELECT leaves out is the table's row: one the table lacks,
    # or whose values differ, is a difference
    path = p.lake.silver(ORDERS)
    mirror = spark.read.format("delta").load(path)
    mirror.where("id = 3").withColumn("id", F.lit(100000)).write.format("delta").mode(
        "append"
    ).save(path)
    DeltaTable.forPath(spark, path).update("id = 101", {"amount": F.lit(-999)})
    code, report = run_validate(p, monkeypatch, capsys, "--no-quality", "--table", "public.orders")
    assert code == 1
    keys = by_table(report)["public.orders"]["keys"]
    assert sorted((k["kind"], k["key"]["id"], tuple(k["columns"])) for k in keys) == [
        ("differs", "101", ("amount",)), ("extra", "100000", ()), ("missing", "6", ()),
    ]  # fmt: skip
    assert by_table(report)["public.orders"]["mismatching"] == 3


@pytest.mark.slow
def test_a_blocking_snapshot_reads_the_select_and_sweeps_what_it_no_longer_returns(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn,
        "CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, amount int)",
        "INSERT INTO orders SELECT g, 'open', g FROM generate_series(1, 30) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.orders"], snapshot="initial",
                      snapshot_extra=f'select.statement.overrides:\n  public.orders: "{LIVE}"\n')  # fmt: skip
    run_in_process(p, spark)
    assert len(silver(spark, p, ORDERS)) == 30
    sql(dsn, "UPDATE orders SET status = 'archived' WHERE id <= 10")
    run_in_process(p, spark)
    assert len(silver(spark, p, ORDERS)) == 30  # archived rows stay: their change streamed

    asked = p.cdc("snapshot", "--pipeline", "p", "--table", "public.orders", "--blocking")
    assert asked.returncode == 0, asked.stderr
    run_in_process(p, spark)

    blocking = [j for j in load_jobs(p.lake) if j.kind == "blocking"]
    assert [t.override for j in blocking for t in j.tables] == [LIVE]
    assert silver(spark, p, ORDERS) == source(
        dsn, "SELECT id, status, amount FROM orders WHERE status <> 'archived'"
    )


def test_the_doctor_refuses_a_select_that_does_not_run_or_leaves_a_column_out(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, amount int)")
    p = make_pipeline(tmp_path, dsn, ["public.orders"], snapshot="initial",
                      snapshot_extra="select.statement.overrides:\n"
                      "  public.orders: SELECT id, status FROM public.orders\n")  # fmt: skip
    doctor = p.cdc("doctor", "--pipeline", "p")
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr
    assert "snapshot select public.orders" in doctor.stdout
    assert 'it returns no column "amount"' in doctor.stdout
    refused = p.ingest("--capture-only")  # a run stops on it before anything is read
    assert refused.returncode == 1, refused.stderr
    assert 'snapshot select public.orders: it returns no column "amount"' in refused.stderr
    assert not (p.home / "lake" / "_staging").exists() or not any(
        (p.home / "lake" / "_staging").rglob("*.parquet")
    )

    p.edit("SELECT id, status FROM public.orders", "SELECT * FROM public.orderz")
    doctor = p.cdc("doctor", "--pipeline", "p")
    assert doctor.returncode == 2
    assert 'the SELECT does not run: relation "public.orderz" does not exist' in doctor.stdout

    p.edit("SELECT * FROM public.orderz", "SELECT * FROM public.orders WHERE amount > 0")
    doctor = p.cdc("doctor", "--pipeline", "p")
    assert doctor.returncode == 0, doctor.stdout
    assert "returns the 3 columns a snapshot reads" in doctor.stdout
