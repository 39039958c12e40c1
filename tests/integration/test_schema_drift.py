"""Schema drift the stream does not show (renamed columns, columns added with a value,
a table dropped and created again, a table taken out of the publication) healed by snapshots,
and key changes that stop one mirror with its remedy while the other tables go on. Drift the stream does show (added, dropped and
widened columns, an incompatible type) is in test_silver_schema.py."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from cdc_core.identifiers import TableName
from cdc_core.signals import signal_table_ddl
from cdc_core.snapshot import load_jobs
from cdc_core.state import memberships_file
from tests.integration.conftest import PgServer
from tests.integration.harness import Pipeline, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source

NAMES = ("renamed", "defaulted", "recreated", "unkeyed", "keyed", "steady")
R, D, X, U, K, S = (TableName("public", n) for n in NAMES)


def _mirrors_equal(spark: SparkSession, p: Pipeline, *tables: TableName) -> dict[str, int]:
    skip = {R: ("a",)}  # the name a column had keeps its old values (a dropped column)
    return {
        t.name: assert_mirror_equals_source(spark, p.lake, p.dsn, t, skip=skip.get(t, ()))
        for t in tables
    }


@pytest.mark.slow
def test_drift_is_healed_or_stops_only_its_table(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    for t in ("renamed", "defaulted", "recreated", "unkeyed", "steady"):
        sql(dsn, f"CREATE TABLE {t} (id int PRIMARY KEY, a text, b int)",
            f"INSERT INTO {t} SELECT g, 'a' || g, g FROM generate_series(1, 50) g")  # fmt: skip
    sql(dsn, "CREATE TABLE keyed (id int, a text, b int)", "ALTER TABLE keyed REPLICA IDENTITY FULL",
        "INSERT INTO keyed SELECT g, 'a' || g, g FROM generate_series(1, 50) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, [f"public.{n}" for n in NAMES], snapshot="initial")
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]
    assert set(_mirrors_equal(spark, p, *(TableName("public", n) for n in NAMES)).values()) == {50}

    sql(dsn,
        # values only a snapshot can bring: the stream sends them with each row's next change
        "ALTER TABLE renamed RENAME COLUMN a TO a2", "UPDATE renamed SET a2 = 'new' WHERE id = 1",
        "ALTER TABLE defaulted ADD COLUMN flag text NOT NULL DEFAULT 'yes'",
        "INSERT INTO defaulted VALUES (51, 'a51', 51, 'no')",
        # the old rows get no deletes; rows before the table is published again are not sent
        "DROP TABLE recreated", "CREATE TABLE recreated (id int PRIMARY KEY, a text, b int)",
        "INSERT INTO recreated VALUES (1000, 'new', 1)",
        # key changes: the mirror's layout (rows by key, or a multiset) cannot follow in place
        "ALTER TABLE unkeyed DROP CONSTRAINT unkeyed_pkey", "INSERT INTO unkeyed VALUES (51, 'x', 0)",
        "ALTER TABLE keyed ADD PRIMARY KEY (id)", "UPDATE keyed SET b = -1 WHERE id <= 5",
        "UPDATE steady SET b = -b WHERE id <= 10", "DELETE FROM steady WHERE id > 45")  # fmt: skip
    silver_before = {t: _silver_rows(spark, p, t) for t in (U, K)}
    run = p.ingest()
    assert run.returncode == 1, run.stderr[-3000:]
    err = run.stderr
    assert "table public.renamed: renamed column a -> a2" in err
    assert "table public.defaulted: added column flag with a value in existing rows" in err
    assert "table public.recreated was dropped and created again" in err
    assert "table public.unkeyed lost its primary key (id)" in err
    assert "ALTER TABLE public.unkeyed ADD PRIMARY KEY (id)" in err
    assert "table public.keyed has a primary key (id) now" in err
    assert "cdc snapshot --table public.keyed" in err
    counts = _mirrors_equal(spark, p, R, D, X, S)  # healed, or never touched
    assert counts == {"renamed": 50, "defaulted": 51, "recreated": 1, "steady": 45}
    for t in (U, K):  # stopped, and nothing already landed was damaged
        assert _silver_rows(spark, p, t) == silver_before[t], t

    # each remedy the error names works; the healed tables stay healed
    sql(dsn, "ALTER TABLE unkeyed ADD PRIMARY KEY (id)", "UPDATE unkeyed SET a = 'back' WHERE id = 2",
        "INSERT INTO recreated VALUES (1001, 'newer', 2)", "UPDATE renamed SET b = 0")  # fmt: skip
    shutil.rmtree(p.lake.silver(K))
    requested = p.cdc("snapshot", "--pipeline", "p", "--table", "public.keyed")
    assert requested.returncode == 0, requested.stderr
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]
    assert "dropped and created again" not in run.stderr  # the reset happens once
    assert _mirrors_equal(spark, p, *(TableName("public", n) for n in NAMES)) == {
        "renamed": 50, "defaulted": 51, "recreated": 2, "unkeyed": 51, "keyed": 50, "steady": 45,
    }  # fmt: skip


def _silver_rows(
    spark: SparkSession, p: Pipeline, t: TableName, columns: tuple[str, ...] = ("id", "a", "b")
) -> list[tuple[object, ...]]:
    df = spark.read.format("delta").load(p.lake.silver(t))
    return sorted(tuple(r) for r in df.select(*columns).collect())


@pytest.mark.slow
def test_a_table_taken_out_of_the_publication_is_added_back_and_snapshotted_again(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Decoding looks the publication up as of each change: what the application wrote while
    the table was out is never sent, and adding it back sends only what follows."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 50) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.items"], snapshot="initial")
    assert p.ingest().returncode == 0
    sql(dsn, "UPDATE items SET v = 'streamed' WHERE id = 1",
        f"ALTER PUBLICATION pub_{p.slot} DROP TABLE items",
        "INSERT INTO items VALUES (51, 'while out')", "UPDATE items SET v = 'while out' WHERE id <= 5",
        "DELETE FROM items WHERE id BETWEEN 10 AND 14")  # fmt: skip

    run = p.ingest()

    assert run.returncode == 0, run.stderr[-3000:]
    assert f"table public.items was taken out of publication pub_{p.slot}" in run.stderr
    assert "it is added back and snapshotted again" in run.stderr
    jobs = [j for j in load_jobs(p.lake) if j.origin == "publication"]
    assert [[t.table for t in j.tables] for j in jobs] == [[TableName("public", "items")]]
    assert jobs[0].finished
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "items")) == 46
    sql(dsn, "DELETE FROM items WHERE id = 51")  # streamed again
    assert p.ingest().returncode == 0
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "items")) == 45
    assert len([j for j in load_jobs(p.lake) if j.origin == "publication"]) == 1  # its new row


@pytest.mark.slow
def test_a_table_taken_out_of_the_publication_and_put_back_between_runs_is_snapshotted_again(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Put back before the next run, the table is a member when that run starts, but what was
    written while it was out was never sent: its membership row is a new one."""
    dsn = pg.dsn(database)
    items, other = TableName("public", "items"), TableName("public", "other")
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 50) g",
        "CREATE TABLE other (id int PRIMARY KEY, v text)", "INSERT INTO other VALUES (1, 'a')")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.items", "public.other"], snapshot="initial")
    assert p.ingest().returncode == 0
    sql(dsn, "UPDATE items SET v = 'streamed' WHERE id = 1",
        f"ALTER PUBLICATION pub_{p.slot} DROP TABLE items",
        "INSERT INTO items VALUES (51, 'while out')", "UPDATE items SET v = 'while out' WHERE id <= 5",
        "DELETE FROM items WHERE id BETWEEN 10 AND 14",
        f"ALTER PUBLICATION pub_{p.slot} ADD TABLE items",
        "UPDATE items SET v = 'back' WHERE id = 2", "INSERT INTO other VALUES (2, 'b')")  # fmt: skip

    run = p.ingest()

    assert run.returncode == 0, run.stderr[-3000:]
    assert assert_mirror_equals_source(spark, p.lake, dsn, other) == 2
    assert assert_mirror_equals_source(spark, p.lake, dsn, items) == 46
    assert (
        f"table public.items was taken out of publication pub_{p.slot} and put back" in run.stderr
    )
    jobs = [j for j in load_jobs(p.lake) if j.origin == "publication"]
    assert [[t.table for t in j.tables] for j in jobs] == [[items]]
    assert jobs[0].finished
    memberships_file(p.lake).unlink()  # as before the product recorded memberships
    sql(dsn, "DELETE FROM items WHERE id = 51")  # streamed again
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]
    assert "taken out of publication" not in run.stderr  # recorded, not snapshotted
    assert len([j for j in load_jobs(p.lake) if j.origin == "publication"]) == 1
    assert assert_mirror_equals_source(spark, p.lake, dsn, items) == 45


