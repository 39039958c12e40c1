"""A run's start and its publication: captured tables taken out of it, or out and put back.

Decoding looks the publication up as of each change, so the changes made while a captured table
was out of the publication (`ALTER PUBLICATION ... DROP TABLE`) were never sent. A run's start
finds such a table missing, or published by other catalog rows than the ones it recorded at the
last start (out and back in between), and snapshots it again incrementally.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import psycopg
from psycopg import sql

from cdc_core.config import Config
from cdc_core.errors import TerminalError
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.pg.catalog import PublicationInfo, publication_info
from cdc_core.pg.slot import published
from cdc_core.snapshot import SnapshotJob, plan_job
from cdc_core.snapshot_modes import Decision, StartState
from cdc_core.state import known_tables_file, memberships_file, read_json, write_json

log = logging.getLogger("cdc_core.start")

Conn = psycopg.Connection[tuple[object, ...]]


def left_publication(
    conn: Conn, config: Config, lake: Lake, decision: Decision, state: StartState, *,
    existing: PublicationInfo | None,
) -> list[SnapshotJob]:  # fmt: skip
    """An incremental snapshot job of each captured table the publication no longer publishes
    (someone ran ALTER PUBLICATION ... DROP TABLE), for the caller to save before the table is
    added back: `filtered` then adds it, before any snapshot read's low watermark; the other
    modes add nothing: the run stops. A table someone added back since the last run's start is
    snapshotted likewise (`_put_back`)."""
    source = config.pipeline.source
    missing = existing.lacks(source.tables) if existing else []
    known = set(read_json(known_tables_file(lake)) or [])
    if missing and source.publication_autocreate_mode != "filtered":
        # forgotten: the run that finds them published again snapshots them as new tables
        write_json(known_tables_file(lake), sorted(known - {str(t) for t in missing}))
        raise unpublished(conn, config, missing)
    left = [t for t in missing if str(t) in known]
    back = [t for t in _put_back(lake, source.tables, existing) if str(t) in known]
    if not left and not back:
        return []
    settings = config.pipeline.snapshot
    full_snapshot = decision.new_slot or (decision.snapshot and not state.snapshot_unfinished)
    plan = state.stored_position and decision.stream and not full_snapshot
    then = "snapshotted again" if plan else "read by this run's snapshot"
    if plan and settings.mode == "no_data":
        plan, then = False, "not read again (snapshot.mode no_data): run `cdc snapshot` for it"
    if left:
        log.warning(
            "table %s was taken out of publication %s (ALTER PUBLICATION ... DROP TABLE): the "
            "changes made since were never sent; it is added back and %s",
            ", ".join(map(str, left)), source.publication, then,
        )  # fmt: skip
    if back:
        log.warning(
            "table %s was taken out of publication %s and put back (ALTER PUBLICATION ... DROP "
            "TABLE, then ADD TABLE): the changes made while it was out were never sent; it is %s",
            ", ".join(map(str, back)), source.publication, then,
        )  # fmt: skip
    if not plan:
        return []
    job = plan_job(conn, "incremental", "publication", left + back,
                   chunk_size=settings.chunk_size, overrides=settings.select_for)  # fmt: skip
    return [job]


def _put_back(
    lake: Lake, tables: Sequence[TableName], existing: PublicationInfo | None
) -> list[TableName]:
    """The `tables` `existing` publishes by none of the catalog rows it did at the last run's
    start (`PublicationInfo.membership`): they were out in between. None without a record (the
    first run that keeps one) or with the record of another publication."""
    recorded = read_json(memberships_file(lake))
    if existing is None or recorded is None or recorded["publication"] != existing.name:
        return []
    before = {t: set(rows) for t, rows in recorded["tables"].items()}
    return [
        t for t in tables
        if (was := before.get(str(t))) and (now := existing.membership(t)) and not was & now
    ]  # fmt: skip


def record_memberships(
    conn: Conn, config: Config, lake: Lake, existing: PublicationInfo | None
) -> None:
    """Record each captured table's rows in the publication, after `ensure_publication`: read
    again when it created the publication or added tables to it (new rows)."""
    source = config.pipeline.source
    if existing is None or existing.lacks(source.tables):
        existing = publication_info(conn, source.publication)
    if existing is None:
        return
    document = {
        "publication": existing.name,
        "tables": {str(t): sorted(existing.membership(t)) for t in source.tables},
    }
    if read_json(memberships_file(lake)) != document:
        write_json(memberships_file(lake), document)


def unpublished(conn: Conn, config: Config, missing: list[TableName]) -> TerminalError:
    """The error for configured tables a publication the product does not add to lacks."""
    source = config.pipeline.source
    add = sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
        sql.Identifier(source.publication), published(missing)
    )
    if config.pipeline.snapshot.mode == "no_data":
        then = "run `cdc snapshot` for any it streamed before: its changes meanwhile were lost"
    else:
        then = "any it streamed before is snapshotted again: its changes meanwhile were lost"
    return TerminalError(
        f"pipeline {config.pipeline.name}: publication {source.publication!r} does not publish "
        f"{', '.join(map(str, missing))}, so their changes are not streamed, and "
        f"publication.autocreate.mode {source.publication_autocreate_mode} adds no table to an "
        f"existing publication. Run {add.as_string(conn)}, then run again ({then})"
    )
