"""Changes silver cannot apply: refused by the typing (warn, skip) and kept in the dead-letter
table once, however often their batch runs; a table without a key's too."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaMergeBuilder, DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_core import dead_letters, faults
from cdc_core.bronze import record_schema
from cdc_core.envelope import BRONZE
from cdc_core.events import ColumnDescriptor, RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.pg.pgoutput import ReplicaIdentity
from cdc_core.pgtypes import DEFAULT_MODES, ColumnType, SilverType
from cdc_core.silver import SilverSettings, apply_silver, apply_table
from cdc_core.silver_batch import REFUSED, parsed, refusal, typed_with
from cdc_core.silver_shape import SilverColumn, TableShape

SHAPE = TableShape(
    "public", "periods",
    (SilverColumn("id", ColumnType("int4", "b", -1, False), SilverType("int"), "integer"),
     SilverColumn("valid_to", ColumnType("date", "b", -1, False), SilverType("date"), "date"),
     SilverColumn("n", ColumnType("int4", "b", -1, False), SilverType("int"), "integer")),
    ("id", "valid_to"), ReplicaIdentity.DEFAULT,
)  # fmt: skip


def change(op: str, lsn: int, seq: int, values: dict[str, str]) -> dict[str, object]:
    text = json.dumps(values)
    return {
        "op": op, "after": None if op == "d" else text, "before": text if op == "d" else None,
        "unchanged": [], "source": {"ts_us": 1_700_000_000_000_000, "lsn": lsn + seq, "txId": 7},
        "commit_lsn": lsn, "seq": seq, "source_table": "public.periods", "staged_file": "f",
    }  # fmt: skip


def bronze(spark: SparkSession, rows: list[dict[str, object]]) -> DataFrame:
    full = [{f.name: r.get(f.name) for f in BRONZE.fields} for r in rows]
    for r in full:
        given = r["source"] or {}
        r["source"] = {f.name: given.get(f.name) for f in BRONZE["source"].dataType.fields}  # type: ignore[attr-defined]
    return spark.createDataFrame(full, BRONZE)


GOOD = change("c", 100, 0, {"id": "1", "valid_to": "2024-01-01", "n": "5"})
INFINITE = change("c", 100, 1, {"id": "2", "valid_to": "infinity", "n": "6"})
UNREADABLE = change("c", 200, 0, {"id": "3", "valid_to": "2024-02-02", "n": "six"})


def test_a_key_silver_cannot_hold_still_stops_the_typing_by_default(spark: SparkSession) -> None:
    with pytest.raises(Exception) as e:  # noqa: PT011 - Spark wraps the worker's ValueError
        typed_with(parsed(bronze(spark, [GOOD, INFINITE]), SHAPE), SHAPE, DEFAULT_MODES, [])
    assert refusal(e.value) == (
        "table public.periods: key column valid_to holds 'infinity', which its silver type "
        "(date) cannot hold, so its changes could not be matched by key. The mirror stops "
        "here; other tables go on. To move on, key the table by columns whose values silver "
        "holds (message.key.columns), or choose a mode that keeps the column's text, or leave "
        "the table out, or set silver.event.processing.failure.handling.mode to warn or skip "
        "(such changes then go to the dead-letter table _state/dead_letters)"
    )


NULL_KEY = change("c", 100, 2, {"id": "4", "n": "7"})  # valid_to NULL: a nullable key column


@pytest.mark.parametrize("rows", [[GOOD, NULL_KEY], [NULL_KEY]], ids=["beside_another", "alone"])
def test_a_null_key_value_matches_no_row_and_is_refused(
    spark: SparkSession, rows: list[dict[str, object]]
) -> None:
    """message.key.columns may name a nullable column (a UNIQUE one holds many NULLs): such a
    change would match no row (a delete removes nothing, an update adds a row)."""
    reason = (
        "key column valid_to is NULL, which matches no row (message.key.columns may name a "
        "nullable column; NULL is not a key)"
    )
    with pytest.raises(Exception) as e:  # noqa: PT011 - Spark wraps the worker's ValueError
        typed_with(parsed(bronze(spark, rows), SHAPE), SHAPE, DEFAULT_MODES, [])
    assert refusal(e.value) == (
        f"table public.periods: {reason}, so its changes could not be matched by key. The "
        "mirror stops here; other tables go on. To move on, key the table by columns whose "
        "values silver holds (message.key.columns), or choose a mode that keeps the column's "
        "text, or leave the table out, or set silver.event.processing.failure.handling.mode "
        "to warn or skip (such changes then go to the dead-letter table _state/dead_letters)"
    )
    typing = typed_with(parsed(bronze(spark, [GOOD, NULL_KEY]), SHAPE), SHAPE, DEFAULT_MODES,
                        [], refusals=True)  # fmt: skip
    assert typing.refused == 1
    assert sorted((r["id"], r[REFUSED]) for r in typing.rows.collect()) == [
        (1, None), (4, reason)
    ]  # fmt: skip


def test_a_value_silver_cannot_read_stops_the_typing_by_default_naming_the_table(
    spark: SparkSession,
) -> None:
    with pytest.raises(Exception) as e:  # noqa: PT011 - Spark wraps the worker's ValueError
        typed_with(parsed(bronze(spark, [GOOD, UNREADABLE]), SHAPE), SHAPE, DEFAULT_MODES, [])
    assert refusal(e.value) == (
        "table public.periods: column n: cannot read 'six' as its type: invalid literal for "
        "int() with base 10: 'six'. The mirror stops here; other tables go on. To move on, "
        "leave the table out, or set silver.event.processing.failure.handling.mode to warn or "
        "skip (such changes then go to the dead-letter table _state/dead_letters)"
    )


def test_refused_changes_are_flagged_with_their_reason_and_every_value_s_text(
    spark: SparkSession,
) -> None:
    rows = bronze(spark, [GOOD, INFINITE, UNREADABLE])
    typing = typed_with(parsed(rows, SHAPE), SHAPE, DEFAULT_MODES, [], refusals=True)

    assert typing.refused == 2
    got = typing.rows.select(
        "_cdc_lsn",
        "_cdc_seq",
        "id",
        "n",
        F.array_sort(F.map_entries("_cdc_raw")).alias("raw"),
        REFUSED,
    )  # fmt: skip (a map cannot be compared: its entries, sorted, can)
    expected = spark.createDataFrame(
        [(100, 0, 1, 5, [], None),
         (100, 1, 2, 6, [("id", "2"), ("n", "6"), ("valid_to", "infinity")],
          "key column valid_to holds 'infinity', which its silver type (date) cannot hold"),
         (200, 0, None, None, [("id", "3"), ("n", "six"), ("valid_to", "2024-02-02")],
          "column n: cannot read 'six' as its type: invalid literal for int() with base 10: "
          "'six'")],
        got.schema,
    )  # fmt: skip
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)


def test_a_batch_without_refused_changes_counts_none_and_keeps_every_row(
    spark: SparkSession,
) -> None:
    typing = typed_with(parsed(bronze(spark, [GOOD]), SHAPE), SHAPE, DEFAULT_MODES, [],
                        refusals=True)  # fmt: skip
    assert typing.refused == 0
    assert [(r["id"], r[REFUSED]) for r in typing.rows.collect()] == [(1, None)]


def letters(
    spark: SparkSession, rows: list[dict[str, object]], table: str = "public.periods"
) -> DataFrame:
    typing = typed_with(parsed(bronze(spark, rows), SHAPE), SHAPE, DEFAULT_MODES, [],
                        refusals=True)  # fmt: skip
    return dead_letters.dead_letters(typing.rows, table)


def test_a_dead_letter_holds_the_change_s_position_op_values_and_reason(
    spark: SparkSession,
) -> None:
    got = letters(spark, [GOOD, INFINITE]).drop("commit_ts", "change_hash", "recorded_at")
    assert [r.asDict() for r in got.collect()] == [{
        "source_table": "public.periods", "op": "c", "commit_lsn": 100, "seq": 1, "lsn": 101,
        "tx_id": 7, "old_key": None, "values": {"id": "2", "valid_to": "infinity", "n": "6"},
        "reason": "key column valid_to holds 'infinity', which its silver type (date) cannot "
                  "hold",
    }]  # fmt: skip


def test_recording_the_same_dead_letters_again_adds_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = Lake(str(tmp_path))
    first = letters(spark, [GOOD, INFINITE, UNREADABLE])
    assert dead_letters.record(spark, lake, first, "public.periods") == 2
    again = letters(spark, [GOOD, INFINITE, UNREADABLE, change("d", 300, 0, {"id": "2", "valid_to": "infinity", "n": "6"})])  # fmt: skip
    assert dead_letters.record(spark, lake, again, "public.periods") == 1

    stored = spark.read.format("delta").load(lake.dead_letters)
    assert sorted((r["commit_lsn"], r["seq"], r["op"]) for r in stored.collect()) == [
        (100, 1, "c"), (200, 0, "c"), (300, 0, "d"),
    ]  # fmt: skip


def test_the_count_recorded_is_this_table_s_though_another_table_committed_right_after(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mirrors merged at once record their dead letters at once: another table's commit can
    land between this table's MERGE and the look at what it inserted."""
    lake = Lake(str(tmp_path))
    other = "public.other"
    assert dead_letters.record(spark, lake, letters(spark, [INFINITE], other), other) == 1
    execute = DeltaMergeBuilder.execute
    others = [letters(spark, [INFINITE, UNREADABLE], other)]

    def then_another_table(builder: DeltaMergeBuilder) -> object:
        done = execute(builder)
        while others:  # the other table's 1 new dead letter, committed right after
            assert dead_letters.record(spark, lake, others.pop(), other) == 1
        return done

    monkeypatch.setattr(DeltaMergeBuilder, "execute", then_another_table)
    got = letters(spark, [GOOD, INFINITE, UNREADABLE])
    assert dead_letters.record(spark, lake, got, "public.periods") == 2


