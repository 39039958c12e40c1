"""Durable progress outside the Delta tables: small JSON documents under `_state/`, atomically.

What a stage records in its own Delta commit (bronze and silver watermarks) lives there; what
is the pipeline's as a whole lives here: the stream position it last confirmed, snapshot jobs
and their progress, the tables it knows, the signals it has carried out.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cdc_core.errors import TerminalError
from cdc_core.events import RelationDescriptor
from cdc_core.lake import Lake


def read_json(path: Path) -> Any:
    """The document at `path`, or None when there is none."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise TerminalError(f"{path} is not valid JSON ({e}): restore it or remove it") from e


def write_json(path: Path, data: object) -> None:
    """Replace the document at `path` in one step: a reader sees the old one or the new one."""
    write_text(path, json.dumps(data, indent=1, sort_keys=True))


def write_text(path: Path, text: str) -> None:
    """Replace the file at `path` in one step, durably: a reader sees the old or the new text."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def stream_file(lake: Lake) -> Path:
    """Where the stream position the pipeline last confirmed is kept."""
    return lake.state / "stream.json"


def record_confirmed(lake: Lake, slot: str, position: object) -> None:
    """Record the position about to be confirmed to `slot` (before confirming it)."""
    write_json(stream_file(lake), {"slot": slot, "confirmed": str(position)})


def known_tables_file(lake: Lake) -> Path:
    return lake.state / "tables.json"


def catalog_file(lake: Lake) -> Path:
    """Each table's catalog entry as the last run saw it (`drift.CatalogEntry`)."""
    return lake.state / "catalog.json"


def caught_up_file(lake: Lake) -> Path:
    """Per mirror, the bronze and silver versions it was caught up at (`silver.CaughtUp`)."""
    return lake.state / "silver_caught.json"


def signals_file(lake: Lake) -> Path:
    return lake.state / "signals.json"


def snapshots_dir(lake: Lake) -> Path:
    return lake.state / "snapshots"


def heartbeat_file(lake: Lake) -> Path:
    """When the last heartbeat was sent."""
    return lake.state / "heartbeat.json"


def schemas_dir(lake: Lake) -> Path:
    """Every shape each table has had (`bronze.record_schema`)."""
    return lake.state / "schemas"


def schema_history(lake: Lake, table: str) -> list[tuple[int, RelationDescriptor]]:
    """(first LSN seen, descriptor) of every shape table `schema.table` has had, oldest first."""
    folder = schemas_dir(lake)
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        entry = json.loads(path.read_text())
        if entry["table"] == table:
            out.append((int(entry["first_lsn"]), RelationDescriptor.from_json(entry["descriptor"])))
    return sorted(out, key=lambda e: (e[0], e[1].version))  # a file's later shapes: later versions
