"""Reading a slot: the streaming replication protocol (COPY BOTH) or bounded SQL peeks.

Both yield batches of `(lsn, message bytes)` pairs in the order the server decodes them (a
batch is whatever arrived together, at most `BATCH` messages or about `BATCH_BYTES`), plus marks:
`CaughtUp(p)` (the server has sent everything before `p`) and, for peeks, `Checkpoint`
(stage what came so far before the next peek). Neither moves the slot on its own: `confirm`
is called with positions that are durably staged.
"""

from __future__ import annotations

import contextlib
import select
import struct
import time
from collections.abc import Generator
from dataclasses import dataclass
from itertools import islice

import psycopg
from psycopg import errors, pq

from cdc_core.config import Dsn
from cdc_core.errors import TerminalError, TransientError, first_line
from cdc_core.lsn import Lsn
from cdc_core.pg.connect import connect
from cdc_core.pg.slot import advance_slot, flush_position, lost_slot, slot_state
from cdc_core.transient import as_transient

PG_EPOCH_US = 946_684_800_000_000
_XLOG_HEADER = struct.Struct(">QQq")
_KEEPALIVE = struct.Struct(">QqB")
_STATUS = struct.Struct(">cQQQqB")


@dataclass(frozen=True)
class CaughtUp:
    """The server has sent every change before `position`."""

    position: Lsn


@dataclass(frozen=True)
class Checkpoint:
    """Stage and confirm everything received so far before more is read."""


Batch = list[tuple[int, bytes]]
Event = Batch | CaughtUp | Checkpoint
BATCH = 10_000
BATCH_BYTES = 16 << 20  # a stream batch also ends past this many bytes (the reader copies it)
# libpq 17 sends a result's rows in chunks as they come (psycopg's bundled libpq is newer); an
# older one sends them one at a time, which is slower but reads the same rows
PEEK_CHUNK = BATCH if pq.version() >= 170000 else 1


def decoding_missed_publication(sqlstate: str | None, context: str | None) -> bool:
    """The server's error says pgoutput met an undefined object while decoding a change: the
    publication, which it looks up as of that change (a missing slot or table has no decoding
    context). The context's words may be translated; the plugin's name is not."""
    return sqlstate == "42704" and '"pgoutput"' in (context or "")


def publication_missing(slot: str, publication: str, said: str) -> TerminalError:
    """The error for a slot holding changes made while its publication did not exist.

    PostgreSQL 15 decodes each change with the catalog as of that change: a change to any
    table (published or not) made between the publication's drop and its re-creation stops
    decoding, on every read, and only WAL after the re-creation decodes again. Those changes
    cannot be read from this slot, so retrying will not help; a new slot and a snapshot will.
    """
    return TerminalError(
        f"publication {publication!r} (source.publication) did not exist when changes still "
        f"in slot {slot!r} were made (the server said: {said}): PostgreSQL decodes each change "
        "with the publications as they were when it was made, so the changes made between the "
        "publication's drop and its re-creation (the next run creates it again unless "
        "publication.autocreate.mode is disabled) can never be read from this slot, and "
        "retrying will not help; the slot holds back WAL meanwhile. Take a new slot and a new "
        f"snapshot: set snapshot.mode: when_needed (if it is not, or always), drop the slot "
        f"(SELECT pg_drop_replication_slot('{slot}')) and run again"
    )


def _server_said(error: psycopg.Error) -> str:
    """The error's first line and its decoding context (the slot, the LSN)."""
    first = first_line(error)
    context = error.diag.context
    return f"{first} ({context.strip()})" if context else first


def _missing_publication(error: psycopg.Error, slot: str, publication: str) -> TerminalError | None:
    if not decoding_missed_publication(error.sqlstate, error.diag.context):
        return None
    return publication_missing(slot, publication, _server_said(error))


def publication_names(publication: str) -> str:
    """pgoutput's `publication_names` option naming the one publication `publication`: a list
    pgoutput splits on commas, so the name is quoted as one identifier."""
    return '"' + publication.replace('"', '""') + '"'


def _options(publication: str) -> list[str]:
    """pgoutput options as name, value pairs (protocol 1: whole transactions after commit)."""
    names = publication_names(publication)
    return ["proto_version", "1", "publication_names", names, "messages", "true"]


