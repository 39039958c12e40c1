"""The decoder against bytes captured from PostgreSQL 15 (tests/data/pgoutput, see capture.py).

Expected values come from the SQL that produced each capture, not from the decoder.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from cdc_core.errors import DecodeError
from cdc_core.lsn import Lsn
from cdc_core.pg import pgoutput as po

DATA = Path(__file__).resolve().parents[1] / "data" / "pgoutput"
INT4, TEXT, NUMERIC, BYTEA = 23, 25, 1700, 17


def load(name: str) -> list[tuple[Lsn, po.Message]]:
    """Decode a capture, tracking Stream Start/Stop the way a reader does."""
    capture = json.loads((DATA / f"{name}.json").read_text())
    out: list[tuple[Lsn, Any]] = []
    in_stream = False
    for m in capture["messages"]:
        lsn = Lsn.parse(m["lsn"])
        msg = po.decode(bytes.fromhex(m["hex"]), lsn, in_stream=in_stream)
        if isinstance(msg, po.StreamStart):
            in_stream = True
        elif isinstance(msg, po.StreamStop):
            in_stream = False
        out.append((lsn, msg))
    return out


def messages(name: str) -> list[Any]:
    return [m for _, m in load(name)]


def values(t: po.TupleData) -> list[bytes | str | None]:
    """Column values, with unchanged TOAST shown as 'u'."""
    return ["u" if c.kind is po.ColumnKind.UNCHANGED_TOAST else c.data for c in t.columns()]


def test_begin_and_commit_frame_a_transaction() -> None:
    begin, *_, commit = messages("insert_types")[:5]
    assert isinstance(begin, po.Begin)
    assert isinstance(commit, po.Commit)
    assert begin.final_lsn == commit.commit_lsn
    assert commit.end_lsn > commit.commit_lsn
    assert begin.commit_time_us == commit.commit_time_us
    assert 1_600_000_000_000_000 < commit.commit_time_us < 4_000_000_000_000_000  # Unix µs
    assert begin.xid > 0


def test_type_message_precedes_a_relation_using_an_enum() -> None:
    _, type_msg, relation, *_ = messages("insert_types")
    assert isinstance(type_msg, po.TypeInfo)
    assert (type_msg.namespace, type_msg.name) == ("public", "mood")
    assert isinstance(relation, po.Relation)
    mood = relation.columns[3]
    assert (mood.name, mood.type_oid) == ("mood", type_msg.oid)


def test_relation_describes_columns_key_and_identity() -> None:
    relation = messages("insert_types")[2]
    assert (relation.namespace, relation.name) == ("public", "items")
    assert relation.replica_identity is po.ReplicaIdentity.DEFAULT
    assert relation.xid is None
    cols = [(c.name, c.type_oid, c.is_key) for c in relation.columns]
    assert cols == [
        ("id", INT4, True),
        ("label", TEXT, False),
        ("price", NUMERIC, False),
        ("mood", relation.columns[3].type_oid, False),
        ("big", TEXT, False),
        ("data", BYTEA, False),
    ]
    assert relation.columns[2].type_modifier == ((10 << 16) | 2) + 4  # numeric(10,2)
    assert relation.columns[0].type_modifier == -1


def test_insert_carries_text_values_and_nulls() -> None:
    msgs = messages("insert_types")
    first, second = msgs[3], msgs[6]
    assert isinstance(first, po.Insert)
    assert first.relation_oid == msgs[2].oid
    assert values(first.new) == [b"1", "Zoë 東京".encode(), b"12.34", b"happy", None, b"\\x00ff10"]
    assert [c.kind for c in second.new.columns()][:2] == [po.ColumnKind.TEXT, po.ColumnKind.NULL]
    assert values(second.new) == [b"2", None, None, None, None, None]


def test_update_without_old_tuple_marks_unchanged_toast() -> None:
    update = messages("update_key_and_toast")[6]
    assert isinstance(update, po.Update)
    assert update.old_kind is None
    assert update.old is None
    assert values(update.new) == [b"1", b"b", None, None, "u", None]


def test_update_of_the_key_sends_the_old_key() -> None:
    update = messages("update_key_and_toast")[9]
    assert update.old_kind == b"K"
    assert update.old is not None
    assert values(update.old) == [b"1", None, None, None, None, None]
    assert values(update.new) == [b"10", b"b", None, None, "u", None]


def test_delete_sends_the_old_key() -> None:
    delete = messages("update_key_and_toast")[12]
    assert isinstance(delete, po.Delete)
    assert delete.old_kind == b"K"
    assert values(delete.old) == [b"10", None, None, None, None, None]


def test_replica_identity_full_sends_old_rows() -> None:
    msgs = messages("replica_identity_full")
    relation, update, delete = msgs[1], msgs[5], msgs[8]
    assert relation.replica_identity is po.ReplicaIdentity.FULL
    # the key flag marks replica identity columns: under FULL that is every column, which is
    # why primary keys are read from the catalog, not from Relation messages
    assert all(c.is_key for c in relation.columns)
    assert update.old_kind == b"O"
    assert values(update.old) == [b"1", b"one"]
    assert values(update.new) == [b"1", b"uno"]
    assert delete.old_kind == b"O"
    assert values(delete.old) == [b"1", b"uno"]


def test_truncate_lists_relations_and_flags() -> None:
    msgs = messages("truncate")
    relations = {m.oid: m.name for m in msgs if isinstance(m, po.Relation)}
    first, second = [m for m in msgs if isinstance(m, po.Truncate)]
    assert sorted(relations[o] for o in first.relation_oids) == ["items", "other"]
    assert (first.cascade, first.restart_identity) == (True, True)
    assert [relations[o] for o in second.relation_oids] == ["full_items"]
    assert (second.cascade, second.restart_identity) == (False, False)


def test_logical_messages_transactional_and_not() -> None:
    loose, begin, inside, *_ = messages("messages")
    assert isinstance(loose, po.LogicalMessage)
    assert (loose.transactional, loose.prefix, loose.content) == (
        False,
        "heartbeat",
        b"non-transactional",
    )
    assert isinstance(begin, po.Begin)
    assert (inside.transactional, inside.prefix, inside.content) == (True, "outbox", b'{"a":1}')
    assert inside.lsn < begin.final_lsn
    assert inside.xid is None


def test_origin_names_the_replication_origin() -> None:
    _, origin, *_ = messages("origin")
    assert isinstance(origin, po.Origin)
    assert origin.name == "upstream"
    assert origin.origin_lsn == Lsn.parse("0/AB")


def test_binary_values_are_kept_as_sent() -> None:
    insert = messages("binary_values")[3]
    kinds = [c.kind for c in insert.new.columns()]
    assert kinds[:3] == [po.ColumnKind.BINARY] * 3
    id_, label, price = (c.data for c in insert.new.columns()[:3])
    assert id_ == struct.pack(">i", 7)
    assert label == b"bin"
    # numeric send format: ndigits=2, weight=0, sign=+, dscale=2, digits [1, 5000] = 1.5000
    assert price == struct.pack(">hhHhhh", 2, 0, 0, 2, 1, 5000)


def test_streamed_transaction_that_commits() -> None:
    msgs = messages("streamed_commit")
    starts = [m for m in msgs if isinstance(m, po.StreamStart)]
    stops = [m for m in msgs if isinstance(m, po.StreamStop)]
    inserts = [m for m in msgs if isinstance(m, po.Insert)]
    commit = msgs[-1]
    assert len(starts) == len(stops) >= 2
    assert [s.first_segment for s in starts] == [True] + [False] * (len(starts) - 1)
    assert {s.xid for s in starts} == {commit.xid}
    assert isinstance(commit, po.StreamCommit)
    assert len(inserts) == 1001  # 1000 rows streamed in progress, then 'last'
    assert {i.xid for i in inserts} == {commit.xid}
    assert values(inserts[-1].new)[1] == b"last"
    assert commit.end_lsn > commit.commit_lsn


def test_streamed_transaction_that_aborts() -> None:
    msgs = messages("streamed_abort")
    abort = next(m for m in msgs if isinstance(m, po.StreamAbort))
    streamed = [m for m in msgs[: msgs.index(abort)] if isinstance(m, po.Insert)]
    assert len(streamed) > 0  # changes really were streamed before the abort
    assert {i.xid for i in streamed} == {abort.xid}
    assert abort.subxid == abort.xid  # the top-level transaction aborted
    after = msgs[msgs.index(abort) + 1 :]
    assert [type(m) for m in after] == [po.Begin, po.Relation, po.Insert, po.Commit]
    assert values(after[2].new)[1] == b"after abort"


def test_unknown_message_type_names_the_byte_and_lsn() -> None:
    with pytest.raises(DecodeError, match=r"unknown pgoutput message type 0x5a at LSN 16/B374D848"):
        po.decode(b"Zjunk", Lsn.parse("16/B374D848"))


def test_truncated_message_is_a_decode_error() -> None:
    capture = json.loads((DATA / "insert_types.json").read_text())
    insert = bytes.fromhex(capture["messages"][3]["hex"])
    with pytest.raises(DecodeError, match=r"malformed INSERT message at LSN 0/10"):
        po.decode(insert[:-3], 16)


def test_unknown_tuple_column_kind_is_a_decode_error() -> None:
    bad = b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">h", 1) + b"x"
    with pytest.raises(DecodeError, match="unknown tuple column kind"):
        po.decode(bad)


def test_every_captured_message_decodes() -> None:
    for path in sorted(DATA.glob("*.json")):
        assert load(path.stem), path.name


def test_the_hot_path_split_agrees_with_the_decoder() -> None:
    checked = 0
    for path in sorted(DATA.glob("*.json")):
        if path.stem.startswith("streamed"):
            continue  # the hot path serves unstreamed (protocol 1) transactions only
        for m in json.loads(path.read_text())["messages"]:
            data = bytes.fromhex(m["hex"])
            if data[:1] not in (b"I", b"U", b"D"):
                continue
            msg = po.decode(data)
            oid, old_kind, old, last = po.split_row_change(data)
            assert oid == msg.relation_oid
            if isinstance(msg, po.Delete):
                assert (old_kind, old, last) == (msg.old_kind.decode(), None, msg.old.raw)
            else:
                assert last == msg.new.raw
                kind = (
                    msg.old_kind.decode() if isinstance(msg, po.Update) and msg.old_kind else None
                )
                assert old_kind == kind
                assert old == (msg.old.raw if isinstance(msg, po.Update) and msg.old else None)
            checked += 1
    assert checked >= 10


def test_fast_tuple_values_agree_with_the_columns() -> None:
    for path in sorted(DATA.glob("*.json")):
        for _, msg in load(path.stem):
            tuples = [getattr(msg, name, None) for name in ("old", "new")]
            for t in (t for t in tuples if isinstance(t, po.TupleData)):
                expected = [
                    po.UNCHANGED if c.kind is po.ColumnKind.UNCHANGED_TOAST else c.data
                    for c in t.columns()
                ]
                assert po.tuple_values(t.raw) == expected
