"""`cdc status` as users run it, on a real server and a lake a real ingest run wrote."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from pyspark.sql import SparkSession

from cdc_core.identifiers import TableName
from cdc_core.stager import staged_files
from tests.integration.conftest import PgServer
from tests.integration.harness import ROOT, Pipeline, ingest_ok, make_pipeline, slot_reader, sql
from tests.integration.mirror import assert_mirror_equals_source


def cdc_status(p: Pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdc_core.cli", "status", "--pipeline", "p", *args],
        env=p.env() | {"PYTHONPATH": str(ROOT)}, cwd=p.home, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def status_json(p: Pipeline, expected_exit: int = 0) -> Any:
    """The parsed `--json` form (JSON, so indexed freely)."""
    run = cdc_status(p, "--json")
    assert run.returncode == expected_exit, run.stdout + run.stderr
    return json.loads(run.stdout)


def count(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def test_status_after_a_run_shows_the_slot_the_mirror_and_then_the_pending_capture(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 100) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.items"], snapshot="initial")
    assert p.ingest("--capture-only").returncode == 0  # the slot; the snapshot waits for Spark
    sql(dsn, "INSERT INTO items SELECT g, 'w' || g FROM generate_series(101, 120) g",
        "UPDATE items SET v = 'changed' WHERE id <= 10")  # fmt: skip
    ingest_ok(p)  # the snapshot, then the stream

    data = status_json(p)

    slot = data["slot"]
    assert (slot["name"], slot["exists"], slot["active"]) == (p.slot, True, False)
    assert slot["wal_status"] == "reserved"
    assert slot["confirmed_flush_lsn"] == str(p.confirmed())
    assert isinstance(slot["retained_wal_bytes"], int)
    (table,) = data["tables"]
    assert table["table"] == "public.items"
    assert table["rows"] == count(dsn, "items") == 120
    assert table["applied_lsn"] is not None
    staged = staged_files(p.changes)
    assert staged, "the stream was staged"
    assert data["bronze"]["staged_end"] == str(staged[-1].end)
    assert data["pending"] == {"files": 0, "bytes": 0}
    (job,) = data["snapshots"]
    assert (job["kind"], job["tables_done"], job["tables_total"], job["rows"], job["finished"]) \
        == ("initial", 1, 1, 120, True)  # fmt: skip
    batch = data["last_batch"]
    assert batch["changes"] >= 30, batch  # 20 inserts and 10 updates, at least
    assert batch["lsn_to"] is not None
    assert (data["stale"], data["idle_s"] < 600) == (False, True)
    assert (data["healthy"], data["exit_code"], data["problems"]) == (True, 0, [])

    human = cdc_status(p)
    assert human.returncode == 0, human.stderr
    assert f"slot        {p.slot}: inactive, wal_status reserved" in human.stdout
    (row,) = [line for line in human.stdout.splitlines() if line.startswith("public.items")]
    assert row.split()[:2] == ["public.items", "120"]
    assert human.stdout.rstrip().endswith("ok")

    sql(dsn, "INSERT INTO items SELECT g, 'x' || g FROM generate_series(121, 125) g")
    assert p.ingest("--capture-only").returncode == 0  # staged, not in bronze

    pending = status_json(p)["pending"]
    assert pending["files"] >= 1
    assert pending["bytes"] > 0
    assert f"{pending['files']} staged files" in cdc_status(p).stdout

    time.sleep(3)
    ingest_ok(p)  # stages nothing new: what it makes visible was staged before it
    batch = status_json(p)["last_batch"]
    assert batch["changes"] == 0
    assert batch["freshness_max_s"] >= 3, batch  # the five inserts, committed 3 s before


def test_status_of_a_pipeline_whose_slot_was_dropped_exits_1_and_says_so(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    p = make_pipeline(tmp_path, dsn, ["public.items"])
    assert p.ingest("--capture-only").returncode == 0
    assert status_json(p)["tables"] == [{
        "table": "public.items", "state": "not_created", "rows": None, "version": None,
        "applied_lsn": None, "applied_seq": None, "staged_end": None, "error": None,
        "dead_letters": 0, "dropped": None,
    }]  # fmt: skip

    sql(dsn, f"SELECT pg_drop_replication_slot('{p.slot}')")

    data = status_json(p, expected_exit=1)
    assert data["slot"] == {
        "name": p.slot, "exists": False, "active": None, "active_pid": None, "wal_status": None,
        "confirmed_flush_lsn": None, "restart_lsn": None, "retained_wal_bytes": None,
        "safe_wal_size_bytes": None, "unusable": None, "reader": None, "foreign_reader": False, "held_by": None,
    }  # fmt: skip
    human = cdc_status(p)
    assert human.returncode == 1
    assert f"slot        {p.slot}: MISSING" in human.stdout
    assert f"problem: slot {p.slot} does not exist (dropped?)" in human.stdout
    assert "public.items     -  not yet created" in human.stdout

    # a login the server refuses for good is not "try again" (75) but a problem (1)
    p.edit(f"dbname={database}", "dbname=no_such_database")
    data = status_json(p, expected_exit=1)
    assert data["source"]["reachable"] is False
    assert data["source"]["lasting"] is True
    assert 'database "no_such_database" does not exist' in data["source"]["error"]


def test_past_retained_wal_fail_each_batch_says_so_and_ingest_keeps_consuming(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Consuming is the only thing that frees the WAL a slot retains: past
    `source.retained_wal_fail` a run logs an error naming the way out, and still stages,
    applies and confirms what it read."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    p = make_pipeline(tmp_path, dsn, ["public.items"],
                      source_extra="retained_wal_warn: 1\nretained_wal_fail: 2\n")  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0
    sql(dsn, "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 2000) g")
    before = p.confirmed()

    run = p.ingest()

    assert run.returncode == 0, run.stderr[-3000:]
    assert "more than source.retained_wal_fail (2 B)" in run.stderr
    assert '"level": "ERROR"' in next(
        line for line in run.stderr.splitlines() if "retained_wal_fail (2 B)" in line
    )
    assert p.confirmed() > before  # consumed and confirmed all the same
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "items")) == 2000
    status = cdc_status(p)
    assert status.returncode == 1, status.stdout + status.stderr
    assert "retained_wal_fail" in status.stdout + status.stderr


def test_status_fails_a_slot_no_run_can_read_and_one_another_process_holds(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """A slot of another plugin or another database's, or one a Debezium connector (here a
    pg_recvlogical) still reads: every run stops or waits on it, and status said healthy."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    p = make_pipeline(tmp_path, dsn, ["public.items"])
    sql(dsn, f"SELECT pg_create_logical_replication_slot('{p.slot}', 'test_decoding')")
    data = status_json(p, expected_exit=1)
    assert data["slot"]["unusable"] == "uses plugin test_decoding, not pgoutput"
    assert (
        f"slot {p.slot} uses plugin test_decoding, not pgoutput: every run stops"
        in (data["problems"][0])
    )
    sql(dsn, f"SELECT pg_drop_replication_slot('{p.slot}')")
    sql(pg.dsn("postgres"), f"SELECT pg_create_logical_replication_slot('{p.slot}', 'pgoutput')")
    try:
        data = status_json(p, expected_exit=1)
    finally:
        sql(pg.dsn("postgres"), f"SELECT pg_drop_replication_slot('{p.slot}')")
    assert data["slot"]["unusable"] == 'belongs to database "postgres"'

    assert p.ingest("--capture-only").returncode == 0
    assert status_json(p)["problems"] == []
    with slot_reader(dsn, p.slot, f"pub_{p.slot}", "cdc-lake"):  # as a run of this product reads it
        assert status_json(p)["problems"] == []
    with slot_reader(dsn, p.slot, f"pub_{p.slot}", "pg_recvlogical") as pid:
        data = status_json(p, expected_exit=1)
        run = p.ingest("--capture-only")  # another try may find the slot free: 75, not 1
    assert data["slot"]["reader"] == "pg_recvlogical"
    assert data["problems"] == [
        f"slot {p.slot} is read now by another process (pid {pid}, application_name "
        "'pg_recvlogical'), not by a run of this pipeline: runs exit 75 until it lets go; "
        "stop that reader (a Debezium connector still attached?)"
    ]
    assert run.returncode == 75, run.stderr[-2000:]
    assert f'slot: "{p.slot}" is read now by another process (pid {pid}' in run.stderr


