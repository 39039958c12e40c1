"""Signals: Debezium's signalling table, polled at the start of a run and parsed into requests.

Users send signals the Debezium way, `INSERT INTO <signal.data.collection> (id, type, data)`.
We poll the table instead of reading its inserts from the WAL (the table stays out of the
publication, and the product's role only reads it), so a row is known by the transaction that
inserted it, not by its id: signals are taken in that order, and a row deleted and inserted
again with the same id is a new signal (see `read_signals`, `sort_out`). Signal types:

- `execute-snapshot`: an incremental (default) or blocking snapshot -> `SnapshotRequest`.
- `stop-snapshot`: stop all or some running incremental snapshots -> `StopRequest`.
- `pause-snapshot`, `resume-snapshot`: pause or resume the running incremental snapshots
  -> `PauseRequest` (their data is not read, as in Debezium).
- `log`: its `message` is logged; nothing else to do.
- `snapshot-window-open`, `snapshot-window-close`: Debezium's own watermark rows; ignored.
- `schema-changes` and unknown types: not supported, logged as a warning and ignored.

Every row read is to be marked processed by the caller, whatever it parsed to: a signal that
cannot be carried out is a `SignalProblem`, logged once, never retried. Debezium's other
channel here, its signal file, is `cdc_core.signal_file`; its lines parse the same way.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from cdc_core.errors import TerminalError, TransientError
from cdc_core.identifiers import TableName

log = logging.getLogger("cdc_core.signals")

EXECUTE_SNAPSHOT = "execute-snapshot"
STOP_SNAPSHOT = "stop-snapshot"
PAUSE_SNAPSHOT = "pause-snapshot"
RESUME_SNAPSHOT = "resume-snapshot"
LOG = "log"
WATERMARKS = frozenset({"snapshot-window-open", "snapshot-window-close"})
UNSUPPORTED = frozenset({"schema-changes"})

SnapshotKind = Literal["incremental", "blocking"]
_KINDS: dict[str, SnapshotKind] = {"incremental": "incremental", "blocking": "blocking"}
# A blocking snapshot's filter replaces the whole query (snapshot.select.statement.overrides).
_FULL_QUERY = re.compile(r"\s*\(*\s*(select|with)\b", re.IGNORECASE)
_MAX_LISTED = 20


@dataclass(frozen=True)
class SnapshotRequest:
    """Take a snapshot of `tables` (incremental unless blocking)."""

    signal_id: str
    """The row's id, for logging (Debezium uses it only for that)."""
    kind: SnapshotKind
    tables: tuple[TableName, ...]
    """The captured tables matched by data-collections, in captured-table order."""
    conditions: Mapping[TableName, str] = field(hash=False)
    """additional-conditions: incremental -> a WHERE condition; blocking -> a full SELECT."""
    surrogate_key: str | None
    """Debezium's surrogate-key: chunk by this column instead of the primary key."""


@dataclass(frozen=True)
class StopRequest:
    """Stop running incremental snapshots of `tables`, or of every table when None."""

    signal_id: str
    tables: tuple[TableName, ...] | None


@dataclass(frozen=True)
class PauseRequest:
    """Pause the running incremental snapshots (no chunk is read until resumed; the stream goes
    on), or with `resume` resume them from their next chunk."""

    signal_id: str
    resume: bool = False


@dataclass(frozen=True)
class SignalProblem:
    """A signal row that cannot be carried out: logged and marked processed (never silently
    dropped, never retried forever)."""

    signal_id: str
    reason: str


Signal = SnapshotRequest | StopRequest | PauseRequest | SignalProblem


class _SignalError(ValueError):
    """Why a signal cannot be carried out; becomes a `SignalProblem`, never leaves this module."""


def parse_signal(
    signal_id: str, type_: str, data: str | None, captured: Sequence[TableName]
) -> Signal | None:
    """One signal row -> what to do. None for signal types this product ignores (e.g. Debezium's
    internal 'snapshot-window-open/close' or 'log'); those are still marked processed."""
    kind = type_.strip()
    try:
        if kind == EXECUTE_SNAPSHOT:
            return _execute_snapshot(signal_id, data, captured)
        if kind == STOP_SNAPSHOT:
            return _stop_snapshot(signal_id, data, captured)
    except _SignalError as e:
        return SignalProblem(signal_id, f"{kind} signal {signal_id!r}: {e}")
    if kind in (PAUSE_SNAPSHOT, RESUME_SNAPSHOT):  # Debezium reads no data for either
        return PauseRequest(signal_id, resume=kind == RESUME_SNAPSHOT)
    if kind == LOG:
        _log_message(signal_id, data)
    elif kind in UNSUPPORTED:
        log.warning("signal %r: %r signals are not supported; ignored", signal_id, kind)
    elif kind not in WATERMARKS:
        log.warning("signal %r: unknown signal type %r; ignored", signal_id, kind)
    return None


