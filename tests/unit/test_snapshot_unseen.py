"""Transactions a read's snapshot had running though the stream has their commits before its low
watermark (a commit flushed, waiting for a synchronous standby): found among the staged files by
id, searched back from the low watermark only as far as the captures' floors leave an id open."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from cdc_core.events import ChangeChunk
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.snapshot_window import ReadView, overtaken
from cdc_core.stager import StagedFile, Stager, XidFloor, read_metadata
from tests.unit.test_stager import ORDERS

TABLE = TableName("public", "orders")


def _tuple(*values: str | None) -> bytes:
    out = struct.pack(">h", len(values))
    for v in values:
        out += b"n" if v is None else b"t" + struct.pack(">i", len(v)) + v.encode()
    return out


def update(key: int, note: str) -> bytes:
    return b"U" + struct.pack(">I", ORDERS.oid) + b"N" + _tuple(str(key), note)


def delete(key: int) -> bytes:
    return b"D" + struct.pack(">I", ORDERS.oid) + b"K" + _tuple(str(key), None)


def transaction(xid: int, commit: int, *messages: bytes) -> ChangeChunk:
    c = ChangeChunk(xid=xid, commit_lsn=commit, commit_time_us=1_700_000_000_000_000, first_seq=0)
    for i, m in enumerate(messages):
        c.add(commit - 50 + i, ORDERS.oid, m)
    c.versions = {ORDERS.oid: 0}
    c.relations.append(ORDERS)
    c.last, c.end_lsn = True, commit + 8
    return c


def stage(lake: Lake, floor: XidFloor | None, *transactions: ChangeChunk) -> StagedFile:
    """One staged file of `transactions`, written by a capture that saw `floor`."""
    s = Stager(lake.changes, lake.staging_tmp, floor=floor)
    for t in transactions:
        s.add(t)
    staged = s.flush()
    assert staged is not None
    return staged


def read(xip: tuple[int, ...], before: int, position: int, xmax: int = 1000) -> ReadView:
    """A read whose snapshot had `xip` running (xmin the oldest of them; every transaction of
    these tests but those finished before `xmax`)."""
    xmin = min(xip, default=xmax)
    return ReadView.parse(f"{xmin}:{xmax}:{','.join(map(str, xip))}", str(Lsn(position)),
                          str(Lsn(before)))  # fmt: skip


def spoil(lake: Lake, staged: StagedFile) -> None:
    """Make a staged file unreadable: a search that opens it fails."""
    (lake.changes / str(staged)).write_bytes(b"not parquet")


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return Lake(str(tmp_path / "lake"))


def test_a_commit_before_the_low_watermark_the_snapshot_did_not_see_overtakes_the_read(
    lake: Lake,
) -> None:
    stage(lake, XidFloor(Lsn(0x1000), 800), transaction(700, 0x900, update(1, "new"), delete(2)))
    stage(lake, XidFloor(Lsn(0x2000), 810), transaction(805, 0x1900, update(3, "other")))
    out = overtaken(lake, TABLE, ["id"], read((700, 820), before=0x2100, position=0x3000))
    assert out.newer == {("1",): {"id": "1", "note": "new"}}
    assert out.dropped == {("2",)}  # 805 the read saw (not running): its update stays out


def test_a_skipped_operation_does_not_overtake_the_read(lake: Lake) -> None:
    with_old_row = b"U" + struct.pack(">I", ORDERS.oid) + b"O" + _tuple("1", "old") + b"N"
    with_old_row += _tuple("1", "new")  # an old row is staged when u is skipped: it may move a key
    stage(lake, XidFloor(Lsn(0x1000), 800), transaction(700, 0x900, with_old_row, delete(2)))
    view = read((700,), before=0x2100, position=0x3000)
    out = overtaken(lake, TABLE, ["id"], view, skipped=frozenset("u"))
    assert (out.newer, out.dropped) == ({}, {("2",)})  # bronze never gets the update


def test_the_newest_floor_rules_out_ids_given_after_it_and_the_search_stops(lake: Lake) -> None:
    older = stage(lake, XidFloor(Lsn(0x1000), 800), transaction(790, 0x900, update(1, "x")))
    stage(lake, XidFloor(Lsn(0x2000), 900), transaction(880, 0x1900, update(3, "y")))
    spoil(lake, older)  # 905 and 950 got their ids after 0/2000: the older file is not opened
    out = overtaken(lake, TABLE, ["id"], read((905, 950), before=0x2100, position=0x3000))
    assert not out


def test_an_id_older_than_a_floor_is_searched_for_further_back(lake: Lake) -> None:
    oldest = stage(lake, XidFloor(Lsn(0x800), 600), transaction(590, 0x700, update(7, "w")))
    stage(lake, XidFloor(Lsn(0x1000), 700), transaction(690, 0x900, update(9, "z")))
    stage(lake, XidFloor(Lsn(0x2000), 800), transaction(760, 0x1900, update(1, "waited")))
    stage(lake, XidFloor(Lsn(0x3000), 900), transaction(880, 0x2900, update(3, "seen")))
    spoil(lake, oldest)  # 750 is older than 0/2000's floor: ruled out only by 0/1000's
    out = overtaken(lake, TABLE, ["id"], read((750, 760), before=0x3100, position=0x4000))
    assert out.newer == {("1",): {"id": "1", "note": "waited"}}


def test_a_waiting_transaction_above_xmax_is_found_too(lake: Lake) -> None:
    """xmax is one past the newest transaction to finish: a transaction waiting for a standby
    with none after it finished is at or above xmax, not in the running list."""
    stage(lake, XidFloor(Lsn(0x1000), 999), transaction(1000, 0x1900, update(1, "new")))
    out = overtaken(lake, TABLE, ["id"], read((), before=0x2100, position=0x3000, xmax=1000))
    assert out.newer == {("1",): {"id": "1", "note": "new"}}


def test_ids_above_xmax_are_ruled_out_by_a_floor_below_it(lake: Lake) -> None:
    older = stage(lake, XidFloor(Lsn(0x1000), 800), transaction(1005, 0x900, update(1, "x")))
    stage(lake, XidFloor(Lsn(0x2000), 990), transaction(980, 0x1900, update(3, "y")))
    spoil(lake, older)  # 1000 on got their ids after 0/2000: the older file is not opened
    assert not overtaken(lake, TABLE, ["id"], read((), before=0x2100, position=0x3000))


def test_ids_above_xmax_wrap_around(lake: Lake) -> None:
    span = 1 << 32
    stage(lake, XidFloor(Lsn(0x1000), 5), transaction(2, 0x900, update(1, "wrapped")),
          transaction(span - 1, 0x980, update(2, "before the wrap")))  # fmt: skip
    view = ReadView.parse(f"{span - 2}:{span - 2}:", str(Lsn(0x3000)), str(Lsn(0x2100)))
    out = overtaken(lake, TABLE, ["id"], view)
    assert out.newer == {("1",): {"id": "1", "note": "wrapped"},
                         ("2",): {"id": "2", "note": "before the wrap"}}  # fmt: skip


def test_a_file_staged_without_a_floor_rules_out_nothing(lake: Lake) -> None:
    stage(lake, None, transaction(905, 0x900, update(1, "from an old file")))
    stage(lake, None, transaction(880, 0x1900, update(3, "seen")))
    out = overtaken(lake, TABLE, ["id"], read((905,), before=0x2100, position=0x3000))
    assert out.newer == {("1",): {"id": "1", "note": "from an old file"}}


def test_ids_compare_across_wraparound(lake: Lake) -> None:
    span = 1 << 32
    older = stage(
        lake, XidFloor(Lsn(0x1000), span - 10), transaction(span - 20, 0x900, update(1, "x"))
    )
    stage(lake, XidFloor(Lsn(0x2000), 5), transaction(span - 3, 0x1900, update(3, "y")))
    spoil(lake, older)  # ids 7 and 9 come after 5 (past the wrap): nothing before 0/2000 holds them
    view = ReadView.parse(f"{span + 7}:{span + 10}:{span + 7},{span + 9}", str(Lsn(0x3000)),
                          str(Lsn(0x2100)))  # fmt: skip
    assert not overtaken(lake, TABLE, ["id"], view)


def test_the_floor_is_recorded_in_each_footer(lake: Lake) -> None:
    staged = stage(lake, XidFloor(Lsn(0x1000), 800), transaction(700, 0x900, update(1, "a")))
    assert XidFloor.of(read_metadata(lake.changes / str(staged))) == XidFloor(Lsn(0x1000), 800)
    staged = stage(lake, None, transaction(710, 0x1900, update(1, "b")))
    assert XidFloor.of(read_metadata(lake.changes / str(staged))) is None
