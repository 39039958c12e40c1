"""`cdc doctor`: a preflight of the source database, each check a pass/fail line and its fix."""

from __future__ import annotations

import difflib
import getpass
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from cdc_core.config import Config, SourceConfig
from cdc_core.errors import LoginError, TerminalError, TransientError
from cdc_core.identifiers import TableName
from cdc_core.pg import catalog
from cdc_core.pg.catalog import Connection, RoleInfo, TableInfo
from cdc_core.pg.connect import connect, refusal
from cdc_core.pg.identity import table_identity_problem
from cdc_core.pg.pgoutput import ReplicaIdentity
from cdc_core.pg.slot import VIA_ROOT, identity_change, published
from cdc_core.signals import signal_table_ddl

Status = Literal["pass", "warn", "fail", "skip"]  # warn: the run goes on, and says so

MIN_SERVER_VERSION = 140000  # pgoutput protocol 2: streamed transactions and logical messages
REQUIRED_OPERATIONS = ("insert", "update", "delete")
RESTART = "then restart the server (a reload is not enough)"
SHARED_OWNERSHIP = (
    "or share the tables' ownership with the role through a replication group "
    "(README.md, Permissions)"
)


@dataclass(frozen=True)
class Check:
    """One line of the report; `fix` (first line: the statement to run) explains a failure."""

    name: str
    status: Status
    detail: str
    fix: str | None = None
    # a run's start stops on this itself, with its own error and bookkeeping (configured tables
    # a publication the product does not add to lacks: `start_publication.unpublished`)
    left_to_start: bool = False


@dataclass(frozen=True)
class DoctorReport:
    """Every check, in the order they ran."""

    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)


@dataclass(frozen=True)
class _Context:
    """What every check reads, gathered once after connecting."""

    conn: Connection
    source: SourceConfig
    pipeline_file: str
    role: RoleInfo
    database: catalog.DatabaseInfo
    tables: dict[TableName, TableInfo | None]
    slot: catalog.SlotInfo | None
    signal_table: TableName | None
    publication: catalog.PublicationInfo | None

    def render(self, template: str, *parts: sql.Composable) -> str:
        """A fix statement, composed like the queries so identifiers are quoted the same way."""
        return sql.SQL(template).format(*parts).as_string(self.conn)

    @property
    def role_id(self) -> sql.Identifier:
        return sql.Identifier(self.role.name)

    @property
    def present(self) -> list[TableInfo]:
        """The configured tables that exist, in configured order."""
        return [info for info in self.tables.values() if info is not None]


def run_doctor(config: Config) -> DoctorReport:
    """Run every check against the pipeline's source; a failure is a line, never an exception."""
    source = config.pipeline.source
    try:
        conn = connect(source.dsn)
    except TransientError as e:
        return _unreachable(config, str(e), _connect_fix(str(e), config))
    except LoginError as e:
        return _unreachable(config, e.failure, _connect_fix(e.failure, config))
    except TerminalError as e:  # a malformed conninfo, not quoted: it may hold the password
        return _unreachable(config, str(e), f"{config.pipeline_file}: source.dsn: correct it")
    with conn:
        return DoctorReport(tuple(_checks(conn, config)))


def _checks(conn: Connection, config: Config) -> list[Check]:
    source = config.pipeline.source
    try:
        conn.execute("SET statement_timeout = '30s'")  # a doctor must not hang on a busy server
        role, database = catalog.current_role(conn), catalog.current_database(conn)
        tables, slot = catalog.table_info(conn, source.tables), catalog.slot_info(conn, source.slot)
        signals = config.pipeline.snapshot.signal_data_collection
        pub = catalog.publication_info(conn, source.publication)
        ctx = _Context(conn, source, config.pipeline_file, role, database, tables, slot, signals,
                       pub)  # fmt: skip
    except psycopg.Error as e:
        failed = Check("connect", "fail", f"connected, but cannot read the catalog: {_reason(e)}")
        return [failed, *_not_run(source, "the catalog could not be read")]
    who = f"{source.dsn.redacted} as {_q(ctx.role.name)}, database {_q(ctx.database.name)}"
    checks = [Check("connect", "pass", who)]
    for name, step in _STEPS:
        try:
            result = step(ctx)
        except psycopg.Error as e:  # one broken check must not hide the others
            result = Check(name, "fail", f"the check itself failed: {_reason(e)}")
        checks.extend(result if isinstance(result, list) else [result])
    return checks


