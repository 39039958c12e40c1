"""The product on every supported PostgreSQL major version but Debian's 15, which every other
test runs on: 14 (the oldest, the first with pgoutput's logical messages), 16, 17 and 18, as
built from PostgreSQL's sources (`pg_versions`). On each: `cdc doctor` passes, an initial
snapshot, then changes through the stream reader and the sql reader (unchanged TOAST, a key
change, a transaction larger than the reader's budget, TRUNCATE, quoted names), `cdc status`
reads the slot, and every mirror equals its source. 16 runs in `make slow` only (CI's time)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from cdc_core.config import load_pipeline
from cdc_core.errors import SetupError
from cdc_core.identifiers import TableName
from cdc_core.metrics import Totals
from cdc_core.pg.doctor import run_doctor
from cdc_core.pipeline import batch
from cdc_core.start import start
from tests.conftest import unavailable
from tests.integration import pg_versions
from tests.integration.conftest import PgServer, own_server
from tests.integration.harness import Pipeline, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source

ITEMS, LINES = TableName("public", "items"), TableName("Sales", "Order Items")


@contextlib.contextmanager
def version_server(major: int) -> Iterator[PgServer]:
    try:
        bindir = pg_versions.bindir(major)
    except SetupError as e:
        unavailable(f"no PostgreSQL {major}: {e}")
    with own_server(f"pg{major}", f"PostgreSQL {major}", bindir) as server:
        yield server


@pytest.fixture(
    scope="module",
    # 16 (between 15 and 17) and 17 (the failover tests run on it) in `make slow`
    params=[
        14,
        pytest.param(16, marks=pytest.mark.slow),
        pytest.param(17, marks=pytest.mark.slow),
        18,
    ],
    ids=lambda m: f"pg{m}",
)
def server(request: pytest.FixtureRequest) -> Iterator[PgServer]:
    with version_server(int(request.param)) as server:
        yield server


def run(p: Pipeline, spark: SparkSession) -> None:
    batch(spark, load_pipeline("p", "local", home=p.home), p.lake, Totals())


def assert_mirrors_equal_sources(p: Pipeline, spark: SparkSession) -> None:
    for table in (ITEMS, LINES):
        assert_mirror_equals_source(spark, p.lake, p.dsn, table)


def test_a_pipeline_mirrors_the_source_exactly_on_this_version(
    server: PgServer, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = server.dsn(server.create_database())
    with psycopg.connect(dsn) as conn:
        version = conn.info.server_version // 10_000
    sql(dsn,
        "CREATE TABLE items (id int PRIMARY KEY, v text, big text, n numeric, at timestamptz, "
        "tags text[])",
        "INSERT INTO items SELECT g, 'v' || g, repeat(md5(g::text), 300), g / 7.0, "
        "'2024-03-31 01:30+01'::timestamptz + g * interval '1 hour', ARRAY['a', g::text] "
        "FROM generate_series(1, 300) g",
        'CREATE SCHEMA "Sales"',
        'CREATE TABLE "Sales"."Order Items" ("Line No" int PRIMARY KEY, "Qty" int)',
        'ALTER TABLE "Sales"."Order Items" REPLICA IDENTITY FULL',
        'INSERT INTO "Sales"."Order Items" SELECT g, g FROM generate_series(1, 50) g')  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.items", '"Sales"."Order Items"'],
                      snapshot="initial",
                      extra="capture:\n  chunk_changes: 500\n  file_changes: 2000\n")  # fmt: skip

    report = run_doctor(load_pipeline("p", "local", home=p.home))
    assert [(c.name, c.detail) for c in report.checks if c.status != "pass"] == []
    detail = next(c.detail for c in report.checks if c.name == "server_version")
    assert detail.startswith(f"{version}."), detail

    run(p, spark)  # the initial snapshot, read by Spark JDBC under exported snapshots
    assert_mirrors_equal_sources(p, spark)

    changes = (
        "UPDATE items SET v = 'streamed' WHERE id <= 20",  # big: unchanged TOAST, not sent
        "DELETE FROM items WHERE id BETWEEN 21 AND 30",
        "UPDATE items SET id = id + 1000 WHERE id = 31",  # a key change: d + c
        "INSERT INTO items SELECT g, 'new', repeat('x', 5000), g, now(), '{}' "
        "FROM generate_series(2001, 4000) g",  # one transaction of 2,000 > the 500 budget
        'TRUNCATE "Sales"."Order Items"',
        'INSERT INTO "Sales"."Order Items" VALUES (7, 70), (8, 80)',
        'UPDATE "Sales"."Order Items" SET "Qty" = 71 WHERE "Line No" = 7',
        "SELECT pg_logical_emit_message(true, 'app', 'a message')",
    )
    sql(dsn, *changes)
    run(p, spark)  # the stream reader
    assert_mirrors_equal_sources(p, spark)

    p.edit("  publication:", "  reader: sql\n  publication:")
    sql(dsn, "UPDATE items SET big = 'small now', n = NULL WHERE id BETWEEN 40 AND 60",
        "DELETE FROM items WHERE id > 3500",
        'DELETE FROM "Sales"."Order Items" WHERE "Line No" = 8')  # fmt: skip
    run(p, spark)  # the sql reader: peeks and advances
    assert_mirrors_equal_sources(p, spark)

    status = p.cdc("status", "--pipeline", "p", "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    slot = json.loads(status.stdout)["slot"]
    assert (slot["name"], slot["wal_status"]) == (p.slot, "reserved")


def fails_over(dsn: str, slot: str) -> object:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
    assert row is not None, f"no slot {slot}"
    return row[0]


def test_slot_failover_creates_a_failover_slot_or_makes_one_on_17_and_warns_before(
    pg: PgServer, database: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Debezium's slot.failover: PostgreSQL 17's failover slots, which standbys keep in sync."""
    with version_server(17) as pg17:
        for existing in (False, True):
            dsn = pg17.dsn(pg17.create_database())
            sql(dsn, "CREATE TABLE t (id int PRIMARY KEY)")
            p = make_pipeline(tmp_path / f"existing-{existing}", dsn, ["public.t"],
                              source_extra="slot.failover: true\n")  # fmt: skip
            if existing:  # made before the option was set: an ordinary slot
                sql(dsn, f"SELECT pg_create_logical_replication_slot('{p.slot}', 'pgoutput')")
                assert fails_over(dsn, p.slot) is False
            start(load_pipeline("p", "local", home=p.home), p.lake)
            assert fails_over(dsn, p.slot) is True, f"existing slot: {existing}"
    dsn = pg.dsn(database)  # Debian's 15: an ordinary slot, and a warning that says so
    sql(dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    p = make_pipeline(tmp_path / "pg15", dsn, ["public.t"], source_extra="slot.failover: true\n")
    with caplog.at_level(logging.WARNING, logger="cdc_core.slot"):
        start(load_pipeline("p", "local", home=p.home), p.lake)
    assert (
        f"source.slot.failover: PostgreSQL 15 has no failover slots (17 and newer do): slot "
        f"{p.slot} is not synchronized to standbys"
    ) in caplog.text
    with psycopg.connect(dsn) as conn:
        slots = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                             (p.slot,)).fetchone()  # fmt: skip
    assert slots == (1,)


