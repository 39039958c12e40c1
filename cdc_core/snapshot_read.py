"""Snapshot reads: one group of chunks, read in parallel by Spark JDBC under one MVCC snapshot.

The driver notes the WAL insert position (low watermark), opens a REPEATABLE READ transaction,
locks the table in ACCESS SHARE mode (no TRUNCATE or ALTER while it is read), exports its
snapshot and records what it sees (`pg_current_snapshot()`: xmin, xmax, running xids) and the
WAL insert position after it (high watermark, the read's place in the stream). When the
pipeline streams, the stream is then staged past the high watermark and the rows it overtook
are dropped or brought up to date (`cdc_core.snapshot_window`). Each executor imports the
snapshot (`SET TRANSACTION SNAPSHOT`) and reads one chunk, values as the type's output text
(what pgoutput sends). The rows go to bronze as `op=r` events at the high watermark, carrying
the read view, in one commit per group that Delta skips if it was already made. A pipeline
that does not stream (`initial_only`) has nothing to bring the groups' moments together, so
its groups all import one snapshot, exported by a transaction held open across them
(`shared_snapshot`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from delta.tables import DeltaTable
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_core import __version__, faults
from cdc_core.bronze import WATERMARK as STAGED_END
from cdc_core.bronze import applied_end, ensure_bronze, record_schema
from cdc_core.columns import NO_RULES, ColumnPlan, ColumnRules
from cdc_core.config import Dsn
from cdc_core.config.model import NO_KEYS, KeyColumns
from cdc_core.envelope import BRONZE, conformed
from cdc_core.errors import CdcError, TerminalError, TransientError, first_line, text_of
from cdc_core.events import RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.lake_state import committing
from cdc_core.lsn import Lsn
from cdc_core.notifications import NotificationType, Notifier, TableScanStatus
from cdc_core.pg.catalog import own_rows
from cdc_core.pg.connect import VALUE_OPTIONS, connect, session_init
from cdc_core.pg.sql_text import for_jdbc
from cdc_core.silver_table import quoted
from cdc_core.snapshot import SnapshotJob, TableSnapshot, catalog_descriptor
from cdc_core.snapshot_plan import Chunk, ChunkPlan, chunk_predicate
from cdc_core.snapshot_window import Key, Overtaken, ReadView, departures, overtaken
from cdc_core.transient import as_transient, jdbc_message

log = logging.getLogger("cdc_core.snapshot")


@dataclass(frozen=True)
class GroupRead:
    """One group of one table's snapshot, as its caller describes it."""

    job_id: str
    kind: str  # initial | incremental | blocking
    pipeline: str
    database: str
    table: TableName
    plan: ChunkPlan
    chunks: tuple[Chunk, ...]
    group: int
    condition: str | None  # an extra WHERE condition (Debezium's additional-conditions)
    select: str | None  # a full SELECT to read from instead of the table (blocking snapshots)
    fetch_size: int
    columns: tuple[str, ...] = ()  # as the catalog has them under the read's lock
    primary_key: tuple[str, ...] = ()  # the events' key (the chunk key may be a surrogate)
    keys: KeyColumns = NO_KEYS  # message.key.columns
    rules: ColumnRules = NO_RULES  # column filters and transforms
    skipped: frozenset[str] = frozenset()  # skipped.operations: stream events bronze never gets
    since: int | None = None  # the WAL position before the table's first read in the job

    @property
    def app_id(self) -> str:
        return f"cdc-snapshot-{self.job_id}-{self.table.qualified}"


def jdbc_target(dsn: Dsn, info: psycopg.ConnectionInfo | None = None) -> tuple[str, dict[str, str]]:
    """A JDBC URL and connection properties for the source, formatting values like pgoutput.

    `info`: a psycopg connection to the source, whose host, port, database, user and TLS settings
    are what libpq resolved (the connection string, then PGHOST, PGPORT, PGSSLMODE..., a service
    file; of several hosts, the one that answered). Without it the connection string alone
    decides, and what it leaves out falls to the JDBC driver's defaults (localhost:5432), which
    could be another server than the one the slot is on. A Unix socket, which the driver cannot
    reach, is the same server over TCP on localhost at the same port."""
    params: dict[str, object] = dict(conninfo_to_dict(dsn.conninfo))
    if info is not None:
        params = {**info.get_parameters(), **{k: v for k, v in params.items() if v}}
        socket = info.host.startswith("/") or info.host.startswith("@")
        params.update(host="localhost" if socket else info.host, port=info.port,
                      dbname=info.dbname, user=info.user)  # fmt: skip
    host, port = str(params.get("host") or "localhost"), str(params.get("port") or "5432")
    user = str(params.get("user") or "")
    url = f"jdbc:postgresql://{host}:{port}/{params.get('dbname') or user}"
    # The driver sends its own TimeZone (the JVM's) after `options`, and the server applies it
    # last: the settings are made again once the session is open.
    props = {"driver": "org.postgresql.Driver", "user": user, "options": VALUE_OPTIONS,
             "sessionInitStatement": session_init(dsn)}  # fmt: skip
    for key in ("password", "sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword"):
        if params.get(key):
            props[key] = str(params[key])
    if props.get("sslkey"):
        _check_client_key(Path(props["sslkey"]))
    if dsn.query_timeout_s > 0:  # Spark sets it on each chunk's statement: the driver cancels it
        props["queryTimeout"] = str(math.ceil(dsn.query_timeout_s))  # whole seconds, 0 is none
    return url, props


def _source(read: GroupRead, conn: psycopg.Connection[tuple[object, ...]]) -> sql.Composable:
    """What the group's chunks read from: the table's own rows, or the blocking read's query."""
    if read.select:
        return sql.SQL("(\n{}\n) AS cdc_selected").format(sql.SQL(read.select))
    return own_rows(conn, read.table)


