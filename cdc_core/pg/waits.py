"""Whom a statement of the product's waits for on the source, in words an operator can act on.

Two statements of a run may wait on other sessions of the server:
- creating the slot waits for every transaction that had written when it began to end, in every
  database of the server, a prepared transaction included however old (`reported_wait`);
- `ALTER TABLE ... REPLICA IDENTITY` (replica.identity.autoset.values) waits for every lock on
  the table, and every later statement on the table queues behind it (`holding`).

`pg_blocking_pids` names the sessions; a prepared transaction, which has no session, is its
pid 0, found here by the locks it keeps.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg

from cdc_core.config import Dsn
from cdc_core.errors import CdcError
from cdc_core.identifiers import TableName
from cdc_core.pg.catalog import Connection
from cdc_core.pg.connect import connect

log = logging.getLogger(__name__)

REPORTED_AFTER_S = 5.0
"""How long a statement waits before the log names whom it waits for."""
REPORTED_EVERY_S = 60.0
"""How often the log names them again while it still waits."""


@dataclass(frozen=True)
class Holder:
    """A session, or a prepared transaction, a statement of the product's waits for. Fields a
    role without `pg_read_all_stats` may not see of another role's session are None."""

    pid: int | None
    """None: a prepared transaction (`gid`)."""
    gid: str | None
    user: str | None
    database: str | None
    application: str | None
    state: str | None
    open_s: float | None
    """Seconds its transaction has been open (a prepared transaction: since PREPARE)."""

    def __str__(self) -> str:
        facts = [f"user {self.user}"] if self.user else []
        facts += [f"database {self.database}"] if self.database else []
        facts += [f"application {self.application!r}"] if self.application else []
        if self.gid is not None:
            since = f"prepared {lasting(self.open_s)} ago" if self.open_s is not None else ""
            shown = ", ".join([*facts, since] if since else facts)
            return f"prepared transaction {quote(self.gid)} ({shown})"
        state = self.state or ""
        if self.open_s is not None:
            state = f"{state}, transaction open for {lasting(self.open_s)}".lstrip(", ")
        shown = ", ".join([*facts, state] if state else facts)
        return f"pid {self.pid} ({shown})" if shown else f"pid {self.pid}"

    @property
    def way_out(self) -> str:
        if self.gid is not None:
            where = f" in database {self.database}" if self.database else ""
            gid = quote(self.gid)
            return f"COMMIT PREPARED {gid} or ROLLBACK PREPARED {gid}{where}"
        return (
            "commit or roll back its transaction, or end its session: "
            f"SELECT pg_terminate_backend({self.pid})"
        )


def quote(text: str) -> str:
    """`text` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def lasting(seconds: float) -> str:
    """A duration as an operator reads it: 42 s, 12 min, 3 h 5 min, 2 d 4 h."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def said(holders: list[Holder]) -> str:
    """Each holder and its way out, one after the other."""
    return "; ".join(f"{h}: {h.way_out}" for h in holders)


_SESSION = """
SELECT a.pid, NULL::text, a.usename::text, a.datname::text, nullif(a.application_name, ''),
       a.state, extract(epoch FROM now() - a.xact_start)::float8
FROM pg_stat_activity a
WHERE a.pid = ANY({pids})
"""

# A prepared transaction keeps its locks with no pid, under the virtual transaction it had; its
# own transaction id lock, under the same one, names it in pg_prepared_xacts.
_PREPARED = """
SELECT DISTINCT NULL::int, p.gid, p.owner::text, p.database::text, NULL::text, NULL::text,
       extract(epoch FROM now() - p.prepared)::float8
FROM pg_locks h
JOIN pg_locks x ON x.pid IS NULL AND x.locktype = 'transactionid'
               AND x.virtualtransaction = h.virtualtransaction
JOIN pg_prepared_xacts p ON p.transaction = x.transactionid
WHERE h.pid IS NULL AND h.granted AND {held}
"""

_BLOCKING = (
    _SESSION.format(pids="pg_blocking_pids(%(pid)s)")
    + "UNION ALL"
    + _PREPARED.format(
        held="""EXISTS (
    SELECT FROM pg_locks w
    WHERE w.pid = %(pid)s AND NOT w.granted AND w.locktype = h.locktype
      AND w.database IS NOT DISTINCT FROM h.database AND w.relation IS NOT DISTINCT FROM h.relation
      AND w.page IS NOT DISTINCT FROM h.page AND w.tuple IS NOT DISTINCT FROM h.tuple
      AND w.virtualxid IS NOT DISTINCT FROM h.virtualxid
      AND w.transactionid IS NOT DISTINCT FROM h.transactionid
      AND w.classid IS NOT DISTINCT FROM h.classid AND w.objid IS NOT DISTINCT FROM h.objid
      AND w.objsubid IS NOT DISTINCT FROM h.objsubid)"""
    )
    + "ORDER BY 7 DESC NULLS LAST, 1"
)

_HOLDING = (
    _SESSION.format(
        pids="""ARRAY(
    SELECT l.pid FROM pg_locks l
    WHERE l.relation = %(table)s::regclass AND l.granted AND l.pid <> pg_backend_pid())"""
    )
    + "UNION ALL"
    + _PREPARED.format(held="h.relation = %(table)s::regclass")
    + "ORDER BY 7 DESC NULLS LAST, 1"
)

# Every transaction that has written holds the lock on its own id until it ends (a prepared one,
# with no pid); a snapshot's list would leave out the newest ones (from its xmax on).
_XIDS = """
SELECT transactionid::text FROM pg_locks
WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock' AND granted
"""

