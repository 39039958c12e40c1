"""Debezium options end to end on a real server: table filters, skipped operations, messages."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psycopg
import pyarrow.parquet as pq
import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc_core import faults
from cdc_core.bronze import BronzeOptions, append_staged
from cdc_core.identifiers import TableName
from cdc_core.lsn import Lsn
from cdc_core.metrics import last_batch, metrics_table, prometheus_file
from cdc_core.pgtypes import TypeModes
from cdc_core.stager import staged_files
from tests.integration.conftest import PgServer
from tests.integration.harness import ingest_ok as ingest
from tests.integration.harness import make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source, shape_of
from tests.integration.test_validate import by_table, run_validate


def test_excluded_tables_skipped_operations_and_message_prefixes(  # noqa: PLR0917 - fixtures
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE kept (id int PRIMARY KEY, v text)",
        "CREATE TABLE secret (id int PRIMARY KEY, v text)")  # fmt: skip
    p = make_pipeline(
        tmp_path, dsn, ["public.kept", "public.secret"],
        source_extra="""\
            table.exclude.list: public\\.sec.*
            skipped.operations: d
            message.prefix.include.list: [outbox.*]
            """,
    )  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0
    with psycopg.connect(dsn) as conn:
        tables = {r[0] for r in conn.execute(
            "SELECT tablename FROM pg_publication_tables WHERE pubname = %s", (f"pub_{p.slot}",)
        )}  # fmt: skip
    assert tables == {"kept"}, "the excluded table is not even published"
    sql(
        dsn,
        "INSERT INTO kept SELECT g, 'v' || g FROM generate_series(1, 5) g",
        "INSERT INTO secret VALUES (1, 'do not copy')",
        "BEGIN; SELECT pg_logical_emit_message(true, 'outbox.orders', '{\"id\": 7}');"
        " SELECT pg_logical_emit_message(true, 'audit', 'dropped'); COMMIT",
        "SELECT pg_logical_emit_message(false, 'outbox.lone', 'x')",
        "DELETE FROM kept WHERE id <= 2",
        "UPDATE kept SET v = 'changed' WHERE id = 3",
    )
    ingest(p)
    bronze = spark.read.format("delta").load(p.lake.bronze)
    ops = sorted(
        (r["source_table"], r["op"]) for r in bronze.select("source_table", "op").collect()
    )
    assert ops.count(("public.kept", "c")) == 5
    assert ops.count(("public.kept", "u")) == 1
    assert ("public.kept", "d") not in ops, "a skipped operation reached bronze"
    assert not [o for o in ops if o[0] == "public.secret"], "an excluded table reached bronze"
    messages = bronze.where(F.col("op") == "m").select("key", "message").collect()
    got = sorted((json.loads(r["key"])["prefix"], bytes(r["message"]["content"])) for r in messages)
    assert got == [("outbox.lone", b"x"), ("outbox.orders", b'{"id": 7}')]
    assert not (tmp_path / "lake" / "silver" / "public" / "secret").exists()
    silver = spark.read.format("delta").load(p.lake.silver(TableName("public", "kept")))
    assert sorted(r["id"] for r in silver.collect()) == [1, 2, 3, 4, 5]  # deletes skipped
    # validate: the rows kept by design are no difference, the report says what it left out
    code, report = run_validate(p, monkeypatch, capsys, "--no-quality", "--table", "public.kept")
    kept = by_table(report)["public.kept"]
    assert (code, kept["verdict"], kept["mismatching"]) == (0, "equal", 0), report
    assert any("skipped.operations d" in n for n in kept["not_compared"])
    path = p.lake.silver(TableName("public", "kept"))
    DeltaTable.forPath(spark, path).update("id = 3", {"v": F.lit("wrong")})
    code, report = run_validate(p, monkeypatch, capsys, "--no-quality", "--table", "public.kept")
    (key,) = by_table(report)["public.kept"]["keys"]
    assert (code, key["kind"], key["key"]) == (1, "differs", {"id": "3"})
    DeltaTable.forPath(spark, path).update("id = 3", {"v": F.lit("changed")})
    p.edit("skipped.operations: d", "skipped.operations: none")
    sql(dsn, "DELETE FROM kept WHERE id = 5")
    ingest(p)  # deletes flow again; the ones skipped before stay skipped (the user's choice)
    silver = spark.read.format("delta").load(p.lake.silver(TableName("public", "kept")))
    assert sorted(r["id"] for r in silver.where(~F.col("_cdc_deleted")).collect()) == [1, 2, 3, 4]


@pytest.mark.slow
def test_changes_read_and_dropped_count_in_number_of_events_filtered(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE kept (id int PRIMARY KEY, v text)",
        "CREATE TABLE bystander (id int PRIMARY KEY, v text)")  # fmt: skip
    p = make_pipeline(
        tmp_path, dsn, ["public.kept"],
        source_extra="""\
            publication.autocreate.mode: all_tables
            skipped.operations: d
            message.prefix.include.list: [outbox.*]
            """,
    )  # fmt: skip
    # FOR ALL TABLES takes a superuser: made here, as a DBA would, and used as it is
    sql(dsn, f"CREATE PUBLICATION pub_{p.slot} FOR ALL TABLES "
             "WITH (publish_via_partition_root = true)")  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0
    sql(
        dsn,
        "INSERT INTO kept SELECT g, 'v' || g FROM generate_series(1, 5) g",
        "INSERT INTO bystander SELECT g, 'b' || g FROM generate_series(1, 3) g",
        "BEGIN; UPDATE bystander SET v = 'x' WHERE id = 1; UPDATE kept SET v = 'y' WHERE id = 1;"
        " SELECT pg_logical_emit_message(true, 'audit', 'dropped'); COMMIT",
        "DELETE FROM kept WHERE id <= 2",
    )
    ingest(p)
    line = last_batch(p.lake)
    assert line is not None
    # 3 inserts and 1 update of the table not captured, 2 deletes skipped, 1 message filtered out
    assert line["NumberOfEventsFiltered"] == 7
    assert line["TotalNumberOfEventsSeen"] == 6  # the 5 inserts and the update of kept
    prometheus = prometheus_file(p.lake).read_text()
    assert 'cdc_number_of_events_filtered{pipeline="p"} 7.0' in prometheus
    table = spark.read.format("delta").load(metrics_table(p.lake))
    assert [r["NumberOfEventsFiltered"] for r in table.collect()] == [7]


def test_skipped_operations_apply_to_each_half_of_a_key_change(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE moved (id int PRIMARY KEY, v text)")
    p = make_pipeline(tmp_path, dsn, ["public.moved"], source_extra="skipped.operations: u\n")
    assert p.ingest("--capture-only").returncode == 0
    sql(dsn, "INSERT INTO moved SELECT g, 'v' || g FROM generate_series(1, 3) g",
        "UPDATE moved SET id = 10 WHERE id = 1", "UPDATE moved SET v = 'changed' WHERE id = 2")  # fmt: skip
    ingest(p)
    silver = spark.read.format("delta").load(p.lake.silver(TableName("public", "moved")))

    def rows() -> list[tuple[int, str]]:
        return sorted((r["id"], r["v"]) for r in silver.where(~F.col("_cdc_deleted")).collect())

    assert rows() == [(2, "v2"), (3, "v3"), (10, "v1")]  # the move is a d + c; the update skipped
    p.edit("skipped.operations: u", "skipped.operations: d")
    sql(dsn, "UPDATE moved SET id = 20 WHERE id = 10", "DELETE FROM moved WHERE id = 3")
    ingest(p)
    silver = spark.read.format("delta").load(p.lake.silver(TableName("public", "moved")))
    assert rows() == [(2, "v2"), (3, "v3"), (10, "v1"), (20, "v1")]  # only the move's c


def test_a_table_without_a_key_is_mirrored_by_message_key_columns(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(
        dsn,
        "CREATE TABLE events (event_id bigint NOT NULL, kind text, payload text)",
        "ALTER TABLE events REPLICA IDENTITY FULL",
        "INSERT INTO events SELECT g, 'k' || g % 3, repeat('p', g) FROM generate_series(1, 40) g",
    )
    p = make_pipeline(
        tmp_path, dsn, ["public.events"], snapshot="initial",
        source_extra="message.key.columns: public\\.ev.*:event_id\n",
    )  # fmt: skip
    ingest(p)  # the snapshot, keyed by event_id
    sql(
        dsn,
        "UPDATE events SET kind = 'changed' WHERE event_id <= 5",
        "UPDATE events SET event_id = 1000 WHERE event_id = 6",  # a key change
        "DELETE FROM events WHERE event_id BETWEEN 7 AND 9",
        "INSERT INTO events VALUES (41, 'new', 'x')",
    )
    ingest(p)
    table = TableName("public", "events")
    assert shape_of(p.lake, table).key == ("event_id",)
    assert assert_mirror_equals_source(spark, p.lake, dsn, table) == 38
    silver = spark.read.format("delta").load(p.lake.silver(table))
    assert silver.count() == silver.select("event_id").distinct().count() == 38
    bronze = spark.read.format("delta").load(p.lake.bronze)
    keys = {r["key"] for r in bronze.where(F.col("op") == "d").select("key").collect()}
    assert keys == {
        json.dumps({"event_id": str(i)}, separators=(",", ":")) for i in (6, 7, 8, 9)
    }  # 6: the key change


def test_key_columns_outside_the_replica_identity_are_refused_with_the_fix(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE logs (id int PRIMARY KEY, code text)")
    p = make_pipeline(
        tmp_path, dsn, ["public.logs"], source_extra="message.key.columns: public.logs:code\n"
    )
    run = p.ingest("--capture-only")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "key column code of public.logs is not in its replica identity" in run.stderr
    assert "REPLICA IDENTITY FULL" in run.stderr


HASH = "column.mask.hash.v2.SHA-256.with.salt.CzQMA0cB5K"
SALLY = "649ef7111a7e2b04bd5f69c067e2d22173abf15eb5f59462140ba4dac06860ae"  # Debezium, on the JVM


def test_excluded_columns_and_masked_values_never_land(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(
        dsn,
        "CREATE TABLE people (id int PRIMARY KEY, name text, email varchar(200), ssn text,"
        " note text, code char(8))",
        "ALTER TABLE people REPLICA IDENTITY FULL",  # old rows: their columns go the same way
        "INSERT INTO people VALUES (1, 'Sally Thomas', 'sally@example.com', 'SSN-111',"
        " 'a long note', 'ABCDEFGH')",
    )
    p = make_pipeline(
        tmp_path, dsn, ["public.people"], snapshot="initial",
        source_extra=f"""\
            skip.messages.without.change: true
            column.exclude.list: public\\.people\\.ssn
            column.transforms:
              {HASH}: public.people.name, public.people.code
              column.mask.with.4.chars: public\\.people\\.email
              column.truncate.to.6.chars: public.people.note
            """,
    )  # fmt: skip
    ingest(p)  # the snapshot
    sql(
        dsn,
        "INSERT INTO people VALUES (2, 'Sally Thomas', 'x@example.com', 'SSN-222', 'note two',"
        " 'ZZZZZZZZ')",
        "UPDATE people SET note = 'changed note' WHERE id = 1",
        "UPDATE people SET ssn = 'SSN-333' WHERE id = 2",  # excluded: no change kept
        "UPDATE people SET note = 'note t(w)o' WHERE id = 2",  # the same 6 characters kept
    )
    ingest(p)  # the stream
    files = list((tmp_path / "lake").rglob("*.parquet"))
    assert any("_staging" in str(f) for f in files)
    for f in files:  # staged change files, bronze and silver: every value, decompressed
        table = pq.read_table(f)
        metadata = repr(pq.ParquetFile(f).metadata.metadata)
        text = repr(table.to_pylist()) + metadata
        for raw in ("SSN-111", "SSN-222", "SSN-333", "sally@example.com", "Sally Thomas",
                    "a long note", "note t(w)o"):  # fmt: skip
            assert raw not in text, f"{raw!r} landed in {f}"
        if "_staging" in str(f):  # the staged relation lists the kept columns only
            assert '"note"' in metadata
            assert '"ssn"' not in metadata
    silver = spark.read.format("delta").load(p.lake.silver(TableName("public", "people")))
    assert "ssn" not in silver.columns
    rows = {r["id"]: r for r in silver.collect()}
    for i in (1, 2):  # the snapshot's and the stream's values go through the same hash
        assert rows[i]["name"] == SALLY
        assert rows[i]["email"] == "****"
        assert len(rows[i]["code"]) == 8  # cut to char(8)
    assert (rows[1]["note"], rows[2]["note"]) == ("change", "note t")
    bronze = spark.read.format("delta").load(p.lake.bronze)
    assert not bronze.where(F.col("after").contains("SSN")).count()
    # skip.messages.without.change: id 2's updates left its kept columns as they were
    updates = bronze.where(F.col("op") == "u").select("key", "before").collect()
    assert [json.loads(r["key"]) for r in updates] == [{"id": "1"}]
    assert json.loads(updates[0]["before"])["note"] == "a long"  # the old row, truncated too


def test_a_mask_or_truncation_of_a_key_column_stops_the_run_and_a_hash_keeps_keys_apart(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """A mask gave every row one key: the mirror kept one row, and the first delete took it
    (an empty mirror, the run exit 0). Debezium leaves the event key out of its transforms."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE m (email text PRIMARY KEY, v int)",
        "CREATE TABLE k (id int PRIMARY KEY, code text)", "ALTER TABLE k REPLICA IDENTITY FULL",
        "CREATE TABLE h (code char(8) PRIMARY KEY, v int)",
        "CREATE TABLE w (email varchar(200) PRIMARY KEY, v int)",
        *(f"INSERT INTO {t} SELECT 'user' || g || '@x', g FROM generate_series(1, 5) g"
          for t in "mw"),
        "INSERT INTO k SELECT g, 'code-' || g FROM generate_series(1, 5) g",
        "INSERT INTO h SELECT 'c' || g, g FROM generate_series(1, 5) g")  # fmt: skip
    p = make_pipeline(
        tmp_path, dsn, ["public.m", "public.k", "public.h", "public.w"], snapshot="initial",
        source_extra=f"""\
            message.key.columns: public.k:code
            column.transforms:
              column.mask.with.4.chars: public\\.m\\.email
              column.truncate.to.4.chars: public\\.k\\.code
              {HASH}: public\\.h\\.code, public\\.w\\.email
            """,
    )  # fmt: skip
    doctor = p.cdc("doctor", "--pipeline", "p")
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr  # failures found
    lines = {
        line.split()[3]: line for line in doctor.stdout.splitlines() if "key transforms" in line
    }
    assert sorted(lines) == ["public.h", "public.k", "public.m"], doctor.stdout  # not w
    assert [lines[t][:4] for t in ("public.m", "public.k", "public.h")] == ["FAIL", "FAIL", "WARN"]
    assert 'key column "email" (column.mask.with.4.chars) would be rewritten' in lines["public.m"]
    assert 'key column "code" (column.truncate.to.4.chars)' in lines["public.k"]
    assert "cut to 8 of its 64 hex characters by its type, char(8)" in lines["public.h"]
    assert "or hash them instead" in doctor.stdout

    stopped = p.ingest()
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    [line] = [s for s in stopped.stderr.splitlines() if s.startswith("error:")]
    assert 'key column "email" (column.mask.with.4.chars)' in line
    assert not Path(p.lake.silver(TableName("public", "m"))).exists()  # nothing landed

    p.edit("column.mask.with.4.chars:", "column.mask.hash.v2.SHA-256.with.salt.x:")
    p.edit("column.truncate.to.4.chars: public\\.k\\.code", "column.truncate.to.4.chars: x")
    ingest(p)  # the snapshot
    sql(dsn, "UPDATE m SET v = 100 WHERE email = 'user2@x'", "DELETE FROM m WHERE email = 'user3@x'",
        "DELETE FROM k WHERE id = 3", "UPDATE h SET v = -v")  # fmt: skip
    ingest(p)  # the stream
    silver = {t: spark.read.format("delta").load(p.lake.silver(TableName("public", t))).collect()
              for t in "mkh"}  # fmt: skip
    assert sorted(r["v"] for r in silver["m"]) == [1, 4, 5, 100]
    assert all(len(r["email"]) == 64 for r in silver["m"])  # hashed, each key apart
    assert sorted(r["code"] for r in silver["k"]) == [f"code-{i}" for i in (1, 2, 4, 5)]
    assert sorted(r["v"] for r in silver["h"]) == [-5, -4, -3, -2, -1]


