"""docs/runbooks.md, "Failover to a new primary (PostgreSQL 15 and older)", followed step by step:
a physical standby made with pg_basebackup is promoted after the primary stops; it has no
logical slot (slots are not replicated before PostgreSQL 17), so a run pointed at it under
snapshot.mode initial stops naming the slot, and under when_needed takes a new slot and a new
snapshot, after which every mirror equals the new primary's tables."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from cdc_core.identifiers import TableName
from cdc_core.pg.local import LocalPostgres, free_port
from tests.integration.conftest import PgServer, own_server
from tests.integration.harness import (
    ingest_ok,
    make_pipeline,
    resnapshot_when_needed,
    sql,
)
from tests.integration.mirror import assert_mirror_equals_source

ITEMS = TableName("public", "items")
NOTES = TableName("public", "notes")


@pytest.fixture
def primary() -> Iterator[PgServer]:
    """A server of its own: the test stops it, as a failed primary stops."""
    with own_server("primary", "the failover runbook") as server:
        yield server


def _standby_of(primary: LocalPostgres) -> LocalPostgres:
    """A streaming physical standby of `primary`, made with pg_basebackup (-R: standby.signal
    and primary_conninfo) by the OS user the clusters run as, next to the primary's data."""
    data_dir = primary.data_dir.parent / f"{primary.data_dir.name}-standby"
    standby = LocalPostgres(data_dir, free_port(), primary.bindir)
    primary._run(["pg_basebackup", "-D", str(data_dir), "-d", primary.dsn(), "-R",
                  "-X", "stream", "--no-sync", "-c", "fast"])  # fmt: skip
    standby.start()
    return standby


def _wait_replayed(primary: LocalPostgres, standby: LocalPostgres) -> None:
    """Until the standby has replayed everything the primary has written."""
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    deadline = time.monotonic() + 60
    with psycopg.connect(standby.dsn(), autocommit=True) as conn:
        while time.monotonic() < deadline:
            done = conn.execute(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (row[0],)
            ).fetchone()
            if done == (True,):
                return
            time.sleep(0.2)
    raise AssertionError("the standby did not replay the primary's WAL within 60 s")


@pytest.mark.slow
def test_failover_to_a_promoted_standby_resnapshots_under_when_needed(
    primary: PgServer, tmp_path: Path, spark: SparkSession
) -> None:
    old = primary.cluster
    assert old is not None
    db = primary.create_database("fo")
    old_dsn = primary.dsn(db)
    sql(old_dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "CREATE TABLE notes (id bigint PRIMARY KEY, body text, n numeric(10,2))",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 500) g",
        "INSERT INTO notes SELECT g, repeat('x', g), g / 3.0 FROM generate_series(1, 50) g")  # fmt: skip
    p = make_pipeline(tmp_path, old_dsn, ["public.items", "public.notes"], snapshot="initial")
    ingest_ok(p)  # the initial snapshot
    sql(old_dsn, "INSERT INTO items SELECT g, 'w' || g FROM generate_series(501, 600) g",
        "UPDATE items SET v = 'streamed' WHERE id <= 20")  # fmt: skip
    ingest_ok(p)  # streamed from the old primary's slot

    standby = _standby_of(old)
    try:
        sql(old_dsn, "DELETE FROM items WHERE id BETWEEN 30 AND 39",
            "UPDATE notes SET body = 'before failover' WHERE id = 7")  # fmt: skip
        _wait_replayed(old, standby)
        # pointed at the standby before the promotion, the doctor (and so a run) refuses it
        p.edit(f"port={old.port}", f"port={standby.port}")
        doctor = p.cdc("doctor", "--pipeline", "p")
        assert doctor.returncode == 2, doctor.stdout + doctor.stderr
        assert "FAIL  primary" in doctor.stdout
        assert "the server is a standby (in recovery)" in doctor.stdout
        refused = p.ingest("--capture-only")
        assert refused.returncode == 1, refused.stderr[-3000:]
        assert "primary: the server is a standby (in recovery)" in refused.stderr
        old.stop()  # the primary fails; never ingested: these changes exist only in the WAL
        standby._run(["pg_ctl", "promote", "-w", "-t", "60", "-D", str(standby.data_dir)])
        new_dsn = standby.dsn(db)
        sql(new_dsn, "INSERT INTO items VALUES (1000, 'on the new primary')",
            "DELETE FROM items WHERE id BETWEEN 100 AND 104",
            "UPDATE notes SET n = -1 WHERE id < 5")  # fmt: skip
        with psycopg.connect(new_dsn) as conn:
            slots = conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall()
        assert slots == [], "pg_basebackup carries no replication slot"

        # Runbook step: source.dsn points at the new primary (edited above; role, grants and
        # password came with the physical copy).
        failed = p.ingest()
        assert failed.returncode == 1, failed.stderr[-3000:]
        assert f"error: pipeline p: replication slot {p.slot} does not exist; " in failed.stderr
        assert "Set snapshot.mode: when_needed" in failed.stderr

        # Runbook step: snapshot.mode when_needed, then run: a new slot and a new snapshot.
        out = resnapshot_when_needed(p)
        assert "snapshot: 636 rows read, tables done: public.items, public.notes" in out
        assert assert_mirror_equals_source(spark, p.lake, new_dsn, ITEMS) == 586
        assert assert_mirror_equals_source(spark, p.lake, new_dsn, NOTES) == 50

        # and the new slot streams on
        sql(
            new_dsn,
            "UPDATE items SET v = 'after' WHERE id = 1000",
            "DELETE FROM notes WHERE id = 1",
        )
        ingest_ok(p)
        assert assert_mirror_equals_source(spark, p.lake, new_dsn, ITEMS) == 586
        assert assert_mirror_equals_source(spark, p.lake, new_dsn, NOTES) == 49
    finally:
        standby.destroy()
