"""Schema drift the stream does not carry, found by comparing catalog entries between runs; the
schema history, where a shape that comes back is the table's shape again; and the shapes a
mirror that started over still has to take."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cdc_core.bronze import record_schema
from cdc_core.columns import ColumnRules, Rule
from cdc_core.drift import CatalogEntry, Drift, Member, drifts
from cdc_core.events import ColumnDescriptor, RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.pg.pgoutput import ReplicaIdentity
from cdc_core.pgtypes import DEFAULT_MODES
from cdc_core.silver_shape import SchemaChangeError, table_shape
from cdc_core.state import schema_history

T = TableName("public", "t")


def _recorded(entry: CatalogEntry) -> dict[str, object]:
    return {str(T): entry.to_json()}


BEFORE = CatalogEntry(10, {1: "id", 2: "a", 3: "b"})


def test_a_table_seen_for_the_first_time_or_unchanged_is_no_drift() -> None:
    assert drifts({}, {T: BEFORE}) == []
    assert drifts(_recorded(BEFORE), {T: BEFORE}) == []
    assert drifts(_recorded(BEFORE), {}) == []  # gone: the doctor names it


def test_changed_column_rules_start_the_mirror_over_for_the_columns_both_entries_have() -> None:
    rules = ColumnRules(exclude=(r"public\.t\.secret.*",), rules=(
        Rule.parse("column.mask.with.8.chars", r"public\.t\.a"),))  # fmt: skip
    before = dataclasses.replace(BEFORE, columns={1: "id", 2: "a", 3: "secret"})
    before = dataclasses.replace(before, rules=rules.applied(T, before.columns.values()))
    assert before.rules == {"a": "column.mask.with.8.chars", "secret": "excluded"}
    assert drifts(_recorded(before), {T: before}) == []
    # a column added since, that a pattern excludes, gets its values from the stream as is
    grown = dataclasses.replace(before, columns={**before.columns, 4: "secret2"})
    assert drifts(_recorded(before), {T: replace_rules(grown, rules)}) == []
    lifted = replace_rules(before, ColumnRules(rules=rules.rules))
    [drift] = drifts(_recorded(before), {T: lifted})
    assert drift == Drift(T, "had its column filters or transforms changed (secret: excluded "
                             "then, kept now)", reset=True)  # fmt: skip
    unmasked = replace_rules(before, ColumnRules(exclude=rules.exclude))
    [drift] = drifts(_recorded(before), {T: unmasked})
    assert "(a: column.mask.with.8.chars then, kept now)" in drift.reason
    older = {str(T): {k: v for k, v in before.to_json().items() if k != "column_rules"}}
    assert drifts(older, {T: lifted}) == []  # recorded before the rules were: not compared


def replace_rules(entry: CatalogEntry, rules: ColumnRules) -> CatalogEntry:
    return dataclasses.replace(entry, rules=rules.applied(T, entry.columns.values()))


def test_a_renamed_column_is_found_by_its_attnum() -> None:
    now = CatalogEntry(10, {1: "id", 2: "a2", 3: "b"})
    assert drifts(_recorded(BEFORE), {T: now}) == [Drift(T, "renamed column a -> a2")]


def test_a_dropped_column_and_a_plain_added_one_are_the_stream_s_to_tell() -> None:
    now = CatalogEntry(10, {1: "id", 3: "b", 4: "c"})  # a dropped, c added NULL everywhere
    assert drifts(_recorded(BEFORE), {T: now}) == []


TYPED = CatalogEntry(10, {1: "id", 2: "a", 3: "b"}, types={1: "integer", 2: "text", 3: "real"})


def test_a_table_without_a_key_whose_values_text_changes_is_drift() -> None:
    """Its mirror knows rows by their values' text: a dropped column or a rewritten value would
    leave a later change's old row matching nothing."""
    now = CatalogEntry(10, {1: "id", 3: "b"}, types={1: "integer", 3: "double precision"})
    (found,) = drifts(_recorded(TYPED), {T: now}, [T])
    assert found.reason == (
        "dropped column a; column b changed type (real -> double precision) (a table without a "
        "key: its mirror knows rows by their values' text)"
    )
    assert not found.reset


