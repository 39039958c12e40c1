"""The assembler turns captured pgoutput messages into chunks of whole committed transactions."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import pytest

from cdc_core.errors import DecodeError
from cdc_core.events import ColumnDescriptor, RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.lsn import Lsn
from cdc_core.pg import pgoutput as po
from cdc_core.reader import Assembler, Budget

DATA = Path(__file__).resolve().parents[1] / "data" / "pgoutput"
ITEMS, OTHER, FULL = (
    TableName("public", "items"),
    TableName("public", "other"),
    TableName("public", "full_items"),
)


def describe(rel: po.Relation, type_names: dict[int, str]) -> RelationDescriptor:
    """A catalog-free description: the first replica-identity column stands for the key."""
    columns = tuple(
        ColumnDescriptor(
            c.name,
            c.type_oid,
            c.type_modifier,
            type_names.get(c.type_oid, str(c.type_oid)),
            c.is_key,
        )
        for c in rel.columns
    )
    key = tuple(c.name for c in rel.columns if c.is_key)[:1]
    return RelationDescriptor(
        rel.oid, 0, rel.namespace, rel.name, rel.replica_identity, columns, key
    )


def messages(name: str) -> list[tuple[int, bytes]]:
    capture = json.loads((DATA / f"{name}.json").read_text())
    return [(Lsn.parse(m["lsn"]).value, bytes.fromhex(m["hex"])) for m in capture["messages"]]


def run(assembler: Assembler, name: str) -> list:
    out = []
    for lsn, data in messages(name):
        chunk = assembler.feed(lsn, data)
        if chunk is not None:
            out.append(chunk)
    return out


def commits(name: str) -> list[po.Commit]:
    return [m for m in (po.decode(d) for _, d in messages(name)) if isinstance(m, po.Commit)]


def ops(chunk: object) -> list[str]:
    return [bytes(m[:1]).decode() for m in chunk.message]  # type: ignore[attr-defined]


def test_each_transaction_becomes_one_chunk_in_commit_order() -> None:
    chunks = run(Assembler([ITEMS], describe), "update_key_and_toast")
    assert [ops(c) for c in chunks] == [["I"], ["U"], ["U"], ["D"]]
    assert all(c.last for c in chunks)
    assert [c.end_lsn for c in chunks] == [m.end_lsn.value for m in commits("update_key_and_toast")]
    assert [c.commit_lsn for c in chunks] == [
        m.commit_lsn.value for m in commits("update_key_and_toast")
    ]
    key_change = po.decode(chunks[2].message[0])
    assert isinstance(key_change, po.Update)
    assert key_change.old_kind == b"K"
    assert key_change.old is not None
    assert key_change.old.columns()[0].data == b"1"
    assert key_change.new.columns()[0].data == b"10"
    assert chunks[3].relation_oid == [key_change.relation_oid]
    assert [c.lsn for c in chunks] == [
        [lsn] for lsn, d in messages("update_key_and_toast") if d[:1] in b"IUD"
    ]


def test_a_relation_travels_with_the_first_chunk_that_follows_it() -> None:
    chunks = run(Assembler([ITEMS], describe), "update_key_and_toast")
    assert [(r.table, r.version) for r in chunks[0].relations] == [("items", 0)]
    assert chunks[0].versions == {chunks[0].relation_oid[0]: 0}
    assert not chunks[1].relations


def test_already_staged_transactions_are_skipped_but_their_relations_kept() -> None:
    second_end = commits("update_key_and_toast")[1].end_lsn
    chunks = run(Assembler([ITEMS], describe, skip_before=second_end), "update_key_and_toast")
    assert [ops(c) for c in chunks] == [["U"], ["D"]]
    assert [r.table for r in chunks[0].relations] == ["items"]


def test_changes_of_tables_not_captured_are_dropped_but_transactions_still_end() -> None:
    chunks = run(Assembler([OTHER], describe), "update_key_and_toast")
    assert [len(c) for c in chunks] == [0, 0, 0, 0]
    assert all(c.last and c.end_lsn for c in chunks)


def test_a_large_transaction_arrives_in_chunks_within_the_budget() -> None:
    chunks = run(Assembler([OTHER], describe, budget=Budget(changes=10)), "multi_row")
    big = chunks[:3]
    assert [len(c) for c in big] == [10, 10, 5]
    assert [c.first_seq for c in big] == [0, 10, 20]
    assert [c.last for c in big] == [False, False, True]
    assert len({c.commit_lsn for c in big}) == 1


def test_a_lone_message_is_its_own_transaction_at_its_lsn() -> None:
    chunks = run(Assembler([OTHER], describe, now_us=lambda: 42), "multi_row")
    lone = chunks[1]
    assert (lone.xid, ops(lone), lone.relation_oid) == (0, ["M"], [None])
    decoded = po.decode(lone.message[0])
    assert isinstance(decoded, po.LogicalMessage)
    assert (decoded.prefix, decoded.content) == ("lone", b"between transactions")
    assert lone.commit_lsn == lone.end_lsn
    assert lone.commit_time_us == 42
    assert lone.last
    assert ops(chunks[2]) == ["U", "U", "U"]
    assert chunks[2].first_seq == 0


def test_a_staged_lone_message_is_not_staged_again() -> None:
    first = run(Assembler([OTHER], describe), "multi_row")
    lone_lsn = first[1].end_lsn
    again = run(Assembler([OTHER], describe, skip_before=Lsn(lone_lsn)), "multi_row")
    assert [ops(c) for c in again] == [["U", "U", "U"]]


def test_transactional_messages_stay_inside_their_transaction() -> None:
    chunks = run(Assembler([OTHER], describe), "messages")
    assert po.decode(chunks[0].message[0]).prefix == "heartbeat"  # type: ignore[union-attr]
    inside = chunks[1]
    assert ops(inside) == ["M", "I"]
    assert inside.relation_oid[0] is None
    assert po.decode(inside.message[0]).content == b'{"a":1}'  # type: ignore[union-attr]
    assert inside.xid > 0


def test_truncate_gives_one_change_per_captured_table_with_its_options() -> None:
    chunks = run(Assembler([ITEMS, FULL], describe), "truncate")
    truncates = [c for c in chunks if "T" in ops(c)]
    first, second = (po.decode(c.message[0]) for c in truncates)
    assert [len(c) for c in truncates] == [1, 1]  # other is not captured: items, then full_items
    assert (first.cascade, first.restart_identity) == (True, True)  # type: ignore[union-attr]
    assert (second.cascade, second.restart_identity) == (False, False)  # type: ignore[union-attr]


def test_replica_identity_full_keeps_old_rows() -> None:
    chunks = run(Assembler([FULL], describe), "replica_identity_full")
    assert [po.split_row_change(c.message[0])[1] for c in chunks] == [None, "O", "O"]
    assert chunks[0].relations[0].replica_identity is po.ReplicaIdentity.FULL


def test_a_second_relation_message_bumps_the_version() -> None:
    assembler = Assembler([ITEMS], describe)
    msgs = messages("update_key_and_toast")
    relation = next(d for _, d in msgs if d[:1] == b"R")
    for lsn, data in msgs[:5]:
        assembler.feed(lsn, data)
    assembler.feed(msgs[5][0], msgs[5][1])  # Begin of the second transaction
    assembler.feed(msgs[5][0], relation)
    assert assembler.relations[po.decode(relation).oid].version == 1
    assert assembler.versions[po.decode(relation).oid] == 1


def test_streamed_transactions_are_refused_clearly() -> None:
    lsn, data = messages("streamed_commit")[0]
    with pytest.raises(DecodeError, match="streamed transactions need protocol 2"):
        Assembler([OTHER], describe).feed(lsn, data)


def test_a_change_outside_a_transaction_is_a_protocol_error() -> None:
    lsn, data = next((lsn, d) for lsn, d in messages("insert_types") if d[:1] == b"I")
    with pytest.raises(DecodeError, match="outside any transaction"):
        Assembler([ITEMS], describe).feed(lsn, data)


def test_the_run_stops_before_the_first_transaction_at_the_end_position() -> None:
    third = commits("update_key_and_toast")[2]
    assembler = Assembler([ITEMS], describe, stop_at=third.commit_lsn)
    chunks = assembler.feed_many(messages("update_key_and_toast"))
    assert [ops(c) for c in chunks] == [["I"], ["U"]]
    assert assembler.finished
    assert not assembler.in_transaction


def test_a_batch_gives_the_same_chunks_as_one_message_at_a_time() -> None:
    one_by_one = run(Assembler([ITEMS, OTHER, FULL], describe), "truncate")
    batched = Assembler([ITEMS, OTHER, FULL], describe).feed_many(messages("truncate"))
    assert [(c.message, c.commit_lsn, c.end_lsn, c.relation_oid) for c in batched] == [
        (c.message, c.commit_lsn, c.end_lsn, c.relation_oid) for c in one_by_one
    ]


def test_a_new_shape_of_a_table_mid_chunk_splits_the_chunk() -> None:
    assembler = Assembler([ITEMS], describe)
    msgs = messages("update_key_and_toast")
    relation = next(d for _, d in msgs if d[:1] == b"R")
    begin_lsn, begin = msgs[0]
    assembler.feed(begin_lsn, begin)
    assembler.feed(*next((lsn, d) for lsn, d in msgs if d[:1] == b"R"))
    assembler.feed(*next((lsn, d) for lsn, d in msgs if d[:1] == b"I"))
    handed = assembler.feed(msgs[1][0], relation)  # the same table described again
    assert handed is not None
    assert (len(handed), handed.last, handed.versions) == (1, False, {po.decode(relation).oid: 0})
    assert assembler.chunk is not None
    assert assembler.chunk.first_seq == 1
    assert [r.version for r in assembler.chunk.relations] == [1]


def test_skipped_operations_never_reach_a_chunk_and_the_others_do() -> None:
    kept = run(Assembler([OTHER], describe, skipped=["u"]), "multi_row")
    assert [ops(c) for c in kept] == [["I"] * 25, ["M"], []]  # the update transaction still ends
    assert kept[-1].last
    inserts_gone = run(Assembler([OTHER], describe, skipped=["c", "d"]), "multi_row")
    assert [ops(c) for c in inserts_gone] == [[], ["M"], ["U", "U", "U"]]


def test_skipped_updates_keep_those_with_an_old_tuple_which_may_change_the_key() -> None:
    key_change = run(Assembler([ITEMS], describe, skipped=["u"]), "update_key_and_toast")
    updates = [m for c in key_change for m in c.message if m[:1] == b"U"]
    assert [m[5:6] for m in updates] == [b"K"]  # the plain update (N) is gone, the move stays
    full = run(Assembler([FULL], describe, skipped=["u"]), "replica_identity_full")
    assert [ops(c) for c in full] == [["I"], ["U"], ["D"]]  # an old row (O): the envelope decides


def test_skipped_truncate_leaves_the_transaction_empty() -> None:
    chunks = run(Assembler([ITEMS, FULL], describe, skipped=["t"]), "truncate")
    assert not any("T" in ops(c) for c in chunks)
    assert len(chunks) == len(run(Assembler([ITEMS, FULL], describe), "truncate"))


def test_messages_are_kept_or_dropped_by_prefix() -> None:
    def prefixes(keep: object) -> list[str]:
        chunks = run(Assembler([OTHER], describe, keep_message=keep), "messages")  # type: ignore[arg-type]
        return [
            po.decode(m).prefix  # type: ignore[union-attr]
            for c in chunks
            for m in c.message
            if m[:1] == b"M"
        ]

    assert prefixes(lambda p: True) == ["heartbeat", "outbox"]
    assert prefixes(lambda p: p == "outbox") == ["outbox"]
    assert prefixes(lambda p: False) == []


def _synthetic(seed: int) -> tuple[list[tuple[int, bytes]], list[list[tuple[int, bytes]]]]:
    """Transactions of random inserts, updates and deletes of three tables (items and other
    captured), built byte by byte; and each transaction's captured changes, in order."""
    rng = random.Random(seed)

    def relation(oid: int, name: str) -> bytes:
        column = b"\x01id\x00" + struct.pack(">Ii", 20, -1)
        return (
            b"R"
            + struct.pack(">I", oid)
            + b"public\x00"
            + name.encode()
            + b"\x00d"
            + (struct.pack(">h", 1) + column)
        )

    def change(kind: bytes, oid: int, size: int) -> bytes:
        value = b"v" * size
        return (
            kind + struct.pack(">I", oid) + b"N" + struct.pack(">hci", 1, b"t", len(value)) + value
        )

    oids = {100: "items", 200: "other", 300: "elsewhere"}
    stream: list[tuple[int, bytes]] = []
    expected: list[list[tuple[int, bytes]]] = []
    lsn = 1000
    for xid in range(1, 40):
        changes = [(rng.choice(b"IUD"), rng.choice(list(oids)), rng.randrange(1, 300))
                   for _ in range(rng.randrange(0, 60))]  # fmt: skip
        end = lsn + 10 * (len(changes) + 3)
        stream.append((lsn, b"B" + struct.pack(">QqI", end - 5, 1_700_000_000_000_000, xid)))
        if xid <= 3:
            stream += [(lsn, relation(oid, name)) for oid, name in oids.items()]
        kept = []
        for i, (kind, oid, size) in enumerate(changes):
            message = change(bytes([kind]), oid, size)
            stream.append((lsn + 10 * (i + 1), message))
            if oid != 300 and kind != ord("U"):
                kept.append((lsn + 10 * (i + 1), message))
        stream.append((end - 5, b"C\x00" + struct.pack(">QQq", end - 5, end, 1)))
        expected.append(kept)
        lsn = end
    return stream, expected


