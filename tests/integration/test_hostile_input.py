"""Hostile and extreme input, end to end: each case is mirrored exactly or refused clearly.

One pipeline holds a table per case (names with quotes, spaces, dots, unicode, reserved words
and an injection attempt; 500 columns; an empty table; a table without columns; values beyond
Spark's ranges; extension types the product does not know). It takes a snapshot, then
streams inserts, updates and deletes, and a second run applies them. Rows of 100 MB get a
pipeline of their own, so their time and memory are measured alone.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from cdc_core.identifiers import TableName
from tests.integration.conftest import PgServer
from tests.integration.harness import Pipeline, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source

INJECTION = 'x"; DROP TABLE y; --'
ODD_SCHEMA = 'Sales "EU". 2024'  # a quote, spaces and a dot
UNICODE = TableName(ODD_SCHEMA, "Straße 表")
INJECTED = TableName("public", INJECTION)
RESERVED = TableName("order", "group")
WIDE, EMPTY, NO_COLUMNS = (TableName("public", t) for t in ("wide", "empty", "no_columns"))
RANGES, EXTENSION = TableName("public", "ranges"), TableName("public", "extension_types")
# Column names Delta accepts only with column mapping, and every other kind of hostile name.
ODD_COLUMNS = ("select", "order", "group", 'Col "Quoted"', "a.b", "Ünï 列", INJECTION,
               "odd ,;{}()=\t\nchars")  # fmt: skip
WIDTH = 500

BC_DATE, FAR_DATE = "0001-01-01 BC", "294277-01-01"  # astronomical year 0; past Spark's years
MAX_TIMESTAMP = "294276-12-31 23:59:59.999999"
DIGITS_1000 = "9" * 500 + "." + "1" * 500
INTEGER_1000 = "-" + "7" * 1000


def ident(*parts: str) -> str:
    """`parts` quoted for SQL text, the way PostgreSQL reads them back exactly."""
    return ".".join('"' + p.replace('"', '""') + '"' for p in parts)


def table_sql(t: TableName) -> str:
    return ident(t.schema, t.name)


def odd_columns_sql() -> str:
    return ", ".join(f"{ident(c)} text" for c in ODD_COLUMNS)


def odd_values(i: int) -> str:
    return ", ".join(f"'{c[:3]}{i}'".replace('"', "") for c in ODD_COLUMNS)


DDL = [
    "CREATE EXTENSION cube",
    "CREATE EXTENSION seg",
    "CREATE EXTENSION isn",
    "CREATE TABLE y (id int PRIMARY KEY)",
    "INSERT INTO y VALUES (1)",
    f"CREATE SCHEMA {ident(ODD_SCHEMA)}",
    f"CREATE TABLE {table_sql(UNICODE)} (id int PRIMARY KEY, {odd_columns_sql()})",
    f"CREATE TABLE {table_sql(INJECTED)} (id int PRIMARY KEY, {ident(INJECTION)} text)",
    'CREATE SCHEMA "order"',
    'CREATE TABLE "order"."group" ("select" int PRIMARY KEY, "from" text, "where" int)',
    "CREATE TABLE wide (id int PRIMARY KEY, "
    + ", ".join(f"c{i} int" for i in range(1, WIDTH))
    + ")",
    "CREATE TABLE empty (id int PRIMARY KEY, v text)",
    "CREATE TABLE no_columns ()",
    "ALTER TABLE no_columns REPLICA IDENTITY FULL",
    "CREATE TABLE ranges (id int PRIMARY KEY, d date, ts timestamp, tstz timestamptz, "
    "n numeric, n1000 numeric(1000, 0), d_arr date[])",
    "CREATE TABLE extension_types (id int PRIMARY KEY, c cube, s seg, e ean13, c_arr cube[])",
]

SNAPSHOT_ROWS = [
    *(f"INSERT INTO {table_sql(UNICODE)} VALUES ({i}, {odd_values(i)})" for i in (1, 2, 3)),
    f"INSERT INTO {table_sql(INJECTED)} VALUES (1, 'one'), (2, 'two')",
    """INSERT INTO "order"."group" VALUES (1, 'from', 1), (2, 'to', 2)""",
    "INSERT INTO wide SELECT g, " + ", ".join(f"g * {i}" for i in range(1, WIDTH)) +
    " FROM generate_series(1, 20) g",
    "INSERT INTO no_columns DEFAULT VALUES",
    "INSERT INTO no_columns DEFAULT VALUES",
    f"""INSERT INTO ranges VALUES
        (1, '{BC_DATE}', '{MAX_TIMESTAMP}', '4713-01-01 00:00:00+00 BC', '{DIGITS_1000}',
         {INTEGER_1000}, ARRAY['{BC_DATE}', '2024-01-01']::date[]),
        (2, '{FAR_DATE}', '0001-01-01 00:00:00 BC', '{MAX_TIMESTAMP}+00', 'NaN', 0, NULL)""",
    """INSERT INTO extension_types VALUES
        (1, '(1, 2, 3)', '1.5 .. 2.5', '978-0-306-40615-7', ARRAY['(1)', '(2, 3)']::cube[]),
        (2, NULL, '<1', NULL, NULL)""",
]  # fmt: skip

STREAMED = [
    f"INSERT INTO {table_sql(UNICODE)} VALUES (4, {odd_values(4)})",
    f"UPDATE {table_sql(UNICODE)} SET {ident(INJECTION)} = 'changed', {ident('select')} = NULL "
    "WHERE id = 1",
    f"UPDATE {table_sql(UNICODE)} SET id = 20 WHERE id = 2",
    f"DELETE FROM {table_sql(UNICODE)} WHERE id = 3",
    f"INSERT INTO {table_sql(INJECTED)} VALUES (3, 'three')",
    f"UPDATE {table_sql(INJECTED)} SET {ident(INJECTION)} = 'TWO' WHERE id = 2",
    f"DELETE FROM {table_sql(INJECTED)} WHERE id = 1",
    """UPDATE "order"."group" SET "where" = 20 WHERE "select" = 2""",
    """DELETE FROM "order"."group" WHERE "select" = 1""",
    """INSERT INTO "order"."group" VALUES (3, 'select * from y', NULL)""",
    "UPDATE wide SET c250 = -1, c499 = -2 WHERE id = 7",
    "INSERT INTO no_columns DEFAULT VALUES",
    "DELETE FROM no_columns WHERE ctid = (SELECT min(ctid) FROM no_columns)",
    f"""INSERT INTO ranges VALUES
        (3, '4713-01-01 BC', '4713-01-01 00:00:00 BC', '294276-12-31 23:59:59.999999+00',
         '-{DIGITS_1000}', {INTEGER_1000[1:]}, ARRAY['{FAR_DATE}']::date[]),
        (4, '5874897-12-31', 'infinity', '-infinity', '1e-999', NULL, NULL)""",
    f"UPDATE ranges SET d = '{FAR_DATE}', n = '{DIGITS_1000}1' WHERE id = 1",
    """INSERT INTO extension_types VALUES
        (3, '(0.5), (1.5)', '-1.5e3 .. 2.5', '4006381333931', NULL)""",
    "UPDATE extension_types SET c = '(9, 9)' WHERE id = 1",
]

MIRRORED = [UNICODE, INJECTED, RESERVED, WIDE, EMPTY, NO_COLUMNS, RANGES, EXTENSION]


@dataclass(frozen=True)
class Hostile:
    pipeline: Pipeline
    dsn: str
    runs: tuple[str, ...]  # the log (stderr) of each run


@pytest.fixture(scope="module")
def hostile(pg: PgServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    database = pg.create_database("hostile")
    dsn = pg.dsn(database)
    try:
        sql(dsn, *DDL, *SNAPSHOT_ROWS)
        tables = [str(t) for t in MIRRORED]
        p = make_pipeline(tmp_path_factory.mktemp("hostile"), dsn, tables, snapshot="initial")
        runs = [_ingest(p)]
        sql(dsn, *STREAMED)
        runs.append(_ingest(p))
        yield Hostile(p, dsn, tuple(runs))
    finally:
        pg.drop_database(database)


def _ingest(p: Pipeline) -> str:
    run = p.ingest()
    errors = [
        line[:3000]
        for line in run.stderr.splitlines()
        if line.startswith("error") or "Exception:" in line
    ]
    assert run.returncode == 0, errors or run.stderr[-3000:]
    return run.stderr


@pytest.mark.parametrize(("table", "rows"), [(UNICODE, 3), (INJECTED, 2), (RESERVED, 2)], ids=str)
def test_hostile_names_are_mirrored_exactly(
    hostile: Hostile, spark: SparkSession, table: TableName, rows: int
) -> None:
    """Snapshot, then an insert, updates (one of the key) and a delete, each streamed; the
    mirror has the source's columns, named exactly (Delta's column mapping where needed)."""
    assert assert_mirror_equals_source(spark, hostile.pipeline.lake, hostile.dsn, table) == rows
    silver = spark.read.format("delta").load(hostile.pipeline.lake.silver(table))
    columns = [f.name for f in silver.schema.fields if not f.name.startswith("_cdc_")]
    with psycopg.connect(hostile.dsn) as conn:
        source = [
            r[0]
            for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum",
                (str(table),),
            )
        ]
    assert columns == source


def test_the_injection_attempt_is_only_a_name(hostile: Hostile) -> None:
    with psycopg.connect(hostile.dsn) as conn:
        assert conn.execute("SELECT count(*) FROM y").fetchone() == (1,)


def test_a_table_of_500_columns_is_mirrored(hostile: Hostile, spark: SparkSession) -> None:
    assert assert_mirror_equals_source(spark, hostile.pipeline.lake, hostile.dsn, WIDE) == 20
    row = spark.read.format("delta").load(hostile.pipeline.lake.silver(WIDE)).where("id = 7")
    assert row.select("c249", "c250", "c499").first() == (7 * 249, -1, -2)


def test_an_empty_table_has_an_empty_mirror(hostile: Hostile, spark: SparkSession) -> None:
    silver = spark.read.format("delta").load(hostile.pipeline.lake.silver(EMPTY))
    assert silver.count() == 0
    assert [f.name for f in silver.schema.fields][:2] == ["id", "v"]


def test_a_table_without_columns_is_mirrored_as_a_row_count(
    hostile: Hostile, spark: SparkSession
) -> None:
    """Its content is how many rows it has: a multiset of empty rows, `_cdc_count` of them."""
    assert assert_mirror_equals_source(spark, hostile.pipeline.lake, hostile.dsn, NO_COLUMNS) == 2
    silver = spark.read.format("delta").load(hostile.pipeline.lake.silver(NO_COLUMNS))
    assert [f.name for f in silver.schema.fields if not f.name.startswith("_cdc_")] == []


def test_values_beyond_sparks_ranges_are_kept_exactly(
    hostile: Hostile, spark: SparkSession
) -> None:
    """Dates before year 1 or past 9999 and 'infinity' are NULL in the typed column with their
    exact text in `_cdc_raw`; numeric with 1000 digits is exact text."""
    assert assert_mirror_equals_source(spark, hostile.pipeline.lake, hostile.dsn, RANGES) == 4
    silver = spark.read.format("delta").load(hostile.pipeline.lake.silver(RANGES))
    rows = {r["id"]: r for r in silver.collect()}
    assert rows[1]["d"] is None
    assert rows[1]["_cdc_raw"]["d"] == FAR_DATE
    assert rows[2]["_cdc_raw"]["ts"] == "0001-01-01 00:00:00 BC"
    assert rows[1]["n"] == DIGITS_1000 + "1"
    assert rows[3]["n1000"] == "7" * 1000
    assert rows[1]["d_arr"] is None
    assert rows[1]["_cdc_raw"]["d_arr"] == '{"0001-01-01 BC",2024-01-01}'


def test_unknown_extension_types_are_kept_as_text_with_a_warning(
    hostile: Hostile, spark: SparkSession
) -> None:
    assert assert_mirror_equals_source(spark, hostile.pipeline.lake, hostile.dsn, EXTENSION) == 3
    silver = spark.read.format("delta").load(hostile.pipeline.lake.silver(EXTENSION))
    rows = {r["id"]: r for r in silver.collect()}
    assert (rows[1]["c"], rows[1]["s"], rows[1]["e"]) == (
        "(9, 9)",
        "1.5 .. 2.5",
        "978-0-306-40615-7",
    )
    assert rows[1]["c_arr"] == ["(1)", "(2, 3)"]
    for column, type_name in (("c", "cube"), ("s", "seg"), ("e", "ean13"), ("c_arr", "cube[]")):
        warning = f"table public.extension_types: column {column} has type {type_name}"
        assert warning in hostile.runs[0], hostile.runs[0][-3000:]


# --- rows of 100 MB ----------------------------------------------------------------------

MB = 1 << 20


# The lengths and md5s of a mirror's values, computed by a Spark of its own: reading a 100 MB
# value takes more heap than the tests' shared session has (and its loss would end the session).
DIGESTS = """
import json, sys
from types import MappingProxyType
from pyspark.sql import functions as F
from cdc_core.config import SparkSettings
from cdc_core.spark import build_spark
conf = {"spark.driver.memory": "6g", "spark.ui.enabled": "false"}
spark = build_spark(SparkSettings(master="local[1]", jars="resolve", conf=MappingProxyType(conf)), "digests")
rows = spark.read.format("delta").load(sys.argv[1]).select(
    "id", F.octet_length("b"), F.md5("b"), F.octet_length("t"), F.md5("t")).orderBy("id").collect()