def test_a_keyed_table_whose_values_were_rewritten_in_place_is_drift() -> None:
    """Rows are found by their key: a dropped column is the stream's to tell, and so is a type
    whose values keep their typed value; a real in the batch before an ALTER to double would be
    typed as a double, and char(n) -> text trims every value."""
    now = CatalogEntry(10, {1: "id", 3: "b"}, types={1: "integer", 3: "double precision"})
    assert drifts(_recorded(TYPED), {T: now}) == [
        Drift(T, "column b changed type (real -> double precision), rewriting its rows in place")
    ]
    widened = CatalogEntry(10, {1: "id", 3: "b"}, types={1: "bigint", 3: "real"})
    assert drifts(_recorded(TYPED), {T: widened}) == []


@pytest.mark.parametrize(
    ("old", "new", "kept"),
    [
        ("integer", "bigint", True), ("smallint[]", "bigint[]", True),
        ("character varying(10)", "text", True), ("text", "character varying(40)", True),
        ("numeric(10,2)", "numeric(12,2)", True), ("numeric(10,2)", "numeric", True),
        ("numeric(10,2)", "numeric(12,4)", False), ("numeric", "numeric(12,4)", False),
        ("real", "double precision", False), ("character(3)", "text", False),
        ("integer", "integer[]", False),
        ("timestamp without time zone", "timestamp with time zone", False),
        ("timestamp(3) without time zone", "timestamp without time zone", True),
        ("timestamp without time zone", "timestamp(3) without time zone", False),
    ],
)  # fmt: skip
def test_a_type_change_that_keeps_every_value_s_text_is_no_drift(
    old: str, new: str, kept: bool
) -> None:
    before = CatalogEntry(10, {1: "v"}, types={1: old})
    found = drifts(_recorded(before), {T: CatalogEntry(10, {1: "v"}, types={1: new})}, [T])
    assert (found == []) is kept
    if kept:  # what keeps its text keeps its value, in a keyed table too
        assert drifts(_recorded(before), {T: CatalogEntry(10, {1: "v"}, types={1: new})}) == []


@pytest.mark.parametrize(
    ("old", "new", "kept"),
    [
        ("numeric(10,2)", "numeric(12,4)", True), ("numeric(10,2)[]", "numeric(14,4)[]", True),
        ("numeric(10,2)", "numeric(11,4)", False), ("numeric(12,4)", "numeric(10,2)", False),
        ("real", "double precision", False), ("character(3)", "character varying", False),
        ("text", "character(8)", False),
        ("timestamp(6) with time zone", "timestamp(3) with time zone", False),
        ("time(2) without time zone", "time without time zone", True),
    ],
)  # fmt: skip
def test_a_keyed_table_reads_again_only_values_no_longer_the_same(
    old: str, new: str, kept: bool
) -> None:
    before = CatalogEntry(10, {1: "v"}, types={1: old})
    found = drifts(_recorded(before), {T: CatalogEntry(10, {1: "v"}, types={1: new})})
    assert (found == []) is kept


def test_an_entry_recorded_without_types_finds_only_dropped_columns() -> None:
    recorded = {str(T): {"oid": 10, "columns": {"1": "id", "2": "a"}}}  # an older version's
    now = CatalogEntry(10, {1: "id", 2: "a"}, types={1: "bigint", 2: "text"})
    assert drifts(recorded, {T: now}, [T]) == []
    (found,) = drifts(recorded, {T: CatalogEntry(10, {1: "id"}, types={1: "bigint"})}, [T])
    assert found.reason.startswith("dropped column a (a table without a key")


def test_a_column_added_with_a_value_in_existing_rows_is_drift() -> None:
    now = CatalogEntry(10, {1: "id", 2: "a", 3: "b", 4: "c", 5: "d"}, frozenset({"id", "d"}))
    (found,) = drifts(_recorded(BEFORE), {T: now})
    assert found.reason.startswith("added column d with a value in existing rows")
    assert not found.reset


