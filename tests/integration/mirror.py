"""Silver equals source, row for row and column for column, compared exactly.

The source side is PostgreSQL's text of each value (under the product's session settings)
through the product's converters; the silver side is read with Spark expressions that give
the same canonical forms (days, microseconds, exact decimals), or the exact text `_cdc_raw`
keeps for values the typed column cannot hold. Floats compare by bits, so NaN equals NaN.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections import Counter
from decimal import Decimal
from pathlib import Path

import psycopg
from psycopg import sql
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_core import delta_log
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.pg.connect import VALUE_SETTINGS
from cdc_core.pgtypes import TypeModes, Unrepresentable, converter
from cdc_core.silver import WATERMARK, shapes_since
from cdc_core.silver_shape import TableShape, spark_type, table_shape
from cdc_core.silver_table import quoted
from cdc_core.state import schema_history

DEFAULT_MODES = TypeModes()


def shape_of(lake: Lake, table: TableName, modes: TypeModes = DEFAULT_MODES) -> TableShape:
    """The mirror's shape as silver has it: from its schema history and where it last started
    over (the shapes-since mark its watermark carries)."""
    found = delta_log.newest_record(Path(lake.silver(table)), WATERMARK)
    since = shapes_since(found[1] if found else None)
    return table_shape(schema_history(lake, table.qualified), modes, since=since)


def _canonical(expr: Column, t: T.DataType) -> Column:
    if isinstance(t, T.DateType):
        return F.unix_date(expr)
    if isinstance(t, T.TimestampType):
        return F.unix_micros(expr)
    if isinstance(t, T.TimestampNTZType):
        return F.unix_micros(expr.cast("timestamp"))
    if isinstance(t, T.ArrayType):
        return F.transform(expr, lambda x: _canonical(x, t.elementType))
    return expr


def _norm(value: object) -> object:
    if isinstance(value, float):
        return ("float", struct.pack(">d", value) if not math.isnan(value) else b"nan")
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, Decimal):
        return ("decimal", value)
    if isinstance(value, list):
        return tuple(_norm(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _norm(v)) for k, v in value.items()))
    if hasattr(value, "asDict"):
        return _norm(value.asDict())  # a Spark Row (struct)
    return value


def silver_rows(
    spark: SparkSession, lake: Lake, shape: TableShape, *, soft_delete: bool = False
) -> Counter[tuple[object, ...]]:
    df = spark.read.format("delta").load(lake.silver(TableName(shape.schema, shape.table)))
    if soft_delete:
        df = df.where(~F.coalesce(F.col("_cdc_deleted"), F.lit(False)))
    cols = [
        _canonical(F.col(quoted(c.name)), spark_type(c.silver)).alias(c.name) for c in shape.columns
    ]
    extra = [F.col("_cdc_raw")] + ([] if shape.key else [F.col("_cdc_count")])
    out: Counter[tuple[object, ...]] = Counter()
    for row in df.select(*cols, *extra).collect():
        raw = row["_cdc_raw"] or {}
        values = tuple(
            ("raw", raw[c.name]) if c.name in raw else _norm(row[c.name]) for c in shape.columns
        )
        out[values] += 1 if shape.key else int(row["_cdc_count"])
    return out


def source_rows(
    dsn: str, shape: TableShape, modes: TypeModes = DEFAULT_MODES
) -> Counter[tuple[object, ...]]:
    converters = [converter(c.pg, modes) for c in shape.columns]
    texts = sql.SQL(", ").join(
        # the type's output function, as pgoutput sends it (::text trims char(n), shortens inet)
        # (nullness through ::text: a composite whose fields are all NULL IS NULL in SQL)
        sql.SQL("CASE WHEN {0}::text IS NULL THEN NULL ELSE format('%s', {0}) END").format(
            sql.Identifier(c.name)
        )
        for c in shape.columns
    )
    name = sql.Identifier(shape.schema, shape.table)
    out: Counter[tuple[object, ...]] = Counter()
    with psycopg.connect(dsn) as conn:
        kind = conn.execute(
            "SELECT relkind::text FROM pg_class WHERE oid = to_regclass(%s)",
            (name.as_string(conn),),
        ).fetchone()
        only = sql.SQL("" if kind and kind[0] == "p" else "ONLY ")  # a child's rows are its own
        query = sql.SQL("SELECT {} FROM {}{}").format(texts, only, name)
        for name, value in VALUE_SETTINGS.items():
            conn.execute(
                sql.SQL("SELECT set_config({}, {}, false)").format(
                    sql.Literal(name), sql.Literal(value)
                )
            )
        for row in conn.execute(query):
            out[
                tuple(_expected(conv, text) for conv, text in zip(converters, row, strict=True))
            ] += 1
    return out


def _expected(conv: object, text: str | None) -> object:
    if text is None:
        return None
    try:
        return _norm(conv(text))  # type: ignore[operator]
    except Unrepresentable:
        return ("raw", text)


def assert_mirror_equals_source(
    spark: SparkSession, lake: Lake, dsn: str, table: TableName, *,
    modes: TypeModes = DEFAULT_MODES, soft_delete: bool = False, skip: tuple[str, ...] = (),
) -> int:  # fmt: skip
    """Every row and value of the mirror equals the source; returns the row count. `skip`:
    columns the mirror keeps but the source no longer has (dropped)."""
    full = shape_of(lake, table, modes)
    shape = dataclasses.replace(full, columns=tuple(c for c in full.columns if c.name not in skip))
    want = source_rows(dsn, shape, modes)
    got = silver_rows(spark, lake, shape, soft_delete=soft_delete)
    missing, extra = want - got, got - want
    if missing and extra and shape.key:  # the same key on both sides: name the columns
        names = [c.name for c in shape.columns]
        at = [names.index(k) for k in shape.key]
        others = {tuple(r[i] for i in at): r for r in extra}
        for row in missing:
            twin = others.get(tuple(row[i] for i in at))
            if twin is not None:
                diff = {n: (a, b) for n, a, b in zip(names, row, twin, strict=True) if a != b}
                raise AssertionError(
                    f"{table}: key {[row[i] for i in at]}: source, silver differ in {diff}"
                )
    assert not missing, (
        f"{table}: {sum(missing.values())} source rows missing from silver; first {list(missing)[:2]}"
    )
    assert not extra, (
        f"{table}: {sum(extra.values())} silver rows not in the source; first {list(extra)[:2]}"
    )
    return sum(want.values())
