"""Silver on real Delta tables: the MERGE guard, TOAST, key changes, soft delete, multisets."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_core.envelope import BRONZE, UNAVAILABLE
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.lake_state import committing, read_watermark, table_version
from cdc_core.lsn import Lsn
from cdc_core.pg.pgoutput import ReplicaIdentity
from cdc_core.pgtypes import ColumnType, SilverType
from cdc_core.silver import (
    SOFT_DELETE,
    WATERMARK,
    SilverSettings,
    _append_reads,
    _purge_tombstones,
    _read_summary,
    _summary,
    _summary_aggregates,
    merge_changes,
    sweep,
)  # fmt: skip
from cdc_core.silver_batch import keyed_source, parsed, typed, typed_with
from cdc_core.silver_shape import SilverColumn, TableShape
from cdc_core.silver_table import ensure_silver
from cdc_core.stager import StagedFile


def shape(key: tuple[str, ...] = ("id",)) -> TableShape:
    cols = (
        SilverColumn("id", ColumnType("int4", "b", -1, False), SilverType("int"), "integer"),
        SilverColumn("name", ColumnType("text", "b", -1, False), SilverType("string"), "text"),
        SilverColumn(
            "amount",
            ColumnType("numeric", "b", ((10 << 16) | 2) + 4, False),
            SilverType("decimal", 10, 2),
            "numeric(10,2)",
        ),
    )
    identity = ReplicaIdentity.DEFAULT if key else ReplicaIdentity.FULL
    return TableShape("public", "t", cols, key, identity)


def change(  # noqa: PLR0917 - a test row builder read like a table
    op: str, lsn: int, seq: int = 0, after: dict[str, str | None] | None = None,
    before: dict[str, str | None] | None = None, unchanged: list[str] | None = None,
    old_key: dict[str, str] | None = None,
) -> dict[str, object]:  # fmt: skip
    headers = {"__debezium.oldkey": json.dumps(old_key, separators=(",", ":"))} if old_key else None
    return {
        "op": op, "key": None, "before": json.dumps(before) if before else None,
        "after": json.dumps(after) if after else None, "unchanged": unchanged or [],
        "source": {"ts_us": 1_700_000_000_000_000 + lsn}, "headers": headers,
        "commit_lsn": lsn, "seq": seq, "source_table": "public.t", "staged_file": "f",
    }  # fmt: skip


def bronze(spark: SparkSession, rows: list[dict[str, object]]) -> DataFrame:
    full = [{f.name: r.get(f.name) for f in BRONZE.fields} for r in rows]
    for r in full:
        r["source"] = {
            f.name: (r["source"] or {}).get(f.name) for f in BRONZE["source"].dataType.fields
        }  # type: ignore[union-attr, attr-defined]
    return spark.createDataFrame(full, BRONZE)


def row(i: int, name: str | None, amount: str | None = None) -> dict[str, str | None]:
    return {"id": str(i), "name": name, "amount": amount}


def mirror(spark: SparkSession, path: str, *, deleted: bool = False) -> list[tuple[object, ...]]:
    df = spark.read.format("delta").load(path)
    if not deleted:
        df = df.where(~F.col("_cdc_deleted"))
    return sorted((r["id"], r["name"], r["amount"]) for r in df.collect())


@pytest.fixture
def table(spark: SparkSession, tmp_path: Path) -> str:
    path = str(tmp_path / "silver")
    ensure_silver(spark, path, shape())
    return path


def apply(
    spark: SparkSession, path: str, rows: list[dict[str, object]], **settings: object
) -> None:
    merge_changes(spark, path, shape(), bronze(spark, rows), SilverSettings(**settings))  # type: ignore[arg-type]


def test_inserts_updates_and_deletes(spark: SparkSession, table: str) -> None:
    apply(
        spark,
        table,
        [change("c", 10, after=row(1, "a", "1.5")), change("c", 10, 1, after=row(2, "b"))],
    )
    apply(
        spark,
        table,
        [change("u", 20, after=row(1, "a2", "2")), change("d", 30, before={"id": "2"})],
    )
    assert mirror(spark, table) == [(1, "a2", Decimal("2.00"))]


def test_newest_change_per_key_wins_by_commit_lsn_then_position(
    spark: SparkSession, table: str
) -> None:
    apply(spark, table, [
        change("c", 10, after=row(1, "first")),
        change("u", 30, 0, after=row(1, "third")),
        change("u", 20, 5, after=row(1, "second")),
        change("u", 30, 1, after=row(1, "fourth")),
    ])  # fmt: skip
    assert mirror(spark, table) == [(1, "fourth", None)]


def test_an_older_change_never_overwrites_a_newer_one(spark: SparkSession, table: str) -> None:
    apply(spark, table, [change("c", 50, after=row(1, "new"))])
    apply(spark, table, [change("u", 40, after=row(1, "old"))])
    assert mirror(spark, table) == [(1, "new", None)]


def test_applying_a_batch_twice_changes_nothing(spark: SparkSession, table: str) -> None:
    batch = [change("c", 10, after=row(1, "a")), change("u", 20, after=row(1, "b")),
             change("c", 20, 1, after=row(2, "x")), change("d", 30, before={"id": "2"})]  # fmt: skip
    apply(spark, table, batch)
    before = sorted(map(tuple, spark.read.format("delta").load(table).drop("_cdc_raw").collect()))
    version = DeltaTable.forPath(spark, table).history(1).first()["version"]  # type: ignore[index]
    apply(spark, table, batch)
    assert (
        sorted(map(tuple, spark.read.format("delta").load(table).drop("_cdc_raw").collect()))
        == before
    )
    assert DeltaTable.forPath(spark, table).history(1).first()["version"] == version  # type: ignore[index]


def test_unchanged_toast_keeps_the_stored_value(spark: SparkSession, table: str) -> None:
    apply(spark, table, [change("c", 10, after=row(1, "big value", "1"))])
    apply(spark, table, [change("u", 20, after=row(1, UNAVAILABLE, "2"), unchanged=["name"])])
    assert mirror(spark, table) == [(1, "big value", Decimal("2.00"))]


def test_unchanged_toast_takes_an_earlier_change_of_the_same_batch(
    spark: SparkSession, table: str
) -> None:
    apply(spark, table, [change("c", 10, after=row(1, "v1"))])
    apply(spark, table, [
        change("u", 20, after=row(1, "v2", "1")),
        change("u", 30, after=row(1, UNAVAILABLE, "3"), unchanged=["name"]),
    ])  # fmt: skip
    assert mirror(spark, table) == [(1, "v2", Decimal("3.00"))]


def test_a_key_change_carries_untouched_toast_from_the_old_key(
    spark: SparkSession, table: str
) -> None:
    apply(
        spark,
        table,
        [change("c", 10, after=row(1, "big stored")), change("c", 10, 1, after=row(5, "other"))],
    )
    apply(spark, table, [
        change("d", 20, before={"id": "1"}),
        change("c", 20, after=row(2, UNAVAILABLE, "1"), unchanged=["name"], old_key={"id": "1"}),
        change("u", 30, after=row(5, "other changed")),
        change("d", 40, before={"id": "5"}),
        change("c", 40, after=row(6, UNAVAILABLE), unchanged=["name"], old_key={"id": "5"}),
    ])  # fmt: skip
    assert mirror(spark, table) == [(2, "big stored", Decimal("1.00")), (6, "other changed", None)]


def test_a_key_change_between_two_texts_of_one_typed_key_keeps_the_row(
    spark: SparkSession, table: str
) -> None:
    """A float key updated from 0 to -0, a numeric one from 1.10 to 1.1 where silver types it
    as a double: PostgreSQL sends a key change (the stored bytes differ), so the envelope has a
    d of the old key and a c of the new at one position, which silver types to one key. The c
    came after the d: the row stays (the d won the tie, and the row was deleted)."""
    apply(
        spark,
        table,
        [change("c", 10, after=row(1, "stored")), change("c", 10, 1, after=row(2, "b"))],
    )
    apply(spark, table, [
        change("d", 20, 3, before={"id": "1"}),
        change("c", 20, 3, after=row(1, "moved", "2"), old_key={"id": "01"}),
        change("d", 30, before={"id": "2"}),
        change("c", 30, after=row(2, UNAVAILABLE, "4"), unchanged=["name"], old_key={"id": "02"}),
    ])  # fmt: skip
    assert mirror(spark, table) == [(1, "moved", Decimal("2.00")), (2, "b", Decimal("4.00"))]


def unavailable(spark: SparkSession, path: str) -> dict[object, list[str]]:
    df = spark.read.format("delta").load(path).where(~F.col("_cdc_deleted"))
    return {r["id"]: list(r["_cdc_unavailable"] or []) for r in df.collect()}


def moved(lsn: int, old: int, new: int, amount: str | None = None) -> list[dict[str, object]]:
    """A key change that did not resend `name` (unchanged TOAST): a delete and an insert."""
    return [
        change("d", lsn, before={"id": str(old)}),
        change("c", lsn, after=row(new, UNAVAILABLE, amount), unchanged=["name"],
               old_key={"id": str(old)}),
    ]  # fmt: skip


def untouched(lsn: int, i: int, amount: str) -> dict[str, object]:
    """An update of `amount` alone: `name` not resent."""
    return change("u", lsn, after=row(i, UNAVAILABLE, amount), unchanged=["name"])


def test_changes_after_a_key_change_in_the_same_batch_keep_the_value_it_carried(
    spark: SparkSession, table: str
) -> None:
    """The row's later changes, under its new key, did not send the value either: it is the
    one the move brought from the old key (from the stored row, or from the batch)."""
    apply(spark, table, [change("c", 10, after=row(1, "stored"))])
    apply(spark, table, [
        *moved(20, 1, -1), untouched(30, -1, "3"),  # the old key's value is stored
        change("c", 40, after=row(7, "in batch")), *moved(50, 7, -7), untouched(60, -7, "6"),
    ])  # fmt: skip
    assert mirror(spark, table) == [
        (-7, "in batch", Decimal("6.00")),
        (-1, "stored", Decimal("3.00")),
    ]
    assert unavailable(spark, table) == {-7: [], -1: []}


def test_a_row_moved_twice_in_one_batch_keeps_its_value_through_both_moves(
    spark: SparkSession, table: str
) -> None:
    apply(spark, table, [change("c", 10, after=row(1, "stored"))])
    apply(spark, table, [
        *moved(20, 1, 2), untouched(30, 2, "3"), *moved(40, 2, 3), untouched(50, 3, "5"),
        *moved(60, 3, 4),
    ])  # fmt: skip
    assert mirror(spark, table) == [(4, "stored", None)]
    assert unavailable(spark, table) == {4: []}


def test_a_row_moved_onto_a_key_deleted_in_the_batch_never_takes_the_deleted_row_s_value(
    spark: SparkSession, table: str
) -> None:
    """Key 2 held another row: deleted, then row 1 moved to 2 and was updated, all in one
    batch. The stored row at 2 is the deleted one: its value is not row 1's."""
    apply(spark, table, [change("c", 10, after=row(1, "one")),
                         change("c", 10, 1, after=row(2, "two"))])  # fmt: skip
    apply(spark, table, [
        change("d", 20, before={"id": "2"}), *moved(30, 1, 2), untouched(40, 2, "4"),
    ])  # fmt: skip
    assert mirror(spark, table) == [(2, "one", Decimal("4.00"))]


