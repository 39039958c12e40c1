"""Regular and replication connections to the source (psycopg 3); errors keep secrets out."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator, Mapping

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus

from cdc_core.config import Dsn
from cdc_core.errors import LoginError, TerminalError, TransientError, first_line

APPLICATION_NAME = "cdc-lake"
CONNECT_TIMEOUT_S = 10

# Output settings for every session that reads values (pgoutput formats values with the
# walsender session's settings): the same text whatever the server's defaults are.
VALUE_SETTINGS = {
    "DateStyle": "ISO",
    "IntervalStyle": "iso_8601",
    "TimeZone": "UTC",
    "extra_float_digits": "1",
    "bytea_output": "hex",
    "lc_monetary": "C",
    # not output but input: literals in a snapshot's condition read as the JDBC driver reads
    # them (`snapshot_read.for_jdbc`); the server's default since 9.1
    "standard_conforming_strings": "on",
    # a read row-level security would filter fails instead (the stream sends every row): the
    # doctor names the fixes
    "row_security": "off",
}
# Every session of the product's: it keeps sessions and transactions idle by design (a catalog
# session while the slot is read, a snapshot's coordinator while its chunks are read), which a
# role's idle timeouts, meant for applications, would end mid-run, and on every run again.
SESSION_SETTINGS = {"idle_session_timeout": "0", "idle_in_transaction_session_timeout": "0"}


def options(settings: Mapping[str, str]) -> str:
    """`settings` as libpq's `options`: made as the session starts."""
    return " ".join(f"-c {k}={v}" for k, v in settings.items())


def set_statements(settings: Mapping[str, str]) -> str:
    """`settings` as SET statements: made again on a session already open."""
    return "; ".join(f"SET {k} = '{v}'" for k, v in settings.items())


VALUE_OPTIONS = options({**VALUE_SETTINGS, **SESSION_SETTINGS})
VALUE_SET = set_statements({**VALUE_SETTINGS, **SESSION_SETTINGS})
"""The same as statements, for a client that sends settings of its own after `options` (JDBC
sends the JVM's TimeZone)."""


_HBA_FIX = "allow this client in pg_hba.conf, then SELECT pg_reload_conf();"
REFUSALS = (
    (r"password authentication failed", "{dsn}: correct the user or password"),
    (r"no password supplied", "{dsn}: give the password (through ${{VAR}})"),
    (r"no pg_hba\.conf entry", _HBA_FIX),
    (r"pg_hba\.conf rejects connection", _HBA_FIX),
    (r'(database|role) ".*" does not exist', "{dsn}: correct the user or database name"),
    (r'role ".*" is not permitted to log in', "give the role LOGIN: ALTER ROLE ... LOGIN;"),
    (r'permission denied for database ".*"', "GRANT CONNECT to the role (cdc doctor shows it)"),
    (r'unrecognized configuration parameter "idle_session_timeout"',
     "upgrade PostgreSQL to 14 or newer: this server is older (14 added idle_session_timeout, "
     "which every session of the product sets, and pgoutput's messages option, which "
     "watermarks and heartbeats need)"),
)  # fmt: skip
"""Connect failures retrying will not fix, as libpq words them, and the fix (`{dsn}`: where the
connection string is set). A failed connect has no SQLSTATE in psycopg (libpq reports the
server's message as text, PostgreSQL 18 checked), so the words decide; a server whose
lc_messages is not English matches none, and its refusals stay transient. Anything else (nothing
listening, a timeout, too many clients, a server starting up or shutting down) may pass."""


class InitialStatementError(TerminalError):
    """A statement of `source.database.initial.statements` failed (not the connection)."""


def refusal(message: str) -> str | None:
    """The fix for a connect failure that retrying will not fix (`{dsn}` left to fill in), or
    None when the failure may pass by itself."""
    for pattern, fix in REFUSALS:
        if re.search(pattern, message):
            return fix
    return None


def statement_timeout(seconds: float) -> str:
    """`source.query_timeout_s` as PostgreSQL's `statement_timeout` (whole milliseconds, rounded
    up: a limit never rounds to 0, which means none)."""
    return str(math.ceil(seconds * 1000)) if seconds > 0 else "0"


