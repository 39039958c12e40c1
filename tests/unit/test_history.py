"""A source's WAL history (`cdc_core.pg.history`): where a timeline ended, and whether the lake's
position is in the history of a server on a later one. The history texts are PostgreSQL's own
(`TIMELINE_HISTORY` on a standby promoted twice, PostgreSQL 17)."""

from __future__ import annotations

import pytest

from cdc_core.config import Dsn
from cdc_core.lsn import Lsn
from cdc_core.pg import history
from cdc_core.pg.history import forked_before, switchpoint

TWICE = "1\t0/14DAB50\tno recovery target specified\n\n2\t0/3000A28\tno recovery target specified\n"
DSN = Dsn("host=127.0.0.1 dbname=db")


def test_where_each_ancestor_timeline_ended() -> None:
    assert switchpoint(TWICE, 1) == Lsn.parse("0/14DAB50")
    assert switchpoint(TWICE, 2) == Lsn.parse("0/3000A28")
    assert switchpoint(TWICE, 3) is None  # the file's own timeline: not an ancestor
    assert switchpoint("", 1) is None


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The history file the server would send, and which timelines' were asked for."""
    asked: list[int] = []

    def timeline_history(dsn: Dsn, timeline: int) -> str:
        asked.append(timeline)
        return TWICE

    monkeypatch.setattr(history, "timeline_history", timeline_history)
    return asked


def test_a_position_up_to_the_switchpoint_is_in_the_promoted_servers_history(
    served: list[int],
) -> None:
    assert forked_before(DSN, 3, 1, Lsn.parse("0/14DAB50")) is None  # what the standby had
    assert forked_before(DSN, 3, 2, Lsn.parse("0/2000000")) is None
    assert served == [3, 3]


def test_a_position_past_the_switchpoint_is_a_fork(served: list[int]) -> None:
    why = forked_before(DSN, 3, 1, Lsn.parse("0/14DAB51"))
    assert why is not None
    assert why.startswith(
        "the server is a standby promoted at 0/14DAB50 (timeline 1 to 3), before the lake's "
        "position 0/14DAB51: the old primary sent the pipeline changes its standby never received"
    )
    assert "synchronized_standby_slots" in why


def test_the_same_timeline_or_an_unknown_one_asks_nothing(served: list[int]) -> None:
    for current, recorded in ((2, 2), (None, 1), (2, None)):
        assert forked_before(DSN, current, recorded, Lsn.parse("9/0")) is None
    assert served == []


def test_an_older_timeline_or_one_of_another_branch_is_not_the_lakes_history(
    served: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    older = forked_before(DSN, 1, 2, Lsn.parse("0/100"))
    assert older is not None
    assert "timeline 1, older than timeline 2" in older
    monkeypatch.setattr(history, "timeline_history", lambda dsn, timeline: "1\t0/100\tx\n")
    branch = forked_before(DSN, 3, 2, Lsn.parse("0/50"))
    assert branch == (
        "the server's timeline 3 does not descend from timeline 2 the lake's position 0/50 was "
        "read on"
    )