def test_a_value_no_change_and_no_row_knows_is_null_and_listed_never_another_row_s(
    spark: SparkSession, table: str
) -> None:
    """Row 5 moved to 2 (where a row was just deleted) without resending `name`, and the
    mirror never had row 5 (a gap before the lake began): `name` is not known. It is NULL and
    listed in `_cdc_unavailable`, not the deleted row 2's value, and a later change that does
    not send it keeps it listed."""
    apply(spark, table, [change("c", 10, after=row(2, "two"))])
    apply(
        spark, table, [change("d", 20, before={"id": "2"}), *moved(30, 5, 2), untouched(40, 2, "4")]
    )
    assert mirror(spark, table) == [(2, None, Decimal("4.00"))]
    assert unavailable(spark, table) == {2: ["name"]}
    apply(spark, table, [untouched(50, 2, "5")])
    assert unavailable(spark, table) == {2: ["name"]}
    apply(spark, table, [change("u", 60, after=row(2, "sent again", "6"))])
    assert mirror(spark, table) == [(2, "sent again", Decimal("6.00"))]
    assert unavailable(spark, table) == {2: []}


def test_soft_delete_keeps_the_row_marked(spark: SparkSession, table: str) -> None:
    apply(spark, table, [change("c", 10, after=row(1, "a"))], soft_delete=True)
    apply(spark, table, [change("d", 20, before={"id": "1"})], soft_delete=True)
    assert mirror(spark, table) == []
    assert mirror(spark, table, deleted=True) == [(1, "a", None)]
    apply(spark, table, [change("c", 30, after=row(1, "back"))], soft_delete=True)
    assert mirror(spark, table) == [(1, "back", None)]


