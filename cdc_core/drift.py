"""Schema changes the stream does not show, found at the start of a run and healed by snapshots.

Logical decoding carries rows, not DDL, and three changes leave a mirror wrong with no row event
to say so:

- a renamed column: its values arrive under the new name only with each row's next change;
- a column added with a default, an identity or NOT NULL: existing rows hold a value that no
  change carries;
- a table dropped and created again: the old rows never get their deletes, and the new table's
  first rows may come before it is back in the publication.

Each run compares every table's catalog entry (its oid, its columns by attnum) with the entry
the previous run recorded. A table that changed like that gets an incremental snapshot, and a
recreated table first gets a reset marker: a transactional logical message written now, so it
sits in the WAL before the snapshot's windows, which silver applies as a TRUNCATE of the
mirror. A column added plainly (NULL in every existing row) needs nothing: the stream says it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc_core.identifiers import TableName

Conn = psycopg.Connection[tuple[object, ...]]


@dataclass(frozen=True)
class CatalogEntry:
    """A table as the catalog has it now: its oid, its columns by attnum, and the columns
    existing rows may hold a value for that no change carried (default, identity, NOT NULL)."""

    oid: int
    columns: Mapping[int, str]
    valued: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, object]:
        return {"oid": self.oid, "columns": {str(n): c for n, c in self.columns.items()}}


@dataclass(frozen=True)
class Drift:
    """A change of `table` that the stream did not carry; `reset`: the mirror starts over."""

    table: TableName
    reason: str
    reset: bool = False


def catalog_entries(conn: Conn, tables: Sequence[TableName]) -> dict[TableName, CatalogEntry]:
    """The catalog entry of each table that exists."""
    rows: list[tuple[Any, ...]] = conn.execute(
        """
        SELECT t.ord, c.oid::bigint, a.attnum, a.attname::text,
               a.atthasdef OR a.atthasmissing OR a.attnotnull OR a.attidentity <> ''
        FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS t(schema_name, table_name, ord)
        JOIN pg_namespace n ON n.nspname = t.schema_name
        JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.table_name
        LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY t.ord, a.attnum
        """,
        ([t.schema for t in tables], [t.name for t in tables]),
    ).fetchall()
    columns: dict[int, dict[int, str]] = {}
    valued: dict[int, set[str]] = {}
    oids: dict[int, int] = {}
    for ordinal, oid, attnum, name, has_value in rows:
        i = int(ordinal) - 1
        oids[i] = int(oid)
        columns.setdefault(i, {})
        valued.setdefault(i, set())
        if attnum is not None:  # a table with no columns has one row of NULLs
            columns[i][int(attnum)] = str(name)
            if has_value:
                valued[i].add(str(name))
    return {
        tables[i]: CatalogEntry(oid, columns[i], frozenset(valued[i])) for i, oid in oids.items()
    }


def drifts(recorded: Mapping[str, object], now: Mapping[TableName, CatalogEntry]) -> list[Drift]:
    """What changed between the entries a previous run `recorded` (`CatalogEntry.to_json` by
    table) and the catalog `now`, that the stream did not carry. A table seen for the first
    time, or gone, is not drift: new tables get their snapshot, missing ones the doctor's
    error."""
    found = []
    for table, entry in now.items():
        before = recorded.get(str(table))
        if not isinstance(before, dict):
            continue
        if int(before["oid"]) != entry.oid:
            why = f"was dropped and created again (oid {before['oid']}, now {entry.oid})"
            found.append(Drift(table, why, reset=True))
            continue
        names = {int(n): str(c) for n, c in dict(before["columns"]).items()}
        renamed = [f"{names[n]} -> {c}" for n, c in entry.columns.items() if n in names and
                   names[n] != c]  # fmt: skip
        added = [c for n, c in entry.columns.items() if n not in names and c in entry.valued]
        reasons = []
        if renamed:
            reasons.append(f"renamed column {', '.join(renamed)}")
        if added:
            reasons.append(
                f"added column {', '.join(added)} with a value in existing rows "
                "(a default, an identity or NOT NULL)"
            )
        if reasons:
            found.append(Drift(table, "; ".join(reasons)))
    return found
