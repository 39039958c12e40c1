"""Silver's batches at one commit LSN: a snapshot read is placed at the WAL insert position its
snapshot was taken at (seq -1), and a transaction that commits right then has its commit record
at that very LSN, its changes after the read (seq 0 on). When the read lands a batch earlier,
the next batch ends at the commit LSN the mirror's watermark already reached; its writes must
not be taken for ones already done. And a soft-deleting multiset that starts over counts anew.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from cdc_core.bronze import record_schema
from cdc_core.envelope import BRONZE, DEFAULT_PLACEHOLDER
from cdc_core.events import ColumnDescriptor, RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.lake_state import read_watermark
from cdc_core.lsn import Lsn
from cdc_core.pg.pgoutput import ReplicaIdentity
from cdc_core.silver import WATERMARK, SilverSettings, apply_table, once
from cdc_core.stager import StagedFile

T = TableName("public", "t")
H = 5_000  # the read's place, and the next transaction's commit LSN
FILE = str(StagedFile(Lsn(H), Lsn(H + 100)))


def relation(key: tuple[str, ...]) -> RelationDescriptor:
    identity = ReplicaIdentity.DEFAULT if key else ReplicaIdentity.FULL
    return RelationDescriptor(
        1, 1, T.schema, T.name, identity,
        (ColumnDescriptor("id", 23, -1, "integer", "id" in key or not key, "int4"),
         ColumnDescriptor("v", 25, -1, "text", not key, "text")),
        key,
    )  # fmt: skip


def event(
    op: str, seq: int, after: dict[str, str] | None, *, keyed: bool = True
) -> dict[str, object]:
    before = after if op == "d" else None
    return {
        "op": op, "after": None if op in ("d", "t") else json.dumps(after),
        "before": None if before is None else json.dumps(before),
        "key": json.dumps({"id": after["id"]}) if keyed and after else None,
        "unchanged": [], "commit_lsn": H, "seq": seq, "source_table": T.qualified,
        "source": {"ts_us": 1_700_000_000_000_000, "lsn": H + seq, "txId": None if op == "r" else 9},
        "staged_file": "snapshot:job:0" if op == "r" else FILE,
    }  # fmt: skip


def land(spark: SparkSession, lake: Lake, rows: list[dict[str, object]]) -> None:
    full = [{f.name: r.get(f.name) for f in BRONZE.fields} for r in rows]
    for r in full:
        given = r["source"] or {}
        r["source"] = {f.name: given.get(f.name) for f in BRONZE["source"].dataType.fields}  # type: ignore[attr-defined]
    frame: DataFrame = spark.createDataFrame(full, BRONZE)
    frame.write.format("delta").mode("append").partitionBy("source_table").save(lake.bronze)


def mirror(spark: SparkSession, lake: Lake, *columns: str) -> list[tuple[object, ...]]:
    rows = spark.read.format("delta").load(lake.silver(T)).collect()
    return sorted(tuple(r[c] for c in columns) for r in rows)


def test_once_goes_by_the_commit_lsn_and_within_one_already_reached_by_the_place() -> None:
    assert once("app", (H + 1, 0), (H, -1)) == ("app", H + 1)
    assert once("app", (H, 3), (H, -1)) == (f"app@{H}", 5)
    assert once("app", (H, 7), (H, 3)) == (f"app@{H}", 9)  # later in that commit: a higher one


def test_a_transaction_committed_at_the_place_of_a_read_a_batch_before_is_merged(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = Lake(str(tmp_path))
    record_schema(lake, relation(("id",)), 0)
    land(spark, lake, [event("r", -1, {"id": "1", "v": "read"})])
    apply_table(spark, lake, T, SilverSettings())
    land(spark, lake, [event("c", 0, {"id": "2", "v": "new"}),
                       event("u", 1, {"id": "1", "v": "changed"})])  # fmt: skip

    result = apply_table(spark, lake, T, SilverSettings())

    assert result.changes == 2
    assert mirror(spark, lake, "id", "v") == [(1, "changed"), (2, "new")]
    assert (read_watermark(spark, lake.silver(T), WATERMARK) or {})[WATERMARK] == [H, 1]
    assert apply_table(spark, lake, T, SilverSettings()).changes == 0  # and once only


def test_a_truncate_committed_at_the_place_of_a_read_a_batch_before_empties_the_multiset(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = Lake(str(tmp_path))
    record_schema(lake, relation(()), 0)
    land(spark, lake, [event("r", -1, {"id": "1", "v": "read"}, keyed=False),
                       event("r", -1, {"id": "2", "v": "read"}, keyed=False)])  # fmt: skip
    apply_table(spark, lake, T, SilverSettings())
    assert mirror(spark, lake, "id", "_cdc_count") == [(1, 1), (2, 1)]
    land(spark, lake, [event("t", 0, None, keyed=False),
                       event("c", 1, {"id": "3", "v": "after"}, keyed=False)])  # fmt: skip

    apply_table(spark, lake, T, SilverSettings())

    assert mirror(spark, lake, "id", "v", "_cdc_count") == [(3, "after", 1)]


def test_a_soft_deleting_multiset_counts_anew_after_a_truncate(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = Lake(str(tmp_path))
    record_schema(lake, relation(()), 0)
    soft = SilverSettings(soft_delete=True)
    x, y = {"id": "1", "v": "x"}, {"id": "2", "v": "y"}
    land(spark, lake, [event("c", 0, x, keyed=False) | {"commit_lsn": 100},
                       event("c", 1, x, keyed=False) | {"commit_lsn": 100},
                       event("c", 2, y, keyed=False) | {"commit_lsn": 100}])  # fmt: skip
    apply_table(spark, lake, T, soft)
    assert mirror(spark, lake, "id", "_cdc_count", "_cdc_deleted") == [(1, 2, False), (2, 1, False)]
    land(spark, lake, [event("t", 0, None, keyed=False), event("c", 1, x, keyed=False)])

    apply_table(spark, lake, T, soft)

    assert mirror(spark, lake, "id", "_cdc_count", "_cdc_deleted") == [(1, 1, False), (2, 0, True)]


EMB = ColumnDescriptor("emb", 1022, -1, "double precision[]", False, "float8", is_array=True)


@pytest.mark.parametrize("soft", [False, True])
def test_an_unchanged_value_whose_placeholder_is_no_text_of_its_type_keeps_the_stored_one(
    spark: SparkSession, tmp_path: Path, soft: bool
) -> None:
    """Debezium's placeholder for an unchanged TOASTed float8[] is its bare text, not an
    array's: silver never types it (it used to refuse the change, stopping the mirror)."""
    lake = Lake(str(tmp_path))
    base = relation(("id",))
    record_schema(lake, dataclasses.replace(base, columns=(*base.columns, EMB)), 0)
    placeholder = DEFAULT_PLACEHOLDER.for_column(EMB)
    assert not placeholder.startswith("{")
    stored = "{" + ",".join(["0.5"] * 600) + "}"
    land(spark, lake, [event("c", 0, {"id": "1", "v": "a", "emb": stored}) | {"commit_lsn": 100}])
    apply_table(spark, lake, T, SilverSettings(soft_delete=soft))
    land(spark, lake, [event("u", 0, {"id": "1", "v": "b", "emb": placeholder})
                       | {"commit_lsn": 200, "unchanged": ["emb"]}])  # fmt: skip

    result = apply_table(spark, lake, T, SilverSettings(soft_delete=soft))

    assert (result.changes, result.error) == (1, None)
    (row,) = spark.read.format("delta").load(lake.silver(T)).collect()
    assert (row["v"], row["emb"], row["_cdc_unavailable"]) == ("b", [0.5] * 600, [])
