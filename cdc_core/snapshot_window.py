"""DBLog's window, made exact: which rows of a snapshot read the stream has already overtaken.

A read takes its MVCC snapshot between two WAL positions: `before` (the low watermark) and
`position` (the high watermark, the read's place in the stream). A transaction the snapshot did
not see commits after `before`, or it is one the snapshot still had running though its commit
was already flushed: PostgreSQL writes and flushes a commit, and logical decoding sends it,
before the transaction leaves the running list snapshots see (with synchronous replication it
waits there for a standby). Either comes earlier in the stream than the read when it commits
before `position`, so the read's row for a key it changed is stale there. The first kind is
found in the window [`before`, `position`); the second by its id (the snapshot's running list)
among the files staged before `before`, searched back until each id is ruled out by a
capture's `XidFloor`. Once the stream is
staged past `position`, those transactions are known: a key one of them deleted is dropped from
the read, a key they only updated gets their values on top of the read's (a value an update did
not resend, an unchanged TOASTed one, stays the read's: the update did not change it), and a
row they moved to a new key moves in the read too, keeping the values the move did not resend
(the stream cannot know them: nothing but the read has them). Every other row stands,
positioned after everything it saw.

The other way round, a key change the read saw can take a row out of its chunks to a key an
earlier read had already passed: the read does not find it, and the stream's row at the new
key lacks the values the move did not resend. `departures` finds those rows, for the read to
read them where they went.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cdc_core.bronze import staged_context
from cdc_core.envelope import envelopes
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.stager import StagedFile, XidFloor, read_metadata, staged_files
from cdc_core.storage import arrow

_XID_SPAN = 1 << 32
_HALF = _XID_SPAN // 2

Key = tuple[str | None, ...]
Filter = tuple[str, str, Any]  # a pyarrow filter term: (column, operator, value)


def _precedes(a: int, b: int) -> bool:
    """Transaction id `a` is older than `b` (32-bit, modulo 2^32, as PostgreSQL compares)."""
    return (a - b + _HALF) % _XID_SPAN < _HALF


@dataclass(frozen=True)
class ReadView:
    """What a snapshot read saw: its MVCC snapshot (32-bit xids) and the WAL positions around it."""

    xmin: int
    xmax: int
    xip: tuple[int, ...]
    position: Lsn  # after the snapshot: the read's place in the stream (high watermark)
    before: Lsn  # before the snapshot: what it did not see committed after this (low watermark)
    unseen_from: Lsn | None = None
    """Where the table's changes the read did not see begin in the stream, once it is staged
    past `position`: `before`, or earlier, the commit of a transaction the snapshot had running
    though it was already flushed (None: not known)."""

    @classmethod
    def parse(cls, snapshot: str, position: str, before: str) -> ReadView:
        """From `pg_current_snapshot()::text` ('xmin:xmax:xip,...') and two LSNs."""
        xmin, xmax, xip = snapshot.split(":")
        running = tuple(int(x) % _XID_SPAN for x in xip.split(",") if x)
        return cls(int(xmin) % _XID_SPAN, int(xmax) % _XID_SPAN, running, Lsn.parse(position),
                   Lsn.parse(before))  # fmt: skip

    def sees(self, xid: int) -> bool:
        """Whether transaction `xid` had committed for this snapshot (`silver_batch.visible`)."""
        xid %= _XID_SPAN
        return _precedes(xid, self.xmin) or (_precedes(xid, self.xmax) and xid not in self.xip)


Values = dict[str, str | None]


@dataclass
class Overtaken:
    """Keys (primary-key values as text) the stream changed before the read, unseen by it."""

    dropped: set[Key] = field(default_factory=set)  # the read's rows of these keys go
    newer: dict[Key, Values] = field(default_factory=dict)  # the read's rows get these values
    moved: dict[Key, tuple[Key, Values]] = field(default_factory=dict)
    """New key -> (the read's key it came from, the values on top): rows the read gains."""
    unseen_from: Lsn | None = None  # the first commit the read did not see (ReadView's)
    _leaving: tuple[Key, Values] | None = field(default=None, repr=False)  # a key change's row

    def __bool__(self) -> bool:
        return bool(self.dropped or self.newer or self.moved)

    def apply(self, row: dict[str, Any]) -> None:
        """Take one change (an envelope) the read did not see, in stream order."""
        k = _key_of(row["key"])
        if k is None:
            return
        sent = {}
        if row["after"] is not None:
            unsent = set(row["unchanged"] or ())
            sent = {c: v for c, v in json.loads(row["after"]).items() if c not in unsent}
        headers = dict(row["headers"] or ())  # an Arrow map: (key, value) pairs
        if row["op"] == "d":
            if k in self.moved:
                carried: tuple[Key, Values] | None = self.moved.pop(k)
            elif k in self.dropped:  # the read's row of k went before: this row is the stream's
                carried = None
            else:
                carried = (k, self.newer.pop(k, {}))
            self.dropped.add(k)
            self._leaving = carried if "__debezium.newkey" in headers else None
        elif row["op"] == "c" and "__debezium.oldkey" in headers and self._leaving is not None:
            source, values = self._leaving
            self.moved[k] = (source, {**values, **sent})
            self._leaving = None
        elif row["op"] == "u":
            if k in self.moved:
                self.moved[k][1].update(sent)
            elif k not in self.dropped:
                self.newer.setdefault(k, {}).update(sent)


def overtaken(
    lake: Lake, table: TableName, key: Sequence[str], view: ReadView,
    skipped: Collection[str] = (),
) -> Overtaken:  # fmt: skip
    """What the staged stream says about `table` inside `view`'s window (see the module); the
    events whose op is in `skipped` (skipped.operations) are not in the stream bronze gets."""
    out = Overtaken()
    files = staged_files(lake.changes)
    changes = _committed_unseen(lake, files, table, view)
    out.unseen_from = Lsn(min([view.before.value, *(r["commit_lsn"] for r in changes)]))
    if not key:  # no key to match rows by: silver puts the changes the read did not see, from
        return out  # `unseen_from` on, on top of the read (`silver.apply_table`)
    window = [("commit_lsn", ">=", view.before.value), ("commit_lsn", "<", view.position.value)]
    for staged in files:
        if staged.end <= view.before or staged.start >= view.position:
            continue
        changes += _changes(lake, staged, table, window)
    for row in changes:  # in stream order: the unseen commits before `before` come first
        txid = row["source"]["txId"]
        if txid is not None and not view.sees(int(txid)) and row["op"] not in skipped:
            out.apply(row)
    return out


@dataclass(frozen=True)
class Departure:
    """A row the stream moved away from `origin` (its old key's values) to `key`, in key
    changes that did not resend `unsent` (unchanged TOASTed values): only a read of the row
    where it is now has those values. `xid`: the transaction of the last move."""

    origin: Values
    key: Key
    values: Values  # what the moves sent, at the row's new place
    unsent: frozenset[str]
    xid: int


def departures(lake: Lake, table: TableName, view: ReadView, since: Lsn) -> list[Departure]:
    """The rows `table`'s key changes moved, from `since` to the read's place, in transactions
    the read saw, each followed through later moves to where the read saw it, and kept while
    some value is still unsent (a later move that resends a value makes it known again). The
    read does not find such a row at its old key; if a read before it had already passed the
    new key, the mirror gets the row only from the stream, without the values it did not send.
    Only the staged updates that carry an old key are decoded."""
    ends: dict[Key, Departure] = {}
    leaving: tuple[Key, Values] | None = None
    for row in _key_changes(lake, table, since, view.position):
        txid = row["source"]["txId"]
        if txid is None or not view.sees(int(txid)):
            continue
        headers = dict(row["headers"] or ())
        k = _key_of(row["key"])
        if k is None:
            continue
        if row["op"] == "d" and "__debezium.newkey" in headers:
            leaving = (k, json.loads(row["before"] or "{}"))
        elif row["op"] == "c" and "__debezium.oldkey" in headers and leaving is not None:
            old, before = leaving
            leaving = None
            unsent = frozenset(row["unchanged"] or ())
            sent = {c: v for c, v in json.loads(row["after"]).items() if c not in unsent}
            prior = ends.pop(old, None)
            if prior is not None:  # moved again: what is still unsent is what neither move sent
                before, unsent = prior.origin, unsent & prior.unsent
            if unsent:
                ends[k] = Departure(before, k, sent, unsent, int(txid))
    return list(ends.values())


def _key_changes(lake: Lake, table: TableName, since: Lsn, until: Lsn) -> list[dict[str, Any]]:
    """Envelopes of `table`'s updates that carry an old key ('K' after the relation id, or
    after the xid of a streamed transaction's message), committed in [since, until)."""
    out: list[dict[str, Any]] = []
    window: list[Filter] = [("commit_lsn", ">=", since.value), ("commit_lsn", "<", until.value),
                            ("op", "=", "u")]  # fmt: skip
    for staged in staged_files(lake.changes):
        if staged.end <= since or staged.start >= until:
            continue
        out += _changes(lake, staged, table, window, _carries_old_key)
    return out


def _carries_old_key(rows: pa.Table) -> pa.Table:
    message = rows["message"]
    marks = [pc.equal(pc.binary_slice(message, at, at + 1), b"K") for at in (5, 9)]
    return rows.filter(pc.or_(*marks))


def _committed_unseen(
    lake: Lake, files: Sequence[StagedFile], table: TableName, view: ReadView
) -> list[dict[str, Any]]:  # fmt: skip
    """Envelopes of `table`'s changes by transactions the read's snapshot had running though
    their commits are before `before`, in stream order. Those are the ids in its running list,
    and any from its xmax on: xmax is one past the newest transaction to have finished, so a
    transaction waiting with no later one finished is above it, not in the list. Files are
    searched from `before` back, each file's floor ruling out the ids it can (`XidFloor`),
    until none is left. The files of the read's own catch-up rule out none (their floors are
    after the snapshot); the capture before the read rules out every transaction that began
    after it started, so the search usually ends there, and goes further back only past a
    transaction that ran longer. A file staged before floors were recorded rules out none."""
    running, later = set(view.xip), True  # later: ids from xmax on are still candidates
    floors: list[XidFloor] = []
    found: list[dict[str, Any]] = []
    for staged in reversed([f for f in files if f.start < view.before]):
        floor = XidFloor.of(read_metadata(lake.changes / str(staged)))
        floors += [floor] if floor is not None else []
        running = {x for x in running if not _ruled_out(x, staged, floors)}
        later = later and not _ruled_out(view.xmax, staged, floors)  # and all ids after xmax
        if not running and not later:
            break
        before: Filter = ("commit_lsn", "<", view.before.value)
        candidates = [[before, ("xid", "in", sorted(running))]] if running else []
        candidates += [[before, *r] for r in _from_on(view.xmax)] if later else []
        path, fs = arrow(lake.changes / str(staged))
        xids = pq.read_table(path, columns=["xid"], filters=candidates, filesystem=fs)["xid"]
        ids = set(xids.to_pylist())
        if ids:
            running -= ids  # a file holds whole transactions
            found = _changes(lake, staged, table, [before, ("xid", "in", sorted(ids))]) + found
    return found


def _ruled_out(xid: int, staged: StagedFile, floors: Sequence[XidFloor]) -> bool:
    """Whether a floor says transaction `xid` commits after all of `staged`."""
    return any(staged.end <= f.lsn and not _precedes(xid, f.xid) for f in floors)


def _from_on(xid: int) -> list[list[Filter]]:
    """The 32-bit ids from `xid` on (the half of the circle after it) as `xid` ranges."""
    end = xid + _HALF
    if end <= _XID_SPAN:
        return [[("xid", ">=", xid), ("xid", "<", end)]]
    return [[("xid", ">=", xid)], [("xid", "<", end - _XID_SPAN)]]


def _changes(
    lake: Lake, staged: StagedFile, table: TableName, where: list[Filter],
    keep: Callable[[pa.Table], pa.Table] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Envelopes of `table`'s changes in one staged file that match `where` (and `keep`, on
    the staged rows), in stream order."""
    ctx = staged_context(lake, staged)
    oids = sorted({oid for (oid, _), rel in ctx.relations.items()
                   if (rel.schema, rel.table) == (table.schema, table.name)})  # fmt: skip
    if not oids:
        return []
    path, fs = arrow(lake.changes / str(staged))
    rows = pq.read_table(path, filters=[*where, ("relation_oid", "in", oids)], filesystem=fs)
    if keep is not None:
        rows = keep(rows)
    if not rows.num_rows:
        return []
    rows = rows.append_column("_file", pa.array([str(staged)] * rows.num_rows, pa.string()))
    out: list[dict[str, Any]] = []
    for batch in rows.to_batches():
        out += envelopes(batch, {str(staged): ctx}).to_pylist()
    out.sort(key=lambda r: (r["commit_lsn"], r["seq"]))
    return out


def _key_of(key_json: str | None) -> Key | None:
    """An event's key (JSON of the primary key's columns, in key order) as a tuple."""
    return None if key_json is None else tuple(json.loads(key_json).values())