def _lock_what_it_reads(
    conn: psycopg.Connection[tuple[object, ...]], read: GroupRead, source: sql.Composable,
    lock_timeout_ms: int, *, shared: bool,
) -> None:  # fmt: skip
    """Lock every table the chunks read, as the read's own table is locked: parsing the chunks'
    SELECT (with `LIMIT 0`) takes ACCESS SHARE on each one it names, a join's, a view's or a
    condition's subquery's too, and the coordinator's transaction keeps them. A chunk reader
    that waits for a lock then waits only behind a request queued since, which the read gives
    way to (`READER_LOCK_WAIT_MS`); without them it gave way to a table another session held,
    a wait that was no cycle, and ended the run after five. `shared`: the read is under a
    snapshot taken earlier, whose catalog names the columns as they were then; the table has
    today's, and a column dropped or renamed since cannot be read under it."""
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in read.columns)
    where = sql.SQL(" WHERE (\n{}\n)").format(sql.SQL(read.condition or "true"))
    try:
        conn.execute(sql.SQL("SELECT {} FROM {}{} LIMIT 0").format(columns, source, where))
    except psycopg.errors.UndefinedColumn as e:
        if not shared:
            raise
        raise TerminalError(
            f"snapshot of {read.table}: {e.diag.message_primary}, though the snapshot every "
            "table is read under has it: it was dropped or renamed since; run again for a new "
            "snapshot"
        ) from e
    except psycopg.errors.LockNotAvailable as e:
        raise TransientError(
            f"snapshot of {read.table}: no ACCESS SHARE lock within {lock_timeout_ms} ms on a "
            "table its read joins or selects from (snapshot.lock.timeout.ms; a long ALTER "
            f"TABLE, TRUNCATE or VACUUM FULL holds it): {e.diag.message_primary}; the next run "
            "tries again"
        ) from e
    if shared:
        _refuse_rewritten(conn, read.table, "a table its read joins or selects from", created=False)


def _refuse_rewritten(
    conn: psycopg.Connection[tuple[object, ...]], table: TableName, what: str, *,
    created: bool = True,
) -> None:  # fmt: skip
    """TRUNCATE and the ALTER TABLEs that rewrite a table are not MVCC-safe: a table emptied or
    rewritten since the snapshot the transaction reads under was taken reads empty under it.
    Refuse the read if any table the transaction has locked was (the read's own, its
    partitions, the tables its SELECT joins): pg_class as the snapshot saw it, against
    pg_relation_filenode, the catalog of now. `created`: a relation created since is refused
    too (a partition; not when planning has locked indexes, which may be new and are harmless)."""
    rows = conn.execute(
        """SELECT l.relation::regclass::text
           FROM pg_locks l LEFT JOIN pg_class c ON c.oid = l.relation
           WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND l.granted
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND l.relation >= 16384  -- FirstNormalObjectId: not the catalogs
             AND ((c.oid IS NULL AND %(created)s) OR (c.relkind IN ('r', 'm')
                  AND c.relfilenode IS DISTINCT FROM pg_relation_filenode(c.oid)))
           ORDER BY 1""",
        {"created": created},
    ).fetchall()
    if rows:
        raise TerminalError(
            f"snapshot of {table}: {what} was emptied or rewritten (TRUNCATE, VACUUM FULL or an "
            f"ALTER TABLE that rewrites it: {', '.join(str(r[0]) for r in rows)}) after the "
            "snapshot every table is read under was taken, so a read under it would not find "
            "its rows; run again for a new snapshot"
        )


def _chunk_query(
    read: GroupRead, chunk: Chunk, source: sql.Composable,
    conn: psycopg.Connection[tuple[object, ...]],
) -> str:  # fmt: skip
    return _query(read, chunk_predicate(read.plan, chunk), source, conn)


def _keys_query(
    read: GroupRead, keys: Sequence[Key], source: sql.Composable,
    conn: psycopg.Connection[tuple[object, ...]],
) -> str:  # fmt: skip
    """The read's query for the rows of `keys` (primary-key values as text), wherever their
    chunks are: the keys as rows of the table, so the server compares them as it does rows."""
    names = sql.SQL(", ").join(sql.Identifier(c) for c in read.primary_key)
    rows = [dict(zip(read.primary_key, k, strict=True)) for k in keys]
    among = sql.SQL("({}) IN (SELECT {} FROM jsonb_populate_recordset(NULL::{}, {}::jsonb))")
    predicate = among.format(
        names,
        names,
        sql.Identifier(read.table.schema, read.table.name),
        sql.Literal(json.dumps(rows)),
    )
    return _query(read, predicate.as_string(conn), source, conn)


def _query(
    read: GroupRead, predicate: str, source: sql.Composable,
    conn: psycopg.Connection[tuple[object, ...]],
) -> str:  # fmt: skip
    texts = sql.SQL(", ").join(
        sql.SQL("CASE WHEN {0}::text IS NULL THEN NULL ELSE format('%s', {0}) END AS {0}").format(
            sql.Identifier(c)
        )
        for c in read.columns
    )  # ::text IS NULL: a composite whose fields are all NULL is not NULL itself
    where = [predicate] + ([f"(\n{read.condition}\n)"] if read.condition else [])
    query = sql.SQL("SELECT {} FROM {} WHERE {}").format(
        texts, source, sql.SQL(" AND ".join(where))
    )
    return for_jdbc(query.as_string(conn))


_READABLE_PEM = "-----BEGIN PRIVATE KEY-----"  # unencrypted PKCS #8: libpq and the JDBC driver