def test_snapshot_reads_at_one_position_are_told_apart_by_their_values(
    spark: SparkSession, tmp_path: Path
) -> None:
    reads = [change("r", 50, -1, {"id": str(i), "valid_to": "-infinity", "n": "0"})
             for i in (1, 2)]  # fmt: skip
    lake = Lake(str(tmp_path))
    assert dead_letters.record(spark, lake, letters(spark, reads), "public.periods") == 2
    assert dead_letters.record(spark, lake, letters(spark, reads), "public.periods") == 0
    stored = spark.read.format("delta").load(lake.dead_letters)
    assert stored.select(F.col("values")["id"].alias("id")).orderBy("id").collect() == [
        ("1",), ("2",),
    ]  # fmt: skip


def test_warn_logs_each_change_with_its_lsn_and_skip_only_a_count(
    spark: SparkSession, caplog: pytest.LogCaptureFixture
) -> None:
    rows = letters(spark, [GOOD, INFINITE, UNREADABLE])
    with caplog.at_level(logging.INFO, logger="cdc_core.dead_letters"):
        dead_letters.report("public.periods", rows, "warn", 2)
    assert [r.getMessage() for r in caplog.records] == [
        "public.periods: change at LSN 0/65 (commit 0/64, #1, op c) skipped, in "
        "_state/dead_letters: key column valid_to holds 'infinity', which its silver type "
        "(date) cannot hold",
        "public.periods: change at LSN 0/C8 (commit 0/C8, #0, op c) skipped, in "
        "_state/dead_letters: column n: cannot read 'six' as its type: invalid literal for "
        "int() with base 10: 'six'",
    ]  # fmt: skip
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cdc_core.dead_letters"):
        dead_letters.report("public.periods", rows, "skip", 0)
    assert [r.getMessage() for r in caplog.records] == [
        "public.periods: 2 changes silver cannot apply skipped (0 new in _state/dead_letters)"
    ]