def test_without_soft_delete_the_rows_it_left_marked_go_once_under_the_same_watermark(
    spark: SparkSession, table: str
) -> None:
    apply(spark, table, [change("c", 10, after=row(1, "a")), change("c", 10, 1, after=row(2, "b"))])
    with committing(spark, {WATERMARK: [20, 0], SOFT_DELETE: True}):
        apply(spark, table, [change("d", 20, before={"id": "1"})], soft_delete=True)
    t = TableName("public", "t")

    _purge_tombstones(spark, table, t, SilverSettings(), read_watermark(spark, table, WATERMARK))

    assert mirror(spark, table, deleted=True) == [(2, "b", None)]
    assert read_watermark(spark, table, WATERMARK) == {WATERMARK: [20, 0], SOFT_DELETE: False}
    version = table_version(spark, table)
    _purge_tombstones(spark, table, t, SilverSettings(), read_watermark(spark, table, WATERMARK))
    assert table_version(spark, table) == version  # recorded: not looked at again


def test_a_mirror_from_before_the_setting_was_recorded_is_checked_once(
    spark: SparkSession, table: str
) -> None:
    with committing(spark, {WATERMARK: [10, 1]}):
        apply(spark, table, [change("c", 10, after=row(1, "a"))])
    t = TableName("public", "t")

    _purge_tombstones(spark, table, t, SilverSettings(), read_watermark(spark, table, WATERMARK))

    assert mirror(spark, table, deleted=True) == [(1, "a", None)]
    assert read_watermark(spark, table, WATERMARK) == {WATERMARK: [10, 1], SOFT_DELETE: False}