def test_a_column_filter_or_transform_changed_between_runs_rebuilds_the_mirror_under_it(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Rows no change touches again keep what was captured under the old rules: an exclusion
    lifted left them NULL, a new one or a new mask left their values in the clear."""
    dsn = pg.dsn(database)
    sql(dsn, *(f"CREATE TABLE {t} (id int PRIMARY KEY, v text, secret text)" for t in "abc"),
        *(f"INSERT INTO {t} SELECT g, 'v', 's' || g FROM generate_series(1, 5) g"
          for t in "abc"))  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.a", "public.b", "public.c"], snapshot="initial",
                      source_extra="column.exclude.list: public\\.a\\.secret\n")  # fmt: skip
    ingest(p)
    p.edit("column.exclude.list: public\\.a\\.secret",
           "column.exclude.list: public\\.b\\.secret\n"
           "  column.transforms:\n    column.mask.with.8.chars: public\\.c\\.secret")  # fmt: skip
    sql(dsn, *(f"UPDATE {t} SET v = 'x' WHERE id = 1" for t in "abc"))
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]
    for t in "abc":
        assert f"table public.{t} had its column filters or transforms changed" in run.stderr
    ingest(p)
    got = {t: {r["id"]: r.asDict() for r in spark.read.format("delta")
               .load(p.lake.silver(TableName("public", t))).collect()} for t in "abc"}  # fmt: skip
    for t in "abc":
        assert sorted(got[t]) == [1, 2, 3, 4, 5]
        assert [got[t][i]["v"] for i in range(1, 6)] == ["x", "v", "v", "v", "v"]
    assert [got["a"][i]["secret"] for i in range(1, 6)] == [f"s{i}" for i in range(1, 6)]
    assert {got["b"][i].get("secret") for i in range(1, 6)} == {None}
    assert {got["c"][i]["secret"] for i in range(1, 6)} == {"********"}
    again = p.ingest()  # recorded: the next run leaves the mirrors alone
    assert again.returncode == 0, again.stderr[-3000:]
    assert "column filters or transforms changed" not in again.stderr


def test_heartbeats_run_their_query_are_recorded_and_move_the_slot(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE watched (id int PRIMARY KEY)",
        "CREATE TABLE busy (id serial PRIMARY KEY, v text)",
        "CREATE TABLE beats (at timestamptz NOT NULL)")  # fmt: skip
    p = make_pipeline(
        tmp_path, dsn, ["public.watched"],
        source_extra="""\
            heartbeat.interval.ms: 1
            heartbeat.action.query: INSERT INTO beats VALUES (now())
            message.prefix.include.list: outbox.*
            """,
    )  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0
    for _ in range(2):  # only traffic the pipeline does not capture
        sql(dsn, "INSERT INTO busy (v) SELECT 'x' FROM generate_series(1, 1000)")
        with psycopg.connect(dsn) as conn:
            written = Lsn.parse(str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]))  # type: ignore[index]
        ingest(p)
        assert p.confirmed() > written, "the slot did not move past uncaptured traffic"
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM beats").fetchone() == (3,)  # type: ignore[comparison-overlap]
    bronze = spark.read.format("delta").load(p.lake.bronze)
    beats = bronze.where(F.col("op") == "m").select("key", "message").collect()
    assert len(beats) == 3
    assert {json.loads(r["key"])["prefix"] for r in beats} == {"cdc-lake.heartbeat"}
    assert all("ts_ms" in json.loads(bytes(r["message"]["content"])) for r in beats)


@pytest.mark.slow
def test_replica_identity_is_set_at_start_where_asked(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE nokey (a int, b text)",
        "INSERT INTO nokey SELECT g, 'v' FROM generate_series(1, 10) g")  # fmt: skip
    p = make_pipeline(
        tmp_path, dsn, ["public.nokey"], snapshot="initial",
        source_extra="replica.identity.autoset.values: public\\.no.*:FULL\n",
    )  # fmt: skip
    ingest(p)  # without the setting the doctor refuses a keyless table under DEFAULT
    with psycopg.connect(dsn) as conn:
        ident = conn.execute("SELECT relreplident FROM pg_class WHERE oid = 'nokey'::regclass")
        assert ident.fetchone() == ("f",)  # type: ignore[comparison-overlap]
    sql(dsn, "UPDATE nokey SET b = 'w' WHERE a <= 3", "DELETE FROM nokey WHERE a > 8")
    ingest(p)
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "nokey")) == 8


def test_a_replica_identity_the_role_may_not_set_stops_the_run_naming_the_statement(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """`replica.identity.autoset.values` on a table another role owns (the product's role may
    read it, not alter it): the run stops before it captures anything, with the statement a
    table owner has to run, and the table keeps its identity."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE ROLE alien_owner NOLOGIN", "CREATE TABLE alien (a int, b text)",
        "ALTER TABLE alien OWNER TO alien_owner", "GRANT SELECT ON alien TO cdc_lake")  # fmt: skip
    failed = _autoset_fails(tmp_path, dsn, "alien", "FULL")
    assert (
        'not allowed to run ALTER TABLE "public"."alien" REPLICA IDENTITY FULL: must be owner '
        "of table alien; run it as the tables' owner (cdc doctor shows the grants needed)"
    ) in failed.stderr
    with psycopg.connect(dsn) as conn:
        ident = conn.execute("SELECT relreplident FROM pg_class WHERE oid = 'alien'::regclass")
        assert ident.fetchone() == ("d",)  # type: ignore[comparison-overlap]
    sql(dsn, "DROP TABLE alien", "DROP ROLE alien_owner")

    sql(dsn, "CREATE TABLE owned (a int NOT NULL, b text)")  # the product's group owns it
    failed = _autoset_fails(tmp_path / "index", dsn, "owned", "INDEX nosuch_idx")
    assert (
        "replica.identity.autoset.values asks public.owned for INDEX nosuch_idx: index "
        '"nosuch_idx" for table "owned" does not exist; name one of the table\'s unique indexes'
    ) in failed.stderr


