"""Every built-in PostgreSQL type, with edge values, streamed into silver and equal to the source.

One table holds a column per type and rows of edge values (min, max, NULL, NaN, +-infinity,
empty and nested arrays, unicode, a 1 MB text). Several pipelines read it at once: one with
the default modes and others with every other mode option, so each option is checked against
the same source rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from cdc_core.identifiers import TableName
from cdc_core.pgtypes import TypeModes
from tests.integration.conftest import PgServer
from tests.integration.harness import Pipeline, make_pipeline
from tests.integration.mirror import assert_mirror_equals_source

MATRIX = TableName("public", "matrix")

DDL = [
    "CREATE EXTENSION IF NOT EXISTS hstore",
    "CREATE EXTENSION IF NOT EXISTS citext",
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE DOMAIN posint AS integer CHECK (VALUE > 0)",
    "CREATE DOMAIN price AS numeric(10,2)",
    "CREATE TYPE pair AS (a int, b text)",
    """CREATE TABLE matrix (
        id int PRIMARY KEY,
        c_int2 smallint, c_int4 integer, c_int8 bigint, c_oid oid,
        c_num numeric(12,2), c_num_big numeric(50,10), c_num_free numeric, c_price price,
        c_float4 real, c_float8 double precision, c_money money, c_bool boolean,
        c_char char(5), c_varchar varchar(20), c_text text, c_citext citext, c_name name,
        c_bytea bytea,
        c_date date, c_ts timestamp, c_tstz timestamptz, c_time time, c_time3 time(3),
        c_timetz timetz, c_interval interval,
        c_uuid uuid, c_json json, c_jsonb jsonb, c_xml xml,
        c_int_arr int[], c_text_arr text[], c_num_arr numeric(8,2)[], c_ts_arr timestamptz[],
        c_bool_arr boolean[], c_bytea_arr bytea[],
        c_enum mood, c_enum_arr mood[], c_domain posint, c_composite pair, c_hstore hstore,
        c_inet inet, c_cidr cidr, c_macaddr macaddr, c_macaddr8 macaddr8,
        c_bit bit(3), c_bit1 bit(1), c_varbit varbit(10), c_tsvector tsvector, c_tsquery tsquery,
        c_int4range int4range, c_numrange numrange, c_tstzrange tstzrange, c_daterange daterange,
        c_multirange int4multirange,
        c_point point, c_line line, c_lseg lseg, c_box box, c_path path, c_polygon polygon,
        c_circle circle, c_pg_lsn pg_lsn,
        c_big text
    )""",
    "ALTER TABLE matrix ALTER COLUMN c_big SET STORAGE EXTERNAL",
]

TYPICAL = """(1, 12, 123456, 1234567890123, 4242,
    1234.5, 12345678901234567890123456789012345678.0123456789, 3.14159265358979323846264338327950288, 99.99,
    1.5, 2.718281828459045, 1234.56, true,
    'ab', 'varchar', 'Zoë 東京 🎉 "quoted" \\ back', 'CaseLess', 'a_name',
    '\\x00ff10'::bytea,
    '2024-02-29', '2024-02-29 12:34:56.789012', '2024-02-29 12:34:56.789012+05:30', '12:34:56.789012',
    '12:34:56.789', '12:34:56+02', '1 year 2 mons 3 days 04:05:06.78',
    'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, 2, {"b": null}]}', '{"z": 1, "a": "é"}',
    '<x a="1">t</x>',
    '{1,2,NULL,4}', '{"a b","c\\"d",NULL,"NULL",""}', '{1.50,NULL}',
    '{"2024-01-01 00:00:00+00","1999-12-31 23:59:59.999999+00"}', '{t,f,NULL}', '{"\\\\x00","\\\\xff"}',
    'happy', '{sad,happy}', 7, '(1,"x y")', '"a"=>"1", "b c"=>NULL, "q\\"uote"=>"x"',
    '192.168.0.1', '10.0.0.0/8', '08:00:2b:01:02:03', '08:00:2b:01:02:03:04:05',
    B'101', B'1', B'10101', 'a fat cat:3', 'fat & rat',
    '[1,10)', '[1.5,2.5]', '[2024-01-01 00:00+00,2024-02-01 00:00+00)', '[2024-01-01,2024-02-01)',
    '{[1,3),[5,7)}',
    '(1.5,2)', '{1,-1,0}', '[(0,0),(1,1)]', '(1,1),(0,0)', '[(0,0),(1,1),(2,0)]',
    '((0,0),(1,1),(1,0))', '<(0,0),1.5>', '16/B374D848',
    repeat('0123456789abcdef', 65536)
)"""

MINS = """(2, -32768, -2147483648, -9223372036854775808, 0,
    -9999999999.99, -99999999999999999999999999999999999999.9999999999, -1e-300, -99999999.99,
    -3.4028235e38, -1.7976931348623157e308, -92233720368547758.08, false,
    '', '', '', '', '', ''::bytea,
    '0001-01-01', '0001-01-01 00:00:00', '0001-01-01 00:00:00+00', '00:00:00', '00:00:00',
    '00:00:00+15:59', '-178000000 years',
    '00000000-0000-0000-0000-000000000000', '[]', '{}', '<x/>',
    '{}', '{}', '{}', '{}', '{}', '{}',
    'sad', '{}', 1, '(,)', '',
    '::', '::/0', '00:00:00:00:00:00', '00:00:00:00:00:00:00:00',
    B'000', B'0', B'', '', 'a',
    'empty', 'empty', 'empty', 'empty', '{}',
    '(-1e300,-1e300)', '{1,0,0}', '[(0,0),(0,0)]', '(0,0),(0,0)', '((0,0))', '((0,0))', '<(0,0),0>',
    '0/0', ''
)"""

MAXES = """(3, 32767, 2147483647, 9223372036854775807, 4294967295,
    9999999999.99, 99999999999999999999999999999999999999.9999999999, 1e300, 99999999.99,
    3.4028235e38, 1.7976931348623157e308, 92233720368547758.07, true,
    'zzzzz', repeat('z', 20), 'x', 'X', repeat('n', 63), ('\\x' || repeat('ff', 100))::bytea,
    '9999-12-31', '9999-12-31 23:59:59.999999', '9999-12-31 23:59:59.999999+00', '24:00:00',
    '23:59:59.999', '24:00:00-15:59', '178000000 years',
    'ffffffff-ffff-ffff-ffff-ffffffffffff', '"x"', '[1, 2, 3]', '<a/>',
    '{2147483647,-2147483648}', '{""}', '{999999.99}', '{"9999-12-31 23:59:59.999999+00"}', '{t}',
    '{"\\\\x"}',
    'happy', '{happy,happy}', 2147483647, '(2147483647,"")', '"k"=>""',
    'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', '255.255.255.255/32', 'ff:ff:ff:ff:ff:ff',
    'ff:ff:ff:ff:ff:ff:ff:ff',
    B'111', B'1', B'1111111111', 'z:1A', '!z',
    '(,)', '(,)', '(,)', '(,)', '{(,)}',
    '(1e300,1e300)', '{0,1,0}', '[(1,1),(2,2)]', '(2,2),(1,1)', '[(1,1)]', '((1,1))', '<(1,1),1e300>',
    'FFFFFFFF/FFFFFFFF', 'end'
)"""

SPECIAL = """(4, NULL, NULL, NULL, NULL,
    'NaN', 'NaN', 'Infinity', 'NaN',
    'NaN', '-Infinity', NULL, NULL,
    NULL, NULL, NULL, NULL, NULL, NULL,
    'infinity', '-infinity', 'infinity', NULL, NULL, NULL, NULL,
    NULL, 'null', 'null', NULL,
    '{{1,2},{3,4}}', '[2:3]={a,b}', '{NaN}', '{infinity}', '{NULL}', '{NULL}',
    NULL, '{}', NULL, NULL, NULL,
    NULL, NULL, NULL, NULL,
    NULL, NULL, NULL, NULL, NULL,
    NULL, '[-Infinity,Infinity]', NULL, '[-infinity,infinity]', NULL,
    '(NaN,Infinity)', NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL
)"""

BC = """(5, 0, 0, 0, 0, 0, 0, '-Infinity', 0, 'Infinity', 'NaN', 0, false,
    ' ', ' ', ' ', ' ', ' ', ' '::bytea,
    '4713-01-01 BC', '4713-01-01 00:00:00 BC', '0044-03-15 12:00:00+00 BC', '00:00:01', '00:00:01.5',
    '00:00:01+00', '-1 days +00:00:01',
    NULL, NULL, NULL, NULL,
    NULL, NULL, NULL, '{"0001-01-01 00:00:00+00 BC"}', NULL, NULL,
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, NULL, '[0044-03-15 BC,)', NULL,
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
)"""

OTHER_MODES = {  # every option other than the default, in three pipelines
    "a": ("decimal.handling.mode: double\n  time.precision.mode: microseconds\n"
          "  interval.handling.mode: numeric\n  binary.handling.mode: base64\n"
          "  hstore.handling.mode: map\n",
          TypeModes("double", "microseconds", "numeric", "base64", "map")),
    "b": ("decimal.handling.mode: string\n  time.precision.mode: isostring\n"
          "  binary.handling.mode: hex\n",
          TypeModes("string", "isostring", "string", "hex", "json")),
    "c": ("time.precision.mode: connect\n  binary.handling.mode: base64-url-safe\n",
          TypeModes("precise", "connect", "string", "base64-url-safe", "json")),
    "d": ("time.precision.mode: adaptive_time_microseconds\n",
          TypeModes("precise", "adaptive_time_microseconds", "string", "bytes", "json")),
}  # fmt: skip


@pytest.fixture(scope="module")
def pipelines(
    pg: PgServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, tuple[Pipeline, TypeModes]]]:
    database = pg.create_database("matrix")
    yield _pipelines(pg.dsn(database), tmp_path_factory.mktemp("matrix"))
    pg.drop_database(database)


def _pipelines(dsn: str, tmp_path: Path) -> dict[str, tuple[Pipeline, TypeModes]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in DDL:
            conn.execute(statement)
    out = {"default": (make_pipeline(tmp_path / "default", dsn, [MATRIX.qualified]), TypeModes())}
    for name, (yaml, modes) in OTHER_MODES.items():
        out[name] = (
            make_pipeline(tmp_path / name, dsn, [MATRIX.qualified], extra=f"silver:\n  {yaml}"),
            modes,
        )
    for p, _ in out.values():
        run = p.ingest("--capture-only")  # the slot exists before the rows
        assert run.returncode == 0, run.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        for values in (TYPICAL, MINS, MAXES, SPECIAL, BC):
            conn.execute(f"INSERT INTO matrix VALUES {values}")
    return out


def ingest(p: Pipeline) -> None:
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]


def test_every_type_round_trips_with_the_default_modes(
    pipelines: dict[str, tuple[Pipeline, TypeModes]], spark: SparkSession
) -> None:
    p, modes = pipelines["default"]
    ingest(p)
    assert assert_mirror_equals_source(spark, p.lake, p.dsn, MATRIX, modes=modes) == 5
    raw = spark.read.format("delta").load(p.lake.silver(MATRIX)).where("id = 4").first()["_cdc_raw"]  # type: ignore[index]
    assert raw["c_num"] == "NaN"  # a decimal cannot hold NaN: NULL there, the exact text kept
    assert raw["c_date"] == "infinity"
    with psycopg.connect(p.dsn, autocommit=True) as conn:  # TOAST left untouched, then changed
        conn.execute("UPDATE matrix SET c_int4 = c_int4 + 1 WHERE id = 1")
        conn.execute("UPDATE matrix SET c_text = 'changed' WHERE id IN (2, 3)")
        conn.execute("DELETE FROM matrix WHERE id = 5")
    ingest(p)
    assert assert_mirror_equals_source(spark, p.lake, p.dsn, MATRIX, modes=modes) == 4


@pytest.mark.parametrize("name", sorted(OTHER_MODES))
def test_every_mode_option_round_trips(
    pipelines: dict[str, tuple[Pipeline, TypeModes]], spark: SparkSession, name: str
) -> None:
    p, modes = pipelines[name]
    ingest(p)  # after the default test's changes too, when it ran first: its slot saw them
    assert assert_mirror_equals_source(spark, p.lake, p.dsn, MATRIX, modes=modes) >= 4