def test_a_sweep_under_soft_delete_records_it_with_the_watermark(
    spark: SparkSession, table: str
) -> None:
    with committing(spark, {WATERMARK: [10, 0]}):
        apply(spark, table, [change("c", 10, after=row(1, "a"))])

    sweep(spark, table, (20, -1), SilverSettings(soft_delete=True))

    assert mirror(spark, table, deleted=True) == [(1, "a", None)]
    assert mirror(spark, table) == []
    assert read_watermark(spark, table, WATERMARK) == {WATERMARK: [10, 0], SOFT_DELETE: True}


def test_a_table_without_key_is_a_multiset(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "bag")
    ensure_silver(spark, path, shape(key=()))
    s = shape(key=())
    one, two = row(1, "same"), row(2, "other")
    batch = [change("c", 10, after=one), change("c", 10, 1, after=one), change("c", 10, 2, after=two),
             change("u", 20, before=two, after=one)]  # fmt: skip
    merge_changes(spark, path, s, bronze(spark, batch), SilverSettings())
    counts = {r["id"]: r["_cdc_count"] for r in spark.read.format("delta").load(path).collect()}
    assert counts == {1: 3}
    merge_changes(spark, path, s, bronze(spark, [change("d", 30, before=one)]), SilverSettings())
    counts = {r["id"]: r["_cdc_count"] for r in spark.read.format("delta").load(path).collect()}
    assert counts == {1: 2}


def test_keyed_source_types_values_exactly(spark: SparkSession) -> None:
    s = shape()
    values = parsed(
        bronze(
            spark,
            [change("c", 10, after=row(1, "é", "12.3")), change("u", 20, after=row(1, "x", "NaN"))],
        ),
        s,
    )
    out = keyed_source(
        typed(values, s, SilverSettings().modes), s, spark.createDataFrame([], s.spark_schema())
    )
    got = out.select(
        "id", "name", "amount", F.map_entries("_cdc_raw").alias("raw"), "_cdc_lsn", "_cdc_op"
    )
    schema = T.StructType([
        T.StructField("id", T.IntegerType()), T.StructField("name", T.StringType()),
        T.StructField("amount", T.DecimalType(10, 2)),
        T.StructField("raw", T.ArrayType(T.StructType([T.StructField("key", T.StringType()),
                                                        T.StructField("value", T.StringType())]))),
        T.StructField("_cdc_lsn", T.LongType()), T.StructField("_cdc_op", T.StringType()),
    ])  # fmt: skip
    expected = spark.createDataFrame([(1, "x", None, [("amount", "NaN")], 20, "u")], schema)
    assert_df_equality(got, expected, ignore_nullable=True)


