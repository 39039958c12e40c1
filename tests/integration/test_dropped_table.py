"""A captured table dropped at the source: the changes made to it before the DROP that the
pipeline had not read yet still reach its mirror (followed by the OID the lake recorded), and
the mirror then keeps the table's last rows; a listed table that is gone is a warning, not a
run that stops."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from cdc_core.config import load_pipeline
from cdc_core.dropped import found
from cdc_core.identifiers import TableName
from cdc_core.metrics import Totals
from cdc_core.pipeline import batch
from tests.integration.conftest import PgServer
from tests.integration.harness import Pipeline, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source, shape_of, silver_rows, source_rows

ORDERS, LINES = TableName("public", "orders"), TableName("public", "lines")


def run_in_process(p: Pipeline, spark: SparkSession) -> None:
    """A run's batch in this process and its Spark session, with the dropped tables found as
    `ingest` finds them."""
    batch(spark, found(load_pipeline("p", "local", home=p.home), p.lake), p.lake, Totals())


def test_a_listed_tables_changes_before_its_drop_reach_its_mirror_and_the_run_goes_on(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn,
        "CREATE TABLE orders (id int PRIMARY KEY, v text)",
        "CREATE TABLE lines (id int PRIMARY KEY, qty int, note text)",
        "INSERT INTO orders SELECT g, 'o' || g FROM generate_series(1, 20) g",
        "INSERT INTO lines SELECT g, g, 'n' || g FROM generate_series(1, 20) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.orders", "public.lines"], snapshot="initial")
    run_in_process(p, spark)
    assert assert_mirror_equals_source(spark, p.lake, dsn, LINES) == 20
    sql(dsn,
        "UPDATE lines SET qty = -qty, note = NULL WHERE id <= 5", "DELETE FROM lines WHERE id > 17",
        "INSERT INTO lines VALUES (30, 30, 'last'), (31, 31, 'last')",
        "UPDATE lines SET id = 40 WHERE id = 6",  # a key change: delete 6, create 40
        "UPDATE orders SET v = 'before' WHERE id <= 2")  # fmt: skip
    shape = shape_of(p.lake, LINES)
    last = source_rows(dsn, shape)  # the table's rows when it is dropped
    sql(dsn, "DROP TABLE lines", "UPDATE orders SET v = 'after' WHERE id = 3")

    captured = p.ingest("--capture-only")  # the whole run's start: the doctor, the publication
    assert captured.returncode == 0, captured.stderr[-3000:]
    assert "table public.lines was dropped at the source" in captured.stderr
    assert "(remove public.lines from source.tables)" in captured.stderr
    run_in_process(p, spark)

    assert silver_rows(spark, p.lake, shape) == last  # 19 rows, the changes before the drop in
    assert sum(last.values()) == 19
    assert assert_mirror_equals_source(spark, p.lake, dsn, ORDERS) == 20
    recorded = json.loads((Path(p.lake.root) / "_state" / "dropped.json").read_text())
    assert recorded["public.lines"]["applied"] is True
    doctor = p.cdc("doctor", "--pipeline", "p")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert 'public.lines was dropped in database "' in doctor.stdout
    assert "its mirror holds its last changes" in doctor.stdout
    status = p.cdc("status", "--pipeline", "p")
    assert "dropped at the source, its last changes applied" in status.stdout, status.stdout

    sql(dsn, "UPDATE orders SET v = 'later' WHERE id = 4")
    run_in_process(p, spark)  # the dropped table is no longer followed; the others go on
    assert silver_rows(spark, p.lake, shape) == last
    assert assert_mirror_equals_source(spark, p.lake, dsn, ORDERS) == 20


def test_a_listed_table_dropped_between_continuous_batches_is_followed_to_its_drop(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from cdc_core import pipeline

    dsn = pg.dsn(database)
    sql(dsn,
        "CREATE TABLE orders (id int PRIMARY KEY, v text)",
        "CREATE TABLE lines (id int PRIMARY KEY, qty int)",
        "INSERT INTO orders SELECT g, 'o' || g FROM generate_series(1, 10) g",
        "INSERT INTO lines SELECT g, g FROM generate_series(1, 10) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.orders", "public.lines"], snapshot="initial",
                      extra="capture:\n  trigger_interval_s: 0.1\n")  # fmt: skip
    last: list[Counter[tuple[object, ...]]] = []
    one_batch = pipeline.batch

    def then_drop(*args: Any, **kwargs: Any) -> pipeline.RunSummary:
        done = one_batch(*args, **kwargs)
        if not last:  # between the first batch and the second
            sql(dsn, "UPDATE lines SET qty = 0 WHERE id <= 4", "DELETE FROM lines WHERE id = 10",
                "INSERT INTO lines VALUES (11, 11)")  # fmt: skip
            last.append(source_rows(dsn, shape_of(p.lake, LINES)))
            sql(dsn, "DROP TABLE lines", "UPDATE orders SET v = 'after' WHERE id = 1")
        return done

    monkeypatch.setattr(pipeline, "batch", then_drop)
    loaded = load_pipeline("p", "local", home=p.home)
    options = pipeline.RunOptions(continuous=True, max_batches=3)
    pipeline._continuous(spark, found(loaded, p.lake), p.lake, options, Totals(),
                         loaded=loaded)  # fmt: skip

    assert silver_rows(spark, p.lake, shape_of(p.lake, LINES)) == last[0]
    assert sum(last[0].values()) == 10
    assert assert_mirror_equals_source(spark, p.lake, dsn, ORDERS) == 10
    recorded = json.loads((Path(p.lake.root) / "_state" / "dropped.json").read_text())
    assert recorded["public.lines"]["applied"] is True
