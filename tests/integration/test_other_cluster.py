"""A pipeline pointed at another database cluster than the one its lake followed (`pg_upgrade`,
a restored dump, a new server behind the same host name) stops and names both clusters' system
identifiers, even where a slot of the pipeline's name sits there behind the lake's position: a
slot on a fresh cluster has small LSNs, and before the lake recorded the cluster it passed for
the lake's own slot, so the run read on and took the changes up to the lake's position for
staged already. `cdc status` says so too. Where that cluster's WAL is behind the lake's
position, neither `cdc accept-lost-position` nor a new snapshot under `when_needed` can help
(their changes would sort before what the lake holds, and be left out: row 51 was, before the
refusal): both are refused, and a new lake for that server mirrors it exactly."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from cdc_core.config import load_pipeline
from cdc_core.errors import TerminalError
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.lost_position import accept_file
from cdc_core.lsn import Lsn
from cdc_core.metrics import Totals
from cdc_core.pipeline import batch
from cdc_core.state import stream_file
from tests.integration.conftest import PgServer, own_server
from tests.integration.harness import Pipeline, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source
from tests.integration.privileges import product_dsn

ITEMS = TableName("public", "items")
TABLE = "CREATE TABLE items (id int PRIMARY KEY, v text)"
ROWS = "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 50) g"


def run(p: Pipeline, spark: SparkSession, lake: Lake | None = None) -> None:
    batch(spark, load_pipeline("p", "local", home=p.home), lake or p.lake, Totals())


def wal_position(dsn: str) -> Lsn:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return Lsn.parse(str(row[0]))


def system_identifier(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT system_identifier::text FROM pg_control_system()").fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.slow
def test_a_slot_on_another_cluster_is_not_taken_for_the_lake_s(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, TABLE, ROWS)
    p = make_pipeline(tmp_path, dsn, ["public.items"], snapshot="initial")
    run(p, spark)
    sql(dsn, "UPDATE items SET v = 'streamed' WHERE id <= 5", "CREATE TABLE filler (n int)")
    for _ in range(4):  # the lake's position well past a fresh cluster's WAL
        sql(dsn, "INSERT INTO filler VALUES (1)", "SELECT pg_switch_wal()")
    sql(dsn, "UPDATE items SET v = 'after the switches' WHERE id = 50")
    run(p, spark)
    stored = json.loads(stream_file(p.lake).read_text())
    here = system_identifier(dsn)
    assert stored["system"] == here

    with own_server("other", "a second cluster") as other:
        db = other.create_database("moved")
        odsn = other.dsn(db)
        # what a dump restored there holds: the same rows, in a WAL history of its own
        sql(odsn, TABLE, ROWS, "UPDATE items SET v = 'streamed' WHERE id <= 5",
            "UPDATE items SET v = 'after the switches' WHERE id = 50")  # fmt: skip
        sql(odsn, f"CREATE PUBLICATION pub_{p.slot} FOR TABLE items",  # the dump's
            f"SELECT pg_create_logical_replication_slot('{p.slot}', 'pgoutput')")  # fmt: skip
        with psycopg.connect(odsn) as conn:
            row = conn.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                (p.slot,),
            ).fetchone()
        assert row is not None
        assert Lsn.parse(str(row[0])) < Lsn.parse(stored["confirmed"])  # name and position pass
        sql(
            odsn,
            "INSERT INTO items VALUES (51, 'after the move')",
            "DELETE FROM items WHERE id = 1",
        )
        there = system_identifier(odsn)
        p.edit(product_dsn(dsn), product_dsn(odsn))

        failed = p.ingest("--capture-only")  # a run's start decides: no Spark needed
        assert failed.returncode == 1, failed.stderr[-3000:]
        assert (
            f"error: pipeline p: the source is another database cluster than the one the stored "
            f"position was read from (system identifier {there}, the lake's {here})"
        ) in failed.stderr
        assert "Set snapshot.mode: when_needed" in failed.stderr
        assert json.loads(stream_file(p.lake).read_text()) == stored  # nothing recorded

        status = p.cdc("status", "--pipeline", "p")
        assert status.returncode == 1, status.stdout + status.stderr
        assert (
            f"problem: the source is another database cluster (system identifier {there}) than "
            f"the one the pipeline read (the lake's {here})"
        ) in status.stdout

        asked = p.cdc("accept-lost-position", "--pipeline", "p")  # the slot does not hold it
        assert asked.returncode == 0, asked.stderr
        assert "recorded" in asked.stdout
        refused = p.ingest("--capture-only")
        assert refused.returncode == 1, refused.stderr[-3000:]
        assert "is behind the stored position" in refused.stderr
        assert not accept_file(p.lake).exists()  # refused for good: when_needed does not meet it

        # Nor can a new snapshot help there: its positions would sort before the lake's, and
        # staging and silver would leave out what they took for applied already (row 51).
        assert wal_position(odsn) < Lsn.parse(stored["confirmed"])
        p.edit("mode: initial", "mode: when_needed")
        with pytest.raises(TerminalError, match=r"the server's WAL position \S+ is behind the "
                           r"stored position .*Point target.root at a new lake"):  # fmt: skip
            run(p, spark)
        assert json.loads(stream_file(p.lake).read_text()) == stored

        # The way out: a new lake for this server; the old one keeps what it held.
        fresh = Lake(str(tmp_path / "lake-there"))
        p.edit(f"root: {tmp_path / 'lake'}", f"root: {fresh.root}")
        run(p, spark, fresh)
        assert assert_mirror_equals_source(spark, fresh, odsn, ITEMS) == 50
        assert json.loads(stream_file(fresh).read_text())["system"] == there
        sql(odsn, "UPDATE items SET v = 'streamed there' WHERE id = 51")
        run(p, spark, fresh)
        assert assert_mirror_equals_source(spark, fresh, odsn, ITEMS) == 50
