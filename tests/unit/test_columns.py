"""Column filters and transforms: Debezium's hash outputs, and row messages rewritten exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc_core.columns import SILVER_OWN, ColumnRules, Rule, java_serialized
from cdc_core.events import ColumnDescriptor, RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.lsn import Lsn
from cdc_core.pg import pgoutput as po
from cdc_core.reader import Assembler

DATA = Path(__file__).resolve().parents[1] / "data" / "pgoutput"
ITEMS = TableName("public", "items")
_TYPES = {23: ("int4", "b"), 25: ("text", "b"), 1700: ("numeric", "b"), 17: ("bytea", "b")}

# Debezium's MaskStrings.HashValueConverter run on the JVM (Java 17: MessageDigest over the
# salt's bytes, then ObjectOutputStream.writeObject(value) for v1, value.getBytes() for v2).
JVM_VECTORS = [  # algorithm, salt, value, v1 hex, v2 hex
    ("SHA-256", "CzQMA0cB5K", "Sally Thomas",
     "c52d535f7d1aeb9573ec6b1aadcd32d89f66d480ac00307c021659c9eedb96fd",
     "649ef7111a7e2b04bd5f69c067e2d22173abf15eb5f59462140ba4dac06860ae"),
    ("SHA-256", "CzQMA0cB5K", "é€😀\x00x",
     "9f515d362225d8754d8cefdfd7878cd8d491e1950daf37b45a89c5fa8ceb7cab",
     "faa7bd1fbbdc4860f77aed5420b953821dd402a96ea7f907147c22ce482e27a6"),
    ("MD5", "salt", "", "f7b84b26a44d5b5a9eb9895429174c85", "ceb20772e0c9d240c75eb26b0e37abee"),
    ("SHA-512", "s", "annek@noanswer.org",
     "39dfb33335b18f57b6935bc76eb644ba489f4012668c2f6435a67af6097c65ae9f9b1047c9bddadbc9784b934204165337e7c9e0f9ad00a936fa2876bfa463ee",
     "59f22e8b7566849a492939167ceac1d653eb7bc5af4ab2a7bd3c3fc9f7e2bb590fd0bcef930ea2bf6be298ea5cbbe8ff0d67be993308d1359d156c43db49bb5a"),
]  # fmt: skip


def column(
    name: str, base: str = "text", modifier: int = -1, key: bool = False
) -> ColumnDescriptor:
    return ColumnDescriptor(name, 25, modifier, base, key, base, "b", modifier)


@pytest.mark.parametrize(("algorithm", "salt", "value", "v1", "v2"), JVM_VECTORS)
def test_hashes_equal_debeziums_on_the_jvm(
    algorithm: str, salt: str, value: str, v1: str, v2: str
) -> None:
    c = column("name")
    assert (
        Rule.parse(f"column.mask.hash.{algorithm}.with.salt.{salt}", "x").transform(c)(value) == v1
    )
    assert (
        Rule.parse(f"column.mask.hash.v2.{algorithm}.with.salt.{salt}", "x").transform(c)(value)
        == v2
    )


def test_a_hash_is_cut_to_the_declared_length_of_the_column() -> None:
    rule = Rule.parse("column.mask.hash.v2.SHA-256.with.salt.CzQMA0cB5K", "x")
    assert rule.transform(column("c", "varchar", 12 + 4))("Sally Thomas") == "649ef7111a7e"
    assert rule.transform(column("c", "bpchar", 4 + 4))("Sally Thomas") == "649e"


def test_java_serialization_of_strings() -> None:
    assert java_serialized("ab") == bytes.fromhex("aced0005740002") + b"ab"
    assert java_serialized("\x00") == bytes.fromhex("aced0005740002c080")
    assert java_serialized("x" * 70000)[:5] == bytes.fromhex("aced00057c")


def test_truncate_and_mask() -> None:
    assert Rule.parse("column.truncate.to.3.chars", "x").transform(column("c"))("abcdef") == "abc"
    assert Rule.parse("column.mask.with.5.chars", "x").transform(column("c"))("secret!") == "*****"
    assert Rule.parse("column.mask.with.0.chars", "x").transform(column("c"))("secret") == ""


@pytest.mark.parametrize(
    ("key", "fragment"),
    [("column.mask.hash.SHA-999.with.salt.x", "unknown hash algorithm 'SHA-999'"),
     ("column.truncate.to.x.chars", "not a column transform"),
     ("column.mask.with.5", "not a column transform")],
)  # fmt: skip
def test_bad_rules_say_what_is_wrong(key: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        Rule.parse(key, "public.t.c")


def test_truncating_to_zero_characters_is_refused_as_in_debezium() -> None:
    with pytest.raises(ValueError, match=r"must be positive.*column\.mask\.with\.0\.chars"):
        Rule.parse("column.truncate.to.0.chars", "public.t.c")
    with pytest.raises(ValueError, match="must be positive"):
        Rule.parse("column.truncate.to.00.chars", "public.t.c")


def test_an_escaped_comma_belongs_to_the_expression() -> None:
    rule = Rule.parse("column.mask.with.3.chars", r"public\.t\.c{1\,2}, public\.t\.x")
    assert rule.patterns == (r"public\.t\.c{1,2}", r"public\.t\.x")
    assert rule.matches("public.t.cc")
    assert not rule.matches("public.t.ccc")


CUSTOMERS = RelationDescriptor(
    1, 0, "public", "Customers", po.ReplicaIdentity.DEFAULT,
    (column("id", key=True), column("Email"), column("Notes"), column("SSN")), ("id",),
)  # fmt: skip


def test_lower_case_rules_mask_and_drop_mixed_case_columns_as_in_debezium() -> None:
    rules = ColumnRules(
        exclude=(r"public\.customers\.ssn",),
        rules=(Rule.parse("column.mask.with.3.chars", r"public\.customers\.email"),
               Rule.parse("column.truncate.to.2.chars", r"PUBLIC\.CUSTOMERS\.NOTES")),
    )  # fmt: skip
    plan = rules.plan(CUSTOMERS)
    assert plan is not None
    assert [c.name for c in plan.descriptor.columns] == ["id", "Email", "Notes"]
    row = {"id": "1", "Email": "ann@example.com", "Notes": "vip", "SSN": "123-45-6789"}
    assert plan.text(row) == {"id": "1", "Email": "***", "Notes": "vi"}


def test_a_column_several_rules_match_gets_only_one_and_a_mask_beats_a_truncation() -> None:
    # ColumnMappers.create registers mask before hash v1 before hash v2, and mapperFor applies
    # the first that matches: the order they are written in does not count. Debezium puts
    # truncation first; here it comes last, so a masked column never lands in clear.
    hash_v2 = Rule.parse("column.mask.hash.v2.SHA-256.with.salt.CzQMA0cB5K", r".*\.email")
    hash_v1 = Rule.parse("column.mask.hash.SHA-256.with.salt.CzQMA0cB5K", r".*\.email")
    mask = Rule.parse("column.mask.with.3.chars", r".*\.(email|ssn)")
    cut = Rule.parse("column.truncate.to.2.chars", r".*\.(ssn|notes)")
    plan = ColumnRules(rules=(cut, hash_v2, hash_v1, mask)).plan(CUSTOMERS)
    assert plan is not None
    row = {"id": "1", "Email": "Sally Thomas", "Notes": "vip", "SSN": "123-45-6789"}
    assert plan.text(row) == {"id": "1", "Email": "***", "Notes": "vi", "SSN": "***"}
    plan = ColumnRules(rules=(hash_v2, hash_v1)).plan(CUSTOMERS)
    assert plan is not None
    assert plan.text({"Email": "Sally Thomas"})["Email"] == JVM_VECTORS[0][3]


def test_a_lower_case_include_list_keeps_mixed_case_columns() -> None:
    plan = ColumnRules(include=(r"public\.customers\.(id|email)",)).plan(CUSTOMERS)
    assert plan is not None
    assert [c.name for c in plan.descriptor.columns] == ["id", "Email"]


def describe(rel: po.Relation, type_names: dict[int, str]) -> RelationDescriptor:
    columns = tuple(
        ColumnDescriptor(c.name, c.type_oid, c.type_modifier, str(c.type_oid), c.is_key,
                         *_TYPES.get(c.type_oid, ("mood", "e")), c.type_modifier)
        for c in rel.columns
    )  # fmt: skip
    full = rel.replica_identity is po.ReplicaIdentity.FULL  # the catalog's key: none there
    key = () if full else tuple(c.name for c in rel.columns if c.is_key)
    return RelationDescriptor(
        rel.oid, 0, rel.namespace, rel.name, rel.replica_identity, columns, key
    )


def staged(rules: ColumnRules) -> tuple[list[RelationDescriptor], list[bytes]]:
    capture = json.loads((DATA / "update_key_and_toast.json").read_text())
    assembler = Assembler([ITEMS], describe, columns=rules)
    relations, changes = [], []
    for m in capture["messages"]:
        chunk = assembler.feed(Lsn.parse(m["lsn"]).value, bytes.fromhex(m["hex"]))
        if chunk is not None:
            relations += chunk.relations
            changes += chunk.message
    return relations, changes


def test_excluded_columns_and_masked_values_never_reach_a_chunk() -> None:
    rules = ColumnRules(
        exclude=(r"public\.items\.(big|data)", r"public\.items\.id"),  # the key always stays
        rules=(Rule.parse("column.mask.with.3.chars", r"public\.items\.label"),
               Rule.parse("column.truncate.to.1.chars", r"public\.items\.(label|id)")),
    )  # fmt: skip
    relations, changes = staged(rules)
    assert [c.name for c in relations[0].columns] == ["id", "label", "price", "mood"]
    _, raw = staged(ColumnRules())
    assert [m[:1] for m in changes] == [m[:1] for m in raw] == [b"I", b"U", b"U", b"D"]
    rows = []
    for data in changes:
        _, _, old, new = po.split_row_change(data)
        values = po.tuple_values(new)
        assert len(values) == 4
        rows.append(values)
        if old is not None:
            assert len(po.tuple_values(old)) == 4
    # label: masked, not cut (a mask beats a truncation, one rule per column); id untouched
    assert rows[0][:2] == [b"1", b"***"]
    assert rows[1][:2] == [b"1", b"***"]
    assert rows[2][0] == b"10"
    assert rows[3][0] == b"10"  # the delete's old key
    assert b"xxxx" not in b"".join(changes)


def test_tables_without_rules_are_not_rewritten() -> None:
    relations, changes = staged(ColumnRules(exclude=(r"public\.other\..*",)))
    _, raw = staged(ColumnRules())
    assert changes == raw
    assert len(relations[0].columns) == 6


def test_replica_identity_full_keeps_only_key_columns_from_exclusion() -> None:
    capture = json.loads((DATA / "replica_identity_full.json").read_text())
    full = TableName("public", "full_items")
    assembler = Assembler(
        [full], describe, columns=ColumnRules(exclude=(r"public\.full_items\.label",))
    )
    chunks = [
        c for m in capture["messages"]
        if (c := assembler.feed(Lsn.parse(m["lsn"]).value, bytes.fromhex(m["hex"]))) is not None
    ]  # fmt: skip
    relation = next(r for c in chunks for r in c.relations)
    assert [c.name for c in relation.columns] == ["id"]  # under FULL every column is flagged
    for data in (m for c in chunks for m in c.message):
        _, old_kind, old, new = po.split_row_change(data)
        assert len(po.tuple_values(new)) == 1
        if old is not None:
            assert old_kind == "O"
            assert len(po.tuple_values(old)) == 1


def test_the_columns_silver_adds_are_the_names_no_source_column_may_have() -> None:
    from cdc_core.silver_shape import CDC_COLUMNS, MULTISET_COLUMNS

    assert set(SILVER_OWN) == {f.name for f in [*CDC_COLUMNS.fields, *MULTISET_COLUMNS.fields]}
