"""Typing in the JVM where a Spark cast is exact: the fast path of silver's text -> type step.

The Python converters (`cdc_core.pgtypes`) type every value of every type exactly, but in
Python. For the common types a Spark cast gives the very same value whenever the text has the
plain form PostgreSQL prints (`123`, `-1.50`, `2024-01-02 03:04:05.6+00`); `fast_value`
returns that cast, guarded by the form, and NULL for any other text (NaN in a numeric, BC
dates, infinity, a year past 9999), which the converters then decide. An array has one when
its elements do and it is flat with no element quoted. Types without a fast path (intervals,
money, bytea, geometric types, ...) always go to Python.
`tests/spark/test_silver_fast.py` checks every fast path against its converter.
"""

from __future__ import annotations

import dataclasses

from pyspark.sql import Column
from pyspark.sql import functions as F

from cdc_core.pgtypes import ColumnType, TypeModes, converter, scalars, silver_type
from cdc_core.silver_shape import spark_type

_INTEGER = r"^-?[0-9]+$"
_FLOAT8 = r"^(-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?|-?Infinity|NaN)$"
_DATE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_TIMESTAMP = r"^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
_CASTS = {"int2", "int4", "int8", "oid", "xid", "cid"}
# A one-dimensional array none of whose elements PostgreSQL quoted (none is empty or holds a
# comma, brace, quote, backslash or space): splitting it at its commas is exact.
_FLAT_ARRAY = r'^\{[^",{}\\\s]+(,[^",{}\\\s]+)*\}$'


def fast_value(t: ColumnType, modes: TypeModes, text: Column) -> Column | None:
    """A Spark expression typing `text` exactly as `converter(t, modes)` does, NULL where only
    the converter can say; None when the type has no fast path."""
    if t.array:
        return _array_value(t, modes, text)
    convert = converter(t, modes)
    if convert is scalars.identity:
        return text  # kept as its text (uuid, json, enums, text, varchar, char(n), ...)
    target = spark_type(silver_type(t, modes))
    if t.kind != "b":
        return None
    if t.name in _CASTS:
        return F.when(text.rlike(_INTEGER), text.try_cast(target))
    if t.name == "bool":
        return F.when(text == "t", F.lit(True)).when(text == "f", F.lit(False))
    if t.name == "float8" or (t.name == "numeric" and modes.decimal == "double"):
        return F.when(text.rlike(_FLOAT8), text.try_cast(target))
    if t.name == "float4":  # the JVM parses to the nearest float32 at once, as the converter
        value = text.try_cast(target)  # does; a finite text past float32's range is not cast
        finite = ~(F.abs(value) == F.lit(float("inf"))) | text.isin("Infinity", "-Infinity")
        return F.when(text.rlike(_FLOAT8) & finite, value)
    if t.name == "numeric" and modes.decimal == "precise":
        typmod = scalars.numeric_typmod(t.modifier)
        if typmod is None:
            return None
        _, scale = scalars.decimal_shape(*typmod)
        form = rf"^-?[0-9]+\.[0-9]{{{scale}}}$" if scale > 0 else _INTEGER
        return F.when(text.rlike(form), text.try_cast(target))
    if t.name == "date":
        return F.when(text.rlike(_DATE), text.try_cast(target))
    if t.name == "timestamp":
        return F.when(text.rlike(_TIMESTAMP + "$"), text.try_cast(target))
    if t.name == "timestamptz":  # sessions print UTC (TimeZone=UTC): the offset is always +00
        return F.when(text.rlike(_TIMESTAMP + r"\+00$"), text.try_cast(target))
    return None


def _array_value(t: ColumnType, modes: TypeModes, text: Column) -> Column | None:
    """An array whose elements are kept as text or have a fast path, when it is flat and none
    of its elements is quoted (`{vip,b2b}`, `{1,NULL,3}`): the converter's own split."""
    element = dataclasses.replace(t, array=False)
    if t.name == "box":  # its delimiter is `;`, and a box has no fast path
        return None
    if fast_value(element, modes, F.lit("")) is None:  # (an element kept as text is its text)
        return None

    def typed(x: Column) -> Column:
        value = fast_value(element, modes, x)
        assert value is not None
        return value

    target = spark_type(silver_type(t, modes))
    items = F.split(F.regexp_extract(text, r"^\{(.*)\}$", 1), ",")
    values = F.transform(items, lambda x: F.when(x != "NULL", typed(x)))  # unquoted NULL: null
    plain = F.forall(items, lambda x: (x == "NULL") | typed(x).isNotNull())
    return F.when(text == "{}", F.array().cast(target)).when(
        text.rlike(_FLAT_ARRAY) & plain, values.cast(target)
    )