def test_a_column_delta_cannot_name_plainly_turns_column_mapping_on(
    spark: SparkSession, table: str
) -> None:
    odd = SilverColumn('x"; DROP TABLE y; --', ColumnType("text", "b", -1, False),
                       SilverType("string"), "text")  # fmt: skip
    wider = TableShape("public", "t", (*shape().columns, odd), ("id",), ReplicaIdentity.DEFAULT)
    ensure_silver(spark, table, wider)
    properties = DeltaTable.forPath(spark, table).detail().first()["properties"]  # type: ignore[index]
    assert properties["delta.columnMapping.mode"] == "name"
    rows = [change("c", 10, after={**row(1, "a"), odd.name: "v"})]
    merge_changes(spark, table, wider, bronze(spark, rows), SilverSettings())
    assert spark.read.format("delta").load(table).select(odd.name).first() == ("v",)


def test_values_past_jacksons_default_string_limit_are_parsed_whole(spark: SparkSession) -> None:
    """Jackson stops at 20 M chars by default; from_json then gave a row of NULLs."""
    big = "x" * 21_000_000
    rows = parsed(bronze(spark, [change("c", 10, after=row(1, big))]), shape()).collect()
    assert (rows[0]["_values"]["id"], len(rows[0]["_values"]["name"])) == ("1", len(big))


def snapshot_read(
    i: int, lsn: int, name: str | None, amount: str | None = None
) -> dict[str, object]:
    return change("r", lsn, -1, after=row(i, name, amount)) | {"key": json.dumps({"id": str(i)})}


def append(spark: SparkSession, path: str, rows: list[dict[str, object]], end: int) -> bool:
    lake = Lake(str(Path(path).parent))
    changes = typed(parsed(bronze(spark, rows), shape()), shape(), SilverSettings().modes)
    return _append_reads(spark, lake, path, changes, shape(), end=(end, -1), after=(-1, -1),
                         settings=SilverSettings(), marks={})  # fmt: skip


def every_column(spark: SparkSession, path: str) -> DataFrame:
    df = spark.read.format("delta").load(path)
    return df.withColumn("_cdc_raw", F.map_entries("_cdc_raw"))  # maps do not compare


def test_an_empty_mirror_appends_snapshot_reads_as_the_merge_would_write_them(
    spark: SparkSession, tmp_path: Path
) -> None:
    reads = [
        snapshot_read(1, 10, "a", "1.5"),
        snapshot_read(2, 10, None, "NaN"),
        snapshot_read(3, 20, "c"),
    ]  # fmt: skip; NaN: typed in Python, kept in _cdc_raw
    merged, appended = str(tmp_path / "merged"), str(tmp_path / "appended")
    for path in (merged, appended):
        ensure_silver(spark, path, shape())
    apply(spark, merged, reads)
    assert append(spark, appended, reads, end=20)
    assert_df_equality(every_column(spark, appended), every_column(spark, merged),
                       ignore_row_order=True)  # fmt: skip
    assert read_watermark(spark, appended, WATERMARK) == {WATERMARK: [20, -1]}
    version = table_version(spark, appended)
    assert not append(spark, appended, [snapshot_read(4, 30, "d")], end=30)  # it has rows now
    assert table_version(spark, appended) == version


def test_a_key_read_twice_is_left_to_the_merge(spark: SparkSession, table: str) -> None:
    version = table_version(spark, table)
    assert not append(spark, table, [snapshot_read(1, 10, "a"), snapshot_read(1, 20, "b")], end=20)
    assert table_version(spark, table) == version


def test_a_batch_summary_names_each_column_some_change_did_not_carry(spark: SparkSession) -> None:
    rows = [snapshot_read(1, 10, "a"), change("u", 20, after=row(1, UNAVAILABLE), unchanged=["name"]),
            change("u", 30, after=row(1, UNAVAILABLE), unchanged=["name", "amount"]),
            change("c", 30, 1, after=row(2, "b"))]  # fmt: skip
    summary = _summary(bronze(spark, rows))
    assert summary is not None
    changes, end, truncated, unsent, reads = summary
    assert (changes, end, truncated, unsent, reads) == (4, (30, 1), None, ["amount", "name"], 1)


