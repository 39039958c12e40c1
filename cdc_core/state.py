"""Durable progress outside the Delta tables: small JSON documents under `_state/`, atomically.

What a stage records in its own Delta commit (bronze and silver watermarks) lives there; what
is the pipeline's as a whole lives here: the stream position it last confirmed, snapshot jobs
and their progress, the tables it knows, the signals it has carried out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_core.errors import CdcError, TerminalError, first_line
from cdc_core.events import RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.storage import Location, plain_location, write_atomic


def read_json(path: Location) -> Any:
    """The document at `path`, or None when there is none."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise TerminalError(f"{path} is not valid JSON ({e}): restore it or remove it") from e


def json_line(line: bytes) -> dict[str, Any] | None:
    """One JSON-lines record as an object; None for an empty line, one cut by a crash mid-write,
    or one that holds no object."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Location, data: object) -> None:
    """Replace the document at `path` in one step: a reader sees the old one or the new one."""
    write_text(path, json.dumps(data, indent=1, sort_keys=True))


def write_text(path: Location, text: str) -> None:
    """Replace the file at `path` in one step, durably: a reader sees the old or the new text."""
    write_atomic(path, text.encode())


def stream_file(lake: Lake) -> Location:
    """Where the stream position the pipeline last confirmed is kept."""
    return lake.state / "stream.json"


def owner_file(lake: Lake) -> Location:
    """The pipeline whose lake this is (`{"pipeline": name}`), written by its first run."""
    return lake.state / "pipeline.json"


def check_owner(lake: Lake, pipeline: str, *, claim: bool = False) -> None:
    """Stop a pipeline that is not the one whose lake is at this root: two pipelines sharing a
    root would share their staged files, positions and mirrors. `claim`: a lake no pipeline
    owns yet becomes this one's (ingest, under the run lock). First of all, a lake on a bucket
    that does not exist stops the job, naming it."""
    if lake.store_problem is not None:
        raise lake.store_problem
    stored = read_json(owner_file(lake))
    owner = stored.get("pipeline") if isinstance(stored, dict) else None
    if not isinstance(owner, str) and (stored is not None or owner_file(lake).exists()):
        raise TerminalError(
            f"{owner_file(lake)} does not name the pipeline whose lake this is (it holds "
            f"{json.dumps(stored)[:80]}): restore it from a backup of the lake, or, if this is "
            f"pipeline {pipeline!r}'s lake, remove it and run again"
        )
    if owner is None:  # damaged ones above: never claimed over
        if claim:
            write_json(owner_file(lake), {"pipeline": pipeline})
        return
    if owner != pipeline:
        raise TerminalError(
            f"target.root {lake.root} holds the lake of pipeline {owner!r}, not {pipeline!r}: "
            "two pipelines cannot share a root (their staged changes, positions and mirrors "
            f"would mix); give {pipeline!r} a root of its own. If it is {owner!r} renamed, "
            f"delete {owner_file(lake)} and run it again"
        )


def retired_file(lake: Lake) -> Location:
    """`cdc retire`'s record (`cdc_core.retire`): present, no run of the pipeline starts."""
    return lake.state / "retired.json"


@dataclass(frozen=True)
class Retirement:
    """What `cdc retire` recorded: when, the slot, where the lake's stream stopped."""

    at: str  # UTC, ISO-8601
    slot: str
    confirmed: str | None  # the slot's confirmed position when it was dropped
    done: bool  # False: recorded, and the slot may not be dropped yet

    def describe(self) -> str:
        at = f" at {self.confirmed}" if self.confirmed else ""
        if not self.done:
            return (f"being retired since {self.at} (cdc retire was cut short: run it again "
                    f"with --yes to finish dropping slot {self.slot})")  # fmt: skip
        return f"retired at {self.at} by cdc retire (its slot {self.slot} dropped{at})"


def retirement(lake: Lake) -> Retirement | None:
    """The pipeline's retirement, or None when it was never retired."""
    data = read_json(retired_file(lake))
    if not isinstance(data, dict):
        return None
    confirmed = data.get("confirmed")
    return Retirement(str(data.get("at", "?")), str(data.get("slot", "?")),
                      None if confirmed is None else str(confirmed),
                      bool(data.get("done", False)))  # fmt: skip


def refuse_retired(lake: Lake, pipeline: str) -> None:
    """Stop a run of a retired pipeline before it makes anything on the source."""
    retired = retirement(lake)
    if retired is None:
        return
    if not retired.done:  # the slot may still be there, and with it the stream position
        raise TerminalError(
            f"pipeline {pipeline} is {retired.describe()}; no run starts until it is settled. "
            f"To keep the pipeline instead, delete {retired_file(lake)}: if its slot is still "
            "there, the next run streams on from it; if not, it takes a new snapshot under "
            "snapshot.mode when_needed or always (under initial it stops)"
        )
    raise TerminalError(
        f"pipeline {pipeline} was {retired.describe()}: its lake at {lake.root} is kept for "
        "reading and no run starts, so that no new slot holds WAL for it. To run it again, "
        f"delete {retired_file(lake)}; its stream position is gone, so the next run takes a "
        "new snapshot under snapshot.mode when_needed or always (under initial it stops)"
    )


