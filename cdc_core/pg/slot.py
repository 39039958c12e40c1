"""Idempotent publication and slot set-up, slot state, and advancing the slot past staged data."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from cdc_core.config.model import AutocreateMode, Dsn
from cdc_core.errors import TerminalError, TransientError
from cdc_core.identifiers import TableName
from cdc_core.lsn import Lsn
from cdc_core.pg import catalog, waits
from cdc_core.pg.catalog import Connection
from cdc_core.pg.connect import connect, unbounded
from cdc_core.pg.identity import refused_partition
from cdc_core.pg.pgoutput import ReplicaIdentity

PLUGIN = "pgoutput"
WAITS_FOR = (
    "a new slot starts only once every transaction that had written when it was created has "
    "ended, in every database of the server, a prepared transaction included"
)
log = logging.getLogger("cdc_core.slot")


@dataclass(frozen=True)
class SlotState:
    """A logical slot as the server reports it."""

    name: str
    confirmed_flush: Lsn
    restart: Lsn | None
    wal_status: str | None
    active_pid: int | None


def published(tables: Sequence[TableName]) -> sql.Composable:
    """The tables as a publication names them: each ONLY itself. Without ONLY a table's
    inheritance children are published too, tables the pipeline does not capture, and those
    without a key would then refuse UPDATE and DELETE. (A partitioned table's partitions are
    published with it either way.)"""
    return sql.SQL(", ").join(
        sql.SQL("ONLY {}").format(sql.Identifier(t.schema, t.name)) for t in tables
    )


VIA_ROOT = sql.SQL("WITH (publish_via_partition_root = true)")


def _check_via_root(
    conn: Connection, publication: catalog.PublicationInfo, tables: Sequence[TableName]
) -> None:
    """Refuse a publication that sends a captured partitioned table's changes under its
    partitions' names: the pipeline knows only the partitioned table, so it would miss them."""
    if publication.via_root:
        return
    infos = catalog.table_info(conn, tables)
    partitioned = [t for t, i in infos.items() if i is not None and i.kind == "partitioned"]
    if partitioned:
        names = ", ".join(map(str, partitioned))
        alter = sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = true)").format(
            sql.Identifier(publication.name)
        )
        raise TerminalError(
            f"publication {publication.name!r} sends the changes of partitioned table {names} "
            "under its partitions' names (publish_via_partition_root is off), so the pipeline "
            f"would miss them. Run {alter.as_string(conn)}, then run again; if the pipeline "
            "streamed the table before, its mirror missed those changes: snapshot it again "
            "(cdc snapshot --table)"
        )


def _check_publishable(conn: Connection, tables: Sequence[TableName]) -> None:
    """Refuse tables that are missing, or whose UPDATE/DELETE would start failing on the source.

    A table without a key under REPLICA IDENTITY DEFAULT (or with NOTHING) rejects UPDATE and
    DELETE once a publication publishes them, so adding it would break the application.
    """
    infos = catalog.table_info(conn, tables)
    for table, info in infos.items():
        if info is None:
            raise TerminalError(f"table {table} does not exist (check source.tables)")
        refused = next(filter(None, (refused_partition(table, leaf) for leaf in info.leaves)), None)
        if refused is not None:
            raise TerminalError(str(refused))
        if info.replica_identity is ReplicaIdentity.FULL or info.identity_columns:
            continue
        raise TerminalError(
            f"table {table} has no primary key and REPLICA IDENTITY "
            f"{info.replica_identity.name}: publishing it would make its UPDATEs and DELETEs "
            f"fail on the source. Run ALTER TABLE {table} REPLICA IDENTITY FULL (or add a "
            "primary key), then run again"
        )


