"""Whether a table's replica identity carries the key its deletes are matched by in the mirror."""

from __future__ import annotations

import re

from cdc_core.identifiers import TableName
from cdc_core.pg.catalog import TableInfo
from cdc_core.pg.pgoutput import ReplicaIdentity


def identity_problem(
    table: TableName,
    identity: ReplicaIdentity,
    key: tuple[str, ...],
    identity_columns: tuple[str, ...],
    *,
    primary_key: tuple[str, ...],
    index: str | None = None,
) -> str | None:
    """What is wrong when `table`'s deletes and key changes would not carry `key`, or None.

    `key`: what its events are keyed by (the message.key.columns override, else the primary
    key; empty for a table without one, mirrored as a multiset matched by whole rows).
    `identity_columns`: the old key a DEFAULT or INDEX identity sends. FULL sends whole old
    rows. Under NOTHING, and INDEX whose index is gone, the source itself refuses UPDATE and
    DELETE once the table is published, so only inserts flow; so it does under DEFAULT without
    a primary key, but an override key there is refused, as it always was.
    """
    if identity is ReplicaIdentity.FULL or identity is ReplicaIdentity.NOTHING:
        return None
    if identity is ReplicaIdentity.INDEX and not identity_columns:
        return None
    override = key != primary_key
    if identity is ReplicaIdentity.DEFAULT and not override:
        return None
    shown = _identity(identity, identity_columns, index)
    if not key:
        return (
            f"table {table} has no primary key and REPLICA IDENTITY {shown}: its mirror matches "
            f"whole rows, and its deletes would carry only {', '.join(identity_columns)}, so the "
            f"mirror would keep deleted rows. {_way_out(table, 'FULL', identity_columns)}"
        )
    outside = [c for c in key if c not in identity_columns]
    if not outside:
        return None
    target = "DEFAULT" if primary_key and set(key) <= set(primary_key) else "FULL"
    them = "it" if len(outside) == 1 else "them"
    return (
        f"key column {', '.join(outside)} of {table} {'is' if them == 'it' else 'are'} not in its "
        f"replica identity ({shown}), so its deletes and key changes would not carry {them} and "
        f"the mirror would keep deleted rows. {_way_out(table, target, identity_columns)}"
    )


def _identity(identity: ReplicaIdentity, columns: tuple[str, ...], index: str | None) -> str:
    if identity is ReplicaIdentity.DEFAULT:
        return "DEFAULT" + (f": the primary key {', '.join(columns)}" if columns else "")
    return " ".join(filter(None, ["USING INDEX", index, f"({', '.join(columns)})"]))


def _way_out(table: TableName, target: str, identity_columns: tuple[str, ...]) -> str:
    alter = f"Run ALTER TABLE {table} REPLICA IDENTITY {target}"
    if not identity_columns:
        return alter
    override = f"{re.escape(table.qualified)}:{','.join(map(re.escape, identity_columns))}"
    return f"{alter}, or key it by its replica identity (source.message.key.columns: {override})"


def table_identity_problem(info: TableInfo, override: tuple[str, ...] | None) -> str | None:
    """`identity_problem` for a table as the catalog sees it; `override`: its
    message.key.columns, if any."""
    return identity_problem(
        info.name, info.replica_identity,
        override if override is not None else info.primary_key, info.identity_columns,
        primary_key=info.primary_key, index=info.identity_index,
    )  # fmt: skip
