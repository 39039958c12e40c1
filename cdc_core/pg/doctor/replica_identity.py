"""The doctor's check of each configured table's replica identity: that UPDATE and DELETE events
carry the table's key, and that a replica.identity.autoset.values rule can be applied."""

from __future__ import annotations

import re

from psycopg import sql

from cdc_core.identifiers import TableName
from cdc_core.pg.catalog import TableInfo
from cdc_core.pg.doctor.context import SHARED_OWNERSHIP, Context, quoted, table_id
from cdc_core.pg.doctor.report import Check
from cdc_core.pg.identity import partition_problem, table_identity_problem
from cdc_core.pg.pgoutput import ReplicaIdentity
from cdc_core.pg.slot import identity_change, identity_refusal


def replica_identity(ctx: Context) -> list[Check]:
    return [_identity(ctx, t, info) for t, info in ctx.tables.items()]


def _identity(ctx: Context, t: TableName, info: TableInfo | None) -> Check:
    name = f"replica_identity {t}"
    if info is None:
        return Check(name, "skip", "not run: the table does not exist")
    wanted = ctx.source.replica_identity_autoset_values.for_table(t)
    refusal = identity_refusal(info, wanted) if wanted else None
    if refusal is not None:  # a run refuses it before any ALTER TABLE
        return Check(
            name, "fail", f"replica.identity.autoset.values sets {wanted}: {refusal}",
            f"give {t} FULL (or INDEX of a unique index) in replica.identity.autoset.values, "
            "or leave it out of the rule",
        )  # fmt: skip
    change = identity_change(info, wanted) if wanted else None
    if change is not None and not info.is_owner:  # the run would stop at its ALTER TABLE
        alter = ctx.render("ALTER TABLE {} REPLICA IDENTITY {};", table_id(t), change)
        detail = (
            f"replica.identity.autoset.values sets {wanted} on every run, and "
            f"{quoted(ctx.role.name)} does not own the table (owner {quoted(info.owner)})"
        )
        fix = (
            f"{alter}\n(run once as {quoted(info.owner)}: an identity already right is left alone)"
            f"\n{SHARED_OWNERSHIP}"
        )
        return Check(name, "fail", detail, fix)
    key = ctx.source.message_key_columns.for_table(t, info.columns)
    captured = {i.oid: t for t, i in ctx.tables.items() if i is not None}
    partition = partition_problem(info, key or info.primary_key, captured)
    if partition:
        return Check(name, "fail", partition.why, partition.fix)
    problem = table_identity_problem(info, key)
    if problem:
        return Check(name, "fail", problem, _identity_fix(ctx, info))
    ident, pk = info.replica_identity, info.primary_key
    if ident is ReplicaIdentity.FULL:
        return Check(name, "pass", "FULL" + (f", primary key ({_cols(pk)})" if pk else ""))
    if ident is ReplicaIdentity.DEFAULT and pk:
        return Check(name, "pass", f"primary key ({_cols(pk)})")
    if ident is ReplicaIdentity.INDEX and info.identity_index_columns:
        cols = _cols(info.identity_index_columns)
        return Check(name, "pass", f"USING INDEX {info.identity_index} ({cols})")
    why = {
        ReplicaIdentity.DEFAULT: "no primary key and REPLICA IDENTITY DEFAULT",
        ReplicaIdentity.NOTHING: "REPLICA IDENTITY NOTHING",
        ReplicaIdentity.INDEX: "its REPLICA IDENTITY index is gone",
    }[ident]
    target = "DEFAULT" if pk else "FULL"
    fix = ctx.render("ALTER TABLE {} REPLICA IDENTITY {};", table_id(t), sql.SQL(target))
    fix += "" if pk else "\nor add a primary key"
    fix += "" if info.is_owner else f"\n(run as {quoted(info.owner)}, its owner)"
    if ctx.source.discovered:  # found by the lists, maybe not meant to be captured
        fix += f"\nor leave it out: {ctx.pipeline_file}: {ctx.source.tables_key} lets it through"
    return Check(name, "fail", f"{why}: UPDATE and DELETE events would carry no key", fix)


def _identity_fix(ctx: Context, info: TableInfo) -> str:
    """The identity that carries the table's key: its primary key's, or whole old rows."""
    key = ctx.source.message_key_columns.for_table(info.name, info.columns)
    by_pk = info.primary_key and set(key or info.primary_key) <= set(info.primary_key)
    target = sql.SQL("DEFAULT" if by_pk else "FULL")
    fix = ctx.render("ALTER TABLE {} REPLICA IDENTITY {};", table_id(info.name), target)
    if info.identity_columns:
        columns = ",".join(map(re.escape, info.identity_columns))
        override = f"{re.escape(info.name.qualified)}:{columns}"
        fix += f"\nor {ctx.pipeline_file}: source.message.key.columns: {override}"
    return fix + ("" if info.is_owner else f"\n(run as {quoted(info.owner)}, its owner)")


def _cols(columns: tuple[str, ...]) -> str:
    return ", ".join(quoted(c) for c in columns)