@pytest.mark.parametrize("budget", [Budget(), Budget(changes=7), Budget(nbytes=1500),
                                    Budget(changes=5, nbytes=900)])  # fmt: skip
def test_blocks_of_row_changes_split_and_filter_as_one_change_at_a_time(budget: Budget) -> None:
    stream, expected = _synthetic(seed=7)
    tables = [ITEMS, OTHER]
    assembler = Assembler(tables, describe, budget=budget, skipped=["u"])
    batched = [  # batches of 97 messages, which cut transactions anywhere
        c for i in range(0, len(stream), 97) for c in assembler.feed_many(stream[i : i + 97])
    ]
    one_by_one = run_messages(Assembler(tables, describe, budget=budget, skipped=["u"]), stream)
    key = [(c.commit_lsn, c.first_seq, c.last, c.lsn, c.relation_oid, c.message, c.nbytes)
           for c in batched]  # fmt: skip
    assert key == [
        (c.commit_lsn, c.first_seq, c.last, c.lsn, c.relation_oid, c.message, c.nbytes)
        for c in one_by_one
    ]
    # each transaction's captured changes, whole and in order, in chunks within the budget
    by_transaction: dict[int, list[tuple[int, bytes]]] = {}
    for c in batched:
        by_transaction.setdefault(c.commit_lsn, []).extend(zip(c.lsn, c.message, strict=True))
        assert len(c) <= budget.changes
        assert c.nbytes - len(c.message[-1] if len(c) else b"") < budget.nbytes
        assert c.nbytes == sum(len(m) for m in c.message)
    assert list(by_transaction.values()) == expected
    sizes = [len(c) for c in batched if c.commit_lsn == batched[-1].commit_lsn]
    if budget.changes == 7 and len(expected[-1]) > 7:
        assert sizes[:-1] == [7] * (len(sizes) - 1)