def ensure_publication(
    conn: Connection, name: str, tables: Sequence[TableName], mode: AutocreateMode, *,
    add: bool = True,
) -> list[TableName]:  # fmt: skip
    """Make publication `name` publish `tables`, per Debezium's `publication.autocreate.mode`;
    returns the tables it still does not publish.

    An existing publication is used as it is defined; with `filtered` (and `add`), configured
    tables it lacks are added (never removed: another consumer may rely on them).
    """
    existing = catalog.publication_info(conn, name)
    pub = sql.Identifier(name)
    if existing is None:
        if mode == "disabled":
            raise TerminalError(
                f"publication {name!r} does not exist and publication.autocreate.mode is "
                f"disabled: create it with CREATE PUBLICATION {pub.as_string(conn)} FOR TABLE "
                f"{published(tables).as_string(conn)} {VIA_ROOT.as_string(conn)}"
            )
        _check_publishable(conn, tables)
        if mode == "all_tables":
            create = sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES {}").format(pub, VIA_ROOT)
        else:
            create = sql.SQL("CREATE PUBLICATION {} FOR TABLE {} {}").format(
                pub, published(tables), VIA_ROOT
            )
        _execute(conn, create)
        return []
    _check_via_root(conn, existing, tables)
    missing = existing.lacks(tables)
    if not missing or mode != "filtered" or not add:
        return missing
    _check_publishable(conn, missing)
    _execute(conn, sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(pub, published(missing)))
    return []


DDL_LOCK_WAIT_MS = 5000
"""How long `ALTER TABLE ... REPLICA IDENTITY` waits for its lock (lock_timeout): every
statement on the table that comes after it waits behind it meanwhile."""


def autoset_replica_identity(
    conn: Connection, tables: Sequence[TableName], wanted: Callable[[TableName], str | None]
) -> list[str]:
    """Set the replica identity `wanted` gives each table, where it differs; returns what
    changed, as `table: IDENTITY`. A role that may not alter a table stops the run."""
    changed = []
    targets = {t: wanted(t) for t in tables}
    infos = catalog.table_info(conn, [t for t, w in targets.items() if w])
    refused = [
        f"{table}: {why}"
        for table, info in infos.items()
        if info is not None and (why := identity_refusal(info, targets[table] or "")) is not None
    ]
    if refused:  # before any ALTER: the source is left as it was
        raise TerminalError(
            f"replica.identity.autoset.values would break the source, so nothing was changed: "
            f"{'; '.join(refused)}. Give such tables FULL (or INDEX of a unique index) in the "
            "rule, or leave them out of it"
        )
    for table, info in infos.items():
        target = targets[table]
        if info is None or target is None:
            continue  # the doctor names missing tables
        clause = identity_change(info, target)
        if clause is None:
            continue
        statement = sql.SQL("ALTER TABLE {} REPLICA IDENTITY {}").format(
            sql.Identifier(table.schema, table.name), clause,
        )  # fmt: skip
        try:
            with conn.transaction():  # its lock waits, and every statement on the table behind it
                conn.execute(f"SET LOCAL lock_timeout = {DDL_LOCK_WAIT_MS}")
                _execute(conn, statement)
        except psycopg.errors.LockNotAvailable as e:
            holders = waits.holding(conn, table)
            whom = waits.said(holders) if holders else "sessions that have ended since"
            raise TransientError(
                f"replica.identity.autoset.values: {statement.as_string(conn)} waited "
                f"{DDL_LOCK_WAIT_MS // 1000} s for a lock on {table} and gave up, so that the "
                "table's readers and writers queued behind it do not wait longer (a transient "
                f"failure: exit 75, the next run tries again). Locks on the table are held by: "
                f"{whom}. Or run the statement yourself when the table is quiet",
                sqlstate=e.sqlstate,
            ) from e
        except psycopg.errors.UndefinedObject as e:  # INDEX name: no such index of the table
            raise TerminalError(
                f"replica.identity.autoset.values asks {table} for {target}: "
                f"{e.diag.message_primary}; name one of the table's unique indexes"
            ) from e
        changed.append(f"{table}: {target}")
    return changed


def identity_refusal(info: catalog.TableInfo, target: str) -> str | None:
    """Why setting replica identity `target` on a captured (so published) table would make the
    source refuse its UPDATEs and DELETEs, or None. PostgreSQL refuses them on a published table
    without a replica identity: NOTHING, or DEFAULT without a primary key."""
    kind = target.partition(" ")[0]
    if kind == "NOTHING":
        return "REPLICA IDENTITY NOTHING would make its UPDATEs and DELETEs fail on the source"
    if kind == "DEFAULT" and not info.primary_key:
        return (
            "it has no primary key, so REPLICA IDENTITY DEFAULT would make its UPDATEs and "
            "DELETEs fail on the source"
        )
    return None