def test_a_row_filter_put_on_the_publication_stops_the_run_until_the_table_is_published_whole(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Under a row filter the stream leaves out the changes of rows the condition does not pass,
    so their mirror rows would keep old values: the run stops naming the filter, and the
    doctor's fix (the table taken out and added back whole, in one transaction) brings the
    mirror back in line, changes made under the filter included."""
    dsn = pg.dsn(database)
    items = TableName("public", "items")
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 50) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.items"], snapshot="initial")
    assert p.ingest().returncode == 0
    sql(dsn, f"ALTER PUBLICATION pub_{p.slot} SET TABLE ONLY items WHERE (id > 10)",
        "UPDATE items SET v = 'under the filter' WHERE id <= 15",
        "DELETE FROM items WHERE id IN (1, 2, 20)")  # fmt: skip

    refused = p.ingest("--capture-only")  # the run's start: no Spark needed to see it stop

    assert refused.returncode == 1, refused.stderr[-3000:]
    assert "it publishes only the rows of public.items WHERE (id > 10)" in refused.stderr
    doctor = p.cdc("doctor", "--pipeline", "p")
    assert doctor.returncode == 2, doctor.stdout
    fix = [line.strip().removeprefix("fix: ") for line in doctor.stdout.splitlines()
           if "ALTER PUBLICATION" in line]  # fmt: skip
    assert len(fix) == 1, doctor.stdout
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(fix[0].encode())  # BEGIN; DROP; ADD; COMMIT: the simple query protocol
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]
    assert "taken out of publication" in run.stderr  # and put back: snapshotted again
    assert assert_mirror_equals_source(spark, p.lake, dsn, items) == 47


def test_a_table_whose_values_are_rewritten_in_place_is_read_again(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """A table without a key is a multiset whose rows are known by their values' text. A
    dropped column, or a type change that rewrites every value's text (numeric scale, real ->
    double), changes that text with no change in the stream: a later delete's old row would
    match nothing in the mirror, and the row would stay. A keyed table finds rows by their key,
    but char(n) -> text trims every value in place, and a real changed in the batch before the
    ALTER to double would be typed as a double, and `ALTER ... TYPE ... USING expr` to the same
    type computes every value again, and an enum value renamed reads under its new name in
    every row holding it. The run reads such tables again; a VACUUM FULL, which rewrites the
    table and keeps its values, is not read again."""
    dsn = pg.dsn(database)
    tables = ("dropped", "rescaled", "doubled", "widened")
    for t in tables:  # rows 1-5 twice: counts of 2
        sql(dsn, f"CREATE TABLE {t} (a int, b text, n numeric(10,2), r real)",
            f"ALTER TABLE {t} REPLICA IDENTITY FULL",
            f"INSERT INTO {t} SELECT g % 15, 'b' || g, g + 0.5, g + 0.1 "
            "FROM generate_series(1, 20) g")  # fmt: skip
    keyed = ("padded", "scaled", "readded", "backfilled", "recomputed", "vacuumed")
    for t in keyed:
        sql(dsn, f"CREATE TABLE {t} (id int PRIMARY KEY, c char(4), r real, n numeric(10,2))",
            f"INSERT INTO {t} SELECT g, 'c' || g, g + 0.1, g + 0.5 FROM generate_series(1, 20) g")  # fmt: skip
    sql(dsn, "CREATE TYPE mood AS ENUM ('sad', 'ok')", "CREATE DOMAIN calm AS mood",
        "CREATE TYPE pair AS (a int, b text)",
        "CREATE TABLE relabeled (id int PRIMARY KEY, m mood, ms mood[], c calm, p pair)",
        "INSERT INTO relabeled SELECT g, m, ARRAY[m, 'ok'], m, ROW(g, 'x y')::pair "
        "FROM generate_series(1, 20) g, LATERAL (SELECT (ARRAY['sad', 'ok'])[g % 2 + 1]::mood) x(m)",
        "CREATE TABLE relabeled_bag (a int, m mood)", "ALTER TABLE relabeled_bag REPLICA IDENTITY FULL",
        "INSERT INTO relabeled_bag SELECT g % 4, 'sad' FROM generate_series(1, 8) g",
        "CREATE TABLE recomposed (id int PRIMARY KEY, p pair)",
        "INSERT INTO recomposed SELECT g, ROW(g, 'b')::pair FROM generate_series(1, 20) g")  # fmt: skip
    keyed += ("relabeled", "recomposed")
    captured = [f"public.{t}" for t in (*tables, *keyed, "relabeled_bag")]
    p = make_pipeline(tmp_path, dsn, captured, snapshot="initial")
    assert p.ingest().returncode == 0
    # widened and scaled: their values stay, nothing to read again
    sql(dsn, "ALTER TABLE dropped DROP COLUMN b", "ALTER TABLE rescaled ALTER n TYPE numeric(12,4)",
        "ALTER TABLE doubled ALTER r TYPE double precision",
        "ALTER TABLE widened ALTER a TYPE bigint",
        "UPDATE padded SET r = r + 1 WHERE id <= 5",  # a real, in the batch of the ALTER
        "ALTER TABLE padded ALTER c TYPE text, ALTER r TYPE double precision",
        "UPDATE padded SET r = r + 1 WHERE id BETWEEN 3 AND 7",
        "ALTER TABLE scaled ALTER n TYPE numeric(12,4)", "UPDATE scaled SET n = 0.1234 WHERE id = 1",
        # the mirror holds the dropped c's values under the name c
        "ALTER TABLE readded DROP COLUMN c", "ALTER TABLE readded ADD COLUMN c text",
        "UPDATE readded SET c = 'new' WHERE id = 1",
        # a backfill by a volatile default, dropped before the run: the catalog forgets it
        "ALTER TABLE backfilled ADD COLUMN x float8 DEFAULT random()",
        "ALTER TABLE backfilled ALTER x DROP DEFAULT", "UPDATE backfilled SET r = 0 WHERE id = 1",
        # the catalog keeps the type: the column's catalog row and the table's storage are new
        "ALTER TABLE recomputed ALTER n TYPE numeric(10,2) USING n * 2",
        "UPDATE recomputed SET r = 0 WHERE id = 1",
        "VACUUM FULL vacuumed", "CLUSTER vacuumed USING vacuumed_pkey",
        # rows holding 'sad' read 'blue' now; a delete's old row says 'blue'
        "ALTER TYPE mood RENAME VALUE 'sad' TO 'blue'", "UPDATE relabeled SET m = 'ok' WHERE id = 1",
        "DELETE FROM relabeled_bag WHERE a = 1",
        # every pair's text gains a field: (1,b) reads (1,b,)
        "ALTER TYPE pair ADD ATTRIBUTE z int", "UPDATE recomposed SET p.z = 5 WHERE id = 1")  # fmt: skip
    for t in tables:
        sql(dsn, f"DELETE FROM {t} WHERE a IN (1, 7)", f"UPDATE {t} SET a = -a WHERE a = 2")

    run = p.ingest()

    assert run.returncode == 0, run.stderr[-3000:]
    skip = {"dropped": ("b",)}
    for t in tables:
        count = assert_mirror_equals_source(
            spark, p.lake, dsn, TableName("public", t), skip=skip.get(t, ())
        )
        assert count == 17, t
    for t in keyed:
        assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", t)) == 20, t
    assert "table public.dropped: dropped column b (a table without a key" in run.stderr
    assert "table public.rescaled: column n changed type (numeric(10,2) -> numeric(12,4))" in (
        run.stderr
    )
    assert "table public.doubled: column r changed type (real -> double precision)" in run.stderr
    assert (
        "table public.padded: column c changed type (character(4) -> text); column r changed "
        "type (real -> double precision), rewriting its rows in place"
    ) in run.stderr
    assert "table public.readded: column c dropped and added again" in run.stderr
    assert "table public.backfilled: added column x in a rewrite of the table" in run.stderr
    assert (
        "table public.recomputed: column n computed again in a rewrite of the table (ALTER ... "
        "TYPE ... USING)"
    ) in run.stderr
    assert (
        assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "relabeled_bag")) == 6
    )
    assert "table public.relabeled: enum value renamed (mood 'sad' -> 'blue'" in run.stderr
    assert "table public.relabeled_bag: enum value renamed (mood 'sad' -> 'blue'" in run.stderr
    assert (
        "table public.recomposed: composite type pair's attributes changed (1 integer, 2 text -> "
        "1 integer, 2 text, 3 integer: every value of it reads otherwise)"
    ) in run.stderr
    assert "public.widened" not in run.stderr
    assert "public.vacuumed" not in run.stderr
    assert "public.scaled" not in run.stderr
    sql(dsn, *(f"DELETE FROM {t} WHERE a IN (3, 8)" for t in tables))  # streamed again
    assert p.ingest().returncode == 0
    for t in tables:
        count = assert_mirror_equals_source(
            spark, p.lake, dsn, TableName("public", t), skip=skip.get(t, ())
        )
        assert count == 14, t


def test_a_column_renamed_only_in_case_stops_its_mirror_alone_until_rebuilt(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Spark and Delta take "A" and a for one column: the mirror cannot hold both, so it stops
    with its remedy while the other tables go on, and the remedy rebuilds it."""
    dsn = pg.dsn(database)
    for t in ("cased", "other"):
        sql(dsn, f"CREATE TABLE {t} (id int PRIMARY KEY, a int)",
            f"INSERT INTO {t} SELECT g, g FROM generate_series(1, 10) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.cased", "public.other"], snapshot="initial")
    assert p.ingest().returncode == 0
    sql(dsn, 'ALTER TABLE cased RENAME COLUMN a TO "A"', 'UPDATE cased SET "A" = -1 WHERE id = 1',
        "UPDATE other SET a = -1 WHERE id = 1")  # fmt: skip

    run = p.ingest()

    assert run.returncode == 1, run.stderr[-3000:]
    assert "table public.cased: columns a and A differ only in case" in run.stderr
    assert "AMBIGUOUS" not in run.stderr
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "other")) == 10

    shutil.rmtree(p.lake.silver(TableName("public", "cased")))
    requested = p.cdc("snapshot", "--pipeline", "p", "--table", "public.cased")
    assert requested.returncode == 0, requested.stderr
    sql(dsn, 'UPDATE cased SET "A" = -2 WHERE id = 2')
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "cased")) == 10