def run_messages(assembler: Assembler, stream: list[tuple[int, bytes]]) -> list:
    return [c for lsn, data in stream if (c := assembler.feed(lsn, data)) is not None]


# A captured table renamed or moved: pgoutput names it as the catalog had it at each change.


def _relation(oid: int, schema: str, name: str) -> bytes:
    column = b"\x01id\x00" + struct.pack(">Ii", 20, -1)
    return (b"R" + struct.pack(">I", oid) + schema.encode() + b"\x00" + name.encode() + b"\x00d"
            + struct.pack(">h", 1) + column)  # fmt: skip


def _insert(oid: int, value: int) -> bytes:
    text = str(value).encode()
    return b"I" + struct.pack(">I", oid) + b"N" + struct.pack(">hci", 1, b"t", len(text)) + text


def _transaction(lsn: int, *messages: bytes) -> list[tuple[int, bytes]]:
    """BEGIN, `messages`, COMMIT, at LSNs from `lsn` on (commit LSN lsn + 90)."""
    end = lsn + 100
    begin = b"B" + struct.pack(">QqI", end - 10, 1_700_000_000_000_000, lsn)
    commit = b"C\x00" + struct.pack(">QQq", end - 10, end, 1)
    return [(lsn, begin), *((lsn + i + 1, m) for i, m in enumerate(messages)), (end - 10, commit)]


