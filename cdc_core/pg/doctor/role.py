"""The doctor's checks of the role: may it replicate, and does pg_hba.conf let it do so."""

from __future__ import annotations

import psycopg

from cdc_core.errors import LoginError, TransientError, first_line
from cdc_core.pg.catalog import RoleInfo
from cdc_core.pg.connect import connect
from cdc_core.pg.doctor.context import Context, quoted
from cdc_core.pg.doctor.report import Check


def _can_replicate(role: RoleInfo) -> bool:
    return role.superuser or role.replication or bool(role.rds_replication)


def replication_role(ctx: Context) -> Check:
    role, name = ctx.role, quoted(ctx.role.name)
    if role.superuser:
        return Check("replication_role", "pass", f"{name} is a superuser")
    if _can_replicate(role):
        how = "has REPLICATION" if role.replication else "is a member of rds_replication"
        return Check("replication_role", "pass", f"{name} {how}")
    fix = ctx.render("ALTER ROLE {} WITH REPLICATION;", ctx.role_id) + "\n(run as a superuser)"
    if role.rds_replication is not None:
        fix += "\n" + ctx.render("on Amazon RDS: GRANT rds_replication TO {};", ctx.role_id)
    return Check("replication_role", "fail", f"{name} has neither REPLICATION nor superuser", fix)


def replication_connection(ctx: Context) -> Check:
    """Open a walsender session: the only way to see that pg_hba.conf allows replication."""
    if not _can_replicate(ctx.role):
        return Check("replication_connection", "skip", "not run: the role cannot replicate")
    try:
        with connect(ctx.source.dsn, replication=True) as repl:
            repl.execute("IDENTIFY_SYSTEM")
    except LoginError as e:  # pg_hba.conf has no replication line for the role
        return Check("replication_connection", "fail", e.failure, _hba_fix(ctx, e.failure))
    except (TransientError, psycopg.Error) as e:
        return Check("replication_connection", "fail", first_line(e), _hba_fix(ctx, str(e)))
    return Check("replication_connection", "pass", "pg_hba.conf lets the role replicate")


def _hba_fix(ctx: Context, reason: str) -> str:
    if "max_wal_senders" in reason:
        return "free a WAL sender, or raise max_wal_senders (see that check)"
    row = ctx.conn.execute("SELECT host(inet_client_addr()), family(inet_client_addr())").fetchone()
    role = quoted(ctx.role.name)
    if row is None or row[0] is None:
        line = f"local replication {role} peer"
    else:
        line = f"host replication {role} {row[0]}/{32 if row[1] == 4 else 128} scram-sha-256"
    return f"add to pg_hba.conf: {line}\nthen SELECT pg_reload_conf();"