def test_a_column_dropped_and_added_again_under_its_name_is_drift() -> None:
    """The mirror holds the dropped column's values under the name: the new one's are NULL."""
    now = CatalogEntry(10, {1: "id", 3: "b", 4: "a"})
    assert drifts(_recorded(BEFORE), {T: now}) == [
        Drift(T, "column a dropped and added again (the mirror holds the dropped one's values)")
    ]


def test_a_column_added_in_a_rewrite_of_the_table_is_drift() -> None:
    """A volatile default (random(), clock_timestamp()) rewrites the table; dropped again, the
    catalog no longer says existing rows hold values; the table's new storage does."""
    before = CatalogEntry(10, {1: "id", 2: "a"}, storage="16401")
    now = CatalogEntry(10, {1: "id", 2: "a", 3: "x"}, storage="16420")
    (found,) = drifts(_recorded(before), {T: now})
    assert found.reason.startswith("added column x in a rewrite of the table")
    plain = CatalogEntry(10, {1: "id", 2: "a", 3: "x"}, storage="16401")
    assert drifts(_recorded(before), {T: plain}) == []  # NULL in every existing row
    rewritten = CatalogEntry(10, {1: "id", 2: "a"}, storage="16420")  # VACUUM FULL, CLUSTER
    assert drifts(_recorded(before), {T: rewritten}) == []


def test_a_column_computed_again_by_alter_type_using_is_drift() -> None:
    """`ALTER ... TYPE integer USING a * 2` keeps the type in the catalog and rewrites every
    value with no change in the stream. Its traces: the column's catalog row is new, and so is
    the table's storage, which the same type would not have rewritten by itself."""
    before = CatalogEntry(10, {1: "id", 2: "a"}, types={1: "integer", 2: "integer"},
                          storage="16401", versions={1: "700", 2: "700"})  # fmt: skip
    using = dataclasses.replace(before, storage="16420", versions={1: "700", 2: "745"})
    reason = "column a computed again in a rewrite of the table (ALTER ... TYPE ... USING)"
    assert drifts(_recorded(before), {T: using}) == [Drift(T, reason)]
    assert drifts(_recorded(before), {T: using}, [T]) == [Drift(T, reason)]  # a multiset too
    vacuumed = dataclasses.replace(before, storage="16420")  # VACUUM FULL, CLUSTER
    assert drifts(_recorded(before), {T: vacuumed}) == []
    altered = dataclasses.replace(before, versions={1: "700", 2: "745"})  # SET NOT NULL
    assert drifts(_recorded(before), {T: altered}) == []
    widened = dataclasses.replace(using, types={1: "integer", 2: "bigint"})  # rewrites anyway
    assert drifts(_recorded(before), {T: widened}) == []
    renamed = dataclasses.replace(using, columns={1: "id", 2: "b"})  # the rename reads it again
    assert drifts(_recorded(before), {T: renamed}) == [Drift(T, "renamed column a -> b")]
    older = {str(T): {k: v for k, v in before.to_json().items() if k != "column_versions"}}
    assert drifts(older, {T: using}) == []  # recorded before versions were: not compared


def test_an_enum_value_renamed_is_drift() -> None:
    """`ALTER TYPE mood RENAME VALUE 'sad' TO 'blue'` keeps the label's oid: rows holding it
    read 'blue' with no change, the mirror holds 'sad'. A value added is no drift."""
    before = CatalogEntry(10, {1: "id", 2: "m"}, labels={700: ("mood", "sad"), 701: ("mood", "ok")})
    renamed = dataclasses.replace(before, labels={700: ("mood", "it's"), 701: ("mood", "ok")})
    assert drifts(_recorded(before), {T: renamed}) == [Drift(T, (
        "enum value renamed (mood 'sad' -> 'it''s': rows holding it read the new name)"))]  # fmt: skip
    assert drifts(_recorded(before), {T: renamed}, [T])[0].reason.startswith("enum value renamed")
    added = dataclasses.replace(before, labels={**before.labels, 702: ("mood", "happy")})
    assert drifts(_recorded(before), {T: added}) == []
    older = {str(T): {k: v for k, v in before.to_json().items() if k != "enum_labels"}}
    assert drifts(older, {T: renamed}) == []  # recorded before labels were: not compared