def _captured(chunks: list) -> list[tuple[str, int]]:
    """Each staged change as (the table its descriptor names, its value)."""
    out = []
    described: dict[tuple[int, int], RelationDescriptor] = {}
    for c in chunks:
        described.update(((r.oid, r.version), r) for r in c.relations)
        for oid, message in zip(c.relation_oid, c.message, strict=True):
            rel = described[(oid, c.versions[oid])]
            out.append((f"{rel.schema}.{rel.table}", int(bytes(message[13:]))))
    return out


def test_a_table_renamed_while_captured_is_captured_under_its_configured_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = [
        *_transaction(1000, _relation(100, "public", "items"), _insert(100, 1)),
        *_transaction(2000, _relation(100, "public", "items_old"), _insert(100, 2)),
        *_transaction(3000, _relation(100, "archive", "items_old"), _insert(100, 3)),
        *_transaction(4000, _relation(100, "public", "items"), _insert(100, 4)),
    ]
    chunks = run_messages(Assembler([ITEMS], describe), stream)
    assert _captured(chunks) == [("public.items", n) for n in (1, 2, 3, 4)]
    assert [r.version for c in chunks for r in c.relations] == [0, 1, 2, 3]
    warned = [r.getMessage() for r in caplog.records if r.name == "cdc_core.reader"]
    assert len(warned) == 2
    assert warned[0].startswith(
        "table public.items is called public.items_old at LSN 0/7D1 (renamed, or moved to "
        "another schema; same oid 100): its changes under that name are captured as "
        "public.items's"
    )
    assert "table public.items is called archive.items_old at LSN 0/BB9" in warned[1]


