"""Captured tables dropped at the source: the changes made before the drop still reach silver.

A `DROP TABLE` leaves the table's changes in the WAL, and pgoutput still decodes them, as of
the catalog they were made under: Relation, then the rows. What the pipeline had not read when
the table was dropped is read like any other change, once the run knows to follow the table.
It cannot find it by name any more, so it follows the OID the lake recorded for it
(`_state/catalog.json`), and keys the rows by the key the lake's schema history holds (the
catalog lost the table's primary key with it).

A run finds such a table before anything else reads `source.tables`: a table the pipeline
captured (listed in `source.tables`, or, without it, found in the catalog by the last run's
start and still let through by the include lists) whose name is no longer in the catalog, and
whose recorded OID is no table's either (a renamed table keeps its OID: that is the doctor's
`does not exist`, not a drop). It is recorded in `_state/dropped.json` with a WAL position read
after it was found gone, which the DROP committed before. It leaves `source.tables` (the
publication, the snapshots, the checks see the tables there are) and is followed
(`SourceConfig.followed`) until a batch has bronze past that position and silver has applied it:
its mirror then holds the table's last rows, and stays. A table created again under the name
is a new table: its entry goes, and the catalog drift check starts its mirror over.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping, Sequence

import psycopg

from cdc_core.config import Config
from cdc_core.config.model import DroppedTable
from cdc_core.drift import catalog_entries
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.pg.connect import connect
from cdc_core.pg.discover import discover
from cdc_core.pg.slot import flush_position
from cdc_core.state import known_tables_file, read_json, recorded_oids, write_json
from cdc_core.storage import Location

log = logging.getLogger("cdc_core.dropped")

Conn = psycopg.Connection[tuple[object, ...]]


def dropped_file(lake: Lake) -> Location:
    """The captured tables found dropped at the source (`DroppedTable` by table)."""
    return lake.state / "dropped.json"


def recorded(lake: Lake) -> dict[TableName, DroppedTable]:
    stored = read_json(dropped_file(lake))
    if not isinstance(stored, dict):
        return {}
    return {TableName.parse(t): DroppedTable.from_json(TableName.parse(t), e)
            for t, e in stored.items()}  # fmt: skip


def _save(lake: Lake, dropped: Iterable[DroppedTable]) -> None:
    write_json(dropped_file(lake), {str(d.table): d.to_json() for d in dropped})


def found(config: Config, lake: Lake, *, save: bool = True) -> Config:
    """`config` with the tables it captures (found in the catalog when `source.tables` is
    omitted) and following those dropped at the source (`find`), on one connection."""
    with connect(config.pipeline.source.dsn) as conn:
        return find(conn, discover(config, conn), lake, save=save)


def find(conn: Conn, config: Config, lake: Lake, *, save: bool = True) -> Config:
    """`config` without the captured tables dropped at the source, which it follows instead
    (`SourceConfig.dropped`); with `save`, the lake's record of them is brought up to date
    (a command that only looks, the doctor, leaves it)."""
    source = config.pipeline.source
    stored = recorded(lake)
    if source.discovered:
        known = {TableName.parse(str(t)) for t in read_json(known_tables_file(lake)) or []}
        candidates = known | {t for t, d in stored.items() if not d.applied}
        candidates = {t for t in candidates if source.captures(t)} - set(source.tables)
    else:
        candidates = set(source.tables)
    if not candidates and not stored:
        return config
    missing = set(candidates) - set(catalog_entries(conn, sorted(candidates, key=str)))
    gone = _gone(conn, recorded_oids(lake, missing))
    before = flush_position(conn).value if gone else 0  # after the catalog said gone: the DROP
    # committed before it
    now = []
    for table, oid in sorted(gone.items(), key=lambda e: str(e[0])):
        kept = stored.get(table)  # found before: its position stays the first one read
        now.append(kept if kept and kept.oid == oid else DroppedTable(table, oid, before))
    if now and len(now) == len(source.tables) and not source.discovered:
        return config  # every listed table gone: the doctor's `does not exist` stops the run
    if save and now != [stored[t] for t in sorted(stored, key=str)]:
        _save(lake, now)
    for d in now:
        if d.table not in stored or stored[d.table].oid != d.oid:
            log.warning(
                "table %s was dropped at the source: the changes made to it before the drop "
                "that the pipeline has not read yet are read now, by its OID %d, and applied "
                "to its mirror, which then keeps its last rows%s",
                d.table, d.oid,
                "" if source.discovered else f" (remove {d.table} from source.tables)",
            )  # fmt: skip
    if not now:
        return config
    pipeline = copy.copy(config.pipeline)  # as loaded: keys naming a dropped table stay valid
    object.__setattr__(pipeline, "source", source.with_dropped(now))
    found = copy.copy(config)
    object.__setattr__(found, "pipeline", pipeline)
    return found


def _gone(conn: Conn, oids: Mapping[TableName, int]) -> dict[TableName, int]:
    """The tables of `oids` whose OID is no relation's now."""
    if not oids:
        return {}
    rows = conn.execute(
        "SELECT oid::bigint FROM pg_class WHERE oid = ANY(%s::oid[])", (list(oids.values()),)
    ).fetchall()
    alive = {int(str(r[0])) for r in rows}
    return {t: oid for t, oid in oids.items() if oid not in alive}


def applied(lake: Lake, config: Config, tables: Sequence[str], frontier: int | None) -> None:
    """Record that silver has applied every change of the followed dropped tables among
    `tables` (merged without error this batch) whose drop bronze has passed (`frontier`)."""
    source = config.pipeline.source
    done = {
        d.table
        for d in source.dropped
        if not d.applied and frontier is not None and frontier >= d.before
        and d.table.qualified in tables
    }  # fmt: skip
    if not done:
        return
    stored = recorded(lake)
    for table in done:
        if table in stored:
            stored[table] = DroppedTable(table, stored[table].oid, stored[table].before, True)
            log.info("table %s, dropped at the source: its mirror holds its last changes", table)
    _save(lake, stored.values())