def _check_client_key(path: Path) -> None:
    """A PEM client key libpq reads but the JDBC driver of the snapshot reads cannot (it reads
    PEM only as unencrypted PKCS #8: an encrypted, PKCS #1 or EC key fails every read with
    "Could not read SSL key file", which passes for a lost connection) stops the run before a
    read, naming the conversion. A key this process cannot open is left to the driver (on a
    cluster, the executors')."""
    try:
        with path.open("rb") as f:
            head = f.read(4096).decode("ascii", "replace")
    except OSError:
        return
    begin = next((line.strip() for line in head.splitlines() if line.startswith("-----BEGIN")), "")
    if not begin or begin == _READABLE_PEM:
        return  # DER (.pk8, with sslpassword), PKCS #12 (.p12) or readable PEM
    kind = begin.removeprefix("-----BEGIN ").removesuffix("-----").lower()
    raise TerminalError(
        f"source.dsn: sslkey {path} is a PEM {kind}, which libpq reads but the PostgreSQL JDBC "
        "driver of the snapshot reads does not (it reads unencrypted PKCS #8 PEM, "
        f"{_READABLE_PEM}); convert it, `openssl pkcs8 -topk8 -nocrypt -in {path} -out "
        "client.key`, keep the new file private (chmod 600) and point sslkey at it: both read it"
    )


CatchUp = Callable[[Lsn], object]
"""Stages the stream past a position (`cdc_core.capture.catch_up`)."""


class TableGoneError(Exception):
    """The table was dropped since its snapshot was planned."""


@dataclass(frozen=True)
class SharedSnapshot:
    """One MVCC snapshot that every group of a run's reads imports instead of taking its own:
    without a stream to bring the groups' moments together, the reads must share one."""

    name: str  # pg_export_snapshot()'s
    view: ReadView


@contextlib.contextmanager
def shared_snapshot(dsn: Dsn) -> Iterator[SharedSnapshot]:
    """A snapshot exported by a transaction held open for the block (none of the tables is
    locked meanwhile: each group locks its own while it reads, as without it)."""
    holder = connect(dsn, values=True)
    try:
        before = _one(holder, "SELECT pg_current_wal_flush_lsn()::text")
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        exported = _one(holder, "SELECT pg_export_snapshot()")  # takes the snapshot
        snapshot = _one(holder, "SELECT pg_current_snapshot()::text")
        position = _one(holder, "SELECT pg_current_wal_insert_lsn()::text")
        view = ReadView.parse(snapshot, position, before)
        yield SharedSnapshot(exported, view)
    finally:
        holder.close()  # ends the transaction, and with it the exported snapshot


# How long a chunk reader waits for its table's ACCESS SHARE lock. The coordinator holds that
# lock already, so a reader waits only behind a conflicting request queued since (an ALTER
# TABLE, a TRUNCATE, a VACUUM FULL), which waits for the coordinator, which waits for the
# readers: a wait no side ends, while every other session of the application queues behind
# the DDL. The window gives way instead: it ends, the DDL goes first, and the group is read
# again under a new snapshot, with the columns the table has then.
READER_LOCK_WAIT_MS = 1000
_GIVE_WAY_ATTEMPTS = 5


class _GaveWayError(Exception):
    """A group's readers found a lock request queued behind its coordinator's lock."""


def read_group(
    spark: SparkSession, lake: Lake, dsn: Dsn, read: GroupRead, *, catch_up: CatchUp | None,
    lock_timeout_ms: int = 10_000, shared: SharedSnapshot | None = None,
) -> tuple[ReadView, int, RelationDescriptor]:  # fmt: skip
    """Read the group's chunks under one snapshot and append them to bronze; (view, rows, the
    table's shape as read). `catch_up`: the pipeline streams, and the read is reconciled with
    it (None: no stream). `shared`: the snapshot to read under instead of one of its own. A
    read that a queued DDL would deadlock with gives way to it and starts again."""
    for attempt in range(1, _GIVE_WAY_ATTEMPTS + 1):
        try:
            return _read_group(spark, lake, dsn, read, catch_up=catch_up,
                               lock_timeout_ms=lock_timeout_ms, shared=shared)  # fmt: skip
        except _GaveWayError as e:
            if attempt == _GIVE_WAY_ATTEMPTS:
                raise TransientError(
                    f"snapshot of {read.table}: group {read.group + 1} gave way {attempt} times "
                    "to a lock request queued behind its read (an ALTER TABLE, TRUNCATE or "
                    f"VACUUM FULL of the table, or a LOCK TABLE): {e}; the next run reads it "
                    "again", sqlstate="55P03",
                ) from e  # fmt: skip
            log.warning("snapshot of %s: a lock request (an ALTER TABLE, TRUNCATE, VACUUM FULL "
                        "or LOCK TABLE) queued behind group %d's read; the read gave way to it "
                        "and starts again (attempt %d of %d)", read.table, read.group + 1,
                        attempt + 1, _GIVE_WAY_ATTEMPTS)  # fmt: skip
            time.sleep(min(0.5 * 2**attempt, 8.0))
    raise AssertionError("unreachable")


