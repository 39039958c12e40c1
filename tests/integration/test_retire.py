"""`cdc retire`: a pipeline taken out of service gives up its slot, so the source keeps no WAL
for it, and no later run makes a new one. Before it drops anything it says what would be lost:
changes the slot holds that are not in the lake, staged files not yet in bronze."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psycopg

from cdc_core.config import Dsn
from cdc_core.lsn import Lsn
from cdc_core.pg.replication import StreamSource
from cdc_core.run_lock import run_lock
from cdc_core.state import retired_file, stream_file
from tests.integration.conftest import PgServer
from tests.integration.harness import Pipeline, make_pipeline, sql


def slot_row(dsn: str, slot: str) -> tuple[object, ...] | None:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (slot,),
        ).fetchone()


def publication_exists(dsn: str, name: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone()
    return row is not None


def capture_killed_after_staging(p: Pipeline) -> None:
    """A capture killed once a change file is published, before the slot is confirmed past it."""
    run = p.ingest_with_fault("stager.after_publish", "--capture-only", timeout=300)
    assert "fault injected: stager.after_publish" in run.stderr, run.stderr[-2000:]


def test_retire_says_what_is_lost_then_drops_the_slot_and_refuses_later_runs(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)", "CREATE TABLE other (id int)")
    p = make_pipeline(tmp_path, dsn, ["public.items"])
    first = p.ingest("--capture-only")  # makes the slot and the publication
    assert first.returncode == 0, first.stderr[-2000:]
    publication = f"pub_{p.slot}"  # the harness names it after the slot
    assert publication_exists(dsn, publication)
    sql(dsn, "INSERT INTO items SELECT g, 'staged' FROM generate_series(1, 4) g")
    capture_killed_after_staging(p)  # staged and not confirmed: in the lake, not lost
    sql(dsn, "INSERT INTO items VALUES (10, 'a'), (11, 'b')", "UPDATE items SET v = 'c'",
        "INSERT INTO other VALUES (1)")  # fmt: skip
    sql(dsn, "BEGIN; INSERT INTO items VALUES (12, 'rolled back'); ROLLBACK")

    shown = p.cdc("retire", "--pipeline", "p")
    assert shown.returncode == 2, shown.stderr
    assert f"drop slot {p.slot}" in shown.stdout
    # 2 inserts and 6 updates; the staged four, the uncaptured table and the rollback are not
    assert "8 changes in the WAL not yet read into the lake are LOST with it" in shown.stdout
    assert "1 staged files are not yet in bronze" in shown.stdout
    assert f"keep publication {publication}" in shown.stdout
    assert "run it again with --yes" in shown.stderr
    assert slot_row(dsn, p.slot) is not None
    assert not retired_file(p.lake).exists()

    with run_lock(p.lake, "p"):  # a run of the pipeline under way
        locked = p.cdc("retire", "--pipeline", "p", "--yes")
    assert locked.returncode == 75, locked.stderr
    assert "pipeline p is already running" in locked.stderr

    reader = StreamSource(Dsn(dsn), p.slot, publication)  # another reader: a DBA's, say
    reader.open(Lsn(0))
    try:
        held = p.cdc("retire", "--pipeline", "p", "--yes")
    finally:
        reader.close()
    assert held.returncode == 1, held.stderr
    assert f"slot {p.slot} is being read by process" in held.stderr
    assert "nothing was dropped" in held.stderr
    assert not retired_file(p.lake).exists()
    for _ in range(50):  # the walsender lets the slot go as it exits
        if slot_row(dsn, p.slot)[0] is False:  # type: ignore[index]
            break
        time.sleep(0.1)

    position = slot_row(dsn, p.slot)[1]  # type: ignore[index]
    done = p.cdc("retire", "--pipeline", "p", "--yes")
    assert done.returncode == 0, done.stderr
    assert f"dropped slot {p.slot}" in done.stdout
    assert slot_row(dsn, p.slot) is None
    assert publication_exists(dsn, publication)
    record = json.loads(retired_file(p.lake).read_text())
    assert record["done"] is True
    assert record["confirmed"] == position

    stored = stream_file(p.lake).read_text()
    refused = p.ingest("--capture-only")
    assert refused.returncode == 1, refused.stderr
    assert "pipeline p was retired at" in refused.stderr
    assert f"delete {retired_file(p.lake)}" in refused.stderr
    assert slot_row(dsn, p.slot) is None  # no new slot pins WAL
    assert stream_file(p.lake).read_text() == stored
    for asked in (("snapshot", "--table", "public.items"), ("accept-lost-position",)):
        request = p.cdc(asked[0], "--pipeline", "p", *asked[1:])  # no run would act on it
        assert request.returncode == 1, request.stderr
        assert "pipeline p was retired at" in request.stderr

    status = p.cdc("status", "--pipeline", "p", "--json")
    assert status.returncode == 0, status.stdout
    data = json.loads(status.stdout)
    assert data["retired"]["slot"] == p.slot
    assert data["problems"] == []
    plain = p.cdc("status", "--pipeline", "p")
    assert plain.returncode == 0, plain.stdout
    assert f"{p.slot}: dropped (retired)" in plain.stdout
    doctor = p.cdc("doctor", "--pipeline", "p")  # the source is fine; the pipeline runs no more
    assert doctor.returncode == 2, doctor.stdout
    assert doctor.stdout.startswith("FAIL  retired"), doctor.stdout
    assert f"to run it again, delete {retired_file(p.lake)}" in doctor.stdout

    # someone makes the slot again: it holds WAL nobody reads, which status calls a problem
    sql(dsn, f"SELECT pg_create_logical_replication_slot('{p.slot}', 'pgoutput')")
    status = p.cdc("status", "--pipeline", "p")
    assert status.returncode == 1, status.stdout
    assert "holds WAL no run reads" in status.stdout
    again = p.cdc("retire", "--pipeline", "p", "--yes", "--drop-publication")
    assert again.returncode == 0, again.stderr
    assert "was retired at" in again.stdout
    assert f"dropped publication {publication}" in again.stdout
    assert slot_row(dsn, p.slot) is None
    assert not publication_exists(dsn, publication)
    assert json.loads(retired_file(p.lake).read_text())["at"] == record["at"]

    retired_file(p.lake).unlink()  # put back into service: the position is gone
    back = p.ingest("--capture-only")
    assert back.returncode == 1, back.stderr
    assert "retired" not in back.stderr
    assert "snapshot.mode" in back.stderr  # the lost position's way out


def test_retire_keeps_a_publication_another_pgoutput_slot_may_read_through(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """Which publication a slot's reader names is not on the server: dropping one that another
    pipeline reads through left it needing a new slot and a new snapshot."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    p = make_pipeline(tmp_path, dsn, ["public.items"])
    assert p.ingest("--capture-only").returncode == 0
    publication = f"pub_{p.slot}"
    pgoutput, decoding = (f"other_{kind}_{os.getpid()}" for kind in ("pgoutput", "decoding"))
    for name, plugin in ((pgoutput, "pgoutput"), (decoding, "test_decoding")):
        sql(dsn, f"SELECT pg_create_logical_replication_slot('{name}', '{plugin}')")
    try:
        shown = p.cdc("retire", "--pipeline", "p", "--drop-publication")
        assert shown.returncode == 2, shown.stderr
        assert (
            f"keep publication {publication}, --drop-publication notwithstanding: logical "
            f"slots {pgoutput} on this database decode with pgoutput"
        ) in shown.stdout
        done = p.cdc("retire", "--pipeline", "p", "--drop-publication", "--yes")
        assert done.returncode == 0, done.stderr
        assert slot_row(dsn, p.slot) is None
        assert publication_exists(dsn, publication)
        assert "dropped publication" not in done.stdout
        sql(dsn, f"SELECT pg_drop_replication_slot('{pgoutput}')")  # none reads it now
        again = p.cdc("retire", "--pipeline", "p", "--drop-publication", "--yes")
        assert again.returncode == 0, again.stderr
        assert f"dropped publication {publication}" in again.stdout
        assert not publication_exists(dsn, publication)
    finally:
        sql(dsn, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                 f"WHERE slot_name IN ('{pgoutput}', '{decoding}')")  # fmt: skip