class StreamSource:
    """The streaming replication protocol through psycopg's COPY BOTH support."""

    def __init__(self, dsn: Dsn, slot: str, publication: str, *, idle_probe_s: float = 0.1,
                 status_interval_s: float = 10.0) -> None:  # fmt: skip
        self.dsn, self.slot, self.publication = dsn, slot, publication
        self.idle_probe_s = idle_probe_s
        self.status_interval_s = status_interval_s
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None
        self.flushed = 0
        self._last_status = 0.0

    def open(self, start: Lsn) -> None:
        """START_REPLICATION from `start` (the server never goes back past its confirmed point)."""
        self.conn = connect(self.dsn, replication=True)
        opts = _options(self.publication)
        pairs = ", ".join(
            f"{k} '{v.replace(chr(39), chr(39) * 2)}'"
            for k, v in zip(opts[::2], opts[1::2], strict=True)
        )
        command = f"START_REPLICATION SLOT {self.slot} LOGICAL {start} ({pairs})"
        result = self.conn.pgconn.exec_(command.encode())
        if result.status != pq.ExecStatus.COPY_BOTH:
            message = (result.error_message or b"").decode(errors="replace").strip()
            self.close()
            if "is active for PID" in message:
                raise TransientError(
                    f"replication slot {self.slot!r} is in use by another process: {message}"
                )
            raise TerminalError(f"START_REPLICATION on slot {self.slot!r} failed: {message}")
        self.flushed = max(self.flushed, start.value)

    def events(self) -> Generator[Event, None, None]:
        """Batches of messages and keepalive positions, until the connection ends."""
        assert self.conn is not None
        pgconn = self.conn.pgconn
        get = pgconn.get_copy_data
        header = _XLOG_HEADER.unpack_from
        probe_at = time.monotonic() + self.idle_probe_s
        batch: Batch = []
        nbytes = 0
        while True:
            n, buf = get(1)
            if n > 0:
                kind = buf[0]
                if kind == 0x77:  # 'w' XLogData: start, WAL end, send time, one pgoutput message
                    batch.append((header(buf, 1)[0], bytes(buf[25:])))
                    nbytes += n
                    if len(batch) >= BATCH or nbytes >= BATCH_BYTES:
                        yield batch
                        batch, nbytes = [], 0
                elif kind == 0x6B:  # 'k' keepalive: WAL end, send time, reply requested
                    if batch:
                        yield batch
                        batch, nbytes = [], 0
                    wal_end, _, reply = _KEEPALIVE.unpack_from(buf, 1)
                    if reply:
                        self._status(request_reply=False)
                    yield CaughtUp(Lsn(wal_end))
                continue
            if n < 0:  # what came last is dropped: the slot is not confirmed past it
                raise self._ended()
            if batch:  # the socket is drained: hand over what came
                yield batch
                batch, nbytes = [], 0
                probe_at = time.monotonic() + self.idle_probe_s
                continue
            probe_at = self._wait(probe_at)

    def _wait(self, probe_at: float) -> float:
        """Wait for data; when idle, ask for a keepalive (it says how far the server is)."""
        assert self.conn is not None
        now = time.monotonic()
        if now >= probe_at:
            self._status(request_reply=True)
            probe_at = now + self.idle_probe_s
        elif now - self._last_status >= self.status_interval_s:
            self._status(request_reply=False)
        try:
            select.select([self.conn.pgconn.socket], [], [], self.idle_probe_s)
            self.conn.pgconn.consume_input()
        except (OSError, psycopg.OperationalError) as e:
            raise TransientError(f"replication connection lost: {e}") from e
        return probe_at

    def _ended(self) -> Exception:
        """Why the server ended the COPY: its error, as psycopg raises it (the SQLSTATE tells
        `transient_failures` an administrator's shutdown from a decoding error, which no retry
        fixes), else a lost connection (or a server that finished the stream: shutting down)."""
        assert self.conn is not None
        pgconn = self.conn.pgconn
        result = pgconn.get_result()  # the ErrorResponse that ended it, already received
        if (
            result is not None
            and result.status == pq.ExecStatus.FATAL_ERROR
            and result.error_field(pq.DiagnosticField.SQLSTATE) is not None  # not libpq's own
        ):
            error = errors.error_from_result(result, encoding=self.conn.info.encoding)
            return _missing_publication(error, self.slot, self.publication) or error
        said = (result.error_message if result is not None else b"") or pgconn.error_message
        message = (said or b"connection closed").decode(errors="replace").strip()
        return TransientError(f"replication stream on slot {self.slot!r} ended: {message}")

    def confirm(self, position: Lsn) -> None:
        """Report `position` as flushed: everything before it is durably staged."""
        if position.value > self.flushed:
            self.flushed = position.value
            self._status(request_reply=False)

    def _status(self, *, request_reply: bool) -> None:
        assert self.conn is not None
        now_pg = time.time_ns() // 1000 - PG_EPOCH_US
        f = self.flushed
        message = _STATUS.pack(b"r", f, f, f, now_pg, int(request_reply))
        try:
            self.conn.pgconn.put_copy_data(message)
            self.conn.pgconn.flush()
        except psycopg.OperationalError as e:
            raise TransientError(f"replication connection lost: {e}") from e
        self._last_status = time.monotonic()

    def close(self) -> None:
        if self.conn is not None:
            if not self.conn.closed:
                # if the connection is gone, the slot keeps what it last confirmed
                with contextlib.suppress(TransientError):
                    self._status(request_reply=False)
                self.conn.close()
            self.conn = None


