"""Whether a table's replica identity carries the key its deletes are matched by in the mirror."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from cdc_core.identifiers import TableName
from cdc_core.pg.catalog import Leaf, TableInfo
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


@dataclass(frozen=True)
class Problem:
    """What is wrong, and what to do about it."""

    why: str
    fix: str

    def __str__(self) -> str:
        return f"{self.why}. Run {self.fix}" if self.fix.startswith("ALTER") else (
            f"{self.why}: {self.fix}")  # fmt: skip


def partition_problem(
    info: TableInfo, key: tuple[str, ...], captured: Mapping[int, TableName]
) -> Problem | None:
    """What is wrong with `info`'s partitions for its mirror, and the fix; or None. It is a
    partition of a `captured` table (by OID), whose name its changes are sent under
    (publish_via_partition_root), so its own mirror would never change; or a partition of it
    does not send the old key the mirror matches by (`key`; empty: whole rows), or sends none,
    and then the source refuses its UPDATE and DELETE once published. A partition's replica
    identity is its own: setting the partitioned table's sets neither its partitions' nor
    those created later."""
    parent = next((captured[a] for a in info.ancestors if a in captured), None)
    if parent is not None:
        return Problem(
            f"table {info.name} is a partition of {parent}, which the pipeline captures too: its "
            f"changes are sent as {parent}'s (publish_via_partition_root), so its own mirror "
            "would never change", f"leave {info.name} out of source.tables",
        )  # fmt: skip
    return next(filter(None, (_leaf_problem(info.name, key, leaf) for leaf in info.leaves)), None)


def refused_partition(table: TableName, leaf: Leaf) -> Problem | None:
    """Why the source refuses UPDATE and DELETE on partition `leaf` of `table` once published
    (a replica identity that sends no old key), or None."""
    if leaf.replica_identity is ReplicaIdentity.FULL or leaf.identity_columns:
        return None
    return _leaf_problem(table, leaf.primary_key, leaf)


def _leaf_problem(table: TableName, key: tuple[str, ...], leaf: Leaf) -> Problem | None:
    ident, carried = leaf.replica_identity, leaf.identity_columns
    if ident is ReplicaIdentity.FULL or (carried and key and set(key) <= set(carried)):
        return None
    target = "DEFAULT" if key and set(key) <= set(leaf.primary_key) else "FULL"
    fix = f"ALTER TABLE {leaf.name} REPLICA IDENTITY {target}"
    if ident is ReplicaIdentity.NOTHING:
        shown = "NOTHING"
    elif ident is ReplicaIdentity.DEFAULT:
        shown = "DEFAULT" + (f" (the primary key {', '.join(carried)})" if carried else
                             " without a primary key")  # fmt: skip
    else:
        shown = f"USING INDEX {leaf.identity_index} ({', '.join(carried)})" if carried else (
            "USING INDEX, whose index is gone")  # fmt: skip
    head = f"partition {leaf.name} of {table} has REPLICA IDENTITY {shown}, its own"
    if not carried:
        return Problem(
            f"{head}: the source refuses its UPDATEs and DELETEs while {table} is published",
            f"{fix} (and so for each partition created later)",
        )
    by = f"by {', '.join(key)}" if key else "by whole rows (it has no primary key)"
    return Problem(
        f"{head}: its deletes and key changes would carry only {', '.join(carried)}, and the "
        f"mirror of {table} matches rows {by}, so it would keep deleted rows", fix,
    )  # fmt: skip