print(json.dumps([list(r) for r in rows]))
"""


def _digests(path: str, env: dict[str, str]) -> list[list[object]]:
    run = subprocess.run([sys.executable, "-c", DIGESTS, path], env=env, capture_output=True,
                         text=True, timeout=600, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.slow
def test_rows_of_100_mb_are_mirrored_exactly(
    pg: PgServer, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 100 MB bytea is 200 MB of hex in bronze's JSON; Spark holds such a row several times
    over (UnsafeRow buffers double as they grow, one task per core). The default 2g driver runs
    out of heap writing them to bronze: the run stops with an error naming the largest change and
    the remedy, nothing landed. With 6g, the remedy, both rows are mirrored exactly."""
    monkeypatch.delenv("CDC_DRIVER_MEMORY", raising=False)  # conf/local.yaml's default: 2g
    dsn = pg.dsn(database)
    big = TableName("public", "big")
    sql(dsn, "CREATE TABLE big (id int PRIMARY KEY, b bytea, t text)")
    p = make_pipeline(tmp_path, dsn, ["public.big"])
    assert p.ingest("--capture-only").returncode == 0
    _insert_rows_of_100_mb(dsn)
    refused = p.ingest(child=True)  # its driver dies: its own, not the test worker's
    assert refused.returncode == 1, refused.stderr[-4000:]
    error = refused.stderr.strip().splitlines()[-1]
    assert error.startswith("error: the Spark driver (its JVM) died while applying staged changes")
    assert "The largest change of the batch is 200 MB (table public.big, LSN " in error
    assert "spark.driver.memory, now 2g" in error
    assert "nothing was lost" in error
    print(f"2g driver: {error}")
    assert not Path(p.lake.silver(big)).exists()  # nothing landed
    monkeypatch.setenv("CDC_DRIVER_MEMORY", "6g")
    started = time.monotonic()
    run = p.ingest()
    elapsed = time.monotonic() - started
    assert run.returncode == 0, run.stderr[-4000:]
    want = _big_rows(dsn)
    assert want[0][1] >= 100 * MB
    assert want[1][3] >= 100 * MB - 35
    assert _digests(p.lake.silver(big), p.env()) == want
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
    print(f"100 MB rows: ingest took {elapsed:.0f} s, largest process peaked at {peak} MiB")