def _read_group(
    spark: SparkSession, lake: Lake, dsn: Dsn, read: GroupRead, *, catch_up: CatchUp | None,
    lock_timeout_ms: int, shared: SharedSnapshot | None,
) -> tuple[ReadView, int, RelationDescriptor]:  # fmt: skip
    coordinator = connect(dsn, values=True)
    url, props = jdbc_target(dsn, coordinator.info)  # the server the coordinator reached
    props["options"] = f"{props['options']} -c lock_timeout={READER_LOCK_WAIT_MS}"
    if "password" not in props and coordinator.info.password:  # from PGPASSWORD or a passfile:
        props["password"] = coordinator.info.password  # libpq found it, JDBC would not
    try:
        if shared is None:
            before, exported = _take_snapshot(coordinator, read.table, lock_timeout_ms)
        else:
            exported = _import_snapshot(coordinator, shared, read.table, lock_timeout_ms)
        shape = catalog_descriptor(coordinator, read.table)  # locked
        shape = shape.keyed(read.keys.for_table(read.table, [c.name for c in shape.columns]))
        plan = read.rules.plan(shape)
        if plan is not None:  # only the kept columns are read
            shape = plan.descriptor
        read = dataclasses.replace(
            read, columns=tuple(c.name for c in shape.columns), primary_key=shape.primary_key
        )
        if shared is None:
            snapshot = _one(coordinator, "SELECT pg_current_snapshot()::text")
            faults.point("snapshot.after_export")  # a transaction the read missed may commit
            position = _one(coordinator, "SELECT pg_current_wal_insert_lsn()::text")
            view = ReadView.parse(snapshot, position, before)
        else:
            view = shared.view
        props |= {
            "sessionInitStatement": (
                f"{session_init(dsn)}; BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY; "
                f"SET TRANSACTION SNAPSHOT '{exported}'"
            ),
            "fetchsize": str(read.fetch_size),
        }
        source = _source(read, coordinator)
        _lock_what_it_reads(coordinator, read, source, lock_timeout_ms, shared=shared is not None)
        chunks = [_chunk_query(read, c, source, coordinator) for c in read.chunks]
        with _exported_by(coordinator, read):  # the readers import its snapshot
            frames = _frames(spark, url, props, chunks)
            newer = Overtaken()
            if catch_up is not None:
                catch_up(view.position)  # the stream, staged past the read: what overtook it
                view, newer, moved = _with_the_stream(spark, lake, coordinator, read, view,
                                                      source=source)  # fmt: skip
                frames += _frames(spark, url, props, moved)
            rows = _union(frames)
            if plan is not None and plan.transforms:  # values rewritten before anything lands
                rows = _transformed(rows, plan)
            if newer:
                rows = _overtake(spark, rows, read, newer)
            metadata = _append(spark, lake, read, view, _envelopes(rows, read, view))
        count = _appended_rows(spark, lake, metadata)
        if count is None:  # an earlier run's read of this group is what bronze holds
            view, count = _landed_read(spark, lake, read, view)
    finally:
        coordinator.close()  # ends the transaction, and with it the exported snapshot
    return view, count, shape


def _append(
    spark: SparkSession, lake: Lake, read: GroupRead, view: ReadView, rows: DataFrame
) -> dict[str, object]:
    """Append the group's rows to bronze (the chunks are read here), in a commit Delta skips
    if an earlier run made it; the commit's metadata."""
    faults.point("window.high_watermark")
    ensure_bronze(spark, lake)
    metadata = {
        "snapshot": read.job_id,
        "table": read.table.qualified,
        "group": read.group,
        "before": view.before.value,  # the read's place travels with its rows
        "position": view.position.value,
        **({"unseen_from": view.unseen_from.value} if view.unseen_from else {}),
        STAGED_END: str(applied_end(spark, lake)),
    }  # kept in reach of the history depth
    with committing(spark, metadata), _giving_way():
        (
            rows.write.format("delta").mode("append")
            .option("txnAppId", read.app_id).option("txnVersion", read.group)
            .save(lake.bronze)
        )  # fmt: skip
    return metadata


@contextlib.contextmanager
def _exported_by(
    coordinator: psycopg.Connection[tuple[object, ...]], read: GroupRead
) -> Iterator[None]:
    """The readers import the snapshot the coordinator's transaction exported: one that fails
    because that session is gone (a server restart, a terminated backend: `invalid snapshot
    identifier`) fails the group as a transient error, retried as a lost connection is; any
    other failure is left as it is."""
    try:
        yield
    except CdcError:
        raise
    except Exception as e:
        if _alive(coordinator):
            raise
        raise TransientError(
            f"snapshot of {read.table}: group {read.group + 1}: the session holding the read's "
            "snapshot was lost while the readers imported it (a server restart, or the session "
            f"ended): {_server_said(e)}; the group is read again"
        ) from e