def test_a_primary_key_changed_under_pending_deletes_stops_its_mirror_until_rebuilt(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Silver matches a batch's changes by the table's newest key. A delete recorded under the
    old key carries only that key's values: the mirror stops, naming both keys and the way
    out, rather than keep a deleted row (before: an error blaming message.key.columns). A key
    changed after a run applied every change before it ("drained") just goes on."""
    dsn = pg.dsn(database)
    for t in ("moved", "drained"):
        sql(dsn, f"CREATE TABLE {t} (id int PRIMARY KEY, code text NOT NULL UNIQUE, v int)",
            f"INSERT INTO {t} SELECT g, 'c' || g, g FROM generate_series(1, 20) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.moved", "public.drained"], snapshot="initial")
    assert p.ingest().returncode == 0
    moved, drained = TableName("public", "moved"), TableName("public", "drained")
    # staged under the old key, not yet applied, when the key changes
    sql(dsn, "DELETE FROM moved WHERE id = 1", "UPDATE moved SET id = 300 WHERE id = 3",
        "UPDATE moved SET v = -2 WHERE id = 2")  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0
    for t in ("moved", "drained"):
        sql(dsn, f"ALTER TABLE {t} DROP CONSTRAINT {t}_pkey, ADD PRIMARY KEY (code)",
            f"DELETE FROM {t} WHERE id = 4", f"UPDATE {t} SET code = 'x5' WHERE id = 5",
            f"UPDATE {t} SET v = -6 WHERE id = 6")  # fmt: skip
    before = _silver_rows(spark, p, moved, ("id", "code", "v"))

    run = p.ingest()

    assert run.returncode == 1, run.stderr[-3000:]
    error = run.stderr.strip().splitlines()[-1]
    assert "table public.moved: its primary key changed from (id) to (code)" in error
    assert "cdc snapshot --table public.moved" in error
    assert "message.key.columns" not in error  # not the nullable-key refusal
    assert _silver_rows(spark, p, moved, ("id", "code", "v")) == before  # nothing landed is damaged
    assert assert_mirror_equals_source(spark, p.lake, dsn, drained) == 19

    shutil.rmtree(p.lake.silver(moved))
    requested = p.cdc("snapshot", "--pipeline", "p", "--table", "public.moved")
    assert requested.returncode == 0, requested.stderr
    sql(dsn, "DELETE FROM moved WHERE id = 7", "UPDATE moved SET code = 'x8' WHERE id = 8")
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]
    assert assert_mirror_equals_source(spark, p.lake, dsn, moved) == 17
    sql(dsn, "DELETE FROM moved WHERE code = 'x8'", "DELETE FROM drained WHERE code = 'x5'")
    assert p.ingest().returncode == 0  # keyed by code from the rebuild on
    assert assert_mirror_equals_source(spark, p.lake, dsn, moved) == 16
    assert assert_mirror_equals_source(spark, p.lake, dsn, drained) == 18


@pytest.mark.parametrize("soft_delete", [False, True])
def test_a_table_created_again_with_other_types_or_no_key_starts_its_mirror_over(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession, soft_delete: bool
) -> None:
    """The mirror of a table dropped and created again starts over: a column of a type Delta
    cannot widen into, or a key gained or lost, is no reason to stop it. The emptying commit
    replaces the schema with the rows; the table is read once, though it left the publication
    and drifted both."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE retyped (id int PRIMARY KEY, a text, b int)",
        "CREATE TABLE unkeyed (id int PRIMARY KEY, a text)",
        "INSERT INTO retyped SELECT g, 'a' || g, g FROM generate_series(1, 20) g",
        "INSERT INTO unkeyed SELECT g, 'a' || g FROM generate_series(1, 20) g")  # fmt: skip
    extra = f"silver:\n  soft_delete: {str(soft_delete).lower()}\n"
    p = make_pipeline(tmp_path, dsn, ["public.retyped", "public.unkeyed"], snapshot="initial",
                      extra=extra)  # fmt: skip
    assert p.ingest().returncode == 0
    sql(dsn, "UPDATE retyped SET a = 'streamed' WHERE id = 1", "DELETE FROM unkeyed WHERE id = 2",
        "DROP TABLE retyped", "CREATE TABLE retyped (id int PRIMARY KEY, a int, b text)",
        "INSERT INTO retyped VALUES (1000, 7, 'new'), (1001, 8, 'new')",
        "DROP TABLE unkeyed", "CREATE TABLE unkeyed (id int, a text)",
        "ALTER TABLE unkeyed REPLICA IDENTITY FULL",
        "INSERT INTO unkeyed VALUES (1, 'x'), (1, 'x'), (2, 'y')")  # fmt: skip

    run = p.ingest()

    assert run.returncode == 0, run.stderr[-3000:]
    tables = [TableName("public", "retyped"), TableName("public", "unkeyed")]
    assert [run.stderr.count(f"table {t} was dropped and created again") for t in tables] == [1, 1]
    planned = "planned: public.retyped (1 chunks), public.unkeyed (1 chunks)"
    assert run.stderr.count(planned) == 1, run.stderr[-3000:]
    assert run.stderr.count("planned: ") == 1  # read once, for the publication and the drift
    assert run.stderr.count("the mirror is replaced by an empty one of the new schema") == 2
    # under soft_delete, the old table's rows (19 + 1 deleted by the stream, 20 by the reset)
    assert ("its 20 rows marked _cdc_deleted go with the old one" in run.stderr) == soft_delete
    counts = [assert_mirror_equals_source(spark, p.lake, dsn, t, soft_delete=soft_delete)
              for t in tables]  # fmt: skip
    assert counts == [2, 3]
    sql(dsn, "UPDATE retyped SET a = 9 WHERE id = 1000", "DELETE FROM retyped WHERE id = 1001",
        "INSERT INTO retyped VALUES (1002, 10, 'newer')",
        "DELETE FROM unkeyed WHERE id = 2", "UPDATE unkeyed SET a = 'z' WHERE id = 1")  # fmt: skip
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]
    counts = [assert_mirror_equals_source(spark, p.lake, dsn, t, soft_delete=soft_delete)
              for t in tables]  # fmt: skip
    assert counts == [2, 2]
    live = spark.read.format("delta").load(p.lake.silver(tables[0]))
    columns = {f.name: f.dataType.simpleString() for f in live.schema.fields}
    assert {n: t for n, t in columns.items() if not n.startswith("_cdc")} == {
        "id": "int", "a": "int", "b": "string"
    }  # fmt: skip