class SqlSource:
    """`pg_logical_slot_peek_binary_changes` bounded by LSN and count, then an advance."""

    def __init__(
        self, dsn: Dsn, slot: str, publication: str, *, peek_changes: int = 1_000_000
    ) -> None:
        self.dsn, self.slot, self.publication = dsn, slot, publication
        self.peek_changes = peek_changes
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None
        self.confirmed = Lsn(0)
        self._peeking = False  # the connection is reading a peek's rows
        self._deferred = Lsn(0)  # a confirmation asked for while it was
        self.peeks = 0

    def open(self, start: Lsn) -> None:
        # A peek returns whole transactions, so it takes as long as the largest one takes to
        # decode, and an advance decodes its whole range: source.query_timeout_s (or a role's
        # statement_timeout) would cancel the same peek on every run. The stream reader's
        # walsender has no limit either.
        self.conn = connect(self.dsn, autocommit=True, values=True, bounded=False, reads_slot=True)
        state = slot_state(self.conn, self.slot)
        if state is None:
            raise TerminalError(f"replication slot {self.slot!r} does not exist")
        self.confirmed = state.confirmed_flush
        self.confirm(start)

    def events(self, upto: Lsn | None = None) -> Generator[Event, None, None]:
        """Peek after peek until one has read everything before `upto` (the flush position if
        None)."""
        assert self.conn is not None
        options = _options(self.publication)
        query = (
            "SELECT (lsn - '0/0')::bigint, data FROM pg_logical_slot_peek_binary_changes("
            "%s, %s::pg_lsn, %s, " + ", ".join(["%s"] * len(options)) + ")"
        )
        while True:
            limit = upto or flush_position(self.conn)
            rows, last = 0, (0, b"")
            self._peeking = True
            self.peeks += 1
            try:
                # the rows come as the server sends them, a chunk at a time: the socket keeps
                # filling while the batch before is staged (a server-side cursor waits instead)
                with self.conn.cursor(binary=True) as cur:
                    params = (self.slot, str(limit), self.peek_changes, *options)
                    peeked = cur.stream(query, params, size=PEEK_CHUNK)
                    while fetched := list(islice(peeked, BATCH)):
                        rows += len(fetched)
                        last = fetched[-1]  # type: ignore[assignment]
                        yield fetched  # type: ignore[misc]  # (bigint, bytea) rows: (int, bytes)
            except psycopg.Error as e:
                failure = self._failure("peek", e)
                if failure is e:
                    raise
                raise failure from e
            finally:
                self._peeking = False
            self.confirm(self._deferred)
            if rows:
                yield Checkpoint()
            # The peek read the whole range when it stopped short of its count (it stops only
            # past `peek_changes`, between transactions) or at a commit that ends at the limit;
            # another peek would decode the range again from `restart_lsn` to find nothing.
            if rows < self.peek_changes or (last[1][:1] == b"C" and last[0] >= limit.value):
                yield CaughtUp(limit)
                return

    def confirm(self, position: Lsn) -> None:
        """Advance the slot to `position`; the server refuses to move a slot backwards."""
        assert self.conn is not None
        if self._peeking:  # the connection is busy with the peek's rows: advance after them
            self._deferred = max(self._deferred, position)
            return
        position = max(position, self._deferred)
        if position <= self.confirmed:
            return
        try:
            self.confirmed = advance_slot(self.conn, self.slot, position)
        except psycopg.Error as e:
            failure = self._failure("advance", e)
            if failure is e:
                raise
            raise failure from e

    def _failure(self, what: str, error: psycopg.Error) -> Exception:
        """What a failed peek or advance means, by its SQLSTATE: changes the publication's drop
        made unreadable, a slot that lost its WAL (both stop the run: no retry brings the WAL
        back), a failure that may pass by itself (`as_transient`), else the error itself."""
        missing = _missing_publication(error, self.slot, self.publication)
        if missing is not None:
            return missing
        if error.sqlstate == "55000":  # object not in prerequisite state: the slot's WAL is gone
            return lost_slot(self.slot, _server_said(error))
        transient = as_transient(error)
        if transient is None:
            return error
        return TransientError(f"{what} on slot {self.slot!r} failed: {transient}")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