def _unreachable(config: Config, reason: str, fix: str) -> DoctorReport:
    first = Check("connect", "fail", reason, fix)
    return DoctorReport((first, *_not_run(config.pipeline.source, "cannot connect")))


def _connect_fix(reason: str, config: Config) -> str:
    denied = re.search(r'permission denied for database "(.+)"', reason)
    if denied:  # PUBLIC's CONNECT was revoked: the role needs its own
        params = conninfo_to_dict(config.pipeline.source.dsn.conninfo)
        user = str(params.get("user") or os.environ.get("PGUSER") or getpass.getuser())
        grant = f"GRANT CONNECT ON DATABASE {_q(denied.group(1))} TO {_q(user)};"
        return f"{grant}\n(run as the database's owner or a superuser)"
    fix = refusal(reason)
    if fix is not None:
        return fix.format(dsn=f"{config.pipeline_file}: source.dsn")
    return f"start the server, or {config.pipeline_file}: source.dsn: correct the host and port"


def _not_run(source: SourceConfig, why: str) -> list[Check]:
    names = [n for n, _ in _STEPS if n not in ("tables", "replica_identity", "signal_table")]
    names[-1:-1] = [f"{kind} {t}" for kind in ("table", "replica_identity") for t in source.tables]
    return [Check(name, "skip", f"not run: {why}") for name in names]