def test_status_fails_what_stops_the_next_run_a_damaged_document_and_a_lake_older_than_its_slot(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """Both stopped every run while status said healthy: it read only part of `_state`, and
    did not hold the slot against the stored position as a run's start does."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    p = make_pipeline(tmp_path, dsn, ["public.items"])
    assert p.ingest("--capture-only").returncode == 0
    backup = tmp_path / "backup"
    shutil.copytree(p.home / "lake", backup)  # the lake as a backup taken now holds it
    sql(dsn, "INSERT INTO items VALUES (1, 'a')")
    assert p.ingest("--capture-only").returncode == 0
    assert status_json(p)["problems"] == []

    known = p.lake.state / "tables.json"
    kept = known.read_bytes()
    known.write_bytes(kept[:-1])  # cut short
    run = p.ingest("--capture-only")
    assert run.returncode == 1, run.stderr[-2000:]
    (said,) = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert str(known) in said
    assert status_json(p, expected_exit=1)["problems"] == [said.removeprefix("error: ")]
    known.write_bytes(kept)
    assert status_json(p)["problems"] == []

    shutil.rmtree(p.home / "lake")
    shutil.copytree(backup, p.home / "lake")  # restored: older than the slot's position
    confirmed, stored = p.confirmed(), json.loads((p.lake.state / "stream.json").read_text())
    (problem,) = status_json(p, expected_exit=1)["problems"]
    assert problem.startswith(
        f"slot {p.slot} is confirmed up to {confirmed}, past the lake's stored position "
        f"{stored['confirmed']}: changes between them never reached the lake"
    ), problem
    run = p.ingest("--capture-only")
    assert run.returncode == 1, run.stderr[-2000:]
    assert f"replication slot {p.slot} is ahead of this pipeline's stored position" in run.stderr
