"""A mirror records the representation options its values were typed under. Changed under it
(time.precision.mode adaptive to nanoseconds: both a long in Spark for a time(6), milliseconds
then nanoseconds for a time(3) widened to long), old and new values would sit side by side
unnoticed; the mirror stops instead, naming the option, and the other options change freely."""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import SparkSession

from cdc_core.bronze import record_schema
from cdc_core.envelope import BRONZE
from cdc_core.events import ColumnDescriptor, RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.lake_state import read_watermark
from cdc_core.pg.pgoutput import ReplicaIdentity
from cdc_core.pgtypes import TypeModes
from cdc_core.silver import MODES, WATERMARK, SilverSettings, apply_silver

SHIFTS = TableName("public", "shifts")
RELATION = RelationDescriptor(
    1, 1, "public", "shifts", ReplicaIdentity.DEFAULT,
    (ColumnDescriptor("id", 23, -1, "integer", True, "int4"),
     ColumnDescriptor("starts", 1083, 6, "time(6) without time zone", False, "time"),
     ColumnDescriptor("note", 25, -1, "text", False, "text")),
    ("id",),
)  # fmt: skip


def insert(lsn: int, i: int, starts: str) -> dict[str, object]:
    values = {"id": str(i), "starts": starts, "note": "n"}
    return {f.name: None for f in BRONZE.fields} | {
        "op": "c", "after": json.dumps(values), "unchanged": [],
        "source": {f.name: None for f in BRONZE["source"].dataType.fields}  # type: ignore[attr-defined]
        | {"ts_us": 1_700_000_000_000_000, "lsn": lsn, "txId": 7},
        "commit_lsn": lsn, "seq": 0, "source_table": SHIFTS.qualified, "staged_file": "f",
    }  # fmt: skip


def land(spark: SparkSession, lake: Lake, *rows: dict[str, object]) -> None:
    spark.createDataFrame(list(rows), BRONZE).write.format("delta").mode("append").save(lake.bronze)


def mirror(spark: SparkSession, lake: Lake) -> list[tuple[object, ...]]:
    return sorted(
        (r["id"], r["starts"])
        for r in spark.read.format("delta").load(lake.silver(SHIFTS)).collect()
    )


def settings(**modes: str) -> SilverSettings:
    return SilverSettings(modes=TypeModes(**modes))  # type: ignore[arg-type]


def test_a_mirror_stops_when_an_option_its_values_depend_on_changes(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = Lake(str(tmp_path))
    record_schema(lake, RELATION, 0)
    land(spark, lake, insert(100, 1, "04:05:06.789"))
    (first,) = apply_silver(spark, lake, [SHIFTS], settings(time_precision="microseconds"))
    assert first.error is None
    assert mirror(spark, lake) == [(1, 14_706_789_000)]
    mark = read_watermark(spark, lake.silver(SHIFTS), WATERMARK)
    assert mark is not None
    assert mark[MODES] == {"time.precision.mode": "microseconds"}  # only what its columns use

    land(spark, lake, insert(200, 2, "00:00:01"))
    (changed,) = apply_silver(spark, lake, [SHIFTS], settings(time_precision="nanoseconds"))
    assert changed.error == (
        "table public.shifts: its silver mirror was typed under other options than the "
        "pipeline's now (silver.time.precision.mode: microseconds then, nanoseconds now), and "
        "would hold values of both side by side. The mirror stops here; other tables go on. To "
        "move on, set the option back, or drop the silver table and take a new snapshot of it "
        "(`cdc snapshot --table public.shifts`), which rebuilds the mirror under the new option"
    )
    assert mirror(spark, lake) == [(1, 14_706_789_000)]  # nothing of the batch applied

    # options no column of it uses change freely; the one set back, the mirror goes on
    (back,) = apply_silver(
        spark, lake, [SHIFTS], settings(time_precision="microseconds", hstore="map", binary="hex")
    )
    assert back.error is None
    assert mirror(spark, lake) == [(1, 14_706_789_000), (2, 1_000_000)]
