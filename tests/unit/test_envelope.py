"""Envelope building: staged rows (captured from a real server) -> Debezium-shaped bronze rows."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pyarrow as pa

from cdc_core.envelope import ARROW, DEFAULT_PLACEHOLDER, UNAVAILABLE, StagedContext, envelopes
from cdc_core.events import ColumnDescriptor, RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.lsn import Lsn
from cdc_core.pg import pgoutput as po
from cdc_core.reader import Assembler
from cdc_core.stager import SCHEMA, Stager, iter_rows, relations_of, staged_files
from cdc_core.unavailable import Placeholder

DATA = Path(__file__).resolve().parents[1] / "data" / "pgoutput"


def describe(
    rel: po.Relation, type_names: dict[int, str], bases: dict[str, str] | None = None
) -> RelationDescriptor:
    """`bases`: column -> its resolved type name (text when not named)."""
    columns = tuple(
        ColumnDescriptor(
            c.name,
            c.type_oid,
            c.type_modifier,
            str(c.type_oid),
            c.is_key,
            (bases or {}).get(c.name, "text"),
        )
        for c in rel.columns
    )
    key = ("id",) if rel.name in ("items", "other") else ()  # full_items has no primary key
    return RelationDescriptor(
        rel.oid, 0, rel.namespace, rel.name, rel.replica_identity, columns, key
    )


def bronze_rows(
    tmp_path: Path, capture: str, tables: list[str], skipped: frozenset[str] = frozenset(),
    *, placeholder: Placeholder = DEFAULT_PLACEHOLDER, bases: dict[str, str] | None = None,
    skip_unchanged: bool = False,
) -> list[dict[str, object]]:  # fmt: skip
    """Stage a golden capture for real, then build its envelopes (`skipped.operations`,
    `unavailable.value.placeholder`, columns' types as in `describe`)."""
    messages = json.loads((DATA / f"{capture}.json").read_text())["messages"]
    assembler = Assembler(
        [TableName.parse(t) for t in tables], functools.partial(describe, bases=bases),
        now_us=lambda: 1, skipped=skipped,
    )  # fmt: skip
    stager = Stager(
        tmp_path / "c", tmp_path / "t", source={"database": "shop", "pipeline": "orders"}
    )
    for m in messages:
        chunk = assembler.feed(Lsn.parse(m["lsn"]).value, bytes.fromhex(m["hex"]))
        if chunk is not None:
            stager.add(chunk)
    staged = stager.flush()
    assert staged is not None
    path = tmp_path / "c" / str(staged)
    rows = list(iter_rows(path))
    for r in rows:
        r["_file"] = "f"
    batch = pa.RecordBatch.from_pylist(rows, schema=SCHEMA.append(pa.field("_file", pa.string())))
    ctx = StagedContext(staged.id, relations_of(path), "shop", "orders", 1_700_000_000_123_456)
    assert staged_files(tmp_path / "c") == [staged]
    out = envelopes(batch, {"f": ctx}, placeholder, skipped=skipped, skip_unchanged=skip_unchanged)
    assert out.schema == ARROW
    return out.to_pylist()


def after(row: dict[str, object]) -> dict[str, object]:
    return json.loads(str(row["after"]))


def test_inserts_carry_every_value_as_postgresql_text(tmp_path: Path) -> None:
    first, second = bronze_rows(tmp_path, "insert_types", ["public.items"])
    assert first["op"] == "c"
    assert first["before"] is None
    assert after(first) == {
        "id": "1", "label": "Zoë 東京", "price": "12.34", "mood": "happy", "big": None, "data": "\\x00ff10",
    }  # fmt: skip
    assert json.loads(str(first["key"])) == {"id": "1"}
    assert after(second)["label"] is None
    assert first["source_table"] == "public.items"


def test_the_source_block_is_debeziums(tmp_path: Path) -> None:
    row = bronze_rows(tmp_path, "insert_types", ["public.items"])[0]
    source = row["source"]
    assert isinstance(source, dict)
    assert (source["connector"], source["name"], source["db"], source["schema"], source["table"]) == (
        "postgresql", "orders", "shop", "public", "items",
    )  # fmt: skip
    assert source["snapshot"] == "false"
    assert source["ts_us"] == source["ts_ms"] * 1000 + source["ts_us"] % 1000
    assert source["ts_ns"] == source["ts_us"] * 1000
    assert source["sequence"] == f'["{row["commit_lsn"]}","{source["lsn"]}"]'  # as Debezium's
    assert source["txId"] > 0
    assert (row["ts_us"], row["ts_ms"]) == (1_700_000_000_123_456, 1_700_000_000_123)


def test_an_update_that_leaves_toast_untouched_says_so(tmp_path: Path) -> None:
    rows = bronze_rows(tmp_path, "update_key_and_toast", ["public.items"])
    update = rows[1]
    assert update["op"] == "u"
    assert update["unchanged"] == ["big"]
    assert after(update)["big"] == UNAVAILABLE


def test_a_hex_placeholder_puts_its_octets_in_bytea_and_their_text_elsewhere(
    tmp_path: Path,
) -> None:
    placeholder = Placeholder.of("hex:3c756e6176616c61626c653e")  # "<unavalable>"
    update = bronze_rows(
        tmp_path, "update_key_and_toast", ["public.items"], placeholder=placeholder
    )[1]
    assert update["unchanged"] == ["big"]
    assert after(update)["big"] == "<unavalable>"  # a text column
    as_bytea = bronze_rows(tmp_path / "b", "update_key_and_toast", ["public.items"],
                           placeholder=placeholder, bases={"big": "bytea"})[1]  # fmt: skip
    assert as_bytea["unchanged"] == ["big"]
    assert after(as_bytea)["big"] == "\\x3c756e6176616c61626c653e"  # PostgreSQL's bytea text


def test_the_default_placeholder_in_bytea_is_its_utf8_as_in_debezium(tmp_path: Path) -> None:
    update = bronze_rows(tmp_path, "update_key_and_toast", ["public.items"],
                         bases={"big": "bytea"})[1]  # fmt: skip
    assert after(update)["big"] == "\\x" + UNAVAILABLE.encode().hex()


def test_a_primary_key_change_is_debeziums_delete_and_create(tmp_path: Path) -> None:
    rows = bronze_rows(tmp_path, "update_key_and_toast", ["public.items"])
    delete, create = rows[2], rows[3]
    assert (delete["op"], create["op"]) == ("d", "c")
    assert json.loads(str(delete["key"])) == {"id": "1"}
    assert json.loads(str(delete["before"])) == {"id": "1"}
    assert json.loads(str(create["key"])) == {"id": "10"}
    assert dict(delete["headers"]) == {"__debezium.newkey": '{"id":"10"}'}  # type: ignore[arg-type]
    assert dict(create["headers"]) == {"__debezium.oldkey": '{"id":"1"}'}  # type: ignore[arg-type]
    assert create["unchanged"] == ["big"]
    assert (delete["commit_lsn"], delete["seq"]) == (create["commit_lsn"], create["seq"])


def events(tmp_path: Path, skipped: str) -> list[tuple[object, object]]:
    """The ops and keys of `update_key_and_toast` (insert 1, update 1, move 1 -> 10, delete 10)."""
    rows = bronze_rows(tmp_path, "update_key_and_toast", ["public.items"], frozenset(skipped))
    return [(r["op"], json.loads(str(r["key"]))["id"]) for r in rows]


def test_skipping_updates_keeps_a_key_change_as_a_delete_and_a_create(tmp_path: Path) -> None:
    assert events(tmp_path, "u") == [("c", "1"), ("d", "1"), ("c", "10"), ("d", "10")]


def test_skipping_deletes_keeps_only_the_create_of_a_key_change(tmp_path: Path) -> None:
    assert events(tmp_path, "d") == [("c", "1"), ("u", "1"), ("c", "10")]


def test_skipping_creates_keeps_only_the_delete_of_a_key_change(tmp_path: Path) -> None:
    assert events(tmp_path, "c") == [("u", "1"), ("d", "1"), ("d", "10")]


def test_skipping_updates_drops_those_with_an_old_row_too(tmp_path: Path) -> None:
    rows = bronze_rows(tmp_path, "replica_identity_full", ["public.full_items"], frozenset("u"))
    assert [r["op"] for r in rows] == ["c", "d"]


def test_updates_without_change_are_left_out_when_asked_and_only_then(tmp_path: Path) -> None:
    """skip.messages.without.change: an old row (REPLICA IDENTITY FULL) equal to the new one
    is no event; an update that changed a value stays, and so does one without an old tuple
    (nothing to compare it with), as in Debezium."""
    tables = ["public.full_items", "public.items"]
    kept = bronze_rows(tmp_path / "k", "update_without_change", tables)
    skipped = bronze_rows(tmp_path / "s", "update_without_change", tables, skip_unchanged=True)

    def described(rows: list[dict[str, object]]) -> list[tuple[object, ...]]:
        return [(r["op"], r["source_table"], r["after"]) for r in rows]

    assert described(kept) == [
        ("c", "public.full_items", '{"id":"1","label":"one"}'),
        ("c", "public.full_items", '{"id":"2","label":"two"}'),
        ("u", "public.full_items", '{"id":"1","label":"one"}'),
        ("u", "public.full_items", '{"id":"2","label":"deux"}'),
        ("c", "public.items", '{"id":"1","label":"a","price":null,"mood":null,"big":null,'
         '"data":null}'),
        ("u", "public.items", '{"id":"1","label":"a","price":null,"mood":null,"big":null,'
         '"data":null}'),
    ]  # fmt: skip
    assert described(skipped) == [d for i, d in enumerate(described(kept)) if i != 2]


def test_a_delete_carries_the_old_key(tmp_path: Path) -> None:
    delete = bronze_rows(tmp_path, "update_key_and_toast", ["public.items"])[4]
    assert (delete["op"], delete["after"]) == ("d", None)
    assert json.loads(str(delete["before"])) == {"id": "10"}


def test_replica_identity_full_gives_whole_old_rows(tmp_path: Path) -> None:
    _, update, delete = bronze_rows(tmp_path, "replica_identity_full", ["public.full_items"])
    assert json.loads(str(update["before"])) == {"id": "1", "label": "one"}
    assert after(update) == {"id": "1", "label": "uno"}
    assert update["key"] is None  # no primary key
    assert json.loads(str(delete["before"])) == {"id": "1", "label": "uno"}


def test_truncates_and_messages(tmp_path: Path) -> None:
    rows = bronze_rows(tmp_path, "truncate", ["public.items", "public.full_items"])
    truncates = [r for r in rows if r["op"] == "t"]
    assert [r["source_table"] for r in truncates] == ["public.items", "public.full_items"]
    assert all(r["key"] is None and r["before"] is None and r["after"] is None for r in truncates)
    msgs = [r for r in bronze_rows(tmp_path / "m", "messages", ["public.other"]) if r["op"] == "m"]
    assert [r["message"] for r in msgs] == [
        {"prefix": "heartbeat", "content": b"non-transactional"},
        {"prefix": "outbox", "content": b'{"a":1}'},
    ]
    assert [json.loads(str(r["key"])) for r in msgs] == [
        {"prefix": "heartbeat"},
        {"prefix": "outbox"},
    ]
    assert msgs[0]["source"]["txId"] is None  # type: ignore[index]
    assert msgs[1]["source"]["txId"] > 0  # type: ignore[index]
    assert msgs[0]["source_table"] == "_messages"