def test_postgresql_13_is_refused_by_the_doctor_and_the_run_before_anything_is_made(
    tmp_path: Path,
) -> None:
    """Below the minimum: every session of the product sets idle_session_timeout, which 14
    added, so the server refuses the connection itself. The doctor and a run say what to do
    (not "start the server": retrying never helps), and nothing is made on the server."""
    with version_server(13) as server:
        dsn = server.dsn(server.create_database())
        sql(dsn, "CREATE TABLE t (id int PRIMARY KEY)")
        p = make_pipeline(tmp_path, dsn, ["public.t"], snapshot="initial")
        fix = "upgrade PostgreSQL to 14 or newer: this server is older"
        doctor = p.cdc("doctor", "--pipeline", "p")
        assert doctor.returncode == 2, doctor.stdout + doctor.stderr
        assert "FAIL  connect" in doctor.stdout
        assert f"fix: {fix}" in doctor.stdout
        refused = p.ingest("--capture-only")
        assert refused.returncode == 1, refused.stderr[-3000:]  # not 75: no retry fixes it
        assert fix in refused.stderr
        with psycopg.connect(dsn) as conn:
            made = conn.execute(
                "SELECT (SELECT count(*) FROM pg_replication_slots), "
                "(SELECT count(*) FROM pg_publication)"
            ).fetchone()
        assert made == (0, 0)