def test_the_typed_rows_summarise_as_bronze_does(spark: SparkSession) -> None:
    """The summary a keyed batch takes from its typed rows (one pass) is the one bronze gives."""
    truncate = change("t", 25, 2) | {"staged_file": StagedFile(Lsn(24), Lsn(26)).id}
    rows = [snapshot_read(1, 10, "a"), change("u", 20, after=row(1, UNAVAILABLE), unchanged=["name"]),
            truncate, change("c", 30, after=row(2, UNAVAILABLE), unchanged=["name", "amount"]),
            change("d", 30, 1, before={"id": "1"})]  # fmt: skip
    aggregates = _summary_aggregates(unchanged="_unchanged", staged_file="_staged_file")
    typing = typed_with(parsed(bronze(spark, rows), shape()), shape(),
                        SilverSettings().modes, aggregates)  # fmt: skip
    from_bronze = _summary(bronze(spark, rows))
    assert from_bronze == (5, (30, 1), (25, 2, 24), ["amount", "name"], 1)
    assert _read_summary(typing.found) == from_bronze
    assert typing.rows.count() == 5


def test_a_column_named_with_a_dot_and_a_backtick_is_typed_and_merged(
    spark: SparkSession, table: str
) -> None:
    odd = SilverColumn("a.b`c", ColumnType("int4", "b", -1, False), SilverType("int"), "integer")
    wider = TableShape("public", "t", (*shape().columns, odd), ("id",), ReplicaIdentity.DEFAULT)
    ensure_silver(spark, table, wider)
    rows = [change("c", 10, after={**row(1, "a"), odd.name: "7"})]
    merge_changes(spark, table, wider, bronze(spark, rows), SilverSettings())
    assert spark.read.format("delta").load(table).select(F.col("`a.b``c`")).first() == (7,)


def test_a_batch_adds_one_file_to_its_mirror(spark: SparkSession, table: str) -> None:
    """Until the next OPTIMIZE, every MERGE of a continuous batch touches the files its changes'
    keys are in. A batch whose shuffle is well under the advisory partition size (64 MB) writes
    one file: adaptive execution coalesces to that size, not to one partition per core
    (`spark.sql.adaptive.coalescePartitions.parallelismFirst`, which the product turns off).
    Some 4 MB of changes here: with the setting on, they become two files."""
    template = bronze(spark, [change("c", 10, after=row(0, "a"))]).drop("after", "seq")
    name = F.concat(*[F.sha2(F.concat(F.lit(s), F.col("id").cast("string")), 256) for s in "ab"])
    after = F.to_json(F.struct(F.col("id").cast("string").alias("id"), name.alias("name")))
    changes = (
        template.crossJoin(spark.range(60_000))
        .withColumns({"after": after, "seq": F.col("id")})
        .drop("id")
    )
    merge_changes(spark, table, shape(), changes, SilverSettings())
    metrics = DeltaTable.forPath(spark, table).history(1).first()["operationMetrics"]  # type: ignore[index]
    assert metrics["numTargetRowsInserted"] == "60000"
    assert metrics["numTargetFilesAdded"] == "1"


def raw(spark: SparkSession, path: str) -> dict[object, dict[str, str]]:
    df = spark.read.format("delta").load(path).where(~F.col("_cdc_deleted"))
    return {r["id"]: dict(r["_cdc_raw"] or {}) for r in df.collect()}


def test_a_value_kept_as_text_comes_along_when_taken_from_an_earlier_change_or_old_key(
    spark: SparkSession, table: str
) -> None:
    """A numeric NaN has no decimal: silver keeps its text in `_cdc_raw`. A later change that
    did not send it (unchanged TOAST), in the batch or after a key change, takes the text
    along with the value (NULL), never losing it unflagged."""
    apply(spark, table, [change("c", 10, after=row(1, "stored", "NaN"))])
    apply(spark, table, [
        change("c", 20, after=row(2, "new", "NaN")),
        change("u", 30, after=row(2, "newer", UNAVAILABLE), unchanged=["amount"]),
        change("d", 40, before={"id": "1"}),
        change("c", 40, after=row(3, "moved", UNAVAILABLE), unchanged=["amount"],
               old_key={"id": "1"}),
        change("c", 50, after=row(4, "four", "NaN")),
        change("d", 60, before={"id": "4"}),
        change("c", 60, after=row(5, "moved too", UNAVAILABLE), unchanged=["amount"],
               old_key={"id": "4"}),
    ])  # fmt: skip
    assert mirror(spark, table) == [(2, "newer", None), (3, "moved", None), (5, "moved too", None)]
    assert raw(spark, table) == {2: {"amount": "NaN"}, 3: {"amount": "NaN"}, 5: {"amount": "NaN"}}
    assert unavailable(spark, table) == {2: [], 3: [], 5: []}