def _alive(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    except psycopg.Error:  # reached, its transaction failed: not the session lost
        return True
    return not conn.broken


def _server_said(error: BaseException) -> str:
    """The driver's message in a reader's error (a Py4J error's first line names only the
    call), else the error's first line."""
    text = (text_of(error) or "").strip()
    return jdbc_message(text) or (first_line(text) if text else type(error).__name__)


def _frames(
    spark: SparkSession, url: str, props: dict[str, str], queries: Sequence[str]
) -> list[DataFrame]:
    with _giving_way():  # Spark resolves each query's columns here, on a reader's session
        return [spark.read.jdbc(url, f"({q}) AS cdc_chunk", properties=props) for q in queries]


@contextlib.contextmanager
def _giving_way() -> Iterator[None]:
    """A chunk reader's lock wait (`READER_LOCK_WAIT_MS`) as `_GaveWayError`; the rest as it is."""
    try:
        yield
    except Exception as e:
        mapped = as_transient(e)
        if mapped is not None and mapped.sqlstate == "55P03":
            raise _GaveWayError(mapped.server or str(mapped)) from e
        raise


def _take_snapshot(
    conn: psycopg.Connection[tuple[object, ...]], table: TableName, lock_timeout_ms: int
) -> tuple[str, str]:
    """Open the read's transaction, lock `table` and export the snapshot; (the low watermark,
    the snapshot's name). The low watermark is the flush position: a commit written but not yet
    flushed (not yet visible) is inside the window. A commit flushed but not yet visible (with
    synchronous replication it waits for a standby) is before it: `snapshot_window` finds such
    a transaction by its id, which the snapshot has in its running list."""
    before = _one(conn, "SELECT pg_current_wal_flush_lsn()::text")
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    conn.execute(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}")
    _lock(conn, table, lock_timeout_ms)
    faults.point("window.low_watermark")
    exported = _one(conn, "SELECT pg_export_snapshot()")  # takes the snapshot
    return before, exported


def _import_snapshot(
    conn: psycopg.Connection[tuple[object, ...]], shared: SharedSnapshot, table: TableName,
    lock_timeout_ms: int,
) -> str:  # fmt: skip
    """Open the read's transaction under the shared snapshot and lock `table`; the snapshot's
    name. TRUNCATE and the ALTER TABLEs that rewrite a table are not MVCC-safe: one committed
    since the snapshot was taken would leave a read under it the table emptied, so the table
    must have the storage it had then (the lock keeps it so while the group is read)."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(shared.name)))
    conn.execute(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}")
    _lock(conn, table, lock_timeout_ms)
    _refuse_rewritten(conn, table, "the table")
    return shared.name


def _lock(conn: psycopg.Connection[tuple[object, ...]], table: TableName, timeout_ms: int) -> None:
    try:
        conn.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(
                sql.Identifier(table.schema, table.name)
            )
        )
    except psycopg.errors.UndefinedTable as e:
        raise TableGoneError(str(table)) from e
    except psycopg.errors.LockNotAvailable as e:
        raise TransientError(
            f"snapshot of {table}: no ACCESS SHARE lock within {timeout_ms} ms "
            "(snapshot.lock.timeout.ms; a long ALTER TABLE, TRUNCATE or VACUUM FULL holds it); "
            "the next run tries again"
        ) from e


def _with_the_stream(
    spark: SparkSession, lake: Lake, conn: psycopg.Connection[tuple[object, ...]],
    read: GroupRead, view: ReadView, *, source: sql.Composable,
) -> tuple[ReadView, Overtaken, list[str]]:  # fmt: skip
    """What the stream, staged past the read, changes in it: the view with where the changes
    it did not see begin, the changes that overtook it (`cdc_core.snapshot_window`), and the
    query for the rows that left its chunks for keys read before (`_read_where_they_went`),
    read under the same snapshot, in the same commit."""
    newer = overtaken(lake, read.table, read.primary_key, view, read.skipped)
    newer = _leave_to_later_groups(conn, read, newer)
    departed = _read_where_they_went(spark, lake, conn, read, view)
    view = dataclasses.replace(view, unseen_from=newer.unseen_from)
    return view, newer, [_keys_query(read, departed, source, conn)] if departed else []


def _leave_to_later_groups(
    conn: psycopg.Connection[tuple[object, ...]], read: GroupRead, newer: Overtaken
) -> Overtaken:
    """`newer` without the moves to a key that a later group of this snapshot reads. That
    group reads the row itself, at its own later place in the stream; moved into this read
    too, the row would land twice (an order renumbered to a new id belongs to the last chunk).
    The read's row at the old key goes, as a deleted key's does. Which chunk a key belongs
    to is the server's to say (`_judged`). A move whose chunk key the change did not resend
    moves as before, and so do all of them if the server does not take a key as a row of the
    table."""
    upper = read.chunks[-1].upper
    if upper is None or not read.plan.key or not newer.moved:
        return newer
    judged = [(new, {c: values[c] for c in read.plan.key})
              for new, (_, values) in newer.moved.items()
              if all(c in values for c in read.plan.key)]  # fmt: skip
    if not judged:
        return newer
    later = chunk_predicate(read.plan, Chunk(read.chunks[-1].number + 1, upper, None))
    try:
        found = _judged(conn, read.table, [{"key": key} for _, key in judged], {"key": later})
    except (psycopg.DataError, psycopg.IntegrityError) as e:
        log.warning(
            "snapshot of %s: %d rows the stream moved to new keys are kept in this read, and a "
            "later group may read them again (the server did not take a key as a row of the "
            "table: %s)", read.table, len(judged), e.diag.message_primary,
        )  # fmt: skip
        return newer
    left = {judged[n][0] for n in found}
    moved = {new: move for new, move in newer.moved.items() if new not in left}
    return dataclasses.replace(newer, moved=moved)  # the old keys are among the dropped


def _judged(
    conn: psycopg.Connection[tuple[object, ...]], table: TableName,
    items: Sequence[dict[str, dict[str, str | None]]], where: dict[str, str],
) -> set[int]:  # fmt: skip
    """Which of `items` meet `where`: each item names chunk-key values (as text) that must
    meet the predicate of the same name. Which chunk a key belongs to is the server's to say,
    as it is for the chunks' own reads: the values become rows of the table (its types and
    collations, its NULLs), under the chunks' predicates, in one query; indexes into `items`.
    Inside a savepoint, so the read's transaction goes on when the server does not take a
    value as one of the table's (a DataError or IntegrityError, raised)."""
    relation = sql.Identifier(table.schema, table.name)
    tests = sql.SQL(" AND ").join(
        sql.SQL("EXISTS (SELECT FROM jsonb_populate_record(NULL::{}, e.v -> {}) WHERE {})").format(
            relation, sql.Literal(name), sql.SQL(predicate)
        )  # the predicate's names are the record's: the innermost scope's
        for name, predicate in where.items()
    )
    query = sql.SQL(
        "SELECT e.n FROM jsonb_array_elements({}::jsonb) WITH ORDINALITY AS e(v, n) WHERE {}"
    ).format(sql.Literal(json.dumps(list(items))), tests)  # no parameters: a % in a bound is text
    with conn.transaction():
        found = conn.execute(query).fetchall()
    return {int(str(n)) - 1 for (n,) in found}


