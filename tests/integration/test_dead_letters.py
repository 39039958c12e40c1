"""event.processing.failure.handling.mode end to end: a key silver cannot hold goes to the
dead-letter table under warn, once, even when the run dies between it and the mirror's MERGE;
a table without a key under warn is mirrored exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from cdc_core.identifiers import TableName
from cdc_core.metrics import last_batch
from tests.integration.conftest import PgServer
from tests.integration.harness import make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source

PERIODS = TableName("public", "periods")
WARN = "silver:\n  event.processing.failure.handling.mode: warn\n"


@pytest.mark.slow
def test_a_key_silver_cannot_hold_is_set_aside_once_and_the_rest_applied(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE periods (id int, valid_to date, note text, PRIMARY KEY (id, valid_to))")
    p = make_pipeline(tmp_path, dsn, [PERIODS.qualified], extra=WARN)
    assert p.ingest("--capture-only").returncode == 0
    sql(dsn, "INSERT INTO periods VALUES (1, '2024-01-01', 'closed'), (2, 'infinity', 'open')",
        "INSERT INTO periods VALUES (3, '2024-03-01', 'closed')",
        "UPDATE periods SET note = 'reopened' WHERE id = 1")  # fmt: skip

    # killed once the dead letter is written, before the mirror's MERGE moves its watermark
    killed = p.ingest_with_fault("silver.dead_letters")
    assert "fault injected: silver.dead_letters@1" in killed.stderr, killed.stderr[-2000:]
    letters = spark.read.format("delta").load(p.lake.dead_letters)
    assert letters.count() == 1
    assert spark.read.format("delta").load(p.lake.silver(PERIODS)).count() == 0

    run = p.ingest()
    assert run.returncode == 0, run.stderr[-2000:]
    assert "public.periods: change at LSN" in run.stderr
    assert "key column valid_to holds 'infinity'" in run.stderr
    line = last_batch(p.lake)
    assert line is not None
    assert line["NumberOfErroneousEvents"] == 1  # Debezium's counter: the one dead letter
    mirror = spark.read.format("delta").load(p.lake.silver(PERIODS))
    assert sorted((r["id"], str(r["valid_to"]), r["note"]) for r in mirror.collect()) == [
        (1, "2024-01-01", "reopened"), (3, "2024-03-01", "closed"),
    ]  # fmt: skip
    (letter,) = spark.read.format("delta").load(p.lake.dead_letters).collect()
    assert (letter["source_table"], letter["op"], letter["seq"]) == ("public.periods", "c", 1)
    assert letter["values"] == {"id": "2", "valid_to": "infinity", "note": "open"}
    assert letter["lsn"] > 0
    assert letter["commit_lsn"] >= letter["lsn"]
    assert letter["reason"] == (
        "key column valid_to holds 'infinity', which its silver type (date) cannot hold"
    )

    sql(dsn, "UPDATE periods SET note = 'later' WHERE id = 3")
    assert p.ingest().returncode == 0
    assert spark.read.format("delta").load(p.lake.dead_letters).count() == 1  # nothing again
    status = p.cdc("status", "--pipeline", "p")
    assert "1 in _state/dead_letters" in status.stdout, status.stdout + status.stderr


@pytest.mark.slow
def test_a_table_without_a_key_under_warn_is_mirrored_exactly_with_nothing_set_aside(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """PostgreSQL sends only its own text, so a real source gives a multiset nothing to refuse
    (the refusals themselves: tests/spark/test_dead_letters.py); warn still checks each change
    apart from the rest, and leaves identical rows, updates and deletes as they were."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE bag (a int, b text)", "ALTER TABLE bag REPLICA IDENTITY FULL")
    p = make_pipeline(tmp_path, dsn, ["public.bag"], extra=WARN)
    assert p.ingest("--capture-only").returncode == 0
    sql(dsn, "INSERT INTO bag VALUES (1, 'x'), (1, 'x'), (2, 'y'), (3, NULL), (3, NULL)",
        "UPDATE bag SET b = 'z' WHERE ctid = (SELECT ctid FROM bag WHERE a = 1 LIMIT 1)",
        "DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE a = 3 LIMIT 1)")  # fmt: skip
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-2000:]
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "bag")) == 4
    line = last_batch(p.lake)
    assert line is not None
    assert line["NumberOfErroneousEvents"] == 0
    assert not DeltaTable.isDeltaTable(spark, p.lake.dead_letters)