def test_a_table_known_by_its_oid_is_captured_under_another_name_from_the_first_change() -> None:
    stream = _transaction(1000, _relation(100, "public", "items_old"), _insert(100, 1))
    assert _captured(run_messages(Assembler([ITEMS], describe), stream)) == []
    followed = Assembler([ITEMS], describe, oids={ITEMS: 100})
    assert _captured(run_messages(followed, stream)) == [("public.items", 1)]


def test_a_table_created_again_under_the_configured_name_takes_it_over() -> None:
    """The old table, renamed away, is no longer the one captured: its changes are dropped."""
    stream = [
        *_transaction(1000, _relation(100, "public", "items"), _insert(100, 1)),
        *_transaction(2000, _relation(200, "public", "items"), _insert(200, 2)),
        *_transaction(3000, _relation(100, "public", "items_old"), _insert(100, 3)),
        *_transaction(4000, _insert(200, 4)),
    ]
    chunks = run_messages(Assembler([ITEMS], describe), stream)
    assert _captured(chunks) == [("public.items", 1), ("public.items", 2), ("public.items", 4)]


def test_an_older_table_under_the_configured_name_is_captured_by_name_but_not_followed() -> None:
    """`oids` says which table has the name at the end of the read: one that had it before
    (swapped out by a rename, say) is captured while it has the name, never after."""
    stream = [
        *_transaction(1000, _relation(100, "public", "items"), _insert(100, 1)),
        *_transaction(2000, _relation(100, "public", "items_old"), _insert(100, 2)),
        *_transaction(3000, _relation(200, "public", "items"), _insert(200, 3)),
    ]
    chunks = run_messages(Assembler([ITEMS], describe, oids={ITEMS: 200}), stream)
    assert _captured(chunks) == [("public.items", 1), ("public.items", 3)]


def test_a_table_renamed_away_mid_transaction_keeps_the_changes_made_before() -> None:
    """Its changes before the rename are handed over with the descriptor they were read with."""
    stream = _transaction(
        1000, _relation(100, "public", "items"), _insert(100, 1),
        _relation(100, "public", "items_old"), _insert(100, 2),
    )  # fmt: skip
    chunks = run_messages(Assembler([ITEMS], describe, oids={ITEMS: 200}), stream)
    assert [(len(c), c.last, c.versions) for c in chunks] == [(1, False, {100: 0}), (0, True, {})]
    assert _captured(chunks) == [("public.items", 1)]
    followed = run_messages(Assembler([ITEMS], describe), stream)
    assert [(len(c), c.last) for c in followed] == [(1, False), (1, True)]
    assert _captured(followed) == [("public.items", 1), ("public.items", 2)]