def test_a_composite_type_with_an_attribute_added_or_dropped_is_drift() -> None:
    """`ALTER TYPE pair ADD ATTRIBUTE z int` turns every value's text `(1,2)` into `(1,2,)`
    with no change; renaming an attribute changes no text."""
    before = CatalogEntry(10, {1: "id", 2: "p"}, composites={800: ("pair", "1 integer, 2 text")})
    added = dataclasses.replace(before, composites={800: ("pair", "1 integer, 2 text, 3 integer")})
    [drift] = drifts(_recorded(before), {T: added})
    assert drift.reason == ("composite type pair's attributes changed (1 integer, 2 text -> "
                            "1 integer, 2 text, 3 integer: every value of it reads otherwise)")  # fmt: skip
    dropped = dataclasses.replace(before, composites={800: ("pair", "1 integer")})
    assert drifts(_recorded(before), {T: dropped}, [T])[0].reason.startswith("composite type pair")
    renamed = dataclasses.replace(before, composites={800: ("pair2", "1 integer, 2 text")})
    assert drifts(_recorded(before), {T: renamed}) == []
    older = {str(T): {k: v for k, v in before.to_json().items() if k != "composite_types"}}
    assert drifts(older, {T: added}) == []  # recorded before composites were: not compared


@pytest.mark.parametrize(
    ("old", "new", "as_is"),
    [  # what ALTER ... TYPE new without USING did to the table's storage on PostgreSQL 15
        ("integer", "integer", True), ("integer", "bigint", False),
        ("character varying(10)", "character varying(20)", True),
        ("character varying(20)", "character varying(10)", False),
        ("character varying(10)", "text", True), ("text", "character varying", True),
        ("character varying(10)", "character varying", True),
        ("text", "character varying(10)", False), ("character(4)", "character(8)", False),
        ("numeric(10,2)", "numeric(12,2)", True), ("numeric(10,2)", "numeric", True),
        ("numeric(12,2)", "numeric(10,2)", False), ("numeric(10,2)", "numeric(12,4)", False),
        ("timestamp(3) without time zone", "timestamp(6) without time zone", True),
        ("timestamp with time zone", "timestamp(6) with time zone", True),
        ("timestamp(6) without time zone", "timestamp(3) without time zone", False),
        ("time(3) without time zone", "time(6) without time zone", True),
        ("character varying(10)[]", "character varying(20)[]", False),
        ("character varying(10)[]", "text[]", False), ("integer[]", "integer[]", True),
    ],
)  # fmt: skip
def test_a_type_change_that_rewrites_nothing_by_itself_points_at_a_using_expression(
    old: str, new: str, as_is: bool
) -> None:
    before = CatalogEntry(10, {1: "v"}, types={1: old}, storage="1", versions={1: "700"})
    now = CatalogEntry(10, {1: "v"}, types={1: new}, storage="2", versions={1: "745"})
    found = [d for d in drifts(_recorded(before), {T: now}) if "computed again" in d.reason]
    assert bool(found) is as_is


def _partitioned(*members: Member, nodes: dict[int, int] | None = None) -> CatalogEntry:
    files = ",".join(f"{m.oid}:{(nodes or {}).get(m.oid, m.oid + 1000)}" for m in members)
    return CatalogEntry(10, {1: "id", 2: "a"}, storage=files, members=members)


def _part(oid: int, *, parent: int = 10, attached: bool = False, filled: bool = True) -> Member:
    return Member(oid, parent, f"t_{oid}", attached, filled)