def mirror_owner(lake: Lake, mirror: str) -> str | None:
    """The pipeline whose lake holds the mirror at `mirror` (a silver table's location,
    `<root>/silver/<schema>/<table>`, as a catalog gives it, `file:` or not); None when no
    lake is there (it moved away) or none can be read there."""
    root = plain_location(mirror).rsplit("/", 3)[0]
    try:
        stored = read_json(owner_file(Lake(root, lake.options)))
    except (OSError, ValueError, CdcError):  # gone, unreachable, or not a lake's
        return None
    owner = stored.get("pipeline") if isinstance(stored, dict) else None
    return str(owner) if owner is not None else None


def read_stream(lake: Lake) -> dict[str, Any] | None:
    """`_state/stream.json`: the slot and the position this pipeline last confirmed to it, or
    None before the first. One that does not parse, or holds no slot and position, stops the
    run naming it: without it a run could not tell a slot that passed changes the lake never
    got (recreated, read by another reader) from its own."""
    path = stream_file(lake)
    try:
        stored = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise _damaged_stream(path, f"{type(e).__name__}: {first_line(e)}") from e
    try:
        if isinstance(stored, dict) and isinstance(stored["slot"], str):
            Lsn.parse(str(stored["confirmed"]))
            return stored
        why = "it holds no slot and position"
    except (KeyError, ValueError) as e:
        why = f"{type(e).__name__}: {first_line(e)}"
    raise _damaged_stream(path, why)


def _damaged_stream(path: Location, why: str) -> TerminalError:
    return TerminalError(
        f"{path} is not a stream position record ({why}): restore it from a backup of the lake. "
        "Failing that, remove it and run once with snapshot.mode: always (every table read "
        "again): a run without it cannot tell whether the slot passed changes the lake never got"
    )


def record_confirmed(
    lake: Lake, slot: str, position: Lsn, system: str | None = None, timeline: int | None = None
) -> None:
    """Record the position about to be confirmed to `slot` (before confirming it). The record
    never moves back for the same slot: the slot may already be confirmed up to it (a run
    confirms past WAL that holds nothing captured, beyond its last staged file, and the next
    run starts from that file), and a slot found ahead of the record reads as recreated.
    `system`: the identifier of the cluster the slot is on (`pg_control_system()`), recorded
    with the first position and kept by later ones; `timeline`: the server's timeline, whose
    history the position is in (`cdc_core.pg.history`), likewise."""
    stored: Any = read_stream(lake)
    same = isinstance(stored, dict) and stored.get("slot") == slot
    known = system or (stored.get("system") if same else None)
    on = timeline or (stored.get("timeline") if same else None)
    if (
        same
        and Lsn.parse(str(stored["confirmed"])) >= position
        and stored.get("system") == known
        and stored.get("timeline") == on
    ):
        return
    record: dict[str, object] = {"slot": slot, "confirmed": str(position)}
    if same and Lsn.parse(str(stored["confirmed"])) > position:
        record["confirmed"] = str(stored["confirmed"])
    if known is not None:
        record["system"] = str(known)
    if on is not None:
        record["timeline"] = int(on)
    write_json(stream_file(lake), record)


def other_cluster(stored: object, system: str | None) -> str | None:
    """The system identifier the stored position was recorded on, when it is not `system`'s
    (None when they agree, or either is unknown: positions recorded before identifiers were,
    or a server that does not show its own)."""
    recorded = stored.get("system") if isinstance(stored, dict) else None
    if recorded is None or system is None or str(recorded) == system:
        return None
    return str(recorded)


def known_tables_file(lake: Lake) -> Location:
    return lake.state / "tables.json"


def memberships_file(lake: Lake) -> Location:
    """The publication, and each captured table's rows in it, as the last run's start saw them
    (`PublicationInfo.membership`)."""
    return lake.state / "publication.json"


def catalog_file(lake: Lake) -> Location:
    """Each table's catalog entry as the last run saw it (`drift.CatalogEntry`)."""
    return lake.state / "catalog.json"


def recorded_oids(lake: Lake, tables: Iterable[TableName]) -> dict[TableName, int]:
    """The OID each of `tables` had when a run's start last found it (`catalog_file`); a table
    it never found is left out."""
    entries = read_json(catalog_file(lake)) or {}
    return {
        t: int(str(entry["oid"]))
        for t in tables
        if isinstance(entry := entries.get(str(t)), dict) and "oid" in entry
    }


def caught_up_file(lake: Lake) -> Location:
    """Per mirror, the bronze and silver versions it was caught up at (`silver.CaughtUp`)."""
    return lake.state / "silver_caught.json"