def _insert_rows_of_100_mb(dsn: str) -> None:
    sql(dsn,
        # 100 MB of bytea that does not compress, and 100 MB of text (ASCII and 3-byte UTF-8)
        "INSERT INTO big SELECT 1, string_agg(decode(md5(g::text), 'hex'), '' ORDER BY g), NULL "
        f"FROM generate_series(1, {100 * MB // 16}) g",
        "INSERT INTO big SELECT 2, NULL, string_agg(md5(g::text) || '表', '' ORDER BY g) "
        f"FROM generate_series(1, {100 * MB // 35}) g")  # fmt: skip


def _big_rows(dsn: str) -> list[list[object]]:
    with psycopg.connect(dsn) as conn:
        return [
            list(r)
            for r in conn.execute(
                "SELECT id, octet_length(b), md5(b), octet_length(t), md5(t) FROM big ORDER BY id"
            )
        ]


@pytest.mark.slow
def test_a_snapshot_of_rows_too_large_for_the_driver_says_so_and_resumes(
    pg: PgServer, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same rows read by an initial snapshot: the 2g driver dies reading them, wherever
    the death first reaches Python. The run names the table and the remedy, and nothing
    landed; with 6g the snapshot goes on and both rows are mirrored exactly."""
    monkeypatch.delenv("CDC_DRIVER_MEMORY", raising=False)  # conf/local.yaml's default: 2g
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE big (id int PRIMARY KEY, b bytea, t text)")
    _insert_rows_of_100_mb(dsn)
    p = make_pipeline(tmp_path, dsn, ["public.big"], snapshot="initial")
    refused = p.ingest(child=True)  # its driver dies: its own, not the test worker's
    assert refused.returncode == 1, refused.stderr[-4000:]
    error = refused.stderr.strip().splitlines()[-1]
    assert error.startswith(
        "error: the Spark driver (its JVM) died while reading snapshot chunks of public.big, "
        "most likely out of heap"
    ), refused.stderr[-4000:]
    assert "spark.driver.memory, now 2g" in error
    assert "the snapshot resumes from the chunks not yet done" in error
    print(f"2g driver: {error}")
    assert not Path(p.lake.silver(TableName("public", "big"))).exists()
    monkeypatch.setenv("CDC_DRIVER_MEMORY", "6g")
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-4000:]
    assert _digests(p.lake.silver(TableName("public", "big")), p.env()) == _big_rows(dsn)


def test_names_that_are_no_directory_or_collide_in_bronze_are_refused(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """A mirror lives in silver/<schema>/<table>: '..' or '/' would put it elsewhere (over
    bronze, say); "a.b".c and a."b.c" would share bronze's source.table a.b.c."""
    dsn = pg.dsn(database)
    sql(dsn, 'CREATE SCHEMA "a.b"', "CREATE SCHEMA a", 'CREATE TABLE "a.b".c (id int PRIMARY KEY)',
        'CREATE TABLE a."b.c" (id int PRIMARY KEY)', 'CREATE TABLE ".." (id int PRIMARY KEY)',
        'CREATE TABLE "../../bronze" (id int PRIMARY KEY)')  # fmt: skip
    cases = {
        '"..", public.y': 'public.".." cannot be a directory of the lake',
        '"../../bronze"': 'public."../../bronze" cannot be a directory of the lake',
        '"a.b".c, a."b.c"': '"a.b".c and a."b.c" are both a.b.c in bronze',
    }
    for i, (tables, error) in enumerate(cases.items()):
        p = make_pipeline(tmp_path / str(i), dsn, [t.strip() for t in tables.split(", ")])
        run = p.ingest("--capture-only")
        assert run.returncode == 2, run.stderr
        assert "pipelines/p.yaml: source.tables: " in run.stderr
        assert error in run.stderr


def test_column_names_silver_cannot_tell_apart_are_refused_before_anything_lands(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """PostgreSQL tells "Note" from note; Spark and Delta match column names without case, and
    silver adds columns of its own (`_cdc_op`, ...): such a table could never get a mirror."""
    dsn = pg.dsn(database)
    sql(dsn, 'CREATE TABLE cased (id int PRIMARY KEY, "Note" text, note text)',
        "CREATE TABLE meta (id int PRIMARY KEY, _CDC_op text)",
        'CREATE TABLE ticked (id int PRIMARY KEY, "x`y" text)',
        "INSERT INTO cased VALUES (1, 'a', 'b')", "INSERT INTO meta VALUES (1, 'x')")  # fmt: skip
    tables = ["public.cased", "public.meta", "public.ticked"]
    p = make_pipeline(tmp_path, dsn, tables, snapshot="initial")
    run = p.ingest()
    assert run.returncode == 1, run.stderr[-3000:]
    assert 'public.cased: columns "Note" and "note" are one column to Spark and Delta' in (
        run.stderr
    )
    assert 'public.meta: column "_cdc_op" is a column silver adds to every mirror' in run.stderr
    ticked = """public.ticked: column "x`y" has a backtick, which Delta's MERGE cannot"""
    assert ticked in run.stderr
    assert not (p.lake.place(p.lake.bronze) / "_delta_log").exists()  # nothing landed
    doctor = p.cdc("doctor", "--pipeline", "p")
    assert doctor.returncode == 2, doctor.stdout  # the doctor: 2 when a check fails
    assert "source.column.exclude.list: public\\.cased\\.note" in doctor.stdout
    assert "each pair's columns both go" in doctor.stdout  # the lists ignore case
    p.edit("tables: ['public.cased', 'public.meta', 'public.ticked']", "tables: ['public.cased']\n"
           "  column.exclude.list: public\\.cased\\.note")  # fmt: skip
    ran = p.ingest()  # the fix the doctor gives
    assert ran.returncode == 0, ran.stderr[-3000:]
    mirror = spark.read.format("delta").load(p.lake.silver(TableName("public", "cased")))
    assert [c for c in mirror.columns if not c.startswith("_cdc_")] == ["id"]  # as it said