_RUNNING = (
    _SESSION.format(
        pids="""ARRAY(
    SELECT l.pid FROM pg_locks l
    WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
      AND l.transactionid::text = ANY(%(xids)s))"""
    )
    + "UNION ALL"
    + _PREPARED.format(
        held="h.locktype = 'transactionid' AND h.transactionid::text = ANY(%(xids)s)"
    )
    + "ORDER BY 7 DESC NULLS LAST, 1"
)

_OPEN = (
    _SESSION.format(
        pids="""ARRAY(
    SELECT l.pid FROM pg_locks l
    WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
      AND l.pid <> pg_backend_pid())"""
    )
    + "UNION ALL"
    + _PREPARED.format(held="h.locktype = 'transactionid'")
    + "ORDER BY 7 DESC NULLS LAST, 1"
)


# The transaction with the oldest id still running in this database: decoding restarts before
# its first change, so the slot keeps the WAL from there (a prepared one, with no pid, included).
_OLDEST = """
SELECT l.pid, p.gid, coalesce(a.usename, p.owner)::text, coalesce(a.datname, p.database)::text,
       nullif(a.application_name, ''), a.state,
       extract(epoch FROM now() - coalesce(a.xact_start, p.prepared))::float8
FROM pg_locks l
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
LEFT JOIN pg_prepared_xacts p ON l.pid IS NULL AND p.transaction = l.transactionid
WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
  AND l.pid IS DISTINCT FROM pg_backend_pid()
  AND coalesce(a.datname, p.database) = current_database()
ORDER BY age(l.transactionid) DESC
LIMIT 1
"""


def _holders(conn: Connection, query: str, params: dict[str, object]) -> list[Holder]:
    def text(value: object) -> str | None:
        return None if value is None else str(value)

    return [
        Holder(
            None if pid is None else int(str(pid)),
            text(gid),
            text(user),
            text(db),
            text(app),
            text(state),
            None if open_s is None else float(str(open_s)),
        )
        for pid, gid, user, db, app, state, open_s in conn.execute(query, params).fetchall()
    ]


def blocking(conn: Connection, pid: int) -> list[Holder]:
    """The sessions and prepared transactions session `pid` waits for now, longest open first."""
    return _holders(conn, _BLOCKING, {"pid": pid})


def holding(conn: Connection, table: TableName) -> list[Holder]:
    """The other sessions and prepared transactions that hold a lock on `table` now."""
    return _holders(conn, _HOLDING, {"table": str(table)})


def in_progress(conn: Connection) -> list[str]:
    """The ids of the transactions running now that have written, in every database, prepared
    ones included (as `pg_locks` shows them: 32 bits, as text)."""
    rows = conn.execute(_XIDS).fetchall()
    return [str(xid) for (xid,) in rows]


def still_running(conn: Connection, xids: list[str]) -> list[Holder]:
    """The sessions and prepared transactions of `xids` (`in_progress`) that have not ended."""
    return _holders(conn, _RUNNING, {"xids": xids}) if xids else []


def oldest_transaction(conn: Connection) -> Holder | None:
    """The transaction running longest in this database (by its id, which every role may see),
    where a logical slot's decoding has to restart: None when none runs."""
    found = _holders(conn, _OLDEST, {})
    return found[0] if found else None


def open_transactions(
    conn: Connection, older_than_s: float, *, every_prepared: bool = False
) -> list[Holder]:
    """The transactions that have written (they have a transaction id) and have been open longer
    than `older_than_s` (`every_prepared`: a prepared transaction however young): what a slot
    created that long ago waits for. A session whose start another role may not see is left
    out."""
    found = _holders(conn, _OPEN, {})
    return [
        h for h in found
        if (h.open_s or 0) > older_than_s or (every_prepared and h.gid is not None)
    ]  # fmt: skip


@contextlib.contextmanager
def reported_wait(
    conn: Connection, dsn: Dsn, doing: str, why: str, *,
    first_s: float = REPORTED_AFTER_S, every_s: float = REPORTED_EVERY_S,
) -> Iterator[None]:  # fmt: skip
    """Run the block, a statement on `conn` that may wait on other sessions; once it has waited
    `first_s`, log whom it waits for (on a session of its own), and again every `every_s`: the
    session it waits for now, then those whose transactions were running when it began (what a
    new slot waits for; ids every role may see, where another role's session start is not).
    `doing` names the statement, `why` says why it waits."""
    pid = conn.info.backend_pid
    running = in_progress(conn)
    done = threading.Event()
    started = time.monotonic()

    def watch() -> None:
        if done.wait(first_s):
            return
        try:
            with connect(dsn) as watcher:
                while not done.is_set():
                    elapsed = time.monotonic() - started
                    found = blocking(watcher, pid)  # the one it waits for now, then the others
                    named = {(h.pid, h.gid) for h in found}
                    found += [
                        h for h in still_running(watcher, running) if (h.pid, h.gid) not in named
                    ]  # fmt: skip
                    waited = lasting(elapsed)
                    whom = said(found) if found else "no transaction holds it up this moment"
                    log.warning("%s has waited %s: %s. It waits for: %s. The run goes on by "
                                "itself once they end", doing, waited, why, whom)  # fmt: skip
                    done.wait(every_s)
        except (psycopg.Error, CdcError) as e:  # the statement goes on; only the report is lost
            log.debug("could not tell whom %s waits for: %s", doing, e)

    watcher = threading.Thread(target=watch, name="wait-report", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
