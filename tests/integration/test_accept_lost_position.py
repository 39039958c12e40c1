"""`cdc accept-lost-position`: after a drain (no change since the pipeline last read its slot),
a run whose slot was dropped goes on from a new slot without a snapshot. The request holds only
for the position it was made for, and is refused when the server's WAL is behind that position."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from cdc_core.config import load_pipeline
from cdc_core.errors import TerminalError
from cdc_core.identifiers import TableName
from cdc_core.lost_position import accept_file
from cdc_core.metrics import Totals
from cdc_core.pipeline import batch
from cdc_core.snapshot import load_jobs
from cdc_core.state import stream_file
from tests.integration.conftest import PgServer
from tests.integration.harness import Pipeline, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source

ITEMS = TableName("public", "items")


def run(p: Pipeline, spark: SparkSession) -> None:
    batch(spark, load_pipeline("p", "local", home=p.home), p.lake, Totals())


def slot_position(dsn: str, slot: str) -> str | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    return None if row is None else str(row[0])


def test_a_drained_pipeline_goes_on_from_a_new_slot_without_a_snapshot(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 50) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.items"], snapshot="initial")
    run(p, spark)
    sql(dsn, "UPDATE items SET v = 'streamed' WHERE id <= 5", "INSERT INTO items VALUES (51, 'n')")
    run(p, spark)  # drained: writes stop here, as before a pg_upgrade
    assert_mirror_equals_source(spark, p.lake, dsn, ITEMS)

    sql(dsn, f"SELECT pg_drop_replication_slot('{p.slot}')")  # the upgrade drops the slot
    with pytest.raises(TerminalError, match="run cdc accept-lost-position to go on"):
        run(p, spark)

    # a request for another stored position never applies: here the WAL is behind it
    kept = stream_file(p.lake).read_text()
    stream_file(p.lake).write_text(json.dumps({"slot": p.slot, "confirmed": "FFFF/0"}))
    asked = p.cdc("accept-lost-position", "--pipeline", "p")
    assert asked.returncode == 0, asked.stderr
    with pytest.raises(
        TerminalError, match=r"WAL position \S+ is behind the stored position FFFF/0"
    ):
        run(p, spark)
    stream_file(p.lake).write_text(kept)
    with pytest.raises(TerminalError, match="changes are missing"):
        run(p, spark)  # the request was for FFFF/0: removed, not applied to this position
    assert not accept_file(p.lake).exists()

    asked = p.cdc("accept-lost-position", "--pipeline", "p")
    assert asked.returncode == 0, asked.stderr
    assert "recorded" in asked.stdout
    assert "without a snapshot" in asked.stdout
    with caplog.at_level(logging.WARNING, logger="cdc_core.lost_position"):
        run(p, spark)
    assert "accepted by cdc accept-lost-position" in caplog.text
    assert "does not exist; a new one is created" in caplog.text
    assert [j.kind for j in load_jobs(p.lake)] == ["initial"]  # no new snapshot
    assert not accept_file(p.lake).exists()
    position = slot_position(dsn, p.slot)
    assert position is not None
    assert json.loads(stream_file(p.lake).read_text())["confirmed"] == position

    sql(dsn, "UPDATE items SET v = 'after' WHERE id > 45", "DELETE FROM items WHERE id = 1")
    run(p, spark)
    assert assert_mirror_equals_source(spark, p.lake, dsn, ITEMS) == 50

    again = p.cdc("accept-lost-position", "--pipeline", "p")
    assert again.returncode == 0, again.stderr
    assert "still has the stored position" in again.stdout
    assert not accept_file(p.lake).exists()