def pruned_file(lake: Lake) -> Location:
    """Per table, the position up to which bronze retention may have deleted its rows."""
    return lake.state / "bronze_pruned.json"


def pruned_positions(lake: Lake) -> dict[str, tuple[int, int]]:
    """`pruned_file`'s positions: (commit LSN, position) per table."""
    stored = read_json(pruned_file(lake))
    if not isinstance(stored, dict):
        return {}
    return {t: (int(v[0]), int(v[1])) for t, v in stored.items()}


def record_pruned(lake: Lake, positions: dict[str, tuple[int, int]]) -> None:
    """Record, before bronze retention deletes them, that rows of these tables up to these
    positions may be gone; a table's record only moves forward."""
    stored = pruned_positions(lake)
    merged = stored | {t: max(stored.get(t, p), p) for t, p in positions.items()}
    if merged != stored:
        write_json(pruned_file(lake), {t: list(p) for t, p in merged.items()})


def signals_file(lake: Lake) -> Location:
    return lake.state / "signals.json"


def signal_batch_file(lake: Lake) -> Location:
    """The lines taken from the signal file (`signal.file`) and not all carried out yet."""
    return lake.state / "signal_file.json"


def snapshots_dir(lake: Lake) -> Location:
    """The snapshot jobs under way, and those finished since a run last archived them."""
    return lake.state / "snapshots"


def finished_dir(lake: Lake) -> Location:
    """The finished snapshot jobs, archived (`snapshot.archive_finished`)."""
    return snapshots_dir(lake) / "finished"


def heartbeat_file(lake: Lake) -> Location:
    """When the last heartbeat was sent."""
    return lake.state / "heartbeat.json"


def schemas_dir(lake: Lake) -> Location:
    """Every shape each table has had (`bronze.record_schema`)."""
    return lake.state / "schemas"


def schema_history(lake: Lake, table: str) -> list[tuple[int, RelationDescriptor]]:
    """(first LSN seen, descriptor) of every shape table `schema.table` has had, oldest first."""
    folder = schemas_dir(lake)
    out = []
    paths: list[Location] = list(folder.glob("*.json")) if folder.is_dir() else []
    for path in sorted(paths, key=lambda p: p.name):
        entry = _schema_entry(path)
        if entry["table"] == table:
            out.append((int(entry["first_lsn"]), RelationDescriptor.from_json(entry["descriptor"])))
    return sorted(out, key=lambda e: (e[0], e[1].version))  # a file's later shapes: later versions


_ENTRIES: dict[str, Any] = {}  # object store entries read once: a name is never written again


def _schema_entry(path: Location) -> Any:
    """A schema history entry (its name holds its shape and place, so it never changes)."""
    if isinstance(path, Path):
        return _parsed_schema_entry(path)
    key = str(path)
    if key not in _ENTRIES:
        _ENTRIES[key] = _parsed_schema_entry(path)
    return _ENTRIES[key]


# Read leniently (`run_lock.read_holder`), or by a reader of its own (`read_stream`).
_NOT_READ_WHOLE = frozenset({"run.holder.json", "stream.json"})


def damaged_documents(lake: Lake) -> list[str]:
    """Why each `_state` document a run would stop on cannot be read: the documents `read_json`
    reads (those at the top, and `cdc snapshot` requests) and the schema history's entries, in
    the run's own words. `cdc status` says so before the next run meets them. Snapshot jobs are
    `status.read_snapshots`'s, the stream position `read_stream`'s."""
    whole = _documents(lake.state, skip=_NOT_READ_WHOLE) + _documents(lake.state / "requests")
    found = [
        *(_unreadable(read_json, p) for p in whole),
        *(_unreadable(_schema_entry, p) for p in _documents(schemas_dir(lake))),
    ]
    return [why for why in found if why is not None]


def _unreadable(read: Callable[[Location], object], path: Location) -> str | None:
    try:
        read(path)
    except TerminalError as e:
        return str(e)
    except OSError as e:
        return f"{path} cannot be read ({first_line(e)})"
    return None


def _documents(folder: Location, skip: frozenset[str] = frozenset()) -> list[Location]:
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.glob("*.json") if p.name not in skip), key=lambda p: p.name)


def _parsed_schema_entry(path: Location) -> Any:
    """An entry damaged since it was written (cut short by a copy or a restore) stops the run
    naming it: the history is the lake's record of the shapes the stream sent, and the server
    cannot give it again."""
    try:
        entry = json.loads(path.read_text())
        RelationDescriptor.from_json(entry["descriptor"])  # the shape, before anyone relies on it
        if isinstance(entry["table"], str) and int(entry["first_lsn"]) >= 0:
            return entry
        raise ValueError("table or first_lsn of the wrong kind")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise TerminalError(
            f"{path} is not a schema history entry ({type(e).__name__}: {first_line(e)}): it "
            "records a captured table's shape as the stream sent it, which reading its changes "
            "needs and the server cannot send again; restore it from a backup of the lake"
        ) from e
