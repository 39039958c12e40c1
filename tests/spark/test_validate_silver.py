"""validate's Spark side of a silver table: `_cdc_raw` text stands for a value only where the
typed column is NULL, as silver writes it; rows marked `_cdc_deleted` are left out only when the
pipeline soft deletes (otherwise users read them)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pyspark.sql import SparkSession

from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.pg.pgoutput import ReplicaIdentity
from cdc_core.pgtypes import ColumnType, TypeModes, silver_type
from cdc_core.silver_shape import SilverColumn, TableShape
from cdc_core.validate_encoding import TWICE, raw_token
from cdc_core.validate_spark import SilverTable, column_token, live_rows

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


def test_settle_compares_the_keys_silver_wrote_since_and_every_key_without_a_feed(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Between two settle rounds only the keys the change feed shows were written are compared
    again (across a type widened in place too); without a feed for those versions, every key."""
    from cdc_core.validate import TableReport, _changed_since, _Run

    lake, table = Lake(str(tmp_path)), TableName("public", "t")
    int4 = ColumnType("int4", "b", -1, False)
    columns = tuple(SilverColumn(n, int4, silver_type(int4, TypeModes()), "integer")
                    for n in ("id", "v"))  # fmt: skip
    shape = TableShape("public", "t", columns, ("id",), ReplicaIdentity.DEFAULT)

    def written(path: str, pin: int, since: int) -> _Run:
        run = _Run(table, TableReport(table.qualified), shape=shape, pin=pin, columns=columns)
        _changed_since(spark, Lake(path.removesuffix("/silver/public/t")), run, since)
        return run

    def key_hash(path: str, key: int) -> int:
        rows = spark.read.format("delta").load(path).where(f"id = {key}")
        side = SilverTable(rows, columns, ("id",), soft_delete=False)
        (found,) = side.key_hashes()
        side.close()
        return found

    path, other = lake.silver(table), f"{tmp_path}/nofeed/silver/public/t"
    for feed, at in ((True, path), (False, other)):
        spark.sql(f"CREATE TABLE delta.`{at}` (id int, v int, _cdc_raw map<string, string>, "
                  "_cdc_unavailable array<string>) USING delta TBLPROPERTIES "
                  f"(delta.enableChangeDataFeed = {str(feed).lower()}, "
                  "delta.enableTypeWidening = true)")  # fmt: skip
        spark.sql(f"INSERT INTO delta.`{at}` VALUES (1, 1, NULL, NULL), (2, 2, NULL, NULL), "
                  "(3, 3, NULL, NULL)")  # fmt: skip
        spark.sql(f"UPDATE delta.`{at}` SET v = -2 WHERE id = 2")  # version 2

    run = written(path, 2, 1)
    assert ([d.key_hash for d in run.diffs], run.whole) == ([key_hash(path, 2)], False)
    assert (written(other, 2, 1).diffs, written(other, 2, 1).whole) == ([], True)

    spark.sql(f"ALTER TABLE delta.`{path}` ALTER COLUMN v TYPE bigint")  # version 3
    spark.sql(f"UPDATE delta.`{path}` SET v = -3 WHERE id = 3")  # version 4
    run = written(path, 4, 3)
    assert ([d.key_hash for d in run.diffs], run.whole) == ([key_hash(path, 3)], False)
    # versions before the widening: Delta reads no feed of them with today's schema
    run = written(path, 2, 1)
    assert (run.diffs, run.whole) == ([], True)