def _read_where_they_went(
    spark: SparkSession, lake: Lake, conn: psycopg.Connection[tuple[object, ...]],
    read: GroupRead, view: ReadView,
) -> list[Key]:  # fmt: skip
    """Keys this read reads besides its chunks: rows that were in its chunks and that key
    changes the read saw moved to keys an earlier group had already read without them, not
    resending some values (unchanged TOASTed ones). The read does not find them at their old
    keys, and the mirror would have them only from the stream, without those values: this read
    reads them where they are. Not a row an earlier read of the job found there already (its
    snapshot saw the last move), so that no key is read twice."""
    first = read.chunks[0]
    if read.since is None or first.lower is None or not read.plan.key or not read.primary_key:
        return []  # the first group: no earlier read to have passed a key
    if "c" in read.skipped:  # the stream's rows at new keys never reach the mirror
        return []
    chunk_key = read.plan.key
    gone = [
        d for d in departures(lake, read.table, view, Lsn(read.since))
        if all(c in d.origin for c in chunk_key) and all(c in d.values for c in chunk_key)
    ]  # fmt: skip
    if not gone:
        return []
    items = [
        {"from": {c: d.origin[c] for c in chunk_key}, "to": {c: d.values[c] for c in chunk_key}}
        for d in gone
    ]  # fmt: skip
    mine = chunk_predicate(read.plan, Chunk(first.number, first.lower, read.chunks[-1].upper))
    earlier = chunk_predicate(read.plan, Chunk(first.number - 1, None, first.lower))
    try:
        found = _judged(conn, read.table, items, {"from": mine, "to": earlier})
    except (psycopg.DataError, psycopg.IntegrityError) as e:
        log.warning(
            "snapshot of %s: %d rows the stream moved to new keys without resending some "
            "values are not read where they went; their mirror rows may lack those values "
            "(the server did not take a key as a row of the table: %s)",
            read.table, len(gone), e.diag.message_primary,
        )  # fmt: skip
        return []
    wanted = [gone[n] for n in sorted(found)]
    if not wanted:
        return []
    seen = _views_of_reads(spark, lake, read, [d.key for d in wanted])
    keys = [d.key for d in wanted if not any(v.sees(d.xid) for v in seen.get(d.key, ()))]
    if keys:
        log.info("snapshot of %s: group %d also reads %d rows that key changes moved into "
                 "chunks read before them, not resending some values", read.table,
                 read.group + 1, len(keys))  # fmt: skip
    return keys


def _views_of_reads(
    spark: SparkSession, lake: Lake, read: GroupRead, keys: Sequence[Key]
) -> dict[Key, list[ReadView]]:
    """The MVCC snapshots under which the job's reads of `read.table` found `keys`."""
    names = [f"__cdc_k{i}" for i in range(len(read.primary_key))]
    key_type = T.StructType([T.StructField(c, T.StringType()) for c in read.primary_key])
    wanted = spark.createDataFrame(list(keys), T.StructType(
        [T.StructField(n, T.StringType()) for n in names]
    ))  # fmt: skip
    reads = (
        spark.read.format("delta").load(lake.bronze)
        .where((F.col("source_table") == read.table.qualified) & (F.col("op") == "r")
               & F.col("staged_file").startswith(f"snapshot:{read.job_id}:"))
        .select(F.from_json("key", key_type).alias("k"), "read_view")
    )  # fmt: skip
    on = [reads["k"][c].eqNullSafe(wanted[n]) for c, n in zip(read.primary_key, names, strict=True)]
    found: dict[Key, list[ReadView]] = {}
    for row in reads.join(F.broadcast(wanted), on).collect():
        view = row["read_view"]
        if view is None:
            continue
        key = tuple(row[n] for n in names)
        found.setdefault(key, []).append(
            ReadView(view["xmin"], view["xmax"], tuple(view["xip"] or ()), Lsn(0), Lsn(0))
        )
    return found


def _overtake(spark: SparkSession, rows: DataFrame, read: GroupRead, newer: Overtaken) -> DataFrame:
    """The read as the stream left it at the read's place (`cdc_core.snapshot_window`): rows
    deleted go, rows updated take the new values, rows moved to a new key move."""
    marks: list[tuple[Key, str, dict[str, str | None]]] = [(k, "drop", {}) for k in newer.dropped]
    marks += [(k, "update", v) for k, v in newer.newer.items() if k not in newer.dropped]
    marks += [(source, "move", v) for source, v in newer.moved.values()]
    key = read.primary_key
    schema = T.StructType(
        [T.StructField(f"__cdc_k{i}", T.StringType()) for i in range(len(key))]
        + [T.StructField("__cdc_do", T.StringType()),
           T.StructField("__cdc_values", T.MapType(T.StringType(), T.StringType()))]
    )  # fmt: skip
    data = [(*k, do, values) for k, do, values in marks]
    plan = F.broadcast(spark.createDataFrame(data, schema))
    on = [rows[quoted(c)] == plan[f"__cdc_k{i}"] for i, c in enumerate(key)]
    joined = rows.join(plan, on, "left")  # a moved row also meets its own delete: both kept
    kept = joined.where(F.col("__cdc_do").isNull() | F.col("__cdc_do").isin("update", "move"))
    values = F.col("__cdc_values")
    return kept.select(*[
        F.when(F.map_contains_key(values, c), F.element_at(values, F.lit(c)))
        .otherwise(F.col(quoted(c))).alias(c)
        for c in read.columns
    ])  # fmt: skip


def _transformed(rows: DataFrame, plan: ColumnPlan) -> DataFrame:
    """The read's values through the same column transforms the stream's values go through."""
    out = []
    for n, c in enumerate(plan.descriptor.columns):
        transform = plan.transforms.get(n)
        column = F.col(quoted(c.name))
        if transform is not None:
            column = F.udf(_or_null(transform), T.StringType())(column)
        out.append(column.alias(c.name))
    return rows.select(*out)


def _or_null(transform: Callable[[str], str]) -> Callable[[str | None], str | None]:
    return lambda value: None if value is None else transform(value)


def _one(conn: psycopg.Connection[tuple[object, ...]], query: str) -> str:
    row = conn.execute(query).fetchone()
    assert row is not None
    return str(row[0])


