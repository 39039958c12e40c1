"""A slot that loses its WAL (max_slot_wal_keep_size): a clear stop naming the way out, or,
under snapshot.mode when_needed, a new slot and a new snapshot by itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from cdc_core.config import Dsn
from cdc_core.errors import SetupError, TerminalError
from cdc_core.identifiers import TableName
from cdc_core.lsn import Lsn
from cdc_core.pg.local import throwaway_cluster
from cdc_core.pg.replication import SqlSource
from tests.conftest import unavailable
from tests.integration.harness import ingest_ok, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source


@pytest.fixture(scope="module")
def small_wal_dsn() -> Iterator[str]:
    """A server of its own that keeps at most 1 MB of WAL for a slot."""
    try:
        with throwaway_cluster("lost", extra={"max_slot_wal_keep_size": "1MB"}) as cluster:
            yield cluster.dsn("postgres")
    except SetupError as e:
        unavailable(f"no PostgreSQL for the integration tier: {e}")


def _lose_the_slot(dsn: str, slot: str) -> None:
    """WAL traffic past the slot's allowance, then a checkpoint: the server invalidates it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(4):
            conn.execute("INSERT INTO noise SELECT g FROM generate_series(1, 1000) g")
            conn.execute("SELECT pg_switch_wal()")
        conn.execute("CHECKPOINT")
        status = conn.execute(
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
    assert status == ("lost",), status


def test_lost_wal_stops_with_the_way_out_and_when_needed_resnapshots(
    small_wal_dsn: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = small_wal_dsn
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)", "CREATE TABLE noise (g int)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 300) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.items"], snapshot="initial")
    ingest_ok(p)
    sql(dsn, "DELETE FROM items WHERE id % 5 = 0", "UPDATE items SET v = 'moved' WHERE id < 50")
    _lose_the_slot(dsn, p.slot)  # the changes above go with the WAL

    failed = p.ingest()
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert f"replication slot {p.slot} is lost (wal_status = lost" in failed.stderr
    assert "max_slot_wal_keep_size" in failed.stderr
    assert "snapshot.mode: when_needed" in failed.stderr

    p.edit("mode: initial", "mode: when_needed")
    ingest_ok(p)  # a new slot, a new snapshot: the missed delete and update are in silver
    items = TableName("public", "items")
    assert assert_mirror_equals_source(spark, p.lake, dsn, items) == 240
    sql(dsn, "INSERT INTO items VALUES (1000, 'after')")
    ingest_ok(p)  # and the new slot streams on
    assert assert_mirror_equals_source(spark, p.lake, dsn, items) == 241


def test_a_slot_lost_under_the_sql_reader_stops_the_run_instead_of_being_retried(
    small_wal_dsn: str,
) -> None:
    """The server refuses to peek or advance a slot that lost its WAL with SQLSTATE 55000, a
    psycopg OperationalError, like a lost connection; no retry brings the WAL back, so the
    reader stops with the slot's state instead of retrying until the run gives up (exit 75)."""
    dsn = small_wal_dsn
    sql(dsn, "CREATE TABLE IF NOT EXISTS noise (g int)", "CREATE TABLE peeked (id int)",
        "CREATE PUBLICATION peeked FOR TABLE peeked",
        "SELECT pg_create_logical_replication_slot('peeked', 'pgoutput')",
        "INSERT INTO peeked VALUES (1)")  # fmt: skip
    _lose_the_slot(dsn, "peeked")
    source = SqlSource(Dsn(dsn), "peeked", "peeked")
    source.open(Lsn(0))
    try:
        with pytest.raises(TerminalError, match=r"'peeked' has lost WAL it needed") as peeked:
            list(source.events())
        assert "can no longer get changes" in str(peeked.value)
        assert "snapshot.mode: when_needed" in str(peeked.value)
        with pytest.raises(TerminalError, match=r"'peeked' has lost WAL it needed"):
            source.confirm(Lsn.parse("0/FFFFFFF"))
    finally:
        source.close()
