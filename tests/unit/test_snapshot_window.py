"""A read's view of transactions, and what the changes it missed do to its rows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cdc_core.lsn import Lsn
from cdc_core.snapshot_window import Overtaken, ReadView

SPAN = 1 << 32


def view(xmin: int, xmax: int, xip: tuple[int, ...] = ()) -> ReadView:
    text = f"{xmin}:{xmax}:{','.join(map(str, xip))}"
    return ReadView.parse(text, "0/200", "0/100")


def test_parse_keeps_positions_and_folds_64_bit_xids() -> None:
    v = ReadView.parse(f"{SPAN + 10}:{SPAN + 20}:{SPAN + 12},{SPAN + 15}", "0/200", "0/100")
    assert (v.xmin, v.xmax, v.xip) == (10, 20, (12, 15))
    assert (v.position, v.before) == (Lsn.parse("0/200"), Lsn.parse("0/100"))


@pytest.mark.parametrize(
    ("xid", "seen"),
    [
        (5, True),
        (9, True),
        (10, True),
        (12, False),
        (13, True),
        (19, True),
        (20, False),
        (25, False),
    ],
)
def test_sees_what_committed_before_the_snapshot(xid: int, seen: bool) -> None:
    assert view(10, 20, (12,)).sees(xid) is seen  # 10: not running, below xmax: committed


def test_sees_across_wraparound() -> None:
    v = view(SPAN - 5, 3, (SPAN - 2, 1))
    assert v.sees(SPAN - 10)
    assert v.sees(SPAN - 3)
    assert not v.sees(SPAN - 2)
    assert v.sees(0)
    assert not v.sees(1)
    assert not v.sees(3)
    assert not v.sees(100)


def event(op: str, key: int, after: dict[str, Any] | None = None, *, unchanged: tuple[str, ...] = (),
          headers: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "op": op, "key": json.dumps({"id": str(key)}),
        "after": json.dumps(after) if after is not None else None,
        "unchanged": list(unchanged), "headers": list((headers or {}).items()) or None,
    }  # fmt: skip


def replay(*events: dict[str, Any]) -> Overtaken:
    out = Overtaken()
    for e in events:
        out.apply(e)
    return out


def test_a_delete_drops_and_an_update_brings_values() -> None:
    out = replay(
        event("u", 1, {"id": "1", "v": "a", "big": "__u"}, unchanged=("big",)),
        event("u", 1, {"id": "1", "v": "b", "big": "__u"}, unchanged=("big",)),
        event("d", 2),
        event("c", 3, {"id": "3", "v": "new"}),
    )
    assert out.dropped == {("2",)}
    assert out.newer == {("1",): {"id": "1", "v": "b"}}  # big not resent: the read's stands
    assert not out.moved


def test_an_update_after_a_delete_does_not_revive_the_read_row() -> None:
    out = replay(
        event("d", 1),
        event("c", 1, {"id": "1", "v": "again"}),
        event("u", 1, {"id": "1", "v": "x"}),
    )
    assert out.dropped == {("1",)}
    assert not out.newer


def test_a_row_inserted_again_after_a_delete_moves_without_the_read_row() -> None:
    """Delete, insert again and move one key, unseen by the read: the row that moves is the
    stream's insert, not the read's row the delete removed (which carried that row's
    out-of-line value to the new key, where the stream's move did not resend its own)."""
    out = replay(
        event("d", 1),
        event("c", 1, {"id": "1", "v": "again", "big": "B"}),
        event("d", 1, headers={"__debezium.newkey": json.dumps({"id": "5"})}),
        event(
            "c",
            5,
            {"id": "5", "v": "again", "big": "__u"},
            unchanged=("big",),
            headers={"__debezium.oldkey": json.dumps({"id": "1"})},
        ),
    )
    assert out.dropped == {("1",)}
    assert not out.moved  # the stream's changes carry the row: silver resolves its big
    assert not out.newer


def test_a_key_change_moves_the_row_with_what_it_did_not_resend() -> None:
    old, new = json.dumps({"id": "10"}), json.dumps({"id": "11"})
    out = replay(
        event("u", 10, {"id": "10", "v": "before move"}),
        event("d", 10, headers={"__debezium.newkey": new}),
        event(
            "c",
            11,
            {"id": "11", "v": "moved", "big": "__u"},
            unchanged=("big",),
            headers={"__debezium.oldkey": old},
        ),
        event("u", 11, {"id": "11", "v": "after move"}),
        event("d", 12, headers={"__debezium.newkey": json.dumps({"id": "13"})}),
        event("c", 13, {"id": "13"}, headers={"__debezium.oldkey": json.dumps({"id": "12"})}),
        event("d", 13),
    )
    assert out.dropped == {("10",), ("12",), ("13",)}
    assert out.moved == {("11",): (("10",), {"id": "11", "v": "after move"})}
    assert not out.newer


def test_a_row_moved_twice_comes_from_the_read_row_it_started_as() -> None:
    out = replay(
        event("d", 1, headers={"__debezium.newkey": json.dumps({"id": "2"})}),
        event(
            "c", 2, {"id": "2", "v": "x"}, headers={"__debezium.oldkey": json.dumps({"id": "1"})}
        ),
        event("d", 2, headers={"__debezium.newkey": json.dumps({"id": "3"})}),
        event("c", 3, {"id": "3"}, headers={"__debezium.oldkey": json.dumps({"id": "2"})}),
    )
    assert out.moved == {("3",): (("1",), {"id": "3", "v": "x"})}