def _union(frames: Sequence[DataFrame]) -> DataFrame:
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


def _appended_rows(spark: SparkSession, lake: Lake, metadata: dict[str, object]) -> int | None:
    """Rows the group's commit wrote; None when Delta skipped it (made by an earlier run). The
    metadata names the read's WAL positions, so no other read's commit matches it."""
    newest = DeltaTable.forPath(spark, lake.bronze).history(1).first()
    if newest is None or not newest["userMetadata"]:
        return None
    try:
        mine = json.loads(newest["userMetadata"]) == metadata
    except ValueError:
        return None
    return int((newest["operationMetrics"] or {}).get("numOutputRows", 0)) if mine else None


def _landed_read(
    spark: SparkSession, lake: Lake, read: GroupRead, view: ReadView
) -> tuple[ReadView, int]:
    """The place and row count of the read of this group that bronze holds: an earlier run
    committed it and was killed before its job noted it, so Delta skipped this read's commit.
    The job must take the earlier read's place, or the sweep after the snapshot would take
    that read's rows (and rows streamed between the two reads) for rows the source lost. Only
    the place is replaced: the MVCC snapshot in the view stays this read's, which no caller
    uses (bronze's rows carry their own)."""
    history = (
        DeltaTable.forPath(spark, lake.bronze).history().select("userMetadata", "operationMetrics")
    )
    for row in history.where(F.col("userMetadata").contains(read.job_id)).collect():
        try:
            meta = json.loads(row["userMetadata"])
        except ValueError:
            continue
        if (meta.get("snapshot"), meta.get("table"), meta.get("group")) != (
            read.job_id, read.table.qualified, read.group,
        ):  # fmt: skip
            continue
        rows = int((row["operationMetrics"] or {}).get("numOutputRows", 0))
        if "before" not in meta or "position" not in meta:
            break  # committed by a version that did not record its place
        log.info("snapshot %s: %s group %d was committed by an earlier run; its read stands",
                 read.job_id, read.table, read.group)  # fmt: skip
        before, position = Lsn(int(meta["before"])), Lsn(int(meta["position"]))
        unseen = Lsn(int(meta["unseen_from"])) if "unseen_from" in meta else None
        landed = dataclasses.replace(view, before=before, position=position, unseen_from=unseen)
        return landed, rows
    raise TerminalError(
        f"snapshot {read.job_id}: bronze already holds group {read.group} of {read.table}, but "
        "its commit (made by an earlier version) does not say where it was read, so the "
        f"snapshot cannot finish safely: remove _state/snapshots/{read.job_id}.json under the "
        f"lake root, then request a new one (cdc snapshot --pipeline {read.pipeline} --table "
        f"{read.table.qualified})"
    )