def test_a_replica_identity_that_would_break_the_source_is_refused_before_it_is_set(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """PostgreSQL refuses UPDATE and DELETE on a published table without a replica identity:
    `replica.identity.autoset.values` asking NOTHING, or DEFAULT of a table without a primary
    key, would break the application's writes. The run stops before any ALTER TABLE, the table
    keeps its identity, and the doctor fails the rule with the same reason."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE nokey (a int, b text)", "ALTER TABLE nokey REPLICA IDENTITY FULL",
        "CREATE TABLE keyed (id int PRIMARY KEY, b text)")  # fmt: skip
    failed = _autoset_fails(tmp_path, dsn, "nokey", "DEFAULT")
    assert (
        "error: replica.identity.autoset.values would break the source, so nothing was "
        "changed: public.nokey: it has no primary key, so REPLICA IDENTITY DEFAULT would make "
        "its UPDATEs and DELETEs fail on the source. Give such tables FULL (or INDEX of a "
        "unique index) in the rule, or leave them out of it\n"
    ) in failed.stderr
    doctor = make_pipeline(
        tmp_path / "doctor", dsn, ["public.nokey"],
        source_extra="replica.identity.autoset.values: public\\.nokey:DEFAULT\n",
    ).cdc("doctor", "--pipeline", "p")  # fmt: skip
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr
    assert (
        "replica.identity.autoset.values sets DEFAULT: it has no primary key, so REPLICA "
        "IDENTITY DEFAULT would make its UPDATEs and DELETEs fail on the source"
    ) in doctor.stdout

    failed = _autoset_fails(tmp_path / "nothing", dsn, "keyed", "NOTHING")
    assert (
        "public.keyed: REPLICA IDENTITY NOTHING would make its UPDATEs and DELETEs fail on the "
        "source"
    ) in failed.stderr
    with psycopg.connect(dsn) as conn:
        idents = conn.execute(
            "SELECT relname, relreplident FROM pg_class WHERE relname IN ('nokey', 'keyed') "
            "ORDER BY relname"
        ).fetchall()
    assert idents == [("keyed", "d"), ("nokey", "f")]


def _autoset_fails(
    home: Path, dsn: str, table: str, identity: str
) -> subprocess.CompletedProcess[str]:
    """A run of a pipeline that asks `identity` for `table`, which must stop (exit 1, no
    traceback) before it sets anything up: no slot exists after it."""
    p = make_pipeline(home, dsn, [f"public.{table}"],
                      source_extra=f"replica.identity.autoset.values: public\\.{table}:{identity}\n")  # fmt: skip
    run = p.ingest("--capture-only")
    assert run.returncode == 1, run.stdout + run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert "unexpected" not in run.stderr
    with psycopg.connect(dsn) as conn:
        slots = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                             (p.slot,)).fetchone()  # fmt: skip
    assert slots == (0,)
    return run


def test_a_hex_placeholder_and_money_fraction_digits_reach_bronze_and_silver(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """`unavailable.value.placeholder: hex:...`: an unchanged TOASTed bytea reads the octets in
    bronze, a text one their text; `money.fraction.digits: 0` rounds money half up in silver."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE blobs (id int PRIMARY KEY, price money, doc text, raw bytea)",
        "ALTER TABLE blobs ALTER doc SET STORAGE EXTERNAL, ALTER raw SET STORAGE EXTERNAL")  # fmt: skip
    p = make_pipeline(
        tmp_path, dsn, ["public.blobs"],
        source_extra="unavailable.value.placeholder: hex:3c746f61737465643e\n",  # <toasted>
        extra="silver:\n  money.fraction.digits: 0\n",
    )  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0
    sql(dsn, "INSERT INTO blobs VALUES (1, 1.50, repeat('x', 9000), "
             "decode(repeat('ab', 9000), 'hex')), (2, -2.50, 'small', '\\x00')",
        "UPDATE blobs SET price = 3.49 WHERE id = 1")  # fmt: skip  # doc and raw not resent
    ingest(p)
    bronze = spark.read.format("delta").load(p.lake.bronze)
    (update,) = bronze.where("op = 'u'").collect()
    assert sorted(update["unchanged"]) == ["doc", "raw"]
    after = json.loads(update["after"])
    assert (after["doc"], after["raw"]) == ("<toasted>", "\\x3c746f61737465643e")
    silver = spark.read.format("delta").load(p.lake.silver(TableName("public", "blobs")))
    assert silver.schema["price"].dataType.simpleString() == "decimal(17,0)"
    rows = {r["id"]: r for r in silver.collect()}
    assert (str(rows[1]["price"]), str(rows[2]["price"])) == ("3", "-3")  # half up: from zero
    assert bytes(rows[1]["raw"]) == bytes.fromhex("ab" * 9000)  # kept, not the placeholder
    assert rows[1]["doc"] == "x" * 9000
    modes = TypeModes(money_fraction_digits=0)
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "blobs"),
                                       modes=modes) == 2  # fmt: skip