def identity_change(info: catalog.TableInfo, target: str) -> sql.Composable | None:
    """The REPLICA IDENTITY clause that gives the table identity `target` (FULL, DEFAULT,
    NOTHING or INDEX name), or None when it has it already."""
    kind, _, index = target.partition(" ")
    if kind == "INDEX":
        same = info.replica_identity is ReplicaIdentity.INDEX and (
            (info.identity_index or "").split(".")[-1].strip('"') == index
        )
        return None if same else sql.SQL("USING INDEX {}").format(sql.Identifier(index))
    return None if info.replica_identity.name == kind else sql.SQL(kind)


def _execute(conn: Connection, statement: sql.Composed) -> None:
    try:
        conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege as e:
        raise TerminalError(
            f"not allowed to run {statement.as_string(conn)}: {e.diag.message_primary}; "
            "run it as the tables' owner (cdc doctor shows the grants needed)"
        ) from e


def slot_state(conn: Connection, name: str) -> SlotState | None:
    """The slot's positions and health, or None when it does not exist."""
    row = conn.execute(
        "SELECT confirmed_flush_lsn::text, restart_lsn::text, wal_status, active_pid "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (name,),
    ).fetchone()
    if row is None:
        return None
    confirmed, restart, wal_status, active_pid = row
    return SlotState(
        name,
        Lsn.parse(str(confirmed)) if confirmed else Lsn(0),
        Lsn.parse(str(restart)) if restart else None,
        None if wal_status is None else str(wal_status),
        None if active_pid is None else int(str(active_pid)),
    )


def refusable_value(conn: Connection, query: str) -> object | None:
    """The first value of `query`'s row; None where the server does not let the role ask (some
    managed services), or where the question does not apply (a standby has no WAL position)."""
    try:
        with conn.transaction():  # a savepoint inside a transaction: a refusal leaves it usable
            row = conn.execute(query).fetchone()
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedFunction,
            psycopg.errors.FeatureNotSupported,
            psycopg.errors.ObjectNotInPrerequisiteState):  # fmt: skip
        return None
    return None if row is None else row[0]


def system_identifier(conn: Connection) -> str | None:
    """The database cluster's system identifier (`pg_control_system()`), which tells one
    cluster's WAL from another's: a physical standby, promoted or not, shares its primary's;
    `initdb`, `pg_upgrade` and a restored dump make a new one, whose LSNs are a history of
    their own. None where the server does not let the role read it (some managed services)."""
    value = refusable_value(conn, "SELECT system_identifier::text FROM pg_control_system()")
    return None if value is None else str(value)