def _execute_snapshot(
    signal_id: str, data: str | None, captured: Sequence[TableName]
) -> SnapshotRequest | None:
    payload = _payload(data)
    entries = _string_list(payload, "data-collections")
    if entries is None:
        raise _SignalError("data-collections is required: a list of schema.table patterns")
    if not entries:
        # Debezium: "If the data-collections array is empty, ... it does not perform a snapshot."
        log.info("signal %r: empty data-collections, nothing to snapshot", signal_id)
        return None
    kind = _snapshot_kind(payload)
    tables = _match(signal_id, entries, captured)
    return SnapshotRequest(
        signal_id=signal_id,
        kind=kind,
        tables=tables,
        conditions=_conditions(payload, tables, kind),
        surrogate_key=_surrogate_key(payload),
    )


def _stop_snapshot(signal_id: str, data: str | None, captured: Sequence[TableName]) -> StopRequest:
    payload = _payload(data)
    kind = payload.get("type")
    if kind is None:
        # Debezium: "If you do not specify a type value, the signal fails to stop the snapshot."
        raise _SignalError('data.type is required and must be "incremental"')
    if not isinstance(kind, str) or kind.strip().lower() != "incremental":
        raise _SignalError(
            f'data.type must be "incremental" (only those can be stopped), not {kind!r}'
        )
    entries = _string_list(payload, "data-collections")
    # Debezium treats a missing and an empty list alike: stop the whole incremental snapshot.
    if not entries:
        return StopRequest(signal_id, None)
    return StopRequest(signal_id, _match(signal_id, entries, captured))


def _log_message(signal_id: str, data: str | None) -> None:
    try:
        message = _payload(data).get("message")
    except _SignalError as e:
        log.warning("log signal %r: %s", signal_id, e)
        return
    log.info("log signal %r: %s", signal_id, message)


def _payload(data: str | None) -> dict[str, object]:
    if data is None or not data.strip():
        raise _SignalError("data is empty; it must be a JSON object")
    try:
        payload = json.loads(data)
    except json.JSONDecodeError as e:
        raise _SignalError(
            f"data is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from e
    if not isinstance(payload, dict):
        raise _SignalError(f"data must be a JSON object, not {type(payload).__name__}")
    return payload


def _string_list(payload: Mapping[str, object], key: str) -> list[str] | None:
    """The list of strings under `key`, trimmed as Debezium trims them; None when absent."""
    value = payload.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise _SignalError(f"{key} must be a list of strings, not {value!r}")
    entries: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise _SignalError(f"{key}[{i}] must be a non-empty string, not {item!r}")
        entries.append(item.strip())
    return entries


def _snapshot_kind(payload: Mapping[str, object]) -> SnapshotKind:
    value = payload.get("type", "incremental")
    kind = _KINDS.get(value.strip().lower()) if isinstance(value, str) else None
    if kind is None:
        raise _SignalError(f'type must be "incremental" (the default) or "blocking", not {value!r}')
    return kind


def _surrogate_key(payload: Mapping[str, object]) -> str | None:
    value = payload.get("surrogate-key")
    if value is None:
        return None
    if not isinstance(value, str):
        raise _SignalError(f"surrogate-key must be a column name, not {value!r}")
    return value.strip() or None


def _matcher(entry: str) -> Callable[[TableName], bool]:
    """A data-collection entry as a test on tables: a quoted name matches exactly that table
    (`public."My.Table"`), anything else is a regular expression over `schema.table`."""
    if '"' in entry:
        try:
            exact = TableName.parse(entry)
        except ValueError:
            pass  # not a name after all: a regular expression that happens to contain a quote
        else:
            return lambda table: table == exact
    try:
        pattern = re.compile(entry)
    except re.error as e:
        raise _SignalError(f"{entry!r} is not a valid regular expression: {e}") from e
    return lambda table: pattern.fullmatch(table.qualified) is not None


def _match(
    signal_id: str, entries: Sequence[str], captured: Sequence[TableName]
) -> tuple[TableName, ...]:
    """The captured tables the entries match, in captured order; unmatched entries are logged."""
    matchers = [(entry, _matcher(entry)) for entry in entries]
    tables = tuple(t for t in captured if any(test(t) for _, test in matchers))
    unmatched = [entry for entry, test in matchers if not any(test(t) for t in captured)]
    if not tables:
        raise _SignalError(
            f"data-collections {entries} matches no captured table; captured: {_names(captured)}"
        )
    if unmatched:
        log.warning(
            "signal %r: data-collections %s match no captured table and are skipped; captured: %s",
            signal_id,
            unmatched,
            _names(captured),
        )
    return tables


def _conditions(
    payload: Mapping[str, object], tables: Sequence[TableName], kind: SnapshotKind
) -> Mapping[TableName, str]:
    value = payload.get("additional-conditions")
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, list):
        raise _SignalError(f"additional-conditions must be a list, not {value!r}")
    conditions: dict[TableName, str] = {}
    for i, item in enumerate(value):
        where = f"additional-conditions[{i}]"
        collection, condition = _condition(where, item, kind)
        test = _matcher(collection)
        targets = [t for t in tables if test(t)]
        if not targets:
            raise _SignalError(
                f"{where} is for {collection!r}, which is not among the tables of this "
                f"snapshot: {_names(tables)}"
            )
        for table in targets:
            if table in conditions:
                raise _SignalError(f"{where}: a second condition for {table}; give one per table")
            conditions[table] = condition
    return MappingProxyType(conditions)