def _envelopes(rows: DataFrame, read: GroupRead, view: ReadView) -> DataFrame:
    """JDBC text rows -> bronze `op=r` events."""
    now_us = time.time_ns() // 1000
    after = F.to_json(
        F.struct(*[F.col(quoted(c)) for c in read.columns]), {"ignoreNullFields": "false"}
    )
    key: Column = F.lit(None).cast("string")
    if read.primary_key:
        key = F.to_json(
            F.struct(*[F.col(quoted(k)) for k in read.primary_key]), {"ignoreNullFields": "false"}
        )
    marker = "incremental" if read.kind == "incremental" else "true"
    h = view.position.value
    source = F.struct(
        F.lit(__version__).alias("version"), F.lit("postgresql").alias("connector"),
        F.lit(read.pipeline).alias("name"), F.lit(now_us // 1000).alias("ts_ms"),
        F.lit(now_us).alias("ts_us"), F.lit(now_us * 1000).alias("ts_ns"),
        F.lit(marker).alias("snapshot"), F.lit(read.database).alias("db"),
        F.lit(f'["{h}",null]').alias("sequence"), F.lit(read.table.schema).alias("schema"),
        F.lit(read.table.name).alias("table"), F.lit(None).cast("long").alias("txId"),
        F.lit(h).alias("lsn"), F.lit(None).cast("long").alias("xmin"),
    )  # fmt: skip
    read_view = F.struct(
        F.lit(view.xmin).cast("long").alias("xmin"), F.lit(view.xmax).cast("long").alias("xmax"),
        F.array(*[F.lit(x).cast("long") for x in view.xip]).cast("array<bigint>").alias("xip"),
        F.lit((view.unseen_from or view.before).value).cast("long").alias("unseen_from"),
    )  # fmt: skip
    values = {
        "op": F.lit("r"), "key": key, "before": F.lit(None).cast("string"), "after": after,
        "unchanged": F.array().cast("array<string>"), "source": source,
        "ts_ms": F.lit(now_us // 1000), "ts_us": F.lit(now_us), "ts_ns": F.lit(now_us * 1000),
        "commit_lsn": F.lit(h), "seq": F.lit(-1).cast("long"),
        "source_table": F.lit(read.table.qualified),
        "staged_file": F.lit(f"snapshot:{read.job_id}:{read.group}"), "read_view": read_view,
    }  # fmt: skip
    return rows.select(*conformed(BRONZE, values))


class Progress:
    """Rows, chunks, rate and ETA: one updating line on a terminal, a log line now and then."""

    def __init__(self, total_rows: int, total_chunks: int, *, every_s: float = 10.0) -> None:
        self.total_rows, self.total_chunks = max(total_rows, 1), max(total_chunks, 1)
        self.rows = self.chunks = 0
        self.started = self.last = time.monotonic()
        self.every_s = every_s
        self.tty = sys.stderr.isatty()

    def advance(self, rows: int, chunks: int) -> None:
        self.rows += rows
        self.chunks += chunks
        now = time.monotonic()
        if not self.tty and now - self.last < self.every_s and self.chunks < self.total_chunks:
            return
        self.last = now
        rate = self.rows / max(now - self.started, 1e-6)
        left = max(self.total_rows - self.rows, 0) / rate if rate else 0.0
        done = min(self.rows / self.total_rows, 1.0)
        bar = "#" * int(done * 30)
        text = (
            f"snapshot [{bar:<30}] {self.rows:,}/{self.total_rows:,} rows, {self.chunks}/"
            f"{self.total_chunks} chunks, {rate:,.0f} rows/s, ETA {left:.0f} s"
        )
        if self.tty:
            print(
                "\r" + text,
                end="" if self.chunks < self.total_chunks else "\n",
                file=sys.stderr,
                flush=True,
            )
        else:
            log.info(text)


def read_jobs(
    spark: SparkSession, lake: Lake, dsn: Dsn, jobs: Sequence[SnapshotJob], *,
    pipeline: str, max_threads: int, fetch_size: int, catch_up: CatchUp | None,
    keys: KeyColumns = NO_KEYS,
    rules: ColumnRules = NO_RULES, skipped: frozenset[str] = frozenset(),
    notify: Notifier | None = None, signals: Callable[[], object] | None = None,
    lock_timeout_ms: int = 10_000,
) -> int:  # fmt: skip
    """Read every pending group of `jobs` into bronze; returns the rows read. `catch_up`:
    stages the stream past a read (None: the pipeline does not stream). `notify`: STARTED
    before a job's first read (not again when a run resumes it), IN_PROGRESS per group read,
    TABLE_SCAN_COMPLETED per table read to its end. `signals`: takes the signals sent since,
    between two groups (as Debezium does between chunks), applying stops and pauses to `jobs`;
    a paused or stopped job reads no further group."""
    notify = notify or Notifier(lake)
    for job in jobs:
        if job.paused:  # the stream goes on; its next chunk waits for a resume-snapshot signal
            log.info("snapshot %s is paused: no chunk read until a resume-snapshot signal", job.id)
    pending = [
        (j, t) for j in jobs if not j.stopped and not j.paused
        for t in j.tables if t.last is None and not t.done
    ]  # fmt: skip
    if not pending:
        return 0
    total_rows = sum(t.plan.estimated_rows for _, t in pending)
    total_chunks = sum(len(t.plan.chunks) for _, t in pending)
    progress = Progress(total_rows, total_chunks)
    with connect(dsn, values=True) as conn:
        database = str(conn.info.dbname)
    if catch_up is None:  # no stream to bring the groups' moments together: one snapshot
        _warn_resumed({j.id: j for j, _ in pending}.values())
    with shared_snapshot(dsn) if catch_up is None else contextlib.nullcontext() as shared:
        read, first = 0, True
        for job, part in pending:
            by_number = {c.number: c for c in part.plan.chunks}
            groups = part.groups(max_threads)
            for n in range(part.groups_done, len(groups)):
                if signals is not None and not first:  # the run's start took those before
                    signals()
                first = False
                if job.stopped or job.paused or part.done:
                    break
                if not job.started:  # again if a run dies before it saves the group's read
                    notify.job(job, NotificationType.STARTED)
                    job.started = True
                group = GroupRead(
                    job.id, job.kind, pipeline, database, part.table, part.plan,
                    tuple(by_number[c] for c in groups[n]), n, part.condition, part.query,
                    fetch_size, keys=keys, rules=rules, skipped=skipped, since=part.first,
                )  # fmt: skip
                try:
                    view, rows, shape = read_group(spark, lake, dsn, group, catch_up=catch_up,
                                                   lock_timeout_ms=lock_timeout_ms,
                                                   shared=shared)  # fmt: skip
                except TableGoneError:
                    log.warning(
                        "snapshot %s: %s no longer exists; its snapshot ends", job.id, part.table
                    )
                    job.end(part, "the table was dropped")
                    gone = TableScanStatus.SKIPPED
                    notify.job(job, NotificationType.TABLE_SCAN_COMPLETED, part, status=gone)
                    if job.finished:
                        notify.job(job, NotificationType.COMPLETED)
                    job.save(lake)
                    break
                faults.point("snapshot.chunk_read")
                record_schema(lake, shape, view.position.value)  # silver types the rows by it
                part.groups_done, part.rows = n + 1, part.rows + rows
                part.first = (
                    (view.unseen_from or view.before).value if part.first is None else part.first
                )
                if part.groups_done == len(groups):
                    part.last = view.position.value
                _notify_read(notify, job, part)  # before the save: at least once, as a topic
                job.save(lake)
                faults.point("snapshot.chunk_done")
                log.info("snapshot %s: %s group %d of %d read (%d rows)",
                         job.id, part.table, n + 1, len(groups), rows)  # fmt: skip
                progress.advance(rows, len(groups[n]))
                read += rows
        return read


def _warn_resumed(jobs: Iterable[SnapshotJob]) -> None:
    """A snapshot a run resumes without a stream goes on under a new snapshot: say so."""
    for job in jobs:
        if any(t.groups_done or t.done for t in job.tables):
            log.warning(
                "snapshot %s resumes under a new MVCC snapshot: what it read before it was "
                "interrupted is as of then, the rest as of now, so its mirrors are not the "
                "source at one moment (for that, snapshot into a new lake)", job.id
            )  # fmt: skip


def _notify_read(notify: Notifier, job: SnapshotJob, part: TableSnapshot) -> None:
    """IN_PROGRESS for a group read, and TABLE_SCAN_COMPLETED once it was the table's last."""
    notify.job(job, NotificationType.IN_PROGRESS, part)
    if part.last is not None:
        status = TableScanStatus.SUCCEEDED if part.rows else TableScanStatus.EMPTY
        notify.job(job, NotificationType.TABLE_SCAN_COMPLETED, part, status=status)