def test_a_partition_attached_holding_rows_or_gone_is_drift() -> None:
    """Rows a partitioned table gained or lost with no change: a partition detached or dropped,
    a table holding rows attached (at any level). A partition created as one starts empty."""
    before = _partitioned(_part(20), _part(30))
    created = _partitioned(_part(20), _part(30), _part(40))  # CREATE TABLE ... PARTITION OF
    attached_empty = _partitioned(_part(20), _part(30), _part(40, attached=True, filled=False))
    moved = _partitioned(_part(20), _part(30), nodes={20: 9999})  # VACUUM FULL of a partition
    for now in (created, attached_empty, moved):
        assert drifts(_recorded(before), {T: now}) == []
    attached = _partitioned(_part(20), _part(30), _part(40, attached=True))
    assert drifts(_recorded(before), {T: attached}) == [
        Drift(T, "t_40 attached as a partition holding rows no change carried")
    ]
    below = _partitioned(_part(20), _part(30), _part(50, attached=True, filled=False),
                         _part(51, parent=50))  # fmt: skip
    assert drifts(_recorded(before), {T: below}) == [
        Drift(T, "t_50 attached as a partition holding rows no change carried")
    ]
    gone = _partitioned(_part(20))
    assert drifts(_recorded(before), {T: gone}) == [
        Drift(
            T, "1 partition detached or dropped (oid 30): the mirror holds rows no change deleted"
        )
    ]
    older = CatalogEntry(10, {1: "id", 2: "a"}, storage="1020,1030")  # before oids were kept
    assert drifts(_recorded(older), {T: gone}) == []


def test_a_plain_column_added_beside_a_new_partition_is_no_drift() -> None:
    """A partition created, or one gone, is no rewrite of the partitions still there."""
    before = _partitioned(_part(20))
    now = dataclasses.replace(_partitioned(_part(20), _part(40)), columns={1: "id", 2: "a", 3: "x"})
    assert drifts(_recorded(before), {T: now}) == []
    rewritten = dataclasses.replace(now, storage="20:5555,40:1040")
    (found,) = drifts(_recorded(before), {T: rewritten})
    assert found.reason.startswith("added column x in a rewrite of the table")


def test_a_recreated_table_starts_over() -> None:
    now = CatalogEntry(11, {1: "id", 2: "a", 3: "b"})
    assert drifts(_recorded(BEFORE), {T: now}) == [
        Drift(T, "was dropped and created again (oid 10, now 11)", reset=True)
    ]


def _shape(key: tuple[str, ...], version: int = 0) -> RelationDescriptor:
    columns = tuple(ColumnDescriptor(n, 23, -1, "integer", n in key, "int4") for n in ("id", "v"))
    return RelationDescriptor(10, version, "public", "t", ReplicaIdentity.DEFAULT, columns, key)