# NumberOfEventsFiltered: what the reader drops on purpose is counted where it is dropped.


def _filtered_by_transaction(chunks: list) -> dict[int, int]:
    found: dict[int, int] = {}
    for c in chunks:
        found[c.commit_lsn] = found.get(c.commit_lsn, 0) + c.filtered
    return found


def _row_changes_by_transaction(stream: list[tuple[int, bytes]]) -> dict[int, int]:
    found: dict[int, int] = {}
    commit = 0
    for _, data in stream:
        if data[:1] == b"B":
            commit = struct.unpack(">Q", data[1:9])[0]
            found[commit] = 0
        elif data[:1] in (b"I", b"U", b"D"):
            found[commit] += 1
    return found


@pytest.mark.parametrize("budget", [Budget(), Budget(changes=7)])
def test_blocks_count_the_changes_of_tables_not_captured_and_of_skipped_operations(
    budget: Budget,
) -> None:
    stream, expected = _synthetic(seed=11)
    assembler = Assembler([ITEMS, OTHER], describe, budget=budget, skipped=["u"])
    batched = [  # batches of 97 messages: the block path, cut anywhere
        c for i in range(0, len(stream), 97) for c in assembler.feed_many(stream[i : i + 97])
    ]
    rows = _row_changes_by_transaction(stream)
    wanted = {
        commit: n - len(kept) for (commit, n), kept in zip(rows.items(), expected, strict=True)
    }
    assert sum(wanted.values()) > 0  # the synthetic stream does filter
    assert _filtered_by_transaction(batched) == wanted
    one_by_one = run_messages(
        Assembler([ITEMS, OTHER], describe, budget=budget, skipped=["u"]), stream
    )
    assert _filtered_by_transaction(one_by_one) == wanted


def test_changes_of_transactions_already_staged_are_not_counted_as_filtered() -> None:
    stream, _ = _synthetic(seed=11)
    rows = list(_row_changes_by_transaction(stream))
    later = Assembler([ITEMS], describe, skip_before=Lsn(rows[20])).feed_many(stream)
    assert {c.commit_lsn for c in later} == set(rows[20:])
    everything = _filtered_by_transaction(Assembler([ITEMS], describe).feed_many(stream))
    assert _filtered_by_transaction(later) == {k: everything[k] for k in rows[20:]}


def test_each_table_of_a_truncate_not_staged_counts_as_filtered() -> None:
    captured = run(Assembler([ITEMS, FULL], describe), "truncate")
    assert [c.filtered for c in captured] == [1, 1, 0]  # other's insert, other in the TRUNCATE
    skipped = run(Assembler([ITEMS, FULL], describe, skipped=["t"]), "truncate")
    assert [c.filtered for c in skipped] == [1, 2, 1]


def _message(lsn: int, prefix: str, content: bytes, *, transactional: bool) -> bytes:
    return (b"M" + bytes([transactional]) + struct.pack(">Q", lsn) + prefix.encode() + b"\x00"
            + struct.pack(">I", len(content)) + content)  # fmt: skip


def test_messages_filtered_out_or_not_ours_count_and_watermarks_do_not() -> None:
    from cdc_core.reader import WATERMARK_PREFIX
    from cdc_core.reset_marker import RESET_PREFIX, ResetMarker

    dropped = Assembler([OTHER], describe, keep_message=lambda p: False)
    chunks = run(dropped, "messages")
    assert (dropped.lone_filtered, [c.filtered for c in chunks]) == (1, [1])  # lone, outbox
    theirs = ResetMarker("public.other", "their_slot").encode().encode()
    ours = ResetMarker("public.other", "our_slot").encode().encode()
    assembler = Assembler([OTHER], describe, keep_message=lambda p: False, slot="our_slot")
    for lsn, (prefix, content) in enumerate(
        [(WATERMARK_PREFIX, b"0/10"), (RESET_PREFIX, theirs), (RESET_PREFIX, ours)], start=100
    ):
        assembler.feed(lsn, _message(lsn, prefix, content, transactional=False))
    assert assembler.lone_filtered == 1  # another pipeline's reset marker; the watermark is ours
