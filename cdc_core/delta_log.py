"""Read a Delta table's transaction log in pure Python (local or on an object store), no JVM.

Starting Spark takes longer than everything else `cdc status` does, and a status must also work
while Spark is what is broken. The log holds what status needs: the live files with their row
statistics (the newest checkpoint, then the JSON commits after it) and each commit's
`userMetadata`, where the stages record their watermarks (`cdc_core.lake_state`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq

from cdc_core.errors import TerminalError
from cdc_core.storage import Location, arrow

HISTORY_DEPTH = 200  # commits searched for the newest watermark, as lake_state.read_watermark
_COMMIT = re.compile(r"(\d{20})\.json")
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet")


class DeltaLogError(TerminalError):
    """A transaction log this reader cannot follow; names the table and what is wrong."""


@dataclass(frozen=True)
class TableState:
    """A Delta table as of its newest commit."""

    version: int
    files: int
    rows: int | None  # None when a live file has no numRecords statistic


def read_table(path: Location) -> TableState | None:
    """The table at `path` from its newest checkpoint and the commits after it; None when there
    is no table there yet."""
    found = _live_files(path)
    if found is None:
        return None
    version, live = found
    return TableState(version, len(live), _row_count(live.values()))


def rows_by_partition(path: Location, column: str) -> dict[str, int] | None:
    """Rows of the table at `path` per value of its partition column `column` (a value whose
    files lack the numRecords statistic is left out); None when there is no table there."""
    found = _live_files(path)
    if found is None:
        return None
    by_value: dict[str, list[dict[str, Any]]] = {}
    for add in found[1].values():
        value = (add.get("partitionValues") or {}).get(column)
        by_value.setdefault(str(value), []).append(add)
    counts = {value: _row_count(adds) for value, adds in by_value.items()}
    return {value: n for value, n in counts.items() if n is not None}


def _live_files(path: Location) -> tuple[int, dict[tuple[str, str], dict[str, Any]]] | None:
    """The newest version and the live files (their add actions) of the table at `path`."""
    log = path / "_delta_log"
    commits = sorted(_versions(log))
    checkpoint, parts = _newest_checkpoint(log) if log.is_dir() else (-1, [])
    if not commits and not parts:
        return None
    following = [v for v in commits if v > checkpoint]
    expected = list(range(checkpoint + 1, checkpoint + 1 + len(following)))
    if following != expected:
        raise DeltaLogError(
            f"{log}: commits {_span(following)} do not follow "
            + (f"checkpoint {checkpoint}" if checkpoint >= 0 else "from version 0")
            + ": the log is incomplete (a checkpoint this reader does not know, or files lost)"
        )
    live: dict[tuple[str, str], dict[str, Any]] = {}
    for part in parts:
        for add in _checkpoint_adds(part):
            live[_file_key(add)] = add
    for version in following:
        for action in _actions(log, version):
            if "add" in action:
                live[_file_key(action["add"])] = action["add"]
            elif "remove" in action:
                live.pop(_file_key(action["remove"]), None)
    return (following[-1] if following else checkpoint), live


def newest_metadata(
    path: Location, key: str, depth: int = HISTORY_DEPTH
) -> dict[str, object] | None:
    """The newest commit `userMetadata` of the table at `path` that is a JSON object holding
    `key` (a stage's watermark), among the newest `depth` commits; None when there is none."""
    found = newest_record(path, key, depth)
    return found[1] if found else None


def newest_record(
    path: Location, key: str, depth: int = HISTORY_DEPTH
) -> tuple[int, dict[str, object]] | None:
    """(commits after it, metadata) of the newest commit among the newest `depth` whose
    `userMetadata` is a JSON object holding `key`; None when there is none. Reads only those
    commits' files, walking down from the newest version (commits are contiguous; an older one
    already cleaned up ends the walk, as it ends Delta's own history)."""
    log = path / "_delta_log"
    newest = newest_version(path)
    if newest is None:
        return None
    for after, version in enumerate(range(newest, max(newest - depth, -1), -1)):
        if not (log / f"{version:020d}.json").exists():
            return None
        for action in _actions(log, version):
            metadata = action.get("commitInfo", {}).get("userMetadata")
            if not metadata:
                continue
            try:
                data = json.loads(metadata)
            except ValueError:
                continue  # someone else's metadata
            if isinstance(data, dict) and key in data:
                return after, data
    return None


def partitions_written(path: Location, after: int, upto: int, column: str) -> set[str] | None:
    """The values of partition column `column` that commits `after`+1..`upto` added or removed
    files in; None when it cannot be told (a commit file gone, or a commit that changes the
    table's metadata), so the caller assumes every partition was written."""
    log = path / "_delta_log"
    found: set[str] = set()
    for version in range(after + 1, upto + 1):
        if not (log / f"{version:020d}.json").exists():
            return None
        for action in _actions(log, version):
            if "metaData" in action:
                return None
            change = action.get("add") or action.get("remove")
            if change is not None:
                found.add(str((change.get("partitionValues") or {}).get(column)))
    return found


def newest_version(path: Location) -> int | None:
    """The table's newest commit version, None when there is no table. Starts from the
    `_last_checkpoint` hint and probes the commits after it, so a long-lived table's log (a
    commit per batch) is not listed; the hint may lag behind but never runs ahead, and
    without one (or with an unreadable one) the log is listed."""
    log = path / "_delta_log"
    version = _hinted_checkpoint(log)
    if version is None:
        return max(_versions(log), default=None)
    while (log / f"{version + 1:020d}.json").exists():
        version += 1
    return version


def _hinted_checkpoint(log: Location) -> int | None:
    try:
        hint = json.loads((log / "_last_checkpoint").read_text())
        version = int(hint["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (log / f"{version:020d}.json").exists():
        return version
    return version if any(log.glob(f"{version:020d}.checkpoint*.parquet")) else None


def _versions(log: Location) -> Iterator[int]:
    if not log.is_dir():
        return
    for child in log.iterdir():
        m = _COMMIT.fullmatch(child.name)
        if m:
            yield int(m.group(1))


def _newest_checkpoint(log: Location) -> tuple[int, list[Location]]:
    """The newest complete checkpoint (single or multi-part): its version and files, or -1.
    The directory is listed rather than trusting `_last_checkpoint`, which may lag behind."""
    found: dict[tuple[int, int], list[Location]] = {}
    for child in log.iterdir():
        m = _CHECKPOINT.fullmatch(child.name)
        if m:
            version, total = int(m.group(1)), int(m.group(3) or 1)
            found.setdefault((version, total), []).append(child)
    complete = [(v, sorted(files, key=lambda f: f.name))
                for (v, n), files in found.items() if len(files) == n]  # fmt: skip
    return max(complete, key=lambda c: (c[0], len(c[1])), default=(-1, []))


def _checkpoint_adds(path: Location) -> Iterator[dict[str, Any]]:
    try:
        where, fs = arrow(path)
        column = pq.read_table(where, columns=["add"], filesystem=fs).column("add")
    except (OSError, KeyError, ValueError) as e:
        raise DeltaLogError(f"{path}: cannot read the checkpoint ({e})") from e
    for add in column.to_pylist():
        if add is not None:
            yield add


def _actions(log: Location, version: int) -> Iterator[dict[str, Any]]:
    path = log / f"{version:020d}.json"
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise DeltaLogError(f"{path}: cannot read the commit ({e})") from e
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError as e:
            raise DeltaLogError(f"{path}:{number}: not a JSON action ({e})") from e
        if isinstance(action, dict):
            yield action


def _file_key(action: dict[str, Any]) -> tuple[str, str]:
    """A file's identity in the log: its path and its deletion vector (the protocol's key), so
    replacing a file's deletion vector (an add and a remove of the same path) keeps it live."""
    dv = action.get("deletionVector") or {}
    dv_id = f"{dv.get('storageType', '')}{dv.get('pathOrInlineDv', '')}@{dv.get('offset')}"
    return str(action["path"]), dv_id if dv else ""


def _row_count(adds: Iterable[dict[str, Any]]) -> int | None:
    """Rows of the live files: numRecords less the rows their deletion vectors remove."""
    total = 0
    for add in adds:
        records = _num_records(add)
        if records is None:
            return None
        dv = add.get("deletionVector") or {}
        total += records - int(dv.get("cardinality") or 0)
    return total


def _num_records(add: dict[str, Any]) -> int | None:
    stats = add.get("stats")
    if stats:
        try:
            value = json.loads(stats).get("numRecords")
        except (ValueError, AttributeError):
            value = None
        if value is not None:
            return int(value)
    parsed = add.get("stats_parsed") or {}  # checkpoints may hold the statistics parsed
    value = parsed.get("numRecords")
    return None if value is None else int(value)


def _span(versions: list[int]) -> str:
    return f"{versions[0]}..{versions[-1]}" if versions else "(none)"
