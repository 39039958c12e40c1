"""docs/runbooks.md, "Failover to a new primary", followed step by step.

PostgreSQL 15 and older: a physical standby made with pg_basebackup is promoted after the
primary stops; it has no logical slot (slots are not replicated before PostgreSQL 17), so a run
pointed at it under snapshot.mode initial stops naming the slot, and under when_needed takes a
new slot and a new snapshot, after which every mirror equals the new primary's tables.

PostgreSQL 17 (`slot.failover`): the standby keeps the pipeline's slot in step, and after the
primary crashes and the standby is promoted, the pipeline streams on from it with no snapshot,
no change lost and none twice, the ones the old primary never sent included."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc_core.capture import capture
from cdc_core.config import load_pipeline
from cdc_core.errors import SetupError, TerminalError
from cdc_core.identifiers import TableName
from cdc_core.lsn import Lsn
from cdc_core.metrics import Totals
from cdc_core.pg.local import LocalPostgres, free_port
from cdc_core.pipeline import batch
from cdc_core.stager import staged_files
from cdc_core.start import start
from cdc_core.state import read_json, stream_file, write_json
from tests.conftest import unavailable
from tests.integration import pg_versions
from tests.integration.conftest import PgServer, own_server
from tests.integration.harness import (
    Pipeline,
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


@pytest.fixture
def primary17() -> Iterator[PgServer]:
    """A PostgreSQL 17 server of its own (`pg_versions`): the test crashes it."""
    try:
        bindir = pg_versions.bindir(17)
    except SetupError as e:
        unavailable(f"no PostgreSQL 17: {e}")
    with own_server("primary17", "failover slots", bindir) as server:
        yield server


STANDBY_SLOT = "standby_1"


def _syncing_standby_of(primary: LocalPostgres, *, waited_for: bool = True) -> LocalPostgres:
    """A streaming physical standby of `primary` that synchronizes failover slots (PostgreSQL
    17), set up as the runbook says (`waited_for=False`: but for synchronized_standby_slots).
    The embedded builds have no pg_basebackup, so the standby is a copy of the data directory
    taken while the primary is stopped, without its replication slots (as pg_basebackup copies
    none); the primary starts again at once."""
    primary.stop()
    data_dir = primary.data_dir.parent / f"{primary.data_dir.name}-standby"
    subprocess.run(["cp", "-a", str(primary.data_dir), str(data_dir)], check=True)
    for slot in (data_dir / "pg_replslot").iterdir():
        subprocess.run(["rm", "-r", str(slot)], check=True)
    owner = data_dir.stat()
    signal = data_dir / "standby.signal"
    signal.touch()
    os.chown(signal, owner.st_uid, owner.st_gid)
    conninfo = f"host=127.0.0.1 port={primary.port} user=postgres dbname=postgres"
    with (data_dir / "postgresql.auto.conf").open("a") as f:
        f.write(f"primary_conninfo = '{conninfo}'\nprimary_slot_name = '{STANDBY_SLOT}'\n"
                "hot_standby_feedback = on\n")  # fmt: skip
    primary.start()
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (STANDBY_SLOT,))
        if waited_for:  # the pipeline is never sent what the standby has not received
            conn.execute(f"ALTER SYSTEM SET synchronized_standby_slots = '{STANDBY_SLOT}'")
            conn.execute("SELECT pg_reload_conf()")
    standby = LocalPostgres(data_dir, free_port(), primary.bindir)
    standby.start()
    return standby


def _slot(dsn: str, slot: str) -> tuple[str, bool, bool, bool] | None:
    """(confirmed_flush_lsn, failover, synced, temporary) of `slot`, None without one."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(  # type: ignore[return-value]
            "SELECT confirmed_flush_lsn::text, failover, synced, temporary "
            "FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()  # fmt: skip


