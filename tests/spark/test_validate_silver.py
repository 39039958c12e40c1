"""validate's Spark side of a silver table: `_cdc_raw` text stands for a value only where the
typed column is NULL, as silver writes it; rows marked `_cdc_deleted` are left out only when the
pipeline soft deletes (otherwise users read them)."""

from __future__ import annotations

import datetime as dt

from pyspark.sql import SparkSession

from cdc_core.pgtypes import ColumnType, TypeModes, silver_type
from cdc_core.silver_shape import SilverColumn
from cdc_core.validate_encoding import TWICE, raw_token
from cdc_core.validate_spark import column_token, live_rows

DUE = ColumnType("date", "b", -1, False)
COLUMN = SilverColumn("due", DUE, silver_type(DUE, TypeModes()), "date")
SCHEMA = "due date, _cdc_raw map<string, string>, _cdc_unavailable array<string>"


def test_raw_text_is_the_token_of_a_value_the_typed_column_leaves_null(
    spark: SparkSession,
) -> None:
    df = spark.createDataFrame([(None, {"due": "infinity"}, [])], SCHEMA)
    (row,) = df.select(column_token(COLUMN)).collect()
    assert row[0] == raw_token("infinity")


def test_a_typed_value_next_to_raw_text_matches_no_source_value(spark: SparkSession) -> None:
    # users read the typed column: 2020-01-01 there is not the source's 'infinity'
    df = spark.createDataFrame([(dt.date(2020, 1, 1), {"due": "infinity"}, [])], SCHEMA)
    (row,) = df.select(column_token(COLUMN)).collect()
    assert row[0] == TWICE
    assert row[0] != raw_token("infinity")


ROWS = "id int, _cdc_deleted boolean, _cdc_count long"


def test_with_soft_delete_rows_marked_deleted_are_not_the_sources(spark: SparkSession) -> None:
    df = spark.createDataFrame([(1, False, None), (2, True, None), (3, None, None)], ROWS)
    assert sorted(r["id"] for r in live_rows(df, True, True).collect()) == [1, 3]


def test_without_soft_delete_a_row_marked_deleted_is_one_users_read(spark: SparkSession) -> None:
    df = spark.createDataFrame([(1, False, None), (2, True, None)], ROWS)
    assert sorted(r["id"] for r in live_rows(df, True, False).collect()) == [1, 2]
