"""Which failures may pass by themselves: psycopg, Spark JDBC and object store errors, as
`TransientError`.

A lost connection, a server shutdown or restart, a statement cancelled by `statement_timeout`
(`source.query_timeout_s`: what made it slow, a lock or a busy server, usually passes), a
lock not granted within `lock_timeout`, a Delta commit that lost to a concurrent writer of the
same table (`jobs/maintain.py`'s OPTIMIZE, say): retrying later is safe and may succeed (exit
75): a commit that lost wrote nothing, and every stage redoes its work idempotently. They
arrive as psycopg `OperationalError`s, or from Spark's JDBC reads as Py4J errors whose cause
chain holds the driver's `PSQLException` (its SQLState asked of the JVM, else found in the
text). Anything else is left alone: a real bug still exits 1. Messages carry the server's
first line and the SQLState, never a connection string.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import psycopg

from cdc_core.errors import (
    CdcError,
    TerminalError,
    TransientError,
    causes,
    first_line,
    text_of,
)

# SQLState (or its class, two characters) -> what it means for whoever reads the error line
_TRANSIENT = {
    "08": "the connection to PostgreSQL was lost",
    "57014": "a query on the source ran past source.query_timeout_s (or was cancelled by a cancel "
    "request): a lock another session holds, or a busy server, may be why; if the query is merely "
    "slow, raise source.query_timeout_s (0: no limit)",
    "55P03": "a lock was not granted within lock_timeout (another session holds it)",
    "57P01": "the server is shutting down, or an administrator ended the session",
    "57P02": "the server crashed and is restarting",
    "57P03": "the server is starting up or shutting down",
    "53300": "the server has no free connection slot",
    "55006": "another session is using it (a replication slot another process reads, say)",
    "40001": "a conflict with a concurrent transaction",
    "40P01": "a deadlock with a concurrent transaction",
}
_LOST = _TRANSIENT["08"]
_RETRY = "safe to retry: the next run resumes where this one stopped"

# the texts PostgreSQL and its JDBC driver give those states, for a Spark error whose cause
# can no longer be asked for its SQLState (lc_messages other than English: the state is lost)
_JDBC_TEXTS = (
    ("57014", "canceling statement due to statement timeout"),
    ("57014", "canceling statement due to user request"),
    ("55P03", "canceling statement due to lock timeout"),
    ("55P03", "could not obtain lock"),
    ("57P01", "terminating connection due to administrator command"),
    ("57P02", "terminating connection because of crash of another server process"),
    ("57P03", "the database system is"),  # starting up, shutting down, in recovery mode
    ("08001", "Connection to "),  # ... refused. Check that the hostname and port are correct
    ("08001", "The connection attempt failed"),
    ("08006", "An I/O error occurred while sending to the backend"),
    ("08003", "This connection has been closed"),
)
_PSQL = re.compile(r"org\.postgresql\.util\.PSQLException: ([^\n]*)")
# Delta's commit conflicts (io.delta.exceptions.*, and delta.exceptions' Python classes)
_DELTA_CONFLICTS = frozenset({
    "DeltaConcurrentModificationException", "ConcurrentWriteException", "MetadataChangedException",
    "ProtocolChangedException", "ConcurrentAppendException", "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException", "ConcurrentTransactionException",
})  # fmt: skip
_DELTA = re.compile(r"io\.delta\.exceptions\.(\w+): ([^\n]*)")
_CONFLICT = "a concurrent writer committed to the same Delta table first"
_MAX_CAUSES = 32
# pyarrow's S3 client's errors that pass by themselves (the AWS SDK's retryable kinds), from
# the driver's own files: state, staged files, the run lock's record
_STORE = re.compile(
    r"AWS Error (NETWORK_CONNECTION|SLOW_DOWN|SERVICE_UNAVAILABLE|INTERNAL_FAILURE|"
    r"REQUEST_TIMEOUT|THROTTLING)\b"
)

# the s3a connector's (Spark's own reads and writes of the lake) failures that pass by
# themselves: the network, a store that did not answer, throttling, a 5xx; by exact class, so
# a subclass that says something else (NoAuthWithAWSException: no credentials) is left alone.
# s3a hands on a network failure as its own class (ConnectException); those count only in an
# error about an s3a:// path, not in a JDBC read's (which the driver's SQLState covers)
_S3A = "org.apache.hadoop.fs.s3a."
_S3A_PASSING = frozenset({
    f"{_S3A}AWSClientIOException", f"{_S3A}HttpChannelEOFException",
    f"{_S3A}AWSNoResponseException", f"{_S3A}AWSStatus500Exception",
    f"{_S3A}AWSServiceThrottledException", f"{_S3A}AWSApiCallTimeoutException",
    "org.apache.hadoop.net.ConnectTimeoutException", "java.net.ConnectException",
    "java.net.SocketTimeoutException", "java.net.NoRouteToHostException",
})  # fmt: skip
_S3A_TEXT = re.compile("(" + "|".join(re.escape(n) for n in sorted(_S3A_PASSING)) + r"): ([^\n]*)")
# what a store says to credentials it refuses, or that may not do what was asked
_STORE_REFUSED = re.compile(
    r"AWS Error (ACCESS_DENIED|INVALID_ACCESS_KEY_ID|SIGNATURE_DOES_NOT_MATCH|"
    r"EXPIRED_TOKEN|UNRECOGNIZED_CLIENT)\b|java\.nio\.file\.AccessDeniedException: s3a://"
)  # a local file system's AccessDeniedException names a path, not s3a://


def store_refusal(error: BaseException) -> TerminalError | None:
    """`error` (or what caused it) as the object store refusing these credentials what the job
    asked of it (pyarrow's client for the driver's files, s3a for Spark's): a `TerminalError`
    that says so, else None. A retry does not fix it: exit 1, not an `unexpected` bug."""
    for current in causes(error, _MAX_CAUSES):
        text = text_of(current) or ""
        refused = _STORE_REFUSED.search(text)
        if refused is not None:  # its own line: a Py4J error's first is "An error occurred..."
            line = text[text.rfind("\n", 0, refused.start()) + 1 :]
            return TerminalError(
                "the object store refused these credentials what the job asked (reading, "
                "listing, writing and deleting under target.root are all needed; see the "
                f"README's Object storage): {first_line(line.lstrip(': '))}"
            )
    return None


def as_transient(error: BaseException) -> TransientError | None:
    """`error` as a `TransientError` when it (or what caused it) may pass by itself, else None."""
    for current in causes(error, _MAX_CAUSES):
        if isinstance(current, TransientError):
            return current
        if isinstance(current, CdcError):
            return None  # the product already said what it is
        if isinstance(current, psycopg.Error):
            return _from_psycopg(current)
        if isinstance(current, OSError) and (store := _STORE.search(str(current))):
            return TransientError(f"the object store did not answer ({store.group(1)}): "
                                  f"{first_line(current)}; {_RETRY}")  # fmt: skip
        found = _from_spark(current)
        if found is not None:
            return found
    return None


@contextlib.contextmanager
def transient_failures() -> Iterator[None]:
    """Re-raise a failure that may pass by itself as `TransientError` (from the original)."""
    try:
        yield
    except CdcError:
        raise
    except Exception as e:
        mapped = as_transient(e)
        if mapped is None or mapped is e:
            raise
        raise mapped from e


def _describe(state: str | None, text: str, *, via: str = "") -> TransientError | None:
    hint = _TRANSIENT.get(state or "") or _TRANSIENT.get((state or "")[:2])
    if hint is None:
        return None
    first = first_line(text)
    code = f" [SQLSTATE {state}]" if state else ""
    server = f"{via}{first}{code}"
    return TransientError(f"{hint}: {server}; {_RETRY}", sqlstate=state or None, server=server)


def _from_psycopg(error: psycopg.Error) -> TransientError | None:
    state = error.sqlstate
    if state is None:  # no server message: the connection itself failed or went away
        if not isinstance(error, psycopg.OperationalError):
            return None
        first = first_line(error)
        return TransientError(f"{_LOST}: {first}; {_RETRY}")
    return _describe(state, str(error))


def _conflict(name: str, text: str) -> TransientError:
    first = first_line(text)
    return TransientError(f"{_CONFLICT}: {name}: {first}; {_RETRY}")


def _on_store(name: str, text: str) -> bool:
    return name.startswith(_S3A) or "s3a://" in text


def _store_down(name: str, message: str) -> TransientError:
    kind = name.rpartition(".")[2]
    return TransientError(f"the object store did not answer Spark ({kind}): "
                          f"{first_line(message)}; {_RETRY}")  # fmt: skip


def jdbc_message(text: str) -> str | None:
    """The PostgreSQL JDBC driver's message in a Spark error's text, or None."""
    found = _PSQL.search(text)
    return found.group(1) if found else None


def _from_spark(error: BaseException) -> TransientError | None:
    """A Py4J error (or PySpark's captured form of one) caused by the PostgreSQL JDBC driver,
    or a Delta commit conflict."""
    kind = type(error)
    if kind.__module__.startswith("delta.exceptions") and kind.__name__ in _DELTA_CONFLICTS:
        return _conflict(kind.__name__, text_of(error) or "")
    java = getattr(error, "java_exception", None) or getattr(error, "_origin", None)
    if java is not None:
        with contextlib.suppress(Exception):  # the JVM may be gone: the text is enough then
            for _ in range(_MAX_CAUSES):
                if java is None:
                    break
                name = str(java.getClass().getName())
                if name.startswith("org.postgresql."):
                    state = str(java.getSQLState() or "")
                    return _describe(state, str(java.getMessage() or ""), via="Spark JDBC read: ")
                if name.startswith("io.delta.exceptions.") and name[20:] in _DELTA_CONFLICTS:
                    return _conflict(name[20:], str(java.getMessage() or ""))
                if name in _S3A_PASSING and _on_store(name, str(java.getMessage() or "")):
                    return _store_down(name, str(java.getMessage() or ""))
                java = java.getCause()
    text = text_of(error) or ""
    conflict = _DELTA.search(text)
    if conflict is not None and conflict.group(1) in _DELTA_CONFLICTS:
        return _conflict(conflict.group(1), conflict.group(2))
    message = jdbc_message(text)
    if message is None:
        store = _S3A_TEXT.search(text)
        if store is not None and _on_store(store.group(1), text):
            return _store_down(store.group(1), store.group(2))
        return None
    for state, known in _JDBC_TEXTS:
        if known in message:
            return _describe(state, message, via="Spark JDBC read: ")
    return None