def _sync_slots(
    primary: LocalPostgres, standby: LocalPostgres, slot: str, read: Callable[[], None]
) -> str:
    """Synchronize the standby's failover slots now (`sync_replication_slots` would, every few
    seconds) until `slot` there is a lasting copy at the primary's confirmed position; that
    position. A new copy lasts only once the primary's slot needs no WAL and no catalog rows
    older than the standby has: until then the pipeline `read`s the slot, past a checkpoint's
    record of running transactions, which moves the slot's needs on."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        sql(primary.dsn(), "CHECKPOINT")
        read()
        _wait_replayed(primary, standby)
        with psycopg.connect(standby.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_sync_replication_slots()")
        on_primary = _slot(primary.dsn(), slot)
        assert on_primary is not None
        assert on_primary[1], "the pipeline's slot is a failover slot"
        on_standby = _slot(standby.dsn(), slot)
        if on_standby == (on_primary[0], True, True, False):
            return on_primary[0]
    raise AssertionError(f"slot {slot} was not synchronized to the standby: {on_standby}")


def _run(p: Pipeline, spark: SparkSession) -> None:
    batch(spark, load_pipeline("p", "local", home=p.home), p.lake, Totals())


def _initial_snapshot(
    server: PgServer, name: str, tmp_path: Path, spark: SparkSession
) -> tuple[LocalPostgres, str, Pipeline]:
    """A database `name` with a table of 300 rows, and a pipeline with a failover slot that has
    taken its initial snapshot; (the server's cluster, the database, the pipeline)."""
    assert server.cluster is not None
    db = server.create_database(name)
    sql(server.dsn(db), "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 300) g")  # fmt: skip
    p = make_pipeline(tmp_path, server.dsn(db), ["public.items"], snapshot="initial",
                      source_extra="slot.failover: true\n")  # fmt: skip
    _run(p, spark)
    return server.cluster, db, p


def test_a_failover_slot_carries_the_stream_to_a_promoted_standby_on_17(
    primary17: PgServer, tmp_path: Path, spark: SparkSession
) -> None:
    old, db, p = _initial_snapshot(primary17, "fo", tmp_path, spark)
    old_dsn = primary17.dsn(db)  # the initial snapshot; the slot is made a failover slot
    sql(old_dsn, "UPDATE items SET v = 'streamed' WHERE id <= 20")
    _run(p, spark)

    standby = _syncing_standby_of(old)
    try:
        synced_at = _sync_slots(old, standby, p.slot, lambda: _run(p, spark))
        # read by the pipeline after the standby last synchronized its slot: the promoted
        # standby's slot is behind the pipeline's position, and the stream must not send them
        # twice (or staging must recognise them)
        sql(old_dsn, "UPDATE items SET v = 'after the sync' WHERE id BETWEEN 21 AND 30")
        _run(p, spark)
        # written but never read by the pipeline: only the standby's slot can still send them
        sql(old_dsn, "UPDATE items SET v = 'never read' WHERE id BETWEEN 31 AND 40",
            "DELETE FROM items WHERE id BETWEEN 41 AND 45",
            "INSERT INTO items VALUES (1000, 'inserted before the crash')")  # fmt: skip
        _wait_replayed(old, standby)
        old.stop("immediate")  # the primary crashes
        standby._run(["pg_ctl", "promote", "-w", "-t", "60", "-D", str(standby.data_dir)])
        new_dsn = primary17.dsn(db).replace(f"port={old.port}", f"port={standby.port}")
        assert new_dsn != old_dsn
        kept = _slot(new_dsn, p.slot)
        assert kept is not None
        assert kept[0] == synced_at, kept
        stored = read_json(stream_file(p.lake))
        assert isinstance(stored, dict)
        assert Lsn.parse(stored["confirmed"]) > Lsn.parse(synced_at)  # behind the pipeline

        # Runbook step: source.dsn at the new primary; the doctor passes; the run streams on.
        p.edit(f"port={old.port}", f"port={standby.port}")
        doctor = p.cdc("doctor", "--pipeline", "p")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        _run(p, spark)
        assert assert_mirror_equals_source(spark, p.lake, new_dsn, ITEMS) == 296
        sql(new_dsn, "UPDATE items SET v = 'on the new primary' WHERE id BETWEEN 291 AND 300",
            "DELETE FROM items WHERE id = 1")  # fmt: skip
        _run(p, spark)
        assert assert_mirror_equals_source(spark, p.lake, new_dsn, ITEMS) == 295
    finally:
        standby.destroy()

    bronze = spark.read.format("delta").load(p.lake.bronze)
    assert bronze.where("op = 'r'").count() == 300, "one snapshot: none after the failover"
    values = bronze.where("op = 'u'").groupBy(F.get_json_object("after", "$.v").alias("v"))
    updates = {r["v"]: r["count"] for r in values.count().collect()}
    assert updates == {"streamed": 20, "after the sync": 10, "never read": 10,
                       "on the new primary": 10}, updates  # fmt: skip
    assert bronze.where("op = 'd'").count() == 6
    assert bronze.where("op = 'c'").count() == 1


@pytest.mark.slow
def test_a_standby_promoted_before_the_lakes_position_stops_the_stream_on_17(
    primary17: PgServer, tmp_path: Path, spark: SparkSession
) -> None:
    """Without synchronized_standby_slots the old primary may send the pipeline changes its
    standby never receives. The promoted standby's slot is behind the lake then, as after any
    failover, but its history forked before the lake's position: the new primary's own changes
    up to that position would be taken for staged already and skipped. The run stops instead,
    cdc accept-lost-position refuses, and when_needed takes a new snapshot."""
    old, db, p = _initial_snapshot(primary17, "fork", tmp_path, spark)
    old_dsn = primary17.dsn(db)
    standby = _syncing_standby_of(old, waited_for=False)
    try:
        _sync_slots(old, standby, p.slot, lambda: _run(p, spark))
        standby.stop()  # it falls behind: asynchronous replication, nothing waits for it
        sql(old_dsn, "UPDATE items SET v = 'only the old primary had it' WHERE id <= 50",
            "CREATE TABLE filler AS SELECT g, repeat('x', 100) AS pad "
            "FROM generate_series(1, 20000) g")  # not captured: moves the WAL on  # fmt: skip
        _run(p, spark)  # the lake is past anything the standby has
        old.stop("immediate")
        standby.start()
        standby._run(["pg_ctl", "promote", "-w", "-t", "60", "-D", str(standby.data_dir)])
        new_dsn = primary17.dsn(db).replace(f"port={old.port}", f"port={standby.port}")
        sql(new_dsn, "UPDATE items SET v = 'only the new primary has it' WHERE id > 290")
        stored = read_json(stream_file(p.lake))
        assert isinstance(stored, dict)
        assert stored["timeline"] == 1
        with psycopg.connect(new_dsn) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        assert Lsn.parse(row[0]) < Lsn.parse(stored["confirmed"])  # it sorts before the lake
        kept = _slot(new_dsn, p.slot)
        assert kept is not None
        assert Lsn.parse(kept[0]) <= Lsn.parse(stored["confirmed"])  # as after any failover

        p.edit(f"port={old.port}", f"port={standby.port}")
        with pytest.raises(TerminalError) as stopped:
            _run(p, spark)
        said = str(stopped.value)
        assert said.startswith("pipeline p: the server is a standby promoted at "), said
        assert "(timeline 1 to 2), before the lake's position" in said
        assert "Set snapshot.mode: when_needed" in said
        status = p.cdc("status", "--pipeline", "p", "--json")
        problems = json.loads(status.stdout)["problems"]
        assert any(x.startswith("the server is a standby promoted at") for x in problems), problems
        accept = p.cdc("accept-lost-position", "--pipeline", "p")
        assert accept.returncode == 1, accept.stdout + accept.stderr
        assert "going on without a snapshot cannot bring the lake in line" in accept.stderr

        p.edit("mode: initial", "mode: when_needed")
        with pytest.raises(TerminalError) as behind:  # a new snapshot would sort before it too
            _run(p, spark)
        assert "the server is a standby promoted at" in str(behind.value)
        assert "is behind the stored position" in str(behind.value)
        sql(new_dsn, "CREATE TABLE filler2 AS SELECT g, repeat('y', 100) AS pad "
            "FROM generate_series(1, 40000) g")  # fmt: skip
        _run(p, spark)  # a new slot and a new snapshot
        assert assert_mirror_equals_source(spark, p.lake, new_dsn, ITEMS) == 300
        sql(new_dsn, "DELETE FROM items WHERE id = 1")
        _run(p, spark)
        assert assert_mirror_equals_source(spark, p.lake, new_dsn, ITEMS) == 299
    finally:
        standby.destroy()


def test_capture_stops_before_it_reads_a_history_the_lake_is_not_in(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """The check each capture attempt makes before it reads (a reconnect may reach a promoted
    standby, when an address moved to it), here against a lake recorded on a later timeline
    than the server's: the old primary, pointed at again after a failover."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    p = make_pipeline(tmp_path, dsn, ["public.t"])
    config = load_pipeline("p", "local", home=p.home)
    start(config, p.lake)
    stored = read_json(stream_file(p.lake))
    assert isinstance(stored, dict)
    assert stored["timeline"] == 1  # recorded with the position
    sql(dsn, "INSERT INTO t VALUES (1)")
    assert capture(config, p.lake).changes == 1
    write_json(stream_file(p.lake), stored | {"timeline": 2})
    sql(dsn, "INSERT INTO t VALUES (2)")
    with pytest.raises(TerminalError) as stopped:
        capture(config, p.lake)
    assert str(stopped.value).startswith(
        "pipeline p: the server is on timeline 1, older than timeline 2 the lake's position "
    )
    assert len(staged_files(p.lake.changes)) == 1  # nothing read from it
