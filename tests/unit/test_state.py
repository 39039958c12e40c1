"""The pipeline's own state documents under `_state/`."""

from __future__ import annotations

from pathlib import Path

from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.state import (
    pruned_positions,
    read_json,
    record_confirmed,
    record_pruned,
    stream_file,
)


def test_the_recorded_stream_position_never_moves_back_for_its_slot(tmp_path: Path) -> None:
    """A run confirms past WAL that holds nothing captured (beyond its last staged file); the
    next run starts from that file and confirms it first. Recording that lower position would
    leave the slot ahead of the record, which the next start reads as a recreated slot and
    refuses (what `make crash` seed 20261122 hit after a kill at capture.transaction)."""
    lake = Lake(str(tmp_path))
    record_confirmed(lake, "s", Lsn.parse("0/3000"))
    record_confirmed(lake, "s", Lsn.parse("0/2000"))  # a new run's first confirmation
    assert read_json(stream_file(lake)) == {"slot": "s", "confirmed": "0/3000"}
    record_confirmed(lake, "s", Lsn.parse("0/4000"))
    assert read_json(stream_file(lake)) == {"slot": "s", "confirmed": "0/4000"}
    record_confirmed(lake, "other", Lsn.parse("0/1000"))  # another slot: its own position
    assert read_json(stream_file(lake)) == {"slot": "other", "confirmed": "0/1000"}


def test_a_table_s_pruned_position_only_moves_forward(tmp_path: Path) -> None:
    """Bronze retention records how far it deleted each table's rows before it deletes them; a
    later, smaller deletion must not make an earlier one look undone."""
    lake = Lake(str(tmp_path))
    assert pruned_positions(lake) == {}
    record_pruned(lake, {"public.a": (500, 1)})
    record_pruned(lake, {"public.a": (300, 0), "public.b": (700, 2)})
    assert pruned_positions(lake) == {"public.a": (500, 1), "public.b": (700, 2)}
    record_pruned(lake, {"public.a": (500, 3)})
    assert pruned_positions(lake) == {"public.a": (500, 3), "public.b": (700, 2)}