def connect(
    dsn: Dsn,
    *,
    autocommit: bool = True,
    replication: bool = False,
    values: bool = False,
    bounded: bool = True,
    reads_slot: bool = False,
) -> psycopg.Connection[tuple[object, ...]]:
    """Open a connection; `replication=True` opens a logical replication (walsender) session,
    `values=True` a session that formats values with `VALUE_SETTINGS` (replication implies it).

    A regular session's statements are bounded by `source.query_timeout_s`
    (`dsn.query_timeout_s`, as `statement_timeout`; it wins over a role's or a database's);
    `bounded=False` is a session whose statements may rightly run long (reading or advancing
    the slot, cdc validate's whole-table reads), which then has no limit. A replication session
    is left as it was: the stream is never cancelled by a timeout.

    A regular session runs `dsn.initial_statements` (`source.database.initial.statements`)
    first, unless it `reads_slot` (Debezium leaves its transaction log connection alone), then
    makes its own settings again: the statements may set anything, but not the value formats or
    the limits the product depends on. A statement that fails is a `TerminalError` naming it.

    A server that cannot be reached is a `TransientError` (it may be restarting), one that
    refuses the login for good (`REFUSALS`) a `LoginError`; the message shows the connection
    string without its password. A malformed one is a `TerminalError` that does not quote it
    (libpq's message may quote a piece of the password).
    """
    settings = {**VALUE_SETTINGS, **SESSION_SETTINGS} if replication or values else SESSION_SETTINGS
    if not replication:
        settings = {**settings, "statement_timeout": statement_timeout(
            dsn.query_timeout_s if bounded else 0
        )}  # fmt: skip
    try:
        own = conninfo_to_dict(dsn.conninfo).get("options")  # the source's own, kept first
        ours = options(settings)
        conninfo = make_conninfo(
            dsn.conninfo,
            application_name=APPLICATION_NAME,
            connect_timeout=CONNECT_TIMEOUT_S,
            **({"replication": "database"} if replication else {}),
            options=f"{own} {ours}" if own else ours,
        )
    except psycopg.ProgrammingError as e:
        raise TerminalError(malformed(e)) from None
    try:
        conn = psycopg.connect(conninfo, autocommit=autocommit)
    except psycopg.OperationalError as e:
        failure = f"cannot connect to PostgreSQL at {dsn.redacted}: {first_line(e)}"
        fix = refusal(str(e))
        if fix is not None:
            raise LoginError(failure, fix.format(dsn="source.dsn")) from e
        raise TransientError(failure) from e
    if dsn.initial_statements and not replication and not reads_slot:
        _initial_statements(conn, dsn.initial_statements, settings)
    return conn


def _initial_statements(
    conn: psycopg.Connection[tuple[object, ...]], statements: tuple[str, ...],
    settings: dict[str, str],
) -> None:  # fmt: skip
    """Run `statements` on the new session, then make `settings` again (committed either way:
    a setting made in a transaction rolled back later would be undone with it)."""
    n, statement = 0, ""
    try:
        for n, statement in enumerate(statements, 1):  # noqa: B007 - named when one fails
            conn.execute(statement.encode())  # as written: the simple query protocol
        conn.execute(set_statements(settings).encode())
        if not conn.autocommit:
            conn.commit()
    except psycopg.Error as e:
        lost = conn.broken
        conn.close()
        reason = first_line(e)
        if lost:
            where = "source.database.initial.statements"
            raise TransientError(f"the connection was lost running {where}: {reason}") from e
        shown = statement if len(statement) <= 80 else statement[:77] + "..."
        raise InitialStatementError(
            f"source.database.initial.statements: statement {n} ({shown!r}) failed: {reason}"
        ) from e


def session_init(dsn: Dsn) -> str:
    """A JDBC session's first statements: the pipeline's initial statements, then the value
    settings (`VALUE_SET`, made again after them, as `connect` does)."""
    return "; ".join([*dsn.initial_statements, VALUE_SET])


def malformed(e: psycopg.ProgrammingError) -> str:
    """What is wrong with a connection string libpq cannot parse, without quoting it."""
    text = str(e).strip()
    why = f" ({text.splitlines()[0]})" if text.startswith("invalid connection option") else ""
    return (
        f"source.dsn is not a valid connection string{why}: write a URI "
        "(postgresql://user@host:5432/db) or key=value pairs, quoting values with spaces "
        "in single quotes"
    )


@contextlib.contextmanager
def unbounded(conn: psycopg.Connection[tuple[object, ...]]) -> Iterator[None]:
    """Lift `source.query_timeout_s` on `conn` for statements that may rightly run long (creating
    the slot waits for every running transaction; planning a big table's chunks scans it), then
    set it back (a session still usable; a transaction that failed undoes the SET by itself)."""
    conn.execute("SET statement_timeout = 0")
    try:
        yield
    finally:
        if conn.info.transaction_status in (TransactionStatus.IDLE, TransactionStatus.INTRANS):
            conn.execute("RESET statement_timeout")  # the session's own: connect's limit