def _condition(where: str, item: object, kind: SnapshotKind) -> tuple[str, str]:
    """The (data-collection, filter) of one additional condition, checked for its kind."""
    if not isinstance(item, dict):
        raise _SignalError(f'{where} must be {{"data-collection": ..., "filter": ...}}')
    collection, condition = item.get("data-collection"), item.get("filter")
    if not isinstance(collection, str) or not collection.strip():
        raise _SignalError(f"{where}.data-collection must be a table name, not {collection!r}")
    if not isinstance(condition, str) or not condition.strip():
        raise _SignalError(f"{where}.filter must be a non-empty string, not {condition!r}")
    if kind == "blocking" and not _FULL_QUERY.match(condition):
        raise _SignalError(
            f"{where}.filter of a blocking snapshot is a full SELECT statement "
            f"(as in snapshot.select.statement.overrides), not {condition!r}"
        )
    return collection.strip(), condition.strip()


def _names(tables: Sequence[TableName]) -> str:
    if not tables:
        return "(none)"
    shown = ", ".join(str(t) for t in tables[:_MAX_LISTED])
    more = len(tables) - _MAX_LISTED
    return f"{shown} and {more} more" if more > 0 else shown


def signal_table_ddl(table: TableName) -> str:
    """The CREATE TABLE for a signal table, with Debezium's documented columns."""
    return (
        f"CREATE TABLE {table} (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, "
        "data varchar(2048) NULL);"
    )


@dataclass(frozen=True)
class SignalRow:
    """One row of the signal table, as `read_signals` found it."""

    id: str
    type: str
    data: str | None
    """None for a processed row too: its data is not read again."""
    xmin: str
    """The id of the transaction that inserted the row (PostgreSQL's `xmin`, as text)."""
    processed: bool
    """Its key was among the processed keys given to `read_signals`."""

    @property
    def key(self) -> str:
        """The row itself, not only its id: ids are reused (Debezium's examples all send
        'ad-hoc-1'), and a row deleted and inserted again comes from another transaction."""
        return f"{self.xmin}:{self.id}"


def processed_keys(stored: object) -> list[str]:
    """The processed keys kept in `_state/signals.json` (`{"processed": [key, ...]}`)."""
    keys = stored.get("processed") if isinstance(stored, dict) else None
    return [str(k) for k in keys] if isinstance(keys, list) else []


