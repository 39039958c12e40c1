"""snapshot.mode as a decision: from what is stored and what the server still has, what a run does.

The table of Debezium's reference, for a pipeline run (each run is a start):

| mode         | no stored position | unfinished        | position available | position gone      |
|--------------|--------------------|-------------------|--------------------|--------------------|
| initial      | snapshot, stream   | finish it, stream | stream             | fail               |
| always       | snapshot, stream   | finish it, stream | snapshot, stream   | new slot, snapshot |
| initial_only | snapshot, stop     | finish it, stop   | stop               | stop               |
| no_data      | stream             | stream            | stream             | fail               |
| when_needed  | snapshot, stream   | finish it, stream | stream             | new slot, snapshot |
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc_core.config.model import SnapshotMode


@dataclass(frozen=True)
class StartState:
    """What a run finds when it starts."""

    stored_position: bool  # an earlier run recorded where the stream is
    snapshot_unfinished: bool  # a full snapshot started and did not finish
    position_available: bool  # the slot still has the stored position (not lost, not recreated)


@dataclass(frozen=True)
class Decision:
    """What the run does: snapshot (a full one, or finish the unfinished one), then stream."""

    snapshot: bool
    stream: bool
    new_slot: bool = False  # the stored position is gone: drop the slot, start a new one
    fail: str | None = None  # why the run cannot go on


_GONE = (
    "the slot no longer has the stored position (its WAL was removed, or the slot was dropped "
    "or recreated): changes are missing. Set snapshot.mode: when_needed to take a new "
    "snapshot automatically, or always. Only if no change was made since the pipeline last "
    "read the slot (writes stopped and the pipeline drained, as before a pg_upgrade), run cdc "
    "accept-lost-position to go on from a new slot without a snapshot"
)


def decide(mode: SnapshotMode, state: StartState) -> Decision:
    """The run's plan for `mode` in `state` (see the module's table)."""
    gone = state.stored_position and not state.position_available
    if mode == "no_data":
        return Decision(False, True, fail=_GONE if gone else None)
    if mode == "initial_only":
        first_time = not state.stored_position or state.snapshot_unfinished
        return Decision(first_time, False)
    if state.snapshot_unfinished or not state.stored_position:
        return Decision(True, True, new_slot=gone)
    if gone:
        if mode == "initial":
            return Decision(False, False, fail=_GONE)
        return Decision(True, True, new_slot=True)
    return Decision(mode == "always", True)
