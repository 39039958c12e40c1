"""A bronze table written by an earlier version gains the envelope's newer fields, a struct's own
fields too, and its rows read with them null."""

from __future__ import annotations

from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from cdc_core.bronze import ensure_bronze
from cdc_core.envelope import BRONZE
from cdc_core.lake import Lake


def _older(schema: T.StructType) -> T.StructType:
    """`schema` as an earlier version wrote it: no `headers`, and `read_view` without
    `unseen_from`."""
    fields = []
    for f in schema.fields:
        if f.name == "headers":
            continue
        if f.name == "read_view":
            assert isinstance(f.dataType, T.StructType)
            inner = [g for g in f.dataType.fields if g.name != "unseen_from"]
            fields.append(T.StructField(f.name, T.StructType(inner), f.nullable))
        else:
            fields.append(f)
    return T.StructType(fields)


def test_an_older_bronze_gains_the_new_fields_and_keeps_its_rows(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = Lake(str(tmp_path))
    older = _older(BRONZE)
    row = {f.name: None for f in older.fields} | {
        "op": "r", "commit_lsn": 7, "seq": -1, "source_table": "public.t",
        "read_view": {"xmin": 10, "xmax": 12, "xip": [11]},
    }  # fmt: skip
    frame = spark.createDataFrame([row], older)
    frame.write.format("delta").partitionBy("source_table").save(lake.bronze)

    ensure_bronze(spark, lake)
    ensure_bronze(spark, lake)  # nothing left to add

    schema = DeltaTable.forPath(spark, lake.bronze).toDF().schema
    assert {f.name for f in schema.fields} == {f.name for f in BRONZE.fields}
    view = schema["read_view"].dataType
    assert isinstance(view, T.StructType)
    assert view.fieldNames() == ["xmin", "xmax", "xip", "unseen_from"]
    (read,) = spark.read.format("delta").load(lake.bronze).select("read_view").collect()
    assert read["read_view"].asDict() == {"xmin": 10, "xmax": 12, "xip": [11], "unseen_from": None}
    new = {f.name: None for f in BRONZE.fields} | {
        "op": "r", "commit_lsn": 8, "seq": -1, "source_table": "public.t",
        "read_view": {"xmin": 10, "xmax": 12, "xip": [], "unseen_from": 5},
    }  # fmt: skip
    spark.createDataFrame([new], BRONZE).write.format("delta").mode("append").save(lake.bronze)
    views = spark.read.format("delta").load(lake.bronze).orderBy("commit_lsn").collect()
    assert [r["read_view"]["unseen_from"] for r in views] == [None, 5]
