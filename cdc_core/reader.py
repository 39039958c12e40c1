"""Stage 1: the slot -> whole committed transactions, in commit order, in bounded chunks.

`Assembler` (pure, no I/O) turns pgoutput messages into `ChangeChunk`s. It drops what is
already staged, stops at the first transaction committed at or after `stop_at`, and keeps a
large transaction within a memory budget by handing it over in several chunks. A change is
kept as the message the server sent. The row changes of a batch are handled as Arrow blocks:
numpy reads each one's type and relation OID, and no Python step runs per change. Batches of
messages come from a source in `cdc_core.pg.replication`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from cdc_core.columns import NO_RULES, ColumnPlan, ColumnRules
from cdc_core.errors import DecodeError
from cdc_core.events import ChangeChunk, RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.lsn import ZERO, Lsn
from cdc_core.pg import pgoutput as po
from cdc_core.reset_marker import RESET_PREFIX, ResetMarker

log = logging.getLogger("cdc_core.reader")

Describe = Callable[[po.Relation, dict[int, str]], RelationDescriptor]

_TAGS = {"c": "I", "d": "D"}  # Debezium op -> the pgoutput message that only ever is that op
WATERMARK_PREFIX = "cdc-lake.watermark"
"""Prefix of the logical messages snapshot reads write after themselves; never staged."""
HEARTBEAT_PREFIX = "cdc-lake.heartbeat"
"""Prefix of heartbeat messages (`heartbeat.interval.ms`); staged whatever the prefix filters."""
_INSERT, _UPDATE, _DELETE = b"IUD"
_NEW_ONLY = ord("N")  # byte 5 of an UPDATE without an old tuple ('K' old key, 'O' old row)


def _among(values: np.ndarray, wanted: Collection[int]) -> np.ndarray:
    """`np.isin` without its fixed cost for a handful of values (the usual case)."""
    if len(wanted) > 8:
        return np.isin(values, np.fromiter(wanted, np.int64, len(wanted)))
    found = np.zeros(len(values), np.bool_)
    for w in wanted:
        found |= values == w
    return found


class _Block:
    """A batch of messages as one Arrow array: kinds, OIDs and sizes read without Python."""

    def __init__(self, batch: list[tuple[int, bytes]]) -> None:
        self.batch = batch
        self.message = pa.array([m for _, m in batch], pa.large_binary())
        self.lsns = np.array([lsn for lsn, _ in batch], np.int64)
        self.offsets = np.frombuffer(self.message.buffers()[1], np.int64, len(batch) + 1)
        values = self.message.buffers()[2]
        empty = values is None
        self.values = np.zeros(0, np.uint8) if empty else np.frombuffer(values, np.uint8)
        empty_at = np.flatnonzero(self.offsets[1:] == self.offsets[:-1])
        if len(empty_at):
            raise DecodeError(f"an empty message at LSN {Lsn(self.lsn(int(empty_at[0])))}")
        self.kinds = self.values[self.offsets[:-1]]
        kinds = self.kinds
        self.is_row = (kinds == _INSERT) | (kinds == _UPDATE) | (kinds == _DELETE)

    def lsn(self, i: int) -> int:
        return int(self.lsns[i])

    def oids(self, start: int, end: int) -> np.ndarray:
        """The relation OIDs of row changes `start:end` (bytes 1-4 of each, big-endian)."""
        at = self.offsets[start:end]
        short = np.flatnonzero(self.offsets[start + 1 : end + 1] - at < 5)
        if len(short):
            i = start + int(short[0])
            raise DecodeError(f"a row change without a relation OID at LSN {Lsn(self.lsn(i))}")
        v = self.values
        oids: np.ndarray = (
            (v[at + 1].astype(np.int64) << 24) | (v[at + 2].astype(np.int64) << 16)
            | (v[at + 3].astype(np.int64) << 8) | v[at + 4].astype(np.int64)
        )  # fmt: skip
        return oids

    def plain_updates(self, start: int, end: int) -> np.ndarray:
        """Which row changes `start:end` are UPDATEs without an old tuple: not key changes."""
        at = self.offsets[start:end] + 5
        sent = at < self.offsets[start + 1 : end + 1]  # a shorter message fails its decoding
        tuple_kind = self.values[np.minimum(at, len(self.values) - 1)]
        found: np.ndarray = (self.kinds[start:end] == _UPDATE) & sent & (tuple_kind == _NEW_ONLY)
        return found

    def sizes(self, rows: np.ndarray) -> np.ndarray:
        sizes: np.ndarray = self.offsets[rows + 1] - self.offsets[rows]
        return sizes

    def take(self, rows: np.ndarray, oids: np.ndarray) -> tuple[pa.Array, pa.Array, pa.Array]:
        """lsn, relation_oid and message arrays of `rows` (ascending); a run is a slice."""
        first, n = int(rows[0]), len(rows)
        if int(rows[-1]) - first + 1 == n:
            message = self.message.slice(first, n)
        else:
            message = self.message.take(pa.array(rows))
        return pa.array(self.lsns[rows]), pa.array(oids), message


@dataclass(frozen=True)
class Budget:
    """Bounds of one chunk in memory: a larger transaction arrives in several chunks."""

    changes: int = 50_000
    nbytes: int = 64 << 20


class Assembler:
    """pgoutput messages -> chunks of whole committed transactions, in commit order.

    `skip_before`: transactions already staged (commit LSN below it, or a lone message at or
    below it) are dropped, so a replay after a crash stages nothing twice. `stop_at`: the first
    transaction (or lone message) at or past it ends the run; it is left for the next one.
    Changes of tables outside `tables` are dropped; their transactions still end, which is
    what lets the slot move past WAL that holds nothing for us. So are operations in `skipped`
    (Debezium codes c, u, d, t), messages whose prefix `keep_message` rejects, and reset
    markers for a slot other than `slot` (another pipeline's; None: every one is kept). An
    UPDATE with an old tuple is kept when u is skipped: it may be a key change, which Debezium
    emits as d + c; the envelope drops each event whose op is skipped.

    What is dropped on purpose is counted (Debezium's NumberOfEventsFiltered): in the open
    chunk's `filtered` for a change inside a transaction (each table of a TRUNCATE is one), in
    `lone_filtered` for a lone message. A snapshot read's watermark is the pipeline's own and
    not counted, nor is a change of a transaction already staged or left for the next run.

    A captured table is followed by its OID: pgoutput names a relation as the catalog had it
    when the change was made, so the changes of a table renamed or moved to another schema
    arrive under the other name; they are captured under the configured one, with a warning.
    `oids`: the catalog's OID of each captured table at the end of the WAL read (`stop_at`); a
    table without one (not found under its name) is followed by the OID of the last Relation
    message under its name. A configured name that arrives with another OID (the table dropped
    and created again, or another table renamed to it) is captured by name, as it always was,
    but that OID is not followed under other names.
    """

    def __init__(
        self,
        tables: Collection[TableName],
        describe: Describe,
        *,
        skip_before: Lsn = ZERO,
        stop_at: Lsn | None = None,
        budget: Budget = Budget(),
        now_us: Callable[[], int] = lambda: time.time_ns() // 1000,
        skipped: Collection[str] = (),
        columns: ColumnRules = NO_RULES,
        keep_message: Callable[[str], bool] = lambda prefix: True,
        slot: str | None = None,
        oids: Mapping[TableName, int] | None = None,
    ) -> None:
        self.tables = frozenset(tables)
        self.followed = {oid: t for t, oid in (oids or {}).items() if t in self.tables}
        self.pinned = frozenset(self.followed.values())  # their OID as of the end is known
        self.describe = describe
        self.skip_before = skip_before.value
        self.stop_at = stop_at.value if stop_at is not None else None
        self._end = self.stop_at if self.stop_at is not None else 1 << 64  # past any LSN
        self.budget = budget
        self.now_us = now_us
        self.skipped_tags = frozenset(ord(_TAGS[op]) for op in skipped if op in _TAGS)
        self.skip_plain_updates = "u" in skipped
        self.skip_truncate = "t" in skipped
        self.keep_message = keep_message
        self.slot = slot
        self.columns = columns
        self.plans: dict[int, ColumnPlan] = {}  # oid -> rewrite, for tables with column rules
        self.relations: dict[int, RelationDescriptor] = {}
        self.versions: dict[int, int] = {}  # oid -> version of its captured relation
        self.type_names: dict[int, str] = {}
        self.new_relations: list[RelationDescriptor] = []
        self.chunk: ChangeChunk | None = None  # the open transaction's current chunk
        self.skipping = False
        self.finished = False  # reached stop_at
        self.lone_filtered = 0  # lone messages dropped on purpose (filtered out, not ours)

    @property
    def in_transaction(self) -> bool:
        return self.chunk is not None

    def feed(self, lsn: int, data: bytes) -> ChangeChunk | None:
        """One message; the chunk it completed, if any."""
        out = self.feed_many(((lsn, data),))
        return out[0] if out else None

    def feed_many(self, messages: Iterable[tuple[int, bytes]]) -> list[ChangeChunk]:
        """A batch of messages; the chunks they completed (or filled), in order.

        Row changes (INSERT, UPDATE, DELETE) between two other messages are handled as one
        block with Arrow and numpy: their relation OIDs are read, filtered and appended
        without a Python step per change. Every other message goes through `_other`.
        """
        batch = messages if isinstance(messages, list) else list(messages)
        out: list[ChangeChunk] = []
        if not batch:
            return out
        block = _Block(batch)
        start = 0
        for k in [*np.flatnonzero(~block.is_row).tolist(), len(batch)]:
            if k > start:
                self._rows(block, start, k, out)
            if k == len(batch):
                break
            done = self._other(batch[k][0], batch[k][1])
            if done is not None:
                out.append(done)
            if self.finished:
                break  # the rest belongs to the next run
            start = k + 1
        return out

    def _rows(self, block: _Block, start: int, end: int, out: list[ChangeChunk]) -> None:
        """The row changes `start:end` of a block: keep those of captured tables and
        operations, and hand over the chunk each time it fills."""
        chunk = self.chunk
        if chunk is None:
            raise DecodeError(f"a change outside any transaction at LSN {Lsn(block.lsn(start))}")
        if self.skipping:
            return  # already staged
        oids = block.oids(start, end)
        keep = _among(oids, self.versions.keys())
        if self.skipped_tags:
            keep &= ~_among(block.kinds[start:end], self.skipped_tags)
        if self.skip_plain_updates:
            keep &= ~block.plain_updates(start, end)
        if keep.all():
            taken = np.arange(start, end)
        else:
            taken = np.flatnonzero(keep) + start
            oids = oids[keep]
            chunk.filtered += end - start - len(taken)
        if not len(taken):
            return  # tables not captured, or skipped operations
        if self.plans and _among(oids, self.plans.keys()).any():
            self._rewritten(block, taken.tolist(), oids.tolist(), out)
            return
        sizes = block.sizes(taken)
        max_changes, max_bytes = self.budget.changes, self.budget.nbytes
        while len(taken):
            # the first change after which the chunk is full, as adding one at a time would say
            full_at = max_changes - len(chunk) - 1
            over = np.flatnonzero(chunk.nbytes + np.cumsum(sizes) >= max_bytes)
            if len(over):
                full_at = min(full_at, int(over[0]))
            n = min(len(taken), full_at + 1)
            chunk.add_block(*block.take(taken[:n], oids[:n]), int(sizes[:n].sum()))
            if n <= full_at:
                return
            out.append(self._split(chunk))
            chunk = self.chunk
            assert chunk is not None
            taken, oids, sizes = taken[n:], oids[n:], sizes[n:]

    def _rewritten(
        self, block: _Block, taken: list[int], oids: list[int], out: list[ChangeChunk]
    ) -> None:
        """Row changes of tables with column rules: each message is rewritten before staging."""
        plans = self.plans
        for i, oid in zip(taken, oids, strict=True):
            lsn, data = block.batch[i]
            if oid in plans:
                data = plans[oid].rewrite(data)  # column filters and transforms, before staging
            assert self.chunk is not None
            self.chunk.add(lsn, oid, data)
            full = self._split_if_full(self.chunk)
            if full is not None:
                out.append(full)

    def _other(self, lsn: int, data: bytes) -> ChangeChunk | None:
        msg = po.decode(data, lsn)
        if isinstance(msg, po.Begin):
            self._begin(msg)
        elif isinstance(msg, po.Commit):
            return self._commit(msg)
        elif isinstance(msg, po.Relation):
            return self._relation(lsn, msg)
        elif isinstance(msg, po.TypeInfo):
            self.type_names[msg.oid] = f"{msg.namespace}.{msg.name}"
        elif isinstance(msg, po.Truncate):
            return self._truncate(lsn, msg, data)
        elif isinstance(msg, po.LogicalMessage):
            return self._message(lsn, msg, data)
        elif not isinstance(msg, po.Origin):
            raise DecodeError(
                f"unexpected {type(msg).__name__} at LSN {Lsn(lsn)}: streamed transactions "
                "need protocol 2, which this reader does not ask for"
            )
        return None

    def _begin(self, msg: po.Begin) -> None:
        if self.chunk is not None:
            raise DecodeError(f"BEGIN inside a transaction at commit LSN {msg.final_lsn}")
        if self.stop_at is not None and msg.final_lsn.value >= self.stop_at:
            self.finished = True
            return
        self.skipping = msg.final_lsn.value < self.skip_before
        self.chunk = self._new_chunk(msg.xid, msg.final_lsn.value, msg.commit_time_us, 0)

    def _commit(self, msg: po.Commit) -> ChangeChunk | None:
        chunk, self.chunk = self.chunk, None
        if chunk is None:
            raise DecodeError(f"COMMIT without BEGIN at LSN {msg.commit_lsn}")
        if self.skipping:
            return None
        chunk.last, chunk.end_lsn = True, msg.end_lsn.value
        chunk.versions = dict(self.versions)
        return chunk

    def _new_chunk(self, xid: int, commit_lsn: int, commit_time_us: int, seq: int) -> ChangeChunk:
        chunk = ChangeChunk(xid, commit_lsn, commit_time_us, first_seq=seq)
        if not self.skipping:  # a skipped transaction's chunk is dropped: relations wait
            chunk.relations, self.new_relations = self.new_relations, []
        return chunk

    def _split(self, chunk: ChangeChunk) -> ChangeChunk:
        """Hand over a full chunk; the transaction goes on in a new one."""
        chunk.versions = dict(self.versions)
        seq = chunk.first_seq + len(chunk)
        self.chunk = self._new_chunk(chunk.xid, chunk.commit_lsn, chunk.commit_time_us, seq)
        return chunk

    def _split_if_full(self, chunk: ChangeChunk) -> ChangeChunk | None:
        if len(chunk) < self.budget.changes and chunk.nbytes < self.budget.nbytes:
            return None
        return self._split(chunk)

    def _relation(self, lsn: int, msg: po.Relation) -> ChangeChunk | None:
        """Record a table's shape. A new shape of a table mid-chunk splits the chunk first, so
        each chunk reads every table with one descriptor."""
        named = TableName(msg.namespace or "pg_catalog", msg.name)
        table = self._captured_as(named, msg.oid)
        if table is None:
            handed = self._split_before(msg.oid)  # changes of it in the chunk keep their version
            self.versions.pop(msg.oid, None)
            return handed
        if table != named:
            log.warning(
                "table %s is called %s at LSN %s (renamed, or moved to another schema; same "
                "oid %d): its changes under that name are captured as %s's. If it keeps that "
                "name, the next run stops at its start (%s does not exist): rename it back, or "
                "put the new name in source.tables",
                table, named, Lsn(lsn), msg.oid, table, table,
            )  # fmt: skip
            msg = dataclasses.replace(msg, namespace=table.schema, name=table.name)
        handed = self._split_before(msg.oid)
        described = self.describe(msg, self.type_names)
        version = self.versions.get(msg.oid, -1) + 1
        descriptor = RelationDescriptor(
            described.oid, version, described.schema, described.table,
            described.replica_identity, described.columns, described.primary_key,
        )  # fmt: skip
        plan = self.columns.plan(descriptor)
        if plan is not None:
            self.plans[msg.oid] = plan
            descriptor = plan.descriptor
        else:
            self.plans.pop(msg.oid, None)
        self.relations[msg.oid] = descriptor
        self.versions[msg.oid] = version
        if self.chunk is not None and not self.skipping:
            self.chunk.relations.append(descriptor)
        else:
            self.new_relations.append(descriptor)
        return handed

    def _captured_as(self, named: TableName, oid: int) -> TableName | None:
        """The configured table a relation is captured as, or None: by its name when that is
        configured, else by its OID."""
        if named not in self.tables:
            return self.followed.get(oid)
        if named not in self.pinned:  # followed by its OID of the moment
            for before in [o for o, t in self.followed.items() if t == named and o != oid]:
                del self.followed[before]  # dropped and created again, or another table renamed
            self.followed[oid] = named
        return named

    def _split_before(self, oid: int) -> ChangeChunk | None:
        """Hand over the open chunk when it holds changes of `oid`'s current shape, before that
        shape is replaced or dropped: a chunk reads each table with one descriptor."""
        chunk = self.chunk
        if chunk is None or not len(chunk) or oid not in self.versions or self.skipping:
            return None
        return self._split(chunk)

    def _truncate(self, lsn: int, msg: po.Truncate, data: bytes) -> ChangeChunk | None:
        """One change per captured table, each keeping the whole TRUNCATE message."""
        chunk = self.chunk
        if chunk is None or self.skipping:
            return None
        for oid in msg.relation_oids:
            if oid in self.versions and not self.skip_truncate:
                chunk.add(lsn, oid, data)
            else:
                chunk.filtered += 1
        return self._split_if_full(chunk)

    def _resets_us(self, content: bytes) -> bool:
        return self.slot is None or ResetMarker.decode(content).is_for(self.slot)

    def _keeps(self, msg: po.LogicalMessage) -> bool:
        """Whether a logical message is staged: heartbeats always, reset markers of this slot
        (logical messages reach every slot: another pipeline's are not ours), others by prefix."""
        if msg.prefix == RESET_PREFIX:
            return self._resets_us(msg.content)
        return msg.prefix == HEARTBEAT_PREFIX or self.keep_message(msg.prefix)

    def _filtered_message(self, msg: po.LogicalMessage) -> None:
        """Count a message dropped by `_keeps`, unless already staged or the next run's."""
        if msg.transactional:
            if self.chunk is not None and not self.skipping:
                self.chunk.filtered += 1
        elif self.chunk is None and self.skip_before < msg.lsn.value < self._end:
            self.lone_filtered += 1

    def _message(self, lsn: int, msg: po.LogicalMessage, data: bytes) -> ChangeChunk | None:
        if msg.prefix == WATERMARK_PREFIX:
            return None  # a snapshot read's high watermark: the pipeline's own, not an event
        if not self._keeps(msg):
            self._filtered_message(msg)
            return None
        if msg.transactional:
            chunk = self.chunk
            if chunk is None or self.skipping:
                return None
            chunk.add(lsn, None, data)
            return self._split_if_full(chunk)
        if self.chunk is not None:
            return None  # a lone message never arrives inside a transaction
        if self.stop_at is not None and msg.lsn.value >= self.stop_at:
            self.finished = True
            return None
        if msg.lsn.value <= self.skip_before:
            return None  # already staged
        lone = self._new_chunk(0, msg.lsn.value, self.now_us(), 0)
        lone.add(lsn, None, data)
        lone.last, lone.end_lsn = True, msg.lsn.value
        return lone
