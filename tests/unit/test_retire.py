"""What `cdc retire` shows before it drops anything, and the record that stops later runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cdc_core.errors import TerminalError
from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.pg.slot import SlotState
from cdc_core.retire import Plan
from cdc_core.state import refuse_retired, retired_file, retirement, write_json
from cdc_core.status import PendingStatus

SLOT = SlotState("orders_cdc", Lsn.parse("0/16B3748"), Lsn.parse("0/16B3710"), "reserved", None)
PLAN = Plan("orders", "orders_cdc", SLOT, 0, None, PendingStatus(0, 0), "orders_pub", True,
            drop_publication=False, retired=None)  # fmt: skip


def test_a_drained_pipeline_loses_nothing_and_keeps_its_publication() -> None:
    assert PLAN.lines() == [
        "drop slot orders_cdc (confirmed 0/16B3748)",
        "  every change it holds is in the lake",
        "keep publication orders_pub (it holds no WAL; --drop-publication drops it when no other "
        "pipeline reads through it)",
        "keep the lake; refuse every later run (_state/retired.json)",
    ]


def test_what_would_be_lost_is_said_before_anything_is_dropped() -> None:
    behind = replace(PLAN, unread=1200, pending=PendingStatus(3, 4096), drop_publication=True)

    assert behind.lines()[1:4] == [
        "  1200 changes in the WAL not yet read into the lake are LOST with it: run the pipeline "
        "first to keep them",
        "3 staged files are not yet in bronze: no run applies them after this (run the pipeline "
        "with Spark first)",
        "drop publication orders_pub (--drop-publication)",
    ]
    shared = replace(behind, sharers=("billing_cdc", "crm_cdc"))  # may read through it
    assert shared.lines()[3] == (
        "keep publication orders_pub, --drop-publication notwithstanding: logical slots "
        "billing_cdc, crm_cdc on this database decode with pgoutput, and one may read through it "
        "(a pipeline whose publication is gone needs a new slot and a new snapshot); drop it "
        "once none does: DROP PUBLICATION orders_pub"
    )
    many = replace(PLAN, unread=999_000, unread_more=True)  # the peek stopped at its limit
    assert many.lines()[1].startswith("  at least 999000 changes in the WAL not yet read")
    unknown = replace(
        PLAN, unread=None, unread_error="canceling statement due to statement timeout"
    )
    assert unknown.lines()[1] == (
        "  changes not yet read from it: unknown (canceling statement due to statement timeout)"
    )
    nothing = replace(PLAN, slot=None, unread=None, publication_exists=False)
    assert nothing.lines()[:2] == [
        "slot orders_cdc: does not exist, nothing to drop",
        "publication orders_pub: does not exist, nothing to drop",
    ]


def test_a_run_of_a_retired_pipeline_is_refused_with_the_way_back(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    refuse_retired(lake, "orders")  # never retired: runs
    assert retirement(lake) is None

    write_json(retired_file(lake), {"at": "2026-11-29T08:00:00Z", "slot": "orders_cdc",
                                    "confirmed": "0/16B3748", "done": True})  # fmt: skip

    with pytest.raises(TerminalError) as refused:
        refuse_retired(lake, "orders")
    assert str(refused.value) == (
        "pipeline orders was retired at 2026-11-29T08:00:00Z by cdc retire (its slot orders_cdc "
        f"dropped at 0/16B3748): its lake at {lake.root} is kept for reading and no run starts, "
        "so that no new slot holds WAL for it. To run it again, delete "
        f"{retired_file(lake)}; its stream position is gone, so the next run takes a new "
        "snapshot under snapshot.mode when_needed or always (under initial it stops)"
    )


def test_a_retirement_cut_short_does_not_say_the_position_is_gone(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    write_json(retired_file(lake), {"at": "2026-11-29T08:00:00Z", "slot": "orders_cdc",
                                    "confirmed": "0/16B3748", "done": False})  # fmt: skip

    with pytest.raises(TerminalError) as refused:
        refuse_retired(lake, "orders")
    assert str(refused.value) == (
        "pipeline orders is being retired since 2026-11-29T08:00:00Z (cdc retire was cut short: "
        "run it again with --yes to finish dropping slot orders_cdc); no run starts until it is "
        f"settled. To keep the pipeline instead, delete {retired_file(lake)}: if its slot is "
        "still there, the next run streams on from it; if not, it takes a new snapshot under "
        "snapshot.mode when_needed or always (under initial it stops)"
    )
