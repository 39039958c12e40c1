"""`cdc doctor`: a preflight of the source database, each check a pass/fail line and its fix.

`run_doctor` connects, gathers what the checks read once (`context.Context`), then runs the checks
in the order of `_STEPS`, grouped in modules: the server's settings and encoding (`server`), the
role (`role`), the publication (`publication`), the slot and the other slots that keep WAL
(`slot`), the configured tables and the signal table (`tables`), the tables' replica identity
(`replica_identity`). `report` holds a check's line, the whole report and how it prints.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Callable

import psycopg
from psycopg.conninfo import conninfo_to_dict

from cdc_core.config import Config, SourceConfig
from cdc_core.config.model import DroppedTable
from cdc_core.errors import LoginError, TerminalError, TransientError, first_line
from cdc_core.pg import catalog
from cdc_core.pg.catalog import Connection
from cdc_core.pg.connect import InitialStatementError, connect, refusal
from cdc_core.pg.discover import describe, discover
from cdc_core.pg.doctor import publication, replica_identity, role, server, slot, tables
from cdc_core.pg.doctor.context import Context, quoted
from cdc_core.pg.doctor.report import Check, DoctorReport, Status, format_report

__all__ = ["Check", "DoctorReport", "Status", "format_report", "run_doctor"]


def run_doctor(config: Config) -> DoctorReport:
    """Run every check against the pipeline's source; a failure is a line, never an exception."""
    source = config.pipeline.source
    try:
        conn = connect(source.dsn)
    except TransientError as e:
        return _unreachable(config, str(e), _connect_fix(str(e), config))
    except LoginError as e:
        return _unreachable(config, e.failure, _connect_fix(e.failure, config))
    except InitialStatementError as e:
        fix = f"{config.pipeline_file}: source.database.initial.statements: correct it"
        return _unreachable(config, str(e), fix)
    except TerminalError as e:  # a malformed conninfo, not quoted: it may hold the password
        return _unreachable(config, str(e), f"{config.pipeline_file}: source.dsn: correct it")
    with conn:
        return DoctorReport(tuple(_checks(conn, config)))


def _checks(conn: Connection, config: Config) -> list[Check]:
    try:
        conn.execute("SET statement_timeout = '30s'")  # a doctor must not hang on a busy server
        config = discover(config, conn)  # source.tables omitted: the tables a run would find
        source = config.pipeline.source
        ctx = Context(
            conn=conn,
            source=source,
            pipeline_file=config.pipeline_file,
            role=catalog.current_role(conn),
            database=catalog.current_database(conn),
            tables=catalog.table_info(conn, source.tables),
            slot=catalog.slot_info(conn, source.slot),
            signal_table=config.pipeline.snapshot.signal_data_collection,
            publication=catalog.publication_info(conn, source.publication),
            selects={
                t: query for t in source.tables
                if (query := config.pipeline.snapshot.select_for(t)) is not None
            },
            approximate=_approximate(config),
        )  # fmt: skip
    except psycopg.Error as e:
        detail = f"connected, but cannot read the catalog: {first_line(e)}"
        failed = Check("connect", "fail", detail)
        return [failed, *_not_run(config.pipeline.source, "the catalog could not be read")]
    who = f"{source.dsn.redacted} as {quoted(ctx.role.name)}, database {quoted(ctx.database.name)}"
    checks = [Check("connect", "pass", who)]
    if source.discovered:
        checks.append(Check("discovery", "pass", describe(config)))
    checks += [_dropped(ctx, d) for d in source.dropped]
    for name, step in _STEPS:
        try:
            result = step(ctx)
        except psycopg.Error as e:  # one broken check must not hide the others
            result = Check(name, "fail", f"the check itself failed: {first_line(e)}")
        checks.extend(result if isinstance(result, list) else [result])
    return checks


def _approximate(config: Config) -> dict[str, str]:
    """The base types the silver options type approximately (`Context.approximate`)."""
    silver = config.pipeline.silver
    found: dict[str, str] = {}
    if silver.decimal_handling_mode == "double":
        found |= dict.fromkeys(("numeric", "money"), "decimal.handling.mode: double")
    if silver.interval_handling_mode == "numeric":
        found["interval"] = "interval.handling.mode: numeric"
    return found


def _dropped(ctx: Context, d: DroppedTable) -> Check:
    """A captured table dropped at the source (`cdc_core.dropped`): not a failure, its mirror
    keeps the table's last rows."""
    done = ("its mirror holds its last changes" if d.applied else
            "the run applies the changes made to it before the drop to its mirror, by its OID "
            f"{d.oid}, then keeps the mirror as it is")  # fmt: skip
    detail = f"{d.table} was dropped in database {quoted(ctx.database.name)}: {done}"
    if ctx.source.discovered:
        return Check(f"table {d.table}", "warn", detail, "nothing to do; delete its folder "
                     "under silver/ if the mirror is not wanted")  # fmt: skip
    return Check(f"table {d.table}", "warn", detail,
                 f"{ctx.pipeline_file}: source.tables: remove {d.table}")  # fmt: skip


def _unreachable(config: Config, reason: str, fix: str) -> DoctorReport:
    first = Check("connect", "fail", reason, fix)
    return DoctorReport((first, *_not_run(config.pipeline.source, "cannot connect")))


def _connect_fix(reason: str, config: Config) -> str:
    denied = re.search(r'permission denied for database "(.+)"', reason)
    if denied:  # PUBLIC's CONNECT was revoked: the role needs its own
        params = conninfo_to_dict(config.pipeline.source.dsn.conninfo)
        user = str(params.get("user") or os.environ.get("PGUSER") or getpass.getuser())
        grant = f"GRANT CONNECT ON DATABASE {quoted(denied.group(1))} TO {quoted(user)};"
        return f"{grant}\n(run as the database's owner or a superuser)"
    fix = refusal(reason)
    if fix is not None:
        return fix.format(dsn=f"{config.pipeline_file}: source.dsn")
    return f"start the server, or {config.pipeline_file}: source.dsn: correct the host and port"


def _not_run(source: SourceConfig, why: str) -> list[Check]:
    lines_of_tables = ("guardrail", "tables", "replica_identity", "signal_table")
    names = [n for n, _ in _STEPS if n not in lines_of_tables]
    names[-1:-1] = [f"{kind} {t}" for kind in ("table", "replica_identity") for t in source.tables]
    return [Check(name, "skip", f"not run: {why}") for name in names]


_STEPS: tuple[tuple[str, Callable[[Context], Check | list[Check]]], ...] = (
    ("server_version", server.server_version),
    ("primary", server.primary),
    ("wal_level", server.wal_level),
    ("max_replication_slots", server.max_replication_slots),
    ("max_wal_senders", server.max_wal_senders),
    ("replication_role", role.replication_role),
    ("replication_connection", role.replication_connection),
    ("publication", publication.publication),
    ("slot", slot.slot),
    ("other_slots", slot.other_slots),
    ("guardrail", tables.guardrail),
    ("tables", tables.tables),
    ("key_types", tables.approximate_keys),
    ("key_transforms", tables.key_transforms),
    ("message_keys", tables.message_keys),
    ("replica_identity", replica_identity.replica_identity),
    ("signal_table", tables.signal_table),
    ("encoding", server.encoding),
)
