"""validate's canonical encoding: PostgreSQL's SQL, Spark's expressions and the Python reference
give the same token for every edge value of every type the product mirrors, in every mode.

The source value is stored in a real table; its token comes from the SQL validate runs. The
silver value is what the product's converters make of the server's text (or, when the silver
type cannot hold it, NULL with the text in `_cdc_raw`), loaded into Spark with the silver
schema; its token comes from validate's Spark expressions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from cdc_core.columns import Rule
from cdc_core.config import Dsn
from cdc_core.identifiers import TableName
from cdc_core.pg.connect import connect
from cdc_core.pgtypes import TypeModes, Unrepresentable, converter, silver_type
from cdc_core.silver_shape import SilverColumn, arrow_type, column_type, spark_type
from cdc_core.snapshot import catalog_descriptor
from cdc_core.validate_encoding import (
    apply_steps,
    money_digits,
    pg_form,
    raw_token,
    text_steps,
    token,
)
from cdc_core.validate_pg import SourceColumn, column_token
from cdc_core.validate_spark import column_token as spark_token
from tests.integration.conftest import PgServer

DEFAULT = TypeModes()


@dataclass(frozen=True)
class Case:
    type: str
    values: tuple[str, ...]  # SQL literals
    modes: TypeModes = DEFAULT

    @property
    def id(self) -> str:
        changed = {k: v for k, v in vars(self.modes).items() if v != getattr(DEFAULT, k)}
        return self.type + ("-" + "-".join(map(str, changed.values())) if changed else "")


NULL = ("NULL",)
_HALF_PAST_MAX = 2**1024 - 2**970  # halfway between the largest double and 2^1024
_HALF_LEAST = f"{5**1075}e-1075"  # 2^-1075, half the least double: rounds to 0
_PAST_HALF_LEAST = f"{5**1075 * 10 + 1}e-1076"  # a little more: rounds up to the least double
# fmt: off
CASES = [
    Case("int2", ("-32768", "0", "32767", *NULL)),
    Case("int4", ("-2147483648", "2147483647")),
    Case("int8", ("-9223372036854775808", "9223372036854775807")),
    Case("oid", ("0", "4294967295")),
    Case("numeric(10,2)", ("0", "-1.5", "12345678.99", "'NaN'", *NULL)),
    Case("numeric(38,20)", ("0", "1e-20", "-0.00000001", "123456789012345678.1")),
    Case("numeric(5,-2)", ("12300", "-9999900")),
    Case("numeric(3,5)", ("0.00123", "-0.00999")),
    Case("numeric", ("1.5000", "'NaN'", "1e100", "-0.000001")),
    Case("numeric(10,2)", ("-1.5", "'NaN'"), TypeModes(decimal="double")),
    Case("numeric", ("'-Infinity'", "1e300", "0.1"), TypeModes(decimal="double")),
    # past a double's range: ±Infinity; below its least value: ±0 (numeric::float8 refuses
    # both); around the halfway points, the double either side
    Case("numeric", ("1e400", "-1e400", "1e-400", "-1e-400", str(_HALF_PAST_MAX - 1),
                     str(_HALF_PAST_MAX), f"-{_HALF_LEAST}", _PAST_HALF_LEAST),
         TypeModes(decimal="double")),
    Case("numeric[]", ("ARRAY[1e400, -1e-400, 1]::numeric[]",), TypeModes(decimal="double")),
    Case("numeric(10,2)", ("-1.5", "'NaN'"), TypeModes(decimal="string")),
    Case(
        "float4",
        (
            "1.5",
            "'-0'",
            "'NaN'",
            "'Infinity'",
            "'-Infinity'",
            "1e-45",
            "3.4028235e38",
            "0.1",
            "1.17549435e-38",
        ),
    ),
    Case(
        "float8",
        (
            "0.1",
            "'-0'",
            "'NaN'",
            "'-Infinity'",
            "5e-324",
            "1.7976931348623157e308",
            "123456789012345678",
            "2.2250738585072014e-308",
            "-1e-310",
        ),
    ),
    Case("money", ("-1234.56", "0", "92233720368547758.07")),
    Case("money", ("-1234.56",), TypeModes(decimal="double")),
    Case("money", ("-1234.56",), TypeModes(decimal="string")),
    Case("money", ("-1234.56", "-1.50", "0.49", "92233720368547758.07"),
         TypeModes(money_fraction_digits=0)),
    Case("money", ("-1234.56", "0.05"), TypeModes(money_fraction_digits=4)),
    Case("money", ("-1234.56",), TypeModes(decimal="string", money_fraction_digits=0)),
    Case("bool", ("true", "false", *NULL)),
    Case("bit(1)", ("B'1'", "B'0'")),
    Case("bit(3)", ("B'101'",)),
    Case(
        "text",
        (
            "''",
            "'a'",
            "'héllo 😀 ünïcode'",
            "E'line\\nbreak\\ttab'",
            "'N'",
            "'V1:x'",
            "'R3:abc'",
            "'U'",
            *NULL,
        ),
    ),
    Case("char(5)", ("'ab'", "''")),
    Case("varchar(3)", ("'abc'",)),
    Case("bytea", ("'\\x'", "'\\x00ff'", "'hi'")),
    Case(
        "bytea",
        ("'\\x00ff10'", "'" + "hello world, a longer value to wrap base64 lines " * 3 + "'"),
        TypeModes(binary="base64"),
    ),
    Case("bytea", ("'\\xfbff'", "'\\x3e3f'"), TypeModes(binary="base64-url-safe")),
    Case("bytea", ("'\\x00ff'",), TypeModes(binary="hex")),
    Case(
        "date",
        (
            "'2024-02-29'",
            "'0001-01-01'",
            "'9999-12-31'",
            "'infinity'",
            "'-infinity'",
            "'0044-03-15 BC'",
            "'10000-01-01'",
        ),
    ),
    Case(
        "timestamp",
        (
            "'2024-01-01 12:34:56.789'",
            "'0001-01-01 00:00:00'",
            "'infinity'",
            "'10000-01-01'",
            "'0001-12-31 23:59:59 BC'",
            "'1969-12-31 23:59:59.999999'",
        ),
    ),
    Case(
        "timestamptz",
        (
            "'2024-01-01 12:34:56.123456+05:30'",
            "'0001-01-01 00:00:00+00'",
            "'9999-12-31 23:59:59.999999+00'",
            "'0001-01-01 00:00:00+01'",
            "'-infinity'",
            "'1900-01-01 00:00:00+00'",
        ),
    ),
    Case("time", ("'00:00'", "'23:59:59.999999'", "'24:00:00'")),
    Case("time(3)", ("'12:00:00.123'",)),
    Case("time", ("'12:00:00.123456'",), TypeModes(time_precision="connect")),
    Case("time", ("'12:00:00.1'",), TypeModes(time_precision="isostring")),
    Case("time(3)", ("'00:00'", "'23:59:59.999999'", "'24:00:00'", "'12:00:00.123'"),
         TypeModes(time_precision="nanoseconds")),
    Case("timetz", ("'12:00+02'",)),
    Case("interval", ("'P1Y2M3DT4H5M6.78S'", "'-1 day -00:00:00.5'")),
    Case(
        "interval",
        ("'P1Y2M3DT4H5M6.78S'", "'-1 day -00:00:00.5'", "'P-1M'"),
        TypeModes(interval="numeric"),
    ),
    Case("uuid", ("'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",)),
    Case("json", ('\'{"b": 1,  "a": [1, 2]}\'',)),
    Case("jsonb", ('\'{"b": 1,  "a": [1, 2], "ü": "é"}\'', "'null'")),
    Case("inet", ("'10.0.0.1'", "'10.0.0.0/8'")),
    Case("mood", ("'happy'",)),
    Case("pair", ("ROW(1, 'x y')", "ROW(NULL, NULL)", *NULL)),
    Case("int4range", ("'[1,10)'", "'empty'")),
    Case("point", ("'(1.5,-2)'", "'(NaN,Infinity)'")),
    Case("int4[]", ("'{1,NULL,3}'", "'{}'", "'[2:3]={1,2}'", "'{{1,2},{3,4}}'", *NULL)),
    Case("text[]", ('\'{"a,b","",NULL,"NULL","é"}\'',)),
    Case("numeric(10,2)[]", ("'{1.5,2}'", "'{1.5,NaN}'")),
    Case("date[]", ("'{2024-01-01,NULL}'", "'{2024-01-01,infinity}'")),
    Case("float8[]", ("'{NaN,-0,1e-310}'",)),
    Case("timestamptz[]", ("'{\"2024-01-01 00:00:00+00\"}'",)),
    Case("bytea[]", ("ARRAY['\\x00'::bytea, NULL]",)),
    Case("mood[]", ("'{sad,happy}'",)),
    Case("hstore", ('\'a=>1, "b c"=>NULL, é=>"x\\"y"\'', "''")),
    Case("hstore", ("'a=>1, \"b c\"=>NULL, é=>ü'", "''"), TypeModes(hstore="map")),
]
# fmt: on


@pytest.fixture(scope="module")
def dsn(pg: PgServer) -> Iterator[str]:
    name = pg.create_database("enc")
    dsn = pg.dsn(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION hstore")
        conn.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')")
        conn.execute("CREATE TYPE pair AS (a int, b text)")
    yield dsn
    pg.drop_database(name)


def _arrow(values: list[object], t: T.DataType) -> pa.Array:
    if isinstance(t, T.MapType):
        values = [None if v is None else list(v.items()) for v in values]  # type: ignore[attr-defined]
    return pa.array(values, arrow_type(t))


def _source(
    dsn: str, case: Case, steps: Any = ()
) -> tuple[SilverColumn, list[tuple[str | None, str]]]:
    with connect(Dsn.parse(dsn), values=True) as conn:
        conn.execute("DROP TABLE IF EXISTS c")
        conn.execute(f"CREATE TABLE c (id int, v {case.type})")
        for i, literal in enumerate(case.values):
            conn.execute(f"INSERT INTO c VALUES ({i}, {literal})")
        (described,) = [
            c for c in catalog_descriptor(conn, TableName("public", "c")).columns if c.name == "v"
        ]
        pg = column_type(described)
        column = SilverColumn("v", pg, silver_type(pg, case.modes), described.type_name)
        form = pg_form(pg, case.modes)
        source = SourceColumn("v", pg, form, tuple(steps), money_digits(case.modes))
        query = sql.SQL("SELECT CASE WHEN v::text IS NULL THEN NULL ELSE format('%s', v) END, "
                        "{} FROM c ORDER BY id").format(column_token(source))  # fmt: skip
        rows = [(r[0], str(r[1])) for r in conn.execute(query)]
    return column, rows


def _silver(
    spark: SparkSession, column: SilverColumn, case: Case, texts: list[str | None]
) -> tuple[list[str], list[str]]:
    """Tokens of the silver values (Spark) and of the Python reference."""
    convert = converter(column.pg, case.modes)
    values: list[object] = []
    raws: list[object] = []
    reference = []
    for text in texts:
        try:
            value = None if text is None else convert(text)
        except Unrepresentable:
            values.append(None)
            raws.append([("v", text)])
            reference.append(raw_token(str(text)))
            continue
        values.append(value)
        raws.append([])
        reference.append(token(value, column.silver))
    t = spark_type(column.silver)
    schema = T.StructType([
        T.StructField("v", t), T.StructField("_cdc_raw", T.MapType(T.StringType(), T.StringType())),
        T.StructField("_cdc_unavailable", T.ArrayType(T.StringType())),
    ])  # fmt: skip
    table = pa.table({
        "v": _arrow(values, t), "_cdc_raw": pa.array(raws, pa.map_(pa.string(), pa.string())),
        "_cdc_unavailable": pa.array([[] for _ in values], pa.list_(pa.string())),
    })  # fmt: skip
    df = spark.createDataFrame(table, schema=schema)
    got = [str(r[0]) for r in df.select(spark_token(column)).collect()]
    return got, reference


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_postgresql_spark_and_the_reference_give_every_value_the_same_token(
    dsn: str, spark: SparkSession, case: Case
) -> None:
    column, rows = _source(dsn, case)
    spark_tokens, reference = _silver(spark, column, case, [text for text, _ in rows])
    for (text, pg_token), spark_tok, ref in zip(rows, spark_tokens, reference, strict=True):
        assert (pg_token, spark_tok) == (ref, ref), f"{case.type} value {text!r}"


@pytest.mark.parametrize(
    ("keys", "kind"),
    [
        (["column.truncate.to.4.chars"], "truncate"),
        # the reader applies one rule to a column: the hash, never the truncation too
        (["column.truncate.to.4.chars", "column.mask.hash.v2.SHA-256.with.salt.pepper"], "hash"),
    ],
)
def test_column_transforms_are_repeated_in_sql_as_the_reader_applied_them(
    dsn: str, keys: list[str], kind: str
) -> None:
    rules = [Rule.parse(k, "public.c.v") for k in keys]
    case = Case("varchar(10)", ("'héllo wör'", "''", *NULL))
    steps, why_not = text_steps(rules, "public.c.v", column_type_of(dsn, case))
    assert why_not is None
    assert [s.kind for s in steps] == [kind]
    _, rows = _source(dsn, case, steps)
    for text, pg_token in rows:
        want = (
            "N" if text is None else f"V{len(apply_steps(steps, text))}:{apply_steps(steps, text)}"
        )
        assert pg_token == want


def test_a_hash_postgresql_cannot_repeat_leaves_the_column_out_with_the_reason(dsn: str) -> None:
    rules = [Rule.parse("column.mask.hash.SHA-256.with.salt.pepper", "public.c.v")]  # hash v1
    steps, why_not = text_steps(rules, "public.c.v", column_type_of(dsn, Case("text", ("'x'",))))
    assert steps == ()
    assert (
        why_not == "column.mask.hash.SHA-256.with.salt.pepper (PostgreSQL cannot repeat this hash)"
    )


def column_type_of(dsn: str, case: Case) -> Any:
    column, _ = _source(dsn, case)
    return column.pg