def test_warn_logs_the_first_1000_changes_of_a_batch_then_how_many_more(
    spark: SparkSession, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch that sets a million changes aside does not log a million lines."""
    many = [change("c", 300, seq, {"id": str(seq), "valid_to": "2024-03-03", "n": "x"})
            for seq in range(1003)]  # fmt: skip
    rows = letters(spark, many)
    with caplog.at_level(logging.INFO, logger="cdc_core.dead_letters"):
        dead_letters.report("public.periods", rows, "warn", 1003)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1001
    assert lines[0].startswith("public.periods: change at LSN 0/12C (commit 0/12C, #0, op c)")
    assert lines[999].startswith("public.periods: change at LSN 0/513 (commit 0/12C, #999, op c)")
    assert lines[1000] == "public.periods: and 3 more changes skipped, in _state/dead_letters"


TALLY = TableName("public", "tally")  # no primary key: a multiset (REPLICA IDENTITY FULL)
TALLY_RELATION = RelationDescriptor(
    1, 1, "public", "tally", ReplicaIdentity.FULL,
    (ColumnDescriptor("name", 25, -1, "text", True, "text"),
     ColumnDescriptor("n", 23, -1, "integer", True, "int4")),
    (),
)  # fmt: skip


def tally(
    op: str, lsn: int, seq: int, after: dict[str, str] | None, before: dict[str, str] | None = None
) -> dict[str, object]:
    return {
        "op": op, "after": None if after is None else json.dumps(after),
        "before": None if before is None else json.dumps(before), "unchanged": [],
        "source": {"ts_us": 1_700_000_000_000_000, "lsn": lsn + seq, "txId": 7},
        "commit_lsn": lsn, "seq": seq, "source_table": TALLY.qualified, "staged_file": "f",
    }  # fmt: skip


TALLY_CHANGES = [
    tally("c", 100, 0, {"name": "a", "n": "1"}),
    tally("c", 100, 1, {"name": "b", "n": "six"}),  # refused: not an integer's text
    tally("c", 100, 2, {"name": "b", "n": "6"}),
    tally("u", 200, 0, {"name": "a", "n": "2"}, {"name": "a", "n": "1"}),
    tally("u", 200, 1, {"name": "c", "n": "7"}, {"name": "c", "n": "seven"}),  # its old row
    tally("d", 300, 0, None, {"name": "b", "n": "six"}),  # removes the refused row: refused
]


def tally_lake(
    spark: SparkSession, tmp_path: Path, changes: list[dict[str, object]] = TALLY_CHANGES
) -> Lake:
    lake = Lake(str(tmp_path))
    record_schema(lake, TALLY_RELATION, 0)
    bronze(spark, changes).write.format("delta").save(lake.bronze)
    return lake


def mirror(spark: SparkSession, lake: Lake) -> list[tuple[object, ...]]:
    rows = spark.read.format("delta").load(lake.silver(TALLY)).collect()
    return sorted((r["name"], r["n"], r["_cdc_count"]) for r in rows)


def test_a_table_without_a_key_sets_aside_what_it_cannot_type_once_before_its_merge(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = tally_lake(spark, tmp_path)
    warn = SilverSettings(failure_handling="warn")

    def crash() -> None:
        raise RuntimeError("killed after the dead letters")

    with faults.hooked("silver.dead_letters", crash), pytest.raises(RuntimeError):
        apply_table(spark, lake, TALLY, warn)
    assert not DeltaTable.isDeltaTable(spark, lake.silver(TALLY)) or mirror(spark, lake) == []
    assert spark.read.format("delta").load(lake.dead_letters).count() == 3  # written first
    result = apply_table(spark, lake, TALLY, warn)  # the batch again: nothing recorded twice

    assert (result.changes, result.dead_letters, result.error) == (6, 3, None)
    assert mirror(spark, lake) == [("a", 2, 1), ("b", 6, 1)]
    stored = spark.read.format("delta").load(lake.dead_letters).orderBy("commit_lsn", "seq")
    assert [(r["source_table"], r["op"], r["commit_lsn"], r["seq"], r["values"], r["reason"])
            for r in stored.collect()] == [
        ("public.tally", "c", 100, 1, {"name": "b", "n": "six"},
         "column n: cannot read 'six' as its type: invalid literal for int() with base 10: "
         "'six'"),
        ("public.tally", "u", 200, 1, {"name": "c", "n": "7"},
         "old row: column n: cannot read 'seven' as its type: invalid literal for int() with "
         "base 10: 'seven'"),
        ("public.tally", "d", 300, 0, {"name": "b", "n": "six"},
         "column n: cannot read 'six' as its type: invalid literal for int() with base 10: "
         "'six'"),
    ]  # fmt: skip


def test_a_table_without_a_key_under_fail_stops_alone_naming_table_column_and_value(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = tally_lake(spark, tmp_path, TALLY_CHANGES[:3])  # one value it cannot read
    (result,) = apply_silver(spark, lake, [TALLY], SilverSettings())
    assert result.error == (
        "table public.tally: column n: cannot read 'six' as its type: invalid literal for "
        "int() with base 10: 'six'. The mirror stops here; other tables go on. To move on, "
        "leave the table out, or set silver.event.processing.failure.handling.mode to warn or "
        "skip (such changes then go to the dead-letter table _state/dead_letters)"
    )
    assert not DeltaTable.isDeltaTable(spark, lake.dead_letters)
