"""A reset marker names the table and the slot of the pipeline it is for; the reader stages
only its own pipeline's (and those in the older form, whose pipeline cannot be told)."""

from __future__ import annotations

import struct

from cdc_core.pg import pgoutput as po
from cdc_core.reader import Assembler
from cdc_core.reset_marker import RESET_PREFIX, ResetMarker
from tests.unit.test_assembler import ITEMS, describe


def test_a_marker_reads_back_as_written() -> None:
    marker = ResetMarker('public."Odd.Name"', "cdc_a")
    assert marker.encode() == '{"slot": "cdc_a", "table": "public.\\"Odd.Name\\""}'
    assert ResetMarker.decode(marker.encode().encode()) == marker


def test_a_marker_in_the_older_form_is_the_bare_table_name_and_for_every_pipeline() -> None:
    old = ResetMarker.decode(b"public.items")
    assert old == ResetMarker("public.items", None)
    assert old.encode() == "public.items"
    assert all(old.is_for(slot) for slot in ("cdc_a", "cdc_b"))


def test_a_marker_is_for_its_own_slot_only() -> None:
    marker = ResetMarker("public.items", "cdc_a")
    assert marker.is_for("cdc_a")
    assert not marker.is_for("cdc_b")


def test_content_that_is_not_a_whole_marker_names_no_pipeline() -> None:
    for content in (b'{"table": "public.items"}', b'{"table": 1, "slot": "a"}', b"{not json"):
        assert ResetMarker.decode(content) == ResetMarker(content.decode(), None)
    assert ResetMarker.decode(b"\xff").slot is None  # never an error that stops capture


def _message(lsn: int, content: str) -> tuple[int, bytes]:
    body = RESET_PREFIX.encode() + b"\x00" + struct.pack(">i", len(content)) + content.encode()
    return lsn, b"M" + struct.pack(">BQ", 1, lsn) + body


def test_the_reader_stages_its_own_and_older_markers_only() -> None:
    contents = [
        ResetMarker("public.items", "cdc_a").encode(),
        ResetMarker("public.items", "cdc_b").encode(),
        "public.items",
    ]
    stream = [(1000, b"B" + struct.pack(">QqI", 1095, 1_700_000_000_000_000, 7))]
    stream += [_message(1010 + 10 * i, c) for i, c in enumerate(contents)]
    stream.append((1095, b"C\x00" + struct.pack(">QQq", 1095, 1100, 1)))

    def staged(slot: str | None) -> list[bytes]:
        assembler = Assembler([ITEMS], describe, slot=slot, keep_message=lambda prefix: False)
        chunks = assembler.feed_many(stream)
        return [po.decode(m).content for c in chunks for m in c.message]  # type: ignore[union-attr]

    assert staged("cdc_b") == [contents[1].encode(), b"public.items"]
    assert staged(None) == [c.encode() for c in contents]