def test_a_shape_that_comes_back_is_the_newest_again(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    keyed, unkeyed = _shape(("id",)), _shape(())
    for lsn, shape in ((100, keyed), (200, unkeyed), (300, keyed), (400, keyed), (300, keyed)):
        record_schema(lake, shape, lsn)  # 400 is still the key; 300 again is a replay
    history = schema_history(lake, "public.t")
    assert [(lsn, d.primary_key) for lsn, d in history] == [
        (100, ("id",)),
        (200, ()),
        (300, ("id",)),
    ]
    record_schema(lake, unkeyed, 150)  # an older file replayed: the shape it had then is new
    assert [lsn for lsn, _ in schema_history(lake, "public.t")] == [100, 150, 200, 300]


def test_within_one_file_the_later_version_is_the_newer_shape(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    record_schema(lake, _shape(("id",), version=0), 100)
    record_schema(lake, _shape((), version=1), 100)
    assert schema_history(lake, "public.t")[-1][1].primary_key == ()


def _typed(v_type: str, version: int = 0) -> RelationDescriptor:
    oid, name = {"int8": (20, "bigint"), "text": (25, "text")}[v_type]
    columns = (
        ColumnDescriptor("id", 23, -1, "integer", True, "int4"),
        ColumnDescriptor("v", oid, -1, name, False, v_type),
    )
    return RelationDescriptor(10, version, "public", "t", ReplicaIdentity.DEFAULT, columns, ("id",))


def test_an_incompatible_type_stops_the_mirror_until_it_starts_over_after_it() -> None:
    history = [(100, _typed("int8")), (200, _typed("text"))]
    with pytest.raises(SchemaChangeError, match=r"column v changed type from bigint to text"):
        table_shape(history, DEFAULT_MODES)
    with pytest.raises(SchemaChangeError, match=r"cdc snapshot --table public.t"):
        table_shape(history, DEFAULT_MODES, since=100)  # bigint rows may still be applied
    rebuilt = table_shape(history, DEFAULT_MODES, since=150)  # it started over in a later file
    assert [(c.name, c.type_name) for c in rebuilt.columns] == [("id", "integer"), ("v", "text")]


def test_a_type_changed_and_reverted_before_the_mirror_started_over_is_the_newest() -> None:
    history = [(100, _typed("int8")), (200, _typed("text")), (300, _typed("int8"))]
    with pytest.raises(SchemaChangeError, match=r"changed type from bigint to text"):
        table_shape(history, DEFAULT_MODES)
    with pytest.raises(SchemaChangeError, match=r"changed type from text to bigint"):
        table_shape(history, DEFAULT_MODES, since=200)  # text rows may still be applied
    shape = table_shape(history, DEFAULT_MODES, since=250)
    assert [c.type_name for c in shape.columns] == ["integer", "bigint"]
    widened = [(100, _typed("int8")), (300, _typed("int8"))]  # no conflict: since changes nothing
    assert table_shape(widened, DEFAULT_MODES, since=250) == table_shape(widened, DEFAULT_MODES)


def _timed(modifier: int) -> RelationDescriptor:
    name = "time without time zone" if modifier < 0 else f"time({modifier}) without time zone"
    columns = (
        ColumnDescriptor("id", 23, -1, "integer", True, "int4"),
        ColumnDescriptor("t", 1083, modifier, name, False, "time", base_modifier=modifier),
    )
    return RelationDescriptor(10, 0, "public", "t", ReplicaIdentity.DEFAULT, columns, ("id",))


def test_a_time_whose_unit_changes_stops_the_mirror() -> None:
    """time(3) is int milliseconds, time(6) long microseconds (adaptive, Debezium's default):
    Delta widens int to long, but the rows already mirrored would stay in milliseconds."""
    for after in (6, -1):
        history = [(100, _timed(3)), (200, _timed(after))]
        with pytest.raises(SchemaChangeError, match=r"column t changed type from time\(3\) "
                           r"without time zone to time.* \(int -> long\)"):  # fmt: skip
            table_shape(history, DEFAULT_MODES)
    same_unit = [(100, _timed(4)), (200, _timed(6)), (300, _timed(-1))]
    assert [c.silver.name for c in table_shape(same_unit, DEFAULT_MODES).columns] == ["int", "long"]
    micros = dataclasses.replace(DEFAULT_MODES, time_precision="adaptive_time_microseconds")
    history = [(100, _timed(3)), (200, _timed(6))]  # long microseconds either way
    assert table_shape(history, micros).columns[1].silver.name == "long"
    nanos = dataclasses.replace(DEFAULT_MODES, time_precision="nanoseconds")
    assert table_shape(history, nanos).columns[1].silver.name == "long"  # nanoseconds either way


def _named(v_name: str) -> RelationDescriptor:
    columns = (
        ColumnDescriptor("id", 23, -1, "integer", True, "int4"),
        ColumnDescriptor(v_name, 23, -1, "integer", False, "int4"),
    )
    return RelationDescriptor(10, 0, "public", "t", ReplicaIdentity.DEFAULT, columns, ("id",))


def test_a_column_renamed_only_in_case_stops_the_mirror_until_it_starts_over_after_it() -> None:
    """Spark and Delta take "A" and a for one column: the union of both would be ambiguous."""
    history = [(100, _named("a")), (200, _named("A"))]
    with pytest.raises(SchemaChangeError, match=r"columns a and A differ only in case"):
        table_shape(history, DEFAULT_MODES)
    with pytest.raises(SchemaChangeError, match=r"cdc snapshot --table public.t"):
        table_shape(history, DEFAULT_MODES, since=100)  # rows with a may still be applied
    rebuilt = table_shape(history, DEFAULT_MODES, since=150)
    assert [c.name for c in rebuilt.columns] == ["id", "A"]
    back = table_shape([*history, (300, _named("a"))], DEFAULT_MODES, since=250)
    assert [c.name for c in back.columns] == ["id", "a"]  # renamed back: the newest only
