"""The doctor's checks of the server's settings: version, wal_level, slot and WAL sender headroom,
and the database's encoding."""

from __future__ import annotations

from psycopg import sql

from cdc_core.pg import catalog
from cdc_core.pg.doctor.context import Context
from cdc_core.pg.doctor.report import Check

MIN_SERVER_VERSION = 140000  # pgoutput's messages option: watermarks, heartbeats, reset markers
RESTART = "then restart the server (a reload is not enough)"


def server_version(ctx: Context) -> Check:
    version = ctx.conn.info.server_version
    shown = (ctx.conn.info.parameter_status("server_version") or str(version)).split()[0]
    if version >= MIN_SERVER_VERSION:
        return Check("server_version", "pass", shown)
    detail = f"{shown}; pgoutput's messages option (watermarks, heartbeats) needs 14 or newer"
    return Check("server_version", "fail", detail, "upgrade PostgreSQL to 14 or newer")


def primary(ctx: Context) -> Check:
    """A standby (a server in recovery) cannot serve capture: the slot, the publication, the
    logical messages of snapshots and heartbeats and each capture's transaction id are all
    written on the primary."""
    row = ctx.conn.execute("SELECT pg_is_in_recovery()").fetchone()
    if not (row and row[0]):
        return Check("primary", "pass", "not in recovery")
    detail = (
        "the server is a standby (in recovery): capture writes on the primary (its slot, the "
        "publication, logical messages and transaction ids)"
    )
    fix = (
        "point source.dsn at the primary (after a failover, see docs/runbooks.md: Failover "
        "to a new primary)"
    )
    return Check("primary", "fail", detail, fix)


def wal_level(ctx: Context) -> Check:
    level = catalog.settings(ctx.conn, ["wal_level"])["wal_level"]
    if level.value == "logical":
        return Check("wal_level", "pass", "logical")
    if level.pending_restart:
        detail = f"{level.value}; a new value is set and waits for a restart"
        return Check("wal_level", "fail", detail, "restart the server")
    fix = "ALTER SYSTEM SET wal_level = logical;\n" + RESTART
    fix += (
        "\n(managed services have their own flag, e.g. rds.logical_replication = 1 on Amazon RDS)"
    )
    return Check("wal_level", "fail", f"{level.value}; logical decoding needs logical", fix)


def _headroom(ctx: Context, setting: str, used: int, ours: str | None) -> Check:
    """Pass when one more is free, or when the pipeline already holds one (`ours` says how)."""
    limit = int(catalog.settings(ctx.conn, [setting])[setting].value)
    detail = f"{used} of {limit} in use"
    if ours is not None:
        return Check(setting, "pass", f"{detail}, {ours}")
    if used < limit:
        return Check(setting, "pass", detail)
    fix = f"ALTER SYSTEM SET {setting} = {limit + 1};\n{RESTART}"
    return Check(setting, "fail", f"{detail}: none free for this pipeline", fix)


def max_replication_slots(ctx: Context) -> Check:
    ours = "one is this pipeline's slot" if ctx.slot is not None else None
    return _headroom(ctx, "max_replication_slots", catalog.replication_usage(ctx.conn).slots, ours)


def max_wal_senders(ctx: Context) -> Check:
    streaming = ctx.slot is not None and ctx.slot.active_pid is not None
    ours = "one streams this pipeline's slot" if streaming else None
    return _headroom(ctx, "max_wal_senders", catalog.replication_usage(ctx.conn).wal_senders, ours)


def encoding(ctx: Context) -> Check:
    encoding = ctx.database.encoding
    if encoding == "UTF8":
        return Check("encoding", "pass", "UTF8")
    create = ctx.render("CREATE DATABASE {} WITH ENCODING 'UTF8' TEMPLATE template0;",
                        sql.Identifier(ctx.database.name))  # fmt: skip
    fix = f"{create}\n(to recreate it: dump it, drop it, run the above, restore the dump)"
    return Check("encoding", "fail", f"{encoding}; the product reads text as UTF-8", fix)
