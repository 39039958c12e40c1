"""Stage 1: the slot -> whole committed transactions, in commit order, in bounded chunks.

`Assembler` (pure) turns pgoutput messages into `ChangeChunk`s, skipping what is already
staged. Two sources feed it: `StreamSource`, the streaming replication protocol (COPY BOTH,
the default) and `SqlSource`, bounded `pg_logical_slot_peek_binary_changes` calls. A source
yields messages and `CaughtUp` marks; it moves the slot only when told what is durable.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from cdc_core.errors import DecodeError
from cdc_core.events import ChangeChunk, ChangeOp, RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.lsn import ZERO, Lsn
from cdc_core.pg import pgoutput as po

Describe = Callable[[po.Relation, dict[int, str]], RelationDescriptor]

_INSERT, _UPDATE, _DELETE, _BEGIN, _COMMIT = 0x49, 0x55, 0x44, 0x42, 0x43
_OPS = {
    _INSERT: ChangeOp.CREATE.value,
    _UPDATE: ChangeOp.UPDATE.value,
    _DELETE: ChangeOp.DELETE.value,
}


@dataclass(frozen=True)
class CaughtUp:
    """The server has sent everything before `position`; nothing is in flight."""

    position: Lsn


@dataclass(frozen=True)
class Budget:
    """Bounds of one chunk in memory: a larger transaction arrives in several chunks."""

    changes: int = 50_000
    nbytes: int = 64 << 20


class Assembler:
    """pgoutput messages -> chunks of whole committed transactions. No I/O.

    `skip_before`: transactions already staged (commit LSN below it, or a lone message at or
    below it) are dropped, so a replay after a crash stages nothing twice. Changes of tables
    outside `tables` are dropped; the transactions still count for the position.
    """

    def __init__(
        self,
        tables: Collection[TableName],
        describe: Describe,
        *,
        skip_before: Lsn = ZERO,
        budget: Budget = Budget(),
        now_us: Callable[[], int] = lambda: time.time_ns() // 1000,
    ) -> None:
        self.tables = frozenset(tables)
        self.describe = describe
        self.skip_before = skip_before.value
        self.budget = budget
        self.now_us = now_us
        self.relations: dict[int, RelationDescriptor] = {}
        self.captured: set[int] = set()
        self.type_names: dict[int, str] = {}
        self.new_relations: list[RelationDescriptor] = []
        self.chunk: ChangeChunk | None = None  # the open transaction's current chunk
        self.skipping = False
        self.seq = 0

    def feed(self, lsn: int, data: bytes) -> ChangeChunk | None:
        """Take one message; returns a chunk when one is complete (or full)."""
        kind = data[0]
        if kind in _OPS:
            chunk = self.chunk
            if chunk is None:
                raise DecodeError(f"a change outside any transaction at LSN {Lsn(lsn)}")
            if self.skipping:
                return None
            oid, old_kind, old, tail = po.split_row_change(data)
            if oid not in self.captured:
                return None
            new: bytes | None = tail
            if kind == _DELETE:
                old, new = tail, None
            self._append(chunk, lsn, _OPS[kind], oid, old_kind, old, new, len(data))
            return self._split_if_full(chunk)
        msg = po.decode(data, lsn)
        if isinstance(msg, po.Begin):
            self._begin(msg)
        elif isinstance(msg, po.Commit):
            return self._commit(msg)
        elif isinstance(msg, po.Relation):
            self._relation(msg)
        elif isinstance(msg, po.TypeInfo):
            self.type_names[msg.oid] = f"{msg.namespace}.{msg.name}"
        elif isinstance(msg, po.Truncate):
            return self._truncate(lsn, msg)
        elif isinstance(msg, po.LogicalMessage):
            return self._message(lsn, msg, len(data))
        elif not isinstance(msg, po.Origin):
            raise DecodeError(
                f"unexpected {type(msg).__name__} at LSN {Lsn(lsn)}: streamed transactions "
                "need protocol 2, which this reader does not ask for"
            )
        return None

    @property
    def in_transaction(self) -> bool:
        return self.chunk is not None

    def _begin(self, msg: po.Begin) -> None:
        if self.chunk is not None:
            raise DecodeError(f"BEGIN inside a transaction at commit LSN {msg.final_lsn}")
        self.skipping = msg.final_lsn.value < self.skip_before
        self.seq = 0
        self.chunk = self._new_chunk(msg.xid, msg.final_lsn.value, msg.commit_time_us)

    def _commit(self, msg: po.Commit) -> ChangeChunk | None:
        chunk, self.chunk = self.chunk, None
        if chunk is None:
            raise DecodeError(f"COMMIT without BEGIN at LSN {msg.commit_lsn}")
        if self.skipping:
            return None
        chunk.last, chunk.end_lsn = True, msg.end_lsn.value
        return chunk

    def _new_chunk(self, xid: int, commit_lsn: int, commit_time_us: int) -> ChangeChunk:
        chunk = ChangeChunk(xid, commit_lsn, commit_time_us, first_seq=self.seq)
        chunk.relations, self.new_relations = self.new_relations, []
        return chunk

    def _append(  # noqa: PLR0917 - once per change: positional arguments are the cheapest
        self, chunk: ChangeChunk, lsn: int, op: str, oid: int | None, old_kind: str | None,
        old: bytes | None, new: bytes | None, size: int,
        prefix: str | None = None, content: bytes | None = None, options: int | None = None,
    ) -> None:  # fmt: skip
        chunk.lsn.append(lsn)
        chunk.op.append(op)
        chunk.relation_oid.append(oid)
        chunk.relation_version.append(None if oid is None else self.relations[oid].version)
        chunk.old_kind.append(old_kind)
        chunk.old_tuple.append(old)
        chunk.new_tuple.append(new)
        chunk.message_prefix.append(prefix)
        chunk.message_content.append(content)
        chunk.truncate_options.append(options)
        chunk.nbytes += size
        self.seq += 1

    def _split_if_full(self, chunk: ChangeChunk) -> ChangeChunk | None:
        """Hand over a full chunk; the transaction goes on in a new one."""
        if len(chunk) < self.budget.changes and chunk.nbytes < self.budget.nbytes:
            return None
        self.chunk = self._new_chunk(chunk.xid, chunk.commit_lsn, chunk.commit_time_us)
        return chunk

    def _relation(self, msg: po.Relation) -> None:
        name = TableName(msg.namespace or "pg_catalog", msg.name)
        if name not in self.tables:
            self.captured.discard(msg.oid)
            return
        previous = self.relations.get(msg.oid)
        described = self.describe(msg, self.type_names)
        version = 0 if previous is None else previous.version + 1
        descriptor = RelationDescriptor(
            described.oid, version, described.schema, described.table,
            described.replica_identity, described.columns, described.primary_key,
        )  # fmt: skip
        self.relations[msg.oid] = descriptor
        self.captured.add(msg.oid)
        if self.chunk is not None and not self.skipping:
            self.chunk.relations.append(descriptor)
        else:
            self.new_relations.append(descriptor)

    def _truncate(self, lsn: int, msg: po.Truncate) -> ChangeChunk | None:
        chunk = self.chunk
        if chunk is None or self.skipping:
            return None
        options = int(msg.cascade) | int(msg.restart_identity) << 1
        for oid in msg.relation_oids:
            if oid in self.captured:
                op = ChangeOp.TRUNCATE.value
                self._append(chunk, lsn, op, oid, None, None, None, 16, options=options)
        return self._split_if_full(chunk)

    def _message(self, lsn: int, msg: po.LogicalMessage, size: int) -> ChangeChunk | None:
        op = ChangeOp.MESSAGE.value
        if msg.transactional:
            chunk = self.chunk
            if chunk is None or self.skipping:
                return None
            self._append(chunk, lsn, op, None, None, None, None, size, msg.prefix, msg.content)
            return self._split_if_full(chunk)
        if self.chunk is not None or msg.lsn.value <= self.skip_before:
            return None  # a lone message never arrives inside a transaction; or already staged
        seq, self.seq = self.seq, 0
        lone = self._new_chunk(0, msg.lsn.value, self.now_us())
        self._append(lone, lsn, op, None, None, None, None, size, msg.prefix, msg.content)
        self.seq = seq
        lone.last, lone.end_lsn = True, msg.lsn.value
        return lone