def sort_out(
    rows: Sequence[SignalRow], stored: object, carried_out: Collection[str] = ()
) -> tuple[list[SignalRow], list[str]]:
    """The rows still to carry out, in order, and the processed keys worth keeping: those of
    rows still in the table, so the record never outgrows the table.

    `stored` is `_state/signals.json` as read; before rows had keys it was a list of ids, and
    the rows with those ids are taken as processed (once: the keys replace the ids).
    `carried_out`: keys of signals whose snapshot job was saved, by a run that stopped before
    it marked them processed."""
    legacy = {str(i) for i in stored} if isinstance(stored, list) else set()
    pending: list[SignalRow] = []
    kept: list[str] = []
    for row in rows:
        if row.processed or row.key in carried_out or row.id in legacy:
            kept.append(row.key)
        else:
            pending.append(row)
    return pending, kept


def read_signals(
    conn: psycopg.Connection[Any], table: TableName, processed: Collection[str]
) -> list[SignalRow]:
    """Every row of the signal table, oldest first: by the transaction that inserted it (its
    `xmin`, compared with `age()` so that wraparound does not reorder it), within one
    transaction by the table's ordering column if it has one, then by position. A row whose key
    is in `processed` comes back marked so, without its data. A missing signal table is a clear
    TerminalError naming it and how to create it (the exact CREATE TABLE).

    Transaction order is commit order unless two transactions that insert signals overlap (a
    transaction's id is taken at its first write). An ordering column is one besides id, type
    and data that is a timestamp or is filled from a sequence (identity or serial), e.g.
    `created_at timestamptz NOT NULL DEFAULT clock_timestamp()`; Debezium's own table has none.
    """
    try:
        order = _ordering_column(conn, table)
        query = sql.SQL(
            "SELECT id, xmin, type, CASE WHEN done THEN NULL ELSE data END, done FROM ("
            "SELECT s.id::text AS id, s.xmin::text AS xmin, coalesce(s.type::text, '') AS type, "
            "s.data::text AS data, (s.xmin::text || ':' || s.id::text) = ANY(%s::text[]) AS done, "
            "age(s.xmin) AS age, {order} AS ord, s.ctid AS tid "
            "FROM {table} s WHERE s.id IS NOT NULL) r ORDER BY age DESC, ord, tid"
        ).format(
            order=sql.Identifier("s", order) if order else sql.SQL("NULL"),
            table=sql.Identifier(table.schema, table.name),
        )
        with conn.cursor(row_factory=tuple_row) as cur:
            rows = cur.execute(query, (list(processed),)).fetchall()
    except psycopg.errors.InsufficientPrivilege as e:
        raise TerminalError(
            f"not allowed to read the signal table {table}: {e.diag.message_primary}; "
            f"GRANT SELECT ON {table} (and USAGE on its schema) to the pipeline's role"
        ) from e
    except psycopg.OperationalError as e:
        raise TransientError(f"lost the connection while reading signal table {table}: {e}") from e
    return [
        SignalRow(str(i), str(t), None if d is None else str(d), str(x), bool(done))
        for i, x, t, d, done in rows
    ]


def _ordering_column(conn: psycopg.Connection[Any], table: TableName) -> str | None:
    """The signal table's ordering column, if any; raises if it or its columns are missing, or
    if it is not a table (a view's rows have no inserting transaction)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        columns = cur.execute(
            "SELECT a.attname, a.atttypid::regtype::text, "
            "  a.attidentity <> '' OR coalesce(pg_get_expr(d.adbin, d.adrelid), '') "
            "    LIKE 'nextval(%%', c.relkind::text "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
            "LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum "
            "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f') "
            "ORDER BY a.attnum",
            (table.schema, table.name),
        ).fetchall()
    if not columns:
        raise TerminalError(
            f"signal table {table} (signal.data.collection) does not exist; "
            f"create it with: {signal_table_ddl(table)}"
        )
    if columns[0][3] not in ("r", "p"):
        raise TerminalError(
            f"signal table {table} (signal.data.collection) is not a table (a view, say): a "
            f"signal is known by the transaction that inserted its row; create one with: "
            f"{signal_table_ddl(table)}"
        )
    names = [str(name) for name, _, _, _ in columns]
    missing = [c for c in ("id", "type", "data") if c not in names]
    if missing:
        raise TerminalError(
            f"signal table {table} has no column {', '.join(missing)}; "
            f"a signal table looks like: {signal_table_ddl(table)}"
        )
    for name, type_name, sequenced, _ in columns:
        if name in ("id", "type", "data"):
            continue
        if sequenced or type_name in ("timestamp with time zone", "timestamp without time zone"):
            return str(name)
    return None