def test_a_partition_attached_holding_rows_detached_or_dropped_is_read_again(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Rows a partitioned table gains or loses with no change sent: a table holding rows
    attached as a partition, a partition dropped or detached. A partition created as one
    starts empty (its rows stream), and a plain column added beside it is no rewrite."""
    dsn = pg.dsn(database)
    for t in ("attached", "dropped", "detached", "created"):
        key = "" if t == "detached" else ", PRIMARY KEY (id)"
        sql(dsn, f"CREATE TABLE {t} (id int NOT NULL, v text{key}) PARTITION BY RANGE (id)",
            f"CREATE TABLE {t}_1 PARTITION OF {t} FOR VALUES FROM (0) TO (100)")  # fmt: skip
    for t in ("dropped", "detached"):
        sql(dsn, f"CREATE TABLE {t}_2 PARTITION OF {t} FOR VALUES FROM (100) TO (200)")
    sql(dsn, *(f"ALTER TABLE {t} REPLICA IDENTITY FULL" for t in
               ("detached", "detached_1", "detached_2")),  # a partition's identity is its own
        *(f"INSERT INTO {t} SELECT g, 'v' || g FROM generate_series(1, 99) g" for t in
          ("attached", "created")),
        *(f"INSERT INTO {t} SELECT g, 'v' || g FROM generate_series(1, 150) g" for t in
          ("dropped", "detached")))  # fmt: skip
    names = ["public.attached", "public.dropped", "public.detached", "public.created"]
    p = make_pipeline(tmp_path, dsn, names, snapshot="initial")
    assert p.ingest().returncode == 0
    sql(dsn, "CREATE TABLE attached_2 (id int NOT NULL, v text, PRIMARY KEY (id))",
        "INSERT INTO attached_2 SELECT g, 'old' || g FROM generate_series(100, 119) g",
        "ALTER TABLE attached ATTACH PARTITION attached_2 FOR VALUES FROM (100) TO (200)",
        "UPDATE attached SET v = 'streamed' WHERE id = 101",
        "DROP TABLE dropped_2", "ALTER TABLE detached DETACH PARTITION detached_2",
        "CREATE TABLE created_2 PARTITION OF created FOR VALUES FROM (100) TO (200)",
        "INSERT INTO created VALUES (150, 'streamed')", "ALTER TABLE created ADD COLUMN note text",
        "UPDATE created SET note = 'n' WHERE id = 1")  # fmt: skip

    run = p.ingest()

    assert run.returncode == 0, run.stderr[-3000:]
    assert "table public.attached: attached_2 attached as a partition holding rows" in run.stderr
    assert "table public.dropped: 1 partition detached or dropped (oid " in run.stderr
    assert "table public.detached: 1 partition detached or dropped (oid " in run.stderr
    assert "public.created" not in "".join(
        line for line in run.stderr.splitlines() if "which no change carried" in line
    )  # fmt: skip
    assert "planned: public.attached (1 chunks), public.dropped (1 chunks), public.detached" in (
        run.stderr
    )
    counts = [assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", n[7:]))
              for n in names]  # fmt: skip
    assert counts == [119, 99, 99, 100]


STALE = {  # a schema change under a snapshot's remaining chunks: (DDL, condition, its warning)
    "key renamed": ("ALTER TABLE items RENAME COLUMN id TO id2", None, "changed since its chunks"),
    "key retyped": (
        "ALTER TABLE items ALTER COLUMN id TYPE text",
        None,
        "changed since its chunks",
    ),
    "condition": ("ALTER TABLE items RENAME COLUMN v TO v2", "v <> 'v7'", "no longer reads"),
}


def _runs_on(p: Pipeline, run: subprocess.CompletedProcess[str], *, retyped: bool) -> None:
    """The run after the schema change, and the next, succeed; with the key retyped the mirror
    cannot follow, and the remedy its error names works."""
    if retyped:
        assert run.returncode == 1, run.stderr[-3000:]
        assert "column id changed type from integer to text" in run.stderr
        shutil.rmtree(p.lake.silver(TableName("public", "items")))
        assert p.cdc("snapshot", "--pipeline", "p", "--table", "public.items").returncode == 0
        run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]
    run = p.ingest()  # and every run after
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.parametrize("case", list(STALE))
def test_a_snapshot_resumed_after_its_table_changed_is_planned_again_or_given_up(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession, case: str
) -> None:
    """An incremental snapshot killed after its first group, then its key column renamed or
    retyped, or a column its condition names renamed: its remaining chunks would fail on every
    run, for every table. They are planned again over the key now; a condition the table no
    longer takes gives the read up."""
    dsn = pg.dsn(database)
    ddl, condition, warning = STALE[case]
    signals = TableName("public", "cdc_signal")
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)", signal_table_ddl(signals),
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 400) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.items"], snapshot="initial",
                      snapshot_extra=f"chunk.size: 100\nmax.threads: 1\n"
                                     f"signal.data.collection: {signals}\n")  # fmt: skip
    assert p.ingest().returncode == 0
    request: dict[str, object] = {"data-collections": ["public.items"]}
    if condition:
        request["additional-conditions"] = [
            {"data-collection": "public.items", "filter": condition}
        ]
    data = json.dumps(request).replace("'", "''")
    sql(dsn, f"INSERT INTO {signals} VALUES ('s1', 'execute-snapshot', '{data}')",
        "UPDATE items SET v = 'changed' WHERE id IN (3, 303)")  # fmt: skip
    killed = p.ingest_with_fault("snapshot.chunk_done@1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    sql(dsn, ddl)

    run = p.ingest()

    assert warning in run.stderr, run.stderr[-3000:]
    _runs_on(p, run, retyped=case == "key retyped")
    skip = {"key renamed": ("id",), "condition": ("v",)}.get(case, ())
    items = TableName("public", "items")
    assert assert_mirror_equals_source(spark, p.lake, dsn, items, skip=skip) == 400


@pytest.mark.parametrize("case", ["key renamed", "key retyped"])
def test_an_initial_snapshot_resumed_after_its_table_changed_is_planned_again(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession, case: str
) -> None:
    """The initial snapshot killed after its first group, then its key column renamed or
    retyped: its remaining chunks failed on every run. The table is planned again, in an
    initial snapshot of its own (the first stays unfinished until it is read)."""
    dsn = pg.dsn(database)
    ddl = STALE[case][0]
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 400) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.items"], snapshot="initial",
                      snapshot_extra="chunk.size: 100\nmax.threads: 1\n")  # fmt: skip
    killed = p.ingest_with_fault("snapshot.chunk_done@1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    [first] = load_jobs(p.lake)
    assert (first.kind, first.tables[0].groups_done) == ("initial", 1)
    sql(dsn, ddl, "UPDATE items SET v = 'changed' WHERE v IN ('v3', 'v303')")

    run = p.ingest()

    assert "changed since its chunks were planned" in run.stderr, run.stderr[-3000:]
    old, again = load_jobs(p.lake)
    assert (old.id, old.tables[0].ended) == (
        first.id,
        "read again by a job planned over its key now",
    )
    assert (again.kind, again.origin, again.tables[0].plan.key) == (
        "initial",
        "planned again",
        ("id2",) if case == "key renamed" else ("id",),
    )
    _runs_on(p, run, retyped=case == "key retyped")
    assert all(j.finished for j in load_jobs(p.lake))
    items = TableName("public", "items")
    skip = ("id",) if case == "key renamed" else ()
    assert assert_mirror_equals_source(spark, p.lake, dsn, items, skip=skip) == 400