def _reason(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _q(identifier: str) -> str:
    """Always double-quoted, as in the fixes, so a name reads the same in details and SQL."""
    return sql.Identifier(identifier).as_string()


def _table_id(t: TableName) -> sql.Identifier:
    return sql.Identifier(t.schema, t.name)


def _names(tables: list[TableName]) -> str:
    return ", ".join(str(t) for t in tables)


def _server_version(ctx: _Context) -> Check:
    version = ctx.conn.info.server_version
    shown = (ctx.conn.info.parameter_status("server_version") or str(version)).split()[0]
    if version >= MIN_SERVER_VERSION:
        return Check("server_version", "pass", shown)
    detail = f"{shown}; pgoutput protocol 2 needs 14 or newer"
    return Check("server_version", "fail", detail, "upgrade PostgreSQL to 14 or newer")


def _wal_level(ctx: _Context) -> Check:
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


def _headroom(ctx: _Context, setting: str, used: int, ours: str | None) -> Check:
    """Pass when one more is free, or when the pipeline already holds one (`ours` says how)."""
    limit = int(catalog.settings(ctx.conn, [setting])[setting].value)
    detail = f"{used} of {limit} in use"
    if ours is not None:
        return Check(setting, "pass", f"{detail}, {ours}")
    if used < limit:
        return Check(setting, "pass", detail)
    fix = f"ALTER SYSTEM SET {setting} = {limit + 1};\n{RESTART}"
    return Check(setting, "fail", f"{detail}: none free for this pipeline", fix)


def _max_replication_slots(ctx: _Context) -> Check:
    ours = "one is this pipeline's slot" if ctx.slot is not None else None
    return _headroom(ctx, "max_replication_slots", catalog.replication_usage(ctx.conn).slots, ours)


def _max_wal_senders(ctx: _Context) -> Check:
    streaming = ctx.slot is not None and ctx.slot.active_pid is not None
    ours = "one streams this pipeline's slot" if streaming else None
    return _headroom(ctx, "max_wal_senders", catalog.replication_usage(ctx.conn).wal_senders, ours)


def _can_replicate(role: RoleInfo) -> bool:
    return role.superuser or role.replication or bool(role.rds_replication)


def _replication_role(ctx: _Context) -> Check:
    role, name = ctx.role, _q(ctx.role.name)
    if role.superuser:
        return Check("replication_role", "pass", f"{name} is a superuser")
    if _can_replicate(role):
        how = "has REPLICATION" if role.replication else "is a member of rds_replication"
        return Check("replication_role", "pass", f"{name} {how}")
    fix = ctx.render("ALTER ROLE {} WITH REPLICATION;", ctx.role_id) + "\n(run as a superuser)"
    if role.rds_replication is not None:
        fix += "\n" + ctx.render("on Amazon RDS: GRANT rds_replication TO {};", ctx.role_id)
    return Check("replication_role", "fail", f"{name} has neither REPLICATION nor superuser", fix)


def _replication_connection(ctx: _Context) -> Check:
    """Open a walsender session: the only way to see that pg_hba.conf allows replication."""
    if not _can_replicate(ctx.role):
        return Check("replication_connection", "skip", "not run: the role cannot replicate")
    try:
        with connect(ctx.source.dsn, replication=True) as repl:
            repl.execute("IDENTIFY_SYSTEM")
    except LoginError as e:  # pg_hba.conf has no replication line for the role
        return Check("replication_connection", "fail", e.failure, _hba_fix(ctx, e.failure))
    except (TransientError, psycopg.Error) as e:
        return Check("replication_connection", "fail", _reason(e), _hba_fix(ctx, str(e)))
    return Check("replication_connection", "pass", "pg_hba.conf lets the role replicate")


def _hba_fix(ctx: _Context, reason: str) -> str:
    if "max_wal_senders" in reason:
        return "free a WAL sender, or raise max_wal_senders (see that check)"
    row = ctx.conn.execute("SELECT host(inet_client_addr()), family(inet_client_addr())").fetchone()
    role = _q(ctx.role.name)
    if row is None or row[0] is None:
        line = f"local replication {role} peer"
    else:
        line = f"host replication {role} {row[0]}/{32 if row[1] == 4 else 128} scram-sha-256"
    return f"add to pg_hba.conf: {line}\nthen SELECT pg_reload_conf();"


def _publication(ctx: _Context) -> Check:
    pub = ctx.publication
    if pub is None:
        return _publication_to_create(ctx)
    pub_id, present = sql.Identifier(pub.name), ctx.present
    missing = [i.name for i in present if not pub.all_tables and i.name not in pub.tables]
    detail = f"{_q(pub.name)} publishes {len(present) - len(missing)} of {len(present)} tables"
    detail += " (FOR ALL TABLES)" if pub.all_tables else ""
    problems, fixes = [], []
    absent_ops = [op for op in REQUIRED_OPERATIONS if op not in pub.operations]
    if absent_ops:
        problems.append(f"it does not publish {', '.join(absent_ops)}")
        publish = "ALTER PUBLICATION {} SET (publish = 'insert, update, delete, truncate');"
        fixes.append(ctx.render(publish, pub_id))
    # Only missing tables make the product run ALTER PUBLICATION ... ADD TABLE (and only under
    # publication.autocreate.mode filtered), which needs ownership of the publication and of
    # each table it adds (PostgreSQL 15). The other modes stop the run
    # (`start_publication.unpublished`).
    mode = ctx.source.publication_autocreate_mode
    not_owned = [i.name for i in present if i.name in missing and not i.is_owner]
    if missing and mode != "filtered":
        problems.append(
            f"publication.autocreate.mode {mode} adds no table to an existing publication: "
            f"a run stops until {_names(missing)} {'is' if len(missing) == 1 else 'are'} added"
        )
        add = ctx.render("ALTER PUBLICATION {} ADD TABLE {};", pub_id,
                         published(missing))  # fmt: skip
        fixes += [add, f"(run as {_q(pub.owner)} if it owns those tables, or as a superuser)"]
    elif missing and (not pub.is_owner or not_owned):
        owners = f"the publication ({_q(pub.owner)}) and of the tables"
        problems.append(
            f"{_q(ctx.role.name)} cannot add {_names(missing)}: only the owner of {owners} can"
        )
        add = ctx.render("ALTER PUBLICATION {} ADD TABLE {};", pub_id,
                         published(missing))  # fmt: skip
        fixes += [add, f"(run as {_q(pub.owner)} if it owns those tables, or as a superuser)"]
    partitioned = [i.name for i in present if i.kind == "partitioned"]
    if partitioned and not pub.via_root:
        problems.append(
            f"it sends the changes of partitioned table {_names(partitioned)} under its "
            "partitions' names (publish_via_partition_root is off): the pipeline would miss them"
        )
        via_root = "ALTER PUBLICATION {} SET (publish_via_partition_root = true);"
        fixes.append(ctx.render(via_root, pub_id))
    if problems:
        unpublished = bool(missing) and mode != "filtered"
        return Check("publication", "fail", "; ".join([detail, *problems]), "\n".join(fixes),
                     left_to_start=unpublished)  # fmt: skip
    if missing:
        detail += "; the product adds the others (ALTER PUBLICATION ... ADD TABLE)"
    elif not pub.is_owner:
        detail += f"; used as it is (owner {_q(pub.owner)})"
    return Check("publication", "pass", detail)


def _publication_to_create(ctx: _Context) -> Check:
    name, present = ctx.source.publication, ctx.present
    not_owned = [i for i in present if not i.is_owner]
    if ctx.database.can_create and not not_owned:
        return Check("publication", "pass", f"{_q(name)} does not exist; it will be created")
    create = ctx.render("CREATE PUBLICATION {} FOR TABLE {} {};", sql.Identifier(name),
                        published([i.name for i in present]), VIA_ROOT)  # fmt: skip
    if not_owned:
        why = f"not owner of {_names([i.name for i in not_owned])}"
        owners = ", ".join(sorted({_q(i.owner) for i in not_owned}))
        fix = f"{create}\n(run as a superuser or as the tables' owner: {owners})"
        fix += f"\n{SHARED_OWNERSHIP}"
    else:
        why = f"no CREATE on database {_q(ctx.database.name)}"
        fix = ctx.render("GRANT CREATE ON DATABASE {} TO {};",
                         sql.Identifier(ctx.database.name), ctx.role_id)  # fmt: skip
        fix += f"\nor, as the tables' owner: {create}"
    detail = f"{_q(name)} does not exist and {_q(ctx.role.name)} cannot create it: {why}"
    return Check("publication", "fail", detail, fix)


def _slot(ctx: _Context) -> Check:
    slot, name = ctx.slot, _q(ctx.source.slot)
    if slot is None:
        return Check("slot", "pass", f"{name} does not exist yet; it will be created (pgoutput)")
    problems = []
    if slot.slot_type != "logical":
        problems.append(f"is a {slot.slot_type} slot")
    elif slot.plugin != "pgoutput":
        problems.append(f"uses plugin {slot.plugin}, not pgoutput")
    if slot.database not in (None, ctx.database.name):
        problems.append(f"belongs to database {_q(slot.database)}")
    if problems:
        drop = ctx.render("SELECT pg_drop_replication_slot({});", sql.Literal(slot.name))
        fix = f"{drop}\nor choose another name: {ctx.pipeline_file}: source.slot"
        return Check("slot", "fail", f"{name} " + ", ".join(problems), fix)
    if slot.wal_status == "lost":  # the run decides: snapshot.mode says whether to start over
        mode = f"{ctx.pipeline_file}: snapshot.mode"
        return Check(
            "slot", "warn",
            f"{name} lost the WAL it needs (wal_status lost): changes since its position are "
            "gone from the server",
            f"{mode} when_needed (or always) takes a new slot and a new snapshot by itself; "
            "with initial or no_data the run stops",
        )  # fmt: skip
    state = f"active (pid {slot.active_pid})" if slot.active_pid is not None else "inactive"
    return Check("slot", "pass", f"{name} exists: logical, pgoutput, {state}")


def _tables(ctx: _Context) -> list[Check]:
    known: list[TableName] | None = None  # read only when a table is missing
    checks = []
    for t, info in ctx.tables.items():
        if info is None:
            known = catalog.list_tables(ctx.conn) if known is None else known
            checks.append(_missing_table(ctx, t, known))
            continue
        fixes = []
        if not info.schema_usage:
            grant = "GRANT USAGE ON SCHEMA {} TO {};"
            fixes.append(ctx.render(grant, sql.Identifier(t.schema), ctx.role_id))
        if not info.can_select:
            fixes.append(ctx.render("GRANT SELECT ON {} TO {};", _table_id(t), ctx.role_id))
        if fixes:
            detail = f"{info.kind} table; {_q(ctx.role.name)} cannot SELECT it"
            checks.append(Check(f"table {t}", "fail", detail, "\n".join(fixes)))
        else:
            checks.append(Check(f"table {t}", "pass", f"{info.kind} table, SELECT granted"))
    return checks


def _missing_table(ctx: _Context, t: TableName, known: list[TableName]) -> Check:
    where = f"{ctx.pipeline_file}: source.tables:"
    renamed = _renamed(ctx, t)
    if renamed is not None:
        return renamed
    by_text = {k.qualified.lower(): k for k in known}
    close = difflib.get_close_matches(t.qualified.lower(), list(by_text), n=1, cutoff=0.6)
    if not close:
        detail = f"{t} does not exist in database {_q(ctx.database.name)}"
        return Check(f"table {t}", "fail", detail, f"create it, or {where} remove {t}")
    match = by_text[close[0]]
    detail = f"{t} does not exist (did you mean {match}?)"
    return Check(f"table {t}", "fail", detail, f"{where} write {match} instead of {t}")


def _renamed(ctx: _Context, t: TableName) -> Check | None:
    """A missing table that is likely renamed or moved: the pipeline's publication (which
    publishes a table by its oid, whatever its name) publishes one table source.tables does not
    name. Renamed back, the changes made under the other name are captured as its own."""
    pub = ctx.publication
    if pub is None or pub.all_tables:
        return None
    unnamed = sorted(pub.tables - set(ctx.tables) - {ctx.signal_table})
    if len(unnamed) != 1:
        return None
    (other,) = unnamed
    back = []
    if other.schema != t.schema:
        move = "ALTER TABLE {} SET SCHEMA {};"
        back.append(ctx.render(move, _table_id(other), sql.Identifier(t.schema)))
    if other.name != t.name:
        moved = _table_id(TableName(t.schema, other.name))
        back.append(ctx.render("ALTER TABLE {} RENAME TO {};", moved, sql.Identifier(t.name)))
    detail = (
        f"{t} does not exist; publication {_q(pub.name)} publishes {other}, which source.tables "
        f"does not name: {t} renamed or moved to it?"
    )
    fix = (
        f"{' '.join(back)} (its changes made meanwhile are then captured as {t}'s); or "
        f"{ctx.pipeline_file}: source.tables: write {other} instead of {t} (a new table: "
        "snapshotted, with a mirror of its own)"
    )
    return Check(f"table {t}", "fail", detail, fix)


def _replica_identity(ctx: _Context) -> list[Check]:
    return [_identity(ctx, t, info) for t, info in ctx.tables.items()]


def _identity(ctx: _Context, t: TableName, info: TableInfo | None) -> Check:
    name = f"replica_identity {t}"
    if info is None:
        return Check(name, "skip", "not run: the table does not exist")
    wanted = ctx.source.replica_identity_autoset_values.for_table(t)
    change = identity_change(info, wanted) if wanted else None
    if change is not None and not info.is_owner:  # the run would stop at its ALTER TABLE
        alter = ctx.render("ALTER TABLE {} REPLICA IDENTITY {};", _table_id(t), change)
        detail = (
            f"replica.identity.autoset.values sets {wanted} on every run, and "
            f"{_q(ctx.role.name)} does not own the table (owner {_q(info.owner)})"
        )
        fix = (
            f"{alter}\n(run once as {_q(info.owner)}: an identity already right is left alone)"
            f"\n{SHARED_OWNERSHIP}"
        )
        return Check(name, "fail", detail, fix)
    key = ctx.source.message_key_columns.for_table(t, info.columns)
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
    fix = ctx.render("ALTER TABLE {} REPLICA IDENTITY {};", _table_id(t), sql.SQL(target))
    fix += "" if pk else "\nor add a primary key"
    fix += "" if info.is_owner else f"\n(run as {_q(info.owner)}, its owner)"
    return Check(name, "fail", f"{why}: UPDATE and DELETE events would carry no key", fix)


def _identity_fix(ctx: _Context, info: TableInfo) -> str:
    """The identity that carries the table's key: its primary key's, or whole old rows."""
    key = ctx.source.message_key_columns.for_table(info.name, info.columns)
    by_pk = info.primary_key and set(key or info.primary_key) <= set(info.primary_key)
    target = sql.SQL("DEFAULT" if by_pk else "FULL")
    fix = ctx.render("ALTER TABLE {} REPLICA IDENTITY {};", _table_id(info.name), target)
    if info.identity_columns:
        columns = ",".join(map(re.escape, info.identity_columns))
        override = f"{re.escape(info.name.qualified)}:{columns}"
        fix += f"\nor {ctx.pipeline_file}: source.message.key.columns: {override}"
    return fix + ("" if info.is_owner else f"\n(run as {_q(info.owner)}, its owner)")


def _signal_table(ctx: _Context) -> list[Check]:
    """The signal table is read (never written) at the start of every run."""
    t = ctx.signal_table
    if t is None:
        return []
    name, info = "signal_table", catalog.table_info(ctx.conn, [t])[t]
    if info is None:
        fix = f"{signal_table_ddl(t)}\nor {ctx.pipeline_file}: snapshot.signal.data.collection"
        return [Check(name, "fail", f"{t} does not exist", fix)]
    fixes = []
    if not info.schema_usage:
        fixes.append(ctx.render("GRANT USAGE ON SCHEMA {} TO {};",
                                sql.Identifier(t.schema), ctx.role_id))  # fmt: skip
    if not info.can_select:
        fixes.append(ctx.render("GRANT SELECT ON {} TO {};", _table_id(t), ctx.role_id))
    if fixes:
        return [Check(name, "fail", f"{_q(ctx.role.name)} cannot read {t}", "\n".join(fixes))]
    return [Check(name, "pass", f"{t}, SELECT granted")]


def _cols(columns: tuple[str, ...]) -> str:
    return ", ".join(_q(c) for c in columns)


def _encoding(ctx: _Context) -> Check:
    encoding = ctx.database.encoding
    if encoding == "UTF8":
        return Check("encoding", "pass", "UTF8")
    create = ctx.render("CREATE DATABASE {} WITH ENCODING 'UTF8' TEMPLATE template0;",
                        sql.Identifier(ctx.database.name))  # fmt: skip
    fix = f"{create}\n(to recreate it: dump it, drop it, run the above, restore the dump)"
    return Check("encoding", "fail", f"{encoding}; the product reads text as UTF-8", fix)


_STEPS: tuple[tuple[str, Callable[[_Context], Check | list[Check]]], ...] = (
    ("server_version", _server_version),
    ("wal_level", _wal_level),
    ("max_replication_slots", _max_replication_slots),
    ("max_wal_senders", _max_wal_senders),
    ("replication_role", _replication_role),
    ("replication_connection", _replication_connection),
    ("publication", _publication),
    ("slot", _slot),
    ("tables", _tables),
    ("replica_identity", _replica_identity),
    ("signal_table", _signal_table),
    ("encoding", _encoding),
)

_LABELS: dict[Status, str] = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}
_COLORS: dict[Status, str] = {"pass": "\033[32m", "warn": "\033[33m", "fail": "\033[31m",
                              "skip": "\033[33m"}  # fmt: skip
_NAME_WIDTH = 40  # a longer name (a long table name) pushes its own detail right, not all


def format_report(report: DoctorReport, *, color: bool = False) -> str:
    """One line per check, an indented `fix:` under failures, and a summary line."""
    width = min(max((len(c.name) for c in report.checks), default=0), _NAME_WIDTH)
    lines = []
    for c in report.checks:
        label = f"{_COLORS[c.status]}{_LABELS[c.status]}\033[0m" if color else _LABELS[c.status]
        lines.append(f"{label}  {c.name.ljust(width)}  {c.detail}".rstrip())
        if c.fix:
            first, *rest = c.fix.splitlines()
            lines.append(f"      fix: {first}")
            lines.extend(f"           {line}" for line in rest)
    counts = Counter(c.status for c in report.checks)
    summary = f"{counts['pass']} passed, {counts['fail']} failed"
    if counts["warn"]:
        summary += f", {counts['warn']} warnings"
    if counts["skip"]:
        summary += f", {counts['skip']} not run"
    return "\n".join([*lines, summary])
