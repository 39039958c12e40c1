"""snapshot.mode decides what a run does, for every mode and every start state."""

from __future__ import annotations

import pytest

from cdc_core.snapshot_modes import Decision, StartState, decide

NO_POSITION = StartState(stored_position=False, snapshot_unfinished=False, position_available=False)
UNFINISHED = StartState(stored_position=True, snapshot_unfinished=True, position_available=True)
AVAILABLE = StartState(stored_position=True, snapshot_unfinished=False, position_available=True)
GONE = StartState(stored_position=True, snapshot_unfinished=False, position_available=False)
UNFINISHED_GONE = StartState(
    stored_position=True, snapshot_unfinished=True, position_available=False
)

SNAPSHOT_STREAM = Decision(snapshot=True, stream=True)
STREAM = Decision(snapshot=False, stream=True)
NEW_SLOT = Decision(snapshot=True, stream=True, new_slot=True)


@pytest.mark.parametrize(
    ("mode", "state", "expected"),
    [
        ("initial", NO_POSITION, SNAPSHOT_STREAM),
        ("initial", UNFINISHED, SNAPSHOT_STREAM),
        ("initial", AVAILABLE, STREAM),
        ("initial", UNFINISHED_GONE, NEW_SLOT),
        ("always", NO_POSITION, SNAPSHOT_STREAM),
        ("always", UNFINISHED, SNAPSHOT_STREAM),
        ("always", AVAILABLE, SNAPSHOT_STREAM),
        ("always", GONE, NEW_SLOT),
        ("initial_only", NO_POSITION, Decision(snapshot=True, stream=False)),
        ("initial_only", UNFINISHED, Decision(snapshot=True, stream=False)),
        ("initial_only", AVAILABLE, Decision(snapshot=False, stream=False)),
        ("initial_only", GONE, Decision(snapshot=False, stream=False)),
        ("no_data", NO_POSITION, STREAM),
        ("no_data", UNFINISHED, STREAM),
        ("no_data", AVAILABLE, STREAM),
        ("when_needed", NO_POSITION, SNAPSHOT_STREAM),
        ("when_needed", UNFINISHED, SNAPSHOT_STREAM),
        ("when_needed", AVAILABLE, STREAM),
        ("when_needed", GONE, NEW_SLOT),
        ("when_needed", UNFINISHED_GONE, NEW_SLOT),
    ],
)
def test_the_decision_table(mode: str, state: StartState, expected: Decision) -> None:
    assert decide(mode, state) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["initial", "no_data"])
def test_a_lost_position_stops_the_modes_that_cannot_recover_with_the_way_out(mode: str) -> None:
    decision = decide(mode, GONE)  # type: ignore[arg-type]
    assert not decision.snapshot
    assert decision.fail is not None
    assert "snapshot.mode: when_needed" in decision.fail
