"""The JVM fast path types every value exactly as the Python converter does, or leaves it to it."""

from __future__ import annotations

import dataclasses
import math
import struct
from decimal import Decimal

import pytest
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_core.pgtypes import ColumnType, TypeModes, Unrepresentable, converter
from cdc_core.silver_batch import all_of
from cdc_core.silver_fast import fast_value

PRECISE = TypeModes()


def numeric(p: int, s: int) -> ColumnType:
    return ColumnType("numeric", "b", ((p << 16) | (s & 0x7FF)) + 4, False)


CASES: list[tuple[ColumnType, TypeModes, list[str], int]] = [  # type, modes, texts, fast ones
    (ColumnType("int2", "b", -1, False), PRECISE, ["0", "-32768", "32767", "12"], 4),
    (ColumnType("int4", "b", -1, False), PRECISE, ["-2147483648", "2147483647", "7"], 3),
    (ColumnType("int8", "b", -1, False), PRECISE,
     ["-9223372036854775808", "9223372036854775807", "0"], 3),
    (ColumnType("oid", "b", -1, False), PRECISE, ["4294967295", "1"], 2),
    (ColumnType("bool", "b", -1, False), PRECISE, ["t", "f", "true"], 2),
    (ColumnType("float8", "b", -1, False), PRECISE,
     ["0", "-0", "1.5", "0.1", "1e+100", "-1.2345678901234567e-300", "4.9406564584124654e-324",
      "1.7976931348623157e+308", "Infinity", "-Infinity", "NaN", "123456789012345680000"], 12),
    (numeric(12, 2), PRECISE,
     ["0.00", "-1.50", "9999999999.99", "123.45", "NaN", "Infinity", "-Infinity"], 4),
    (numeric(5, 0), PRECISE, ["0", "-99999", "12345"], 3),
    (numeric(3, -2), PRECISE, ["12300", "-99900", "0"], 3),
    (numeric(2, 4), PRECISE, ["0.0012", "-0.0099"], 2),
    (numeric(38, 10), PRECISE, ["1234567890123456789012345678.0123456789", "0.0000000001"], 2),
    (numeric(12, 2), TypeModes(decimal="double"), ["123.45", "NaN", "-0.10"], 3),
    (ColumnType("date", "b", -1, False), PRECISE,
     ["2017-09-15", "0001-01-01", "9999-12-31", "1970-01-01", "infinity", "-infinity",
      "0044-03-15 BC", "10000-01-01"], 4),
    (ColumnType("timestamp", "b", -1, False), PRECISE,
     ["2018-06-20 15:13:16.945104", "2018-06-20 15:13:16", "0001-01-01 00:00:00",
      "9999-12-31 23:59:59.999999", "1999-01-08 04:05:06.5", "infinity", "0044-03-15 12:00:00 BC",
      "10000-01-01 00:00:00"], 5),
    (ColumnType("timestamptz", "b", -1, False), PRECISE,
     ["2021-06-05 07:23:45.5+00", "2021-06-05 07:23:45+00", "0001-01-01 00:00:00+00",
      "9999-12-31 23:59:59.999999+00", "1970-01-01 00:00:00.000001+00", "-infinity",
      "2021-06-05 07:23:45.5+05:30", "0044-03-15 12:00:00+00 BC"], 5),
    (ColumnType("text", "b", -1, False), PRECISE, ["", "a b", "ü\\x00'\""], 3),
    (ColumnType("bpchar", "b", 7, False), PRECISE, ["ab ", "EUR"], 2),
    (ColumnType("uuid", "b", -1, False), PRECISE, ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"], 1),
    (ColumnType("jsonb", "b", -1, False), PRECISE, ['{"a": [1, 2.50]}'], 1),
    (ColumnType("order_status", "e", -1, False), PRECISE, ["paid"], 1),
    # arrays: flat, no element quoted (PostgreSQL quotes empty ones and those with a comma,
    # brace, quote, backslash, space, or that read NULL); the rest is left to the converter
    (ColumnType("int4", "b", -1, True), PRECISE,
     ["{1,2}", "{}", "{1,NULL,3}", "{-2147483648}", "{2147483648}", "{{1,2},{3,4}}",
      "[2:3]={1,2}"], 4),
    (ColumnType("text", "b", -1, True), PRECISE,
     ["{vip,b2b}", "{}", "{NULL,éco}", "{late-payer}", '{"a b",c}', '{""}', '{"NULL"}',
      '{"a\\\\b"}', "{{a},{b}}"], 4),
    (ColumnType("float4", "b", -1, True), PRECISE, ["{1.5,NaN}", "{0.1,-Infinity}"], 2),
    (dataclasses.replace(numeric(12, 2), array=True), PRECISE, ["{1.50,2.00}", "{NaN}"], 1),
    (ColumnType("bool", "b", -1, True), PRECISE, ["{t,f,NULL}"], 1),
    (ColumnType("date", "b", -1, True), PRECISE, ["{2024-01-02,0001-01-01}", "{infinity}"], 1),
    (ColumnType("order_status", "e", -1, True), PRECISE, ["{paid,shipped}"], 1),
    (ColumnType("box", "b", -1, True), PRECISE, ["{(1,1),(0,0);(2,2),(1,1)}"], 0),
    (ColumnType("float4", "b", -1, False), PRECISE,
     ["1.5", "-0", "0.1", "3.4028235e+38", "1.4e-45", "1.17549435e-38", "1.6777216e+07",
      "Infinity", "-Infinity", "NaN",
      # the double nearest each is a float32 midpoint: parsing to double first rounds twice
      "1.000000178813934326171874", "1.000000178813934326171876",
      "3.4028236e+38", "1e+39"], 12),  # past float32's range: left to the converter
    (ColumnType("interval", "b", -1, False), PRECISE, ["P1D"], 1),  # kept as text
    (ColumnType("interval", "b", -1, False), TypeModes(interval="numeric"), ["P1D"], 0),
]  # fmt: skip


def canonical(value: Column, t: T.DataType) -> Column:
    if isinstance(t, T.ArrayType):
        element = t.elementType
        return F.transform(value, lambda x: canonical(x, element))
    if isinstance(t, T.DateType):
        return F.unix_date(value)
    if isinstance(t, (T.TimestampType,)):
        return F.unix_micros(value)
    if isinstance(t, T.TimestampNTZType):
        return F.unix_micros(value.cast("timestamp"))
    return value


def same(a: object, b: object) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack(">d", a) == struct.pack(">d", b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, Decimal) and isinstance(b, Decimal):
        return a == b  # the column's scale is fixed: equal values are equal in it
    return a == b and type(a) is type(b)


@pytest.mark.parametrize(
    ("t", "modes", "texts", "fast"), CASES, ids=lambda c: getattr(c, "name", "")
)
def test_fast_values_equal_the_converters(
    spark: SparkSession, t: ColumnType, modes: TypeModes, texts: list[str], fast: int
) -> None:
    expression = fast_value(t, modes, F.col("text"))
    if expression is None:
        assert fast == 0
        return
    df = spark.createDataFrame([(x,) for x in texts], "text string").select(
        "text", expression.alias("v")
    )
    typed = df.schema["v"].dataType
    rows = df.select("text", canonical(F.col("v"), typed).alias("v")).collect()
    convert = converter(t, modes)
    taken = 0
    for row in rows:
        if row["v"] is None:
            continue  # left to the converter
        taken += 1
        try:
            expected = convert(row["text"])
        except Unrepresentable:
            raise AssertionError(
                f"{t.name}: {row['text']!r} is unrepresentable, but fast-typed"
            ) from None
        assert same(row["v"], expected), (t.name, row["text"], row["v"], expected)
    assert taken == fast, f"{t.name}: {taken} of {len(texts)} texts fast-typed, {fast} expected"


def test_typed_splits_rows_between_the_jvm_and_python_and_agrees_with_the_converters(
    spark: SparkSession,
) -> None:
    from cdc_core.pg.pgoutput import ReplicaIdentity
    from cdc_core.pgtypes import silver_type
    from cdc_core.silver_batch import typed
    from cdc_core.silver_shape import SilverColumn, TableShape

    pg = {
        "id": ColumnType("int8", "b", -1, False),
        "amount": numeric(12, 2),
        "day": ColumnType("date", "b", -1, False),
        "at": ColumnType("timestamptz", "b", -1, False),
        "note": ColumnType("text", "b", -1, False),
    }
    shape = TableShape(
        "public", "t",
        tuple(SilverColumn(n, t, silver_type(t, PRECISE), t.name) for n, t in pg.items()),
        ("id",), ReplicaIdentity.DEFAULT,
    )  # fmt: skip
    rows = [  # (values, old key): plain rows, rows with one value only Python can type
        ({"id": "1", "amount": "1.50", "day": "2024-01-02", "at": "2024-01-02 03:04:05.6+00",
          "note": "a"}, None),
        ({"id": "2", "amount": "NaN", "day": "2024-01-02", "at": None, "note": None}, None),
        ({"id": "3", "amount": "2.00", "day": "0044-03-15 BC", "at": "infinity", "note": "b"},
         {"id": "2"}),
        ({"id": "4", "amount": None, "day": None, "at": None, "note": None}, {"id": "1"}),
    ]  # fmt: skip
    text = T.StructType([T.StructField(n, T.StringType()) for n in pg])
    key = T.StructType([T.StructField("id", T.StringType())])
    schema = T.StructType([
        T.StructField("op", T.StringType()), T.StructField("commit_lsn", T.LongType()),
        T.StructField("seq", T.LongType()), T.StructField("_commit_ts_us", T.LongType()),
        T.StructField("_values", text), T.StructField("_old_key", key),
    ])  # fmt: skip
    df = spark.createDataFrame(
        [("u", 10 + i, 0, 0, values, old) for i, (values, old) in enumerate(rows)], schema
    )
    result = typed(df, shape, PRECISE)
    out = (
        result.select(
            "_cdc_lsn", "_cdc_raw", "_old_id",
            *[canonical(F.col(n), result.schema[n].dataType).alias(n) for n in pg],
        )
        .orderBy("_cdc_lsn")
        .collect()
    )  # fmt: skip
    assert len(out) == len(rows)
    for got, (values, old) in zip(out, rows, strict=True):
        raw: dict[str, str] = {}
        for name, t in pg.items():
            text_value = values[name]
            try:
                expected = None if text_value is None else converter(t, PRECISE)(text_value)
            except Unrepresentable:
                expected, raw[name] = None, text_value  # type: ignore[assignment]
            value = got[name]
            assert same(value, expected), (name, text_value, value, expected)
        assert dict(got["_cdc_raw"] or {}) == raw
        assert got["_old_id"] == (int(old["id"]) if old else None)


def test_a_condition_over_500_columns_is_a_shallow_tree(spark: SparkSession) -> None:
    """A chain of 500 ANDs overflowed the JVM stack on a 500-column table."""
    columns = [f"c{i}" for i in range(500)]
    df = spark.createDataFrame(
        [tuple(range(500)), tuple([None] * 500)], ", ".join(f"{c} int" for c in columns)
    )
    every = all_of([F.col(c).isNotNull() for c in columns])
    assert df.where(every).count() == 1
    assert df.where(all_of([])).count() == 2