def ensure_slot(conn: Connection, name: str, dsn: Dsn, *, failover: bool = False) -> SlotState:
    """Create logical slot `name` (pgoutput) if missing; refuse a slot that is not ours to use.
    Only a run's start creates it (`cdc_core.start`): what reads it later uses `usable_slot`.
    Creating it waits for every transaction that had written to end, in every database of the
    server: after a few seconds the log names them (`waits.reported_wait`, on a session to
    `dsn`). `failover` (slot.failover): a failover slot, synchronized to standbys, on
    PostgreSQL 17+ (an existing one is made one, on a replication session to `dsn`); a warning
    before 17."""
    can_fail_over = conn.info.server_version >= catalog.FAILOVER_SLOTS
    if failover and not can_fail_over:
        log.warning("source.slot.failover: PostgreSQL %s has no failover slots (17 and newer "
                    "do): slot %s is not synchronized to standbys",
                    conn.info.server_version // 10_000, name)  # fmt: skip
    if catalog.slot_info(conn, name) is None:
        create = "SELECT pg_create_logical_replication_slot(%s, %s)"
        if failover and can_fail_over:  # (name, plugin, temporary, two-phase, failover)
            create = "SELECT pg_create_logical_replication_slot(%s, %s, false, false, true)"
        # created concurrently: it is checked below like any existing slot
        # the server waits for every transaction running to end, however long that takes
        doing = f"creating replication slot {name!r}"
        with (
            contextlib.suppress(psycopg.errors.DuplicateObject),
            unbounded(conn),
            waits.reported_wait(conn, dsn, doing, WAITS_FOR),
        ):
            conn.execute(create, (name, PLUGIN))
    state = usable_slot(conn, name)
    assert state is not None
    info = catalog.slot_info(conn, name) if failover and can_fail_over else None
    if info is not None and info.failover is False:
        with connect(dsn, replication=True) as replication:  # a replication command
            replication.execute(
                sql.SQL("ALTER_REPLICATION_SLOT {} ( FAILOVER true )").format(sql.Identifier(name))
            )
        log.info("slot %s is a failover slot now (source.slot.failover)", name)
    return state


def usable_slot(conn: Connection, name: str) -> SlotState | None:
    """Slot `name`, or None when it does not exist (never created here: a new slot has none of
    the changes before it); refuses a slot that is not ours to use, or that lost its WAL."""
    info = catalog.slot_info(conn, name)
    if info is None:
        return None
    database = catalog.current_database(conn).name
    if info.slot_type != "logical" or info.plugin != PLUGIN or info.database != database:
        raise TerminalError(
            f"replication slot {name!r} exists but is a {info.slot_type} slot using "
            f"{info.plugin or 'no plugin'} on database {info.database or '-'}; this pipeline "
            f"needs a logical {PLUGIN} slot on {database}: choose another source.slot or drop "
            f"it with SELECT pg_drop_replication_slot('{name}')"
        )
    state = slot_state(conn, name)
    if state is None:  # dropped this instant
        return None
    if state.wal_status == "lost":
        raise lost_slot(name)
    if state.confirmed_flush == Lsn(0):  # NULL: a logical slot has one once it is created
        raise still_created(conn, state)
    return state


def still_created(conn: Connection, state: SlotState) -> TransientError:
    """A slot another session is creating still (its creation waits for open transactions): a
    run stopped meanwhile leaves its session waiting on the server, and that session finishes
    the slot once they end. The slot has no position yet: using it now would record none."""
    waiting = waits.blocking(conn, state.active_pid) if state.active_pid is not None else []
    whom = f" It waits for: {waits.said(waiting)}." if waiting else ""
    return TransientError(
        f"replication slot {state.name!r} is still being created by session "
        f"{state.active_pid or '(ended)'} ({WAITS_FOR}; a run stopped while it waited leaves "
        f"that session on the server, which finishes the slot).{whom} This run exits 75; the "
        "next run uses the slot once it is created"
    )


def lost_slot(name: str, said: str = "") -> TerminalError:
    """The error for a slot found lost after a run's start checked it (the server invalidated
    it meanwhile): no retry brings the WAL back; the next run's start says what `snapshot.mode`
    does about it."""
    server = f" (the server said: {said})" if said else ""
    return TerminalError(
        f"replication slot {name!r} has lost WAL it needed (wal_status = lost, see "
        f"max_slot_wal_keep_size){server}: changes are missing. The next run's start decides by "
        "snapshot.mode: when_needed takes a new slot and a new snapshot, the other modes stop "
        "with the way out"
    )


def advance_slot(conn: Connection, name: str, to: Lsn) -> Lsn:
    """Move the slot's confirmed position forward to `to` (never backwards); returns it."""
    row = conn.execute(
        "SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)", (name, str(to))
    ).fetchone()
    return Lsn.parse(str(row[0])) if row and row[0] else to


def next_xid(conn: Connection) -> int:
    """A transaction id given out now (32-bit): every id from it on is given out later. Costs
    one id and an empty commit, neither flushed nor waited for. (A snapshot's xmax is no such
    bound: it is one past the newest transaction to finish, and ids above it may be running.)"""
    with conn.transaction():
        conn.execute("SET LOCAL synchronous_commit = off")
        row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
    assert row is not None
    return int(str(row[0])) % (1 << 32)


def flush_position(conn: Connection) -> Lsn:
    """The server's WAL flush position: logical decoding never reads past it."""
    row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
    assert row is not None
    return Lsn.parse(str(row[0]))