@pytest.mark.slow
def test_transaction_metadata_placeholder_and_source_types(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(
        dsn,
        "CREATE TABLE acct (id int PRIMARY KEY, name varchar(40), amount numeric(10,2), big text)",
        "CREATE TABLE audit (id serial PRIMARY KEY, what text)",
    )
    p = make_pipeline(
        tmp_path, dsn, ["public.acct", "public.audit"],
        source_extra="provide.transaction.metadata: true\n"
                     "unavailable.value.placeholder: '<toasted>'\n",
        extra="silver:\n  column.propagate.source.type: public\\.acct\\.(name|tag)\n"
              "  datatype.propagate.source.type: .*\\.numeric\n",
    )  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0  # the slot: changes from here on
    big = "".join(f"{i:08x}" for i in range(40_000))  # 320 kB that does not compress: TOASTed
    xids = []
    with psycopg.connect(dsn) as conn:
        for statements in (
            ["INSERT INTO acct VALUES (1, 'ann', 10.50, %(big)s), (2, 'bob', 3, 'small')",
             "INSERT INTO audit (what) VALUES ('opened')"],
            ["UPDATE acct SET amount = amount + 1 WHERE id = 1",  # big is not resent
             "UPDATE acct SET id = 3 WHERE id = 2"],  # a key change: d, then c
            ["INSERT INTO audit (what) VALUES ('a'), ('b')", "DELETE FROM acct WHERE id = 3"],
        ):  # fmt: skip
            for s in statements:
                conn.execute(s, {"big": big} if "%(big)s" in s else None)
            xids.append(conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0])  # type: ignore[index]
            conn.commit()
        conn.execute("SELECT pg_logical_emit_message(true, 'note', 'alone')")
        conn.commit()
    assert p.ingest("--capture-only").returncode == 0

    def crash() -> None:
        raise RuntimeError("killed between the transactions commit and the bronze commit")

    with faults.hooked("bronze.between_commits", crash), pytest.raises(RuntimeError):
        append_staged(spark, p.lake, staged_files(p.lake.changes),
                      options=BronzeOptions(transaction_metadata=True))  # fmt: skip
    ingest(p)  # bronze and silver, after the crash
    ingest(p)  # and nothing new: nothing twice

    tx = spark.read.format("delta").load(p.lake.transactions)
    ends = {r["txId"]: r for r in tx.where("status = 'END'").collect()}
    assert tx.where("status = 'BEGIN'").count() == len(ends) == 3
    assert sorted(ends) == sorted(xids)
    counts = [(ends[x]["event_count"], [tuple(c) for c in ends[x]["data_collections"]])
              for x in xids]  # fmt: skip
    assert counts == [
        (3, [("public.acct", 2), ("public.audit", 1)]),
        (3, [("public.acct", 3)]),
        (3, [("public.acct", 1), ("public.audit", 2)]),
    ]
    bronze = spark.read.format("delta").load(p.lake.bronze)
    events = bronze.where("op != 'm'").orderBy("commit_lsn", "transaction.total_order").collect()
    assert len(events) == 9
    for e in events:
        assert e["transaction"]["id"] == f"{e['source']['txId']}:{e['commit_lsn']}"
        assert e["transaction"]["id"] == ends[e["source"]["txId"]]["id"]
    middle = [(e["op"], e["transaction"]["total_order"], e["transaction"]["data_collection_order"])
              for e in events if e["source"]["txId"] == xids[1]]  # fmt: skip
    assert middle == [("u", 1, 1), ("d", 2, 2), ("c", 3, 3)]
    assert [e["transaction"]["data_collection_order"] for e in events
            if e["source"]["txId"] == xids[2]] == [1, 2, 1]  # fmt: skip
    (note,) = bronze.where("op = 'm'").collect()
    assert note["transaction"] is None
    (update,) = [e for e in events if e["op"] == "u"]
    assert json.loads(update["after"])["big"] == "<toasted>"
    assert update["unchanged"] == ["big"]

    silver_path = p.lake.silver(TableName("public", "acct"))
    silver = spark.read.format("delta").load(silver_path)
    assert [(r["id"], r["big"] == big) for r in silver.collect()] == [(1, True)]  # kept
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "acct")) == 1
    fields = {f.name: f.metadata for f in silver.schema.fields}
    source = "__debezium.source.column."
    assert fields["name"] == {f"{source}type": "VARCHAR", f"{source}length": "40",
                              f"{source}scale": "0"}  # fmt: skip
    assert fields["amount"] == {f"{source}type": "NUMERIC", f"{source}length": "10",
                                f"{source}scale": "2"}  # fmt: skip
    assert fields["id"] == fields["big"] == {}
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "audit")) == 3

    sql(dsn, "ALTER TABLE acct ADD COLUMN tag varchar(9)",
        "INSERT INTO acct VALUES (4, 'dan', 1, 'x', 'new')")  # fmt: skip
    ingest(p)  # a column added later carries its type too
    silver = spark.read.format("delta").load(silver_path)
    assert silver.schema["tag"].metadata == {f"{source}type": "VARCHAR", f"{source}length": "9",
                                             f"{source}scale": "0"}  # fmt: skip
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "acct")) == 2
