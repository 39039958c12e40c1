"""Decoded changes as they travel from the reader to the stager: ops, relations, change chunks.

A transaction reaches the stager as one or more `ChangeChunk`s (columnar, bounded in
size); the chunk that ends it has `last=True` and the commit's end LSN. Chunks of one
transaction are contiguous and transactions arrive in commit order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum

import pyarrow as pa

from cdc_core.pg.pgoutput import ReplicaIdentity

_COLUMN_TYPES = (pa.int64(), pa.int64(), pa.large_binary())


class ChangeOp(str, Enum):
    """Debezium's `op` codes."""

    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    TRUNCATE = "t"
    MESSAGE = "m"
    READ = "r"


@dataclass(frozen=True)
class ColumnDescriptor:
    """A column as a Relation message describes it, with its type resolved in the catalog.

    `base_*` describe the type behind domains, and for arrays the element's type: what the
    silver type mapping needs (`cdc_core.pgtypes.ColumnType`).
    """

    name: str
    type_oid: int
    type_modifier: int
    type_name: str  # format_type(): what users read, e.g. numeric(10,2), public.mood, text[]
    in_identity: bool
    base_type: str = "text"  # pg_type.typname of the resolved (element) type
    base_kind: str = "b"  # its typtype: b base, e enum, c composite, r range, m multirange
    base_modifier: int = -1
    is_array: bool = False


@dataclass(frozen=True)
class RelationDescriptor:
    """What is needed to read a table's tuples without the server: columns, types, key."""

    oid: int
    version: int  # counts Relation messages for this oid within one run
    schema: str
    table: str
    replica_identity: ReplicaIdentity
    columns: tuple[ColumnDescriptor, ...]
    primary_key: tuple[str, ...]  # from the catalog; empty when the table has none

    def keyed(self, key: tuple[str, ...] | None) -> RelationDescriptor:
        """This descriptor with `key` (message.key.columns) in place of the primary key."""
        return self if key is None else dataclasses.replace(self, primary_key=key)

    def to_json(self) -> dict[str, object]:
        return {
            "oid": self.oid,
            "version": self.version,
            "schema": self.schema,
            "table": self.table,
            "replica_identity": self.replica_identity.value,
            "primary_key": list(self.primary_key),
            "columns": [
                [
                    c.name,
                    c.type_oid,
                    c.type_modifier,
                    c.type_name,
                    c.in_identity,
                    c.base_type,
                    c.base_kind,
                    c.base_modifier,
                    c.is_array,
                ]
                for c in self.columns
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> RelationDescriptor:
        columns = tuple(
            ColumnDescriptor(
                str(n), int(o), int(m), str(t), bool(k), str(b), str(bk), int(bm), bool(a)
            )
            for n, o, m, t, k, b, bk, bm, a in data["columns"]  # type: ignore[attr-defined]
        )
        return cls(
            oid=int(data["oid"]),  # type: ignore[call-overload]
            version=int(data["version"]),  # type: ignore[call-overload]
            schema=str(data["schema"]),
            table=str(data["table"]),
            replica_identity=ReplicaIdentity(str(data["replica_identity"])),
            columns=columns,
            primary_key=tuple(str(c) for c in data["primary_key"]),  # type: ignore[attr-defined]
        )


@dataclass
class ChangeChunk:
    """Part of one committed transaction: its changes, in order, as three columns.

    A change is kept as the pgoutput message the server sent (INSERT, UPDATE, DELETE, TRUNCATE
    or a transactional MESSAGE), exact and lossless; decoding its tuples happens after
    staging. `versions` maps each relation OID of the chunk to the version of its Relation
    descriptor (a schema change inside a chunk splits it, so one version per OID holds).
    Changes arrive one at a time (`add`) or as Arrow blocks (`add_block`, the reader's fast
    path); `columns` hands them over as Arrow arrays.
    """

    xid: int
    commit_lsn: int  # the transaction's commit LSN (for a lone message: its own LSN)
    commit_time_us: int
    first_seq: int  # position in the transaction of this chunk's first change
    last: bool = False
    end_lsn: int = 0  # set on the last chunk: just past the commit record
    versions: dict[int, int] = field(default_factory=dict)
    nbytes: int = 0
    relations: list[RelationDescriptor] = field(default_factory=list)  # first seen in this chunk
    filtered: int = 0  # changes the reader dropped on purpose while it was open (not staged)
    _blocks: list[tuple[pa.Array, pa.Array, pa.Array]] = field(default_factory=list, repr=False)
    _lsn: list[int] = field(default_factory=list, repr=False)  # changes added one at a time,
    _oid: list[int | None] = field(default_factory=list, repr=False)  # after the blocks
    _message: list[bytes] = field(default_factory=list, repr=False)
    _count: int = 0

    def __len__(self) -> int:
        return self._count

    def add(self, lsn: int, relation_oid: int | None, message: bytes) -> None:
        """One change after the others."""
        self._lsn.append(lsn)
        self._oid.append(relation_oid)
        self._message.append(message)
        self._count += 1
        self.nbytes += len(message)

    def add_block(
        self, lsn: pa.Array, relation_oid: pa.Array, message: pa.Array, nbytes: int
    ) -> None:
        """Changes after the others: int64, int64 and large_binary arrays of one length, and
        the bytes of their messages."""
        self._seal()
        self._blocks.append((lsn, relation_oid, message))
        self._count += len(lsn)
        self.nbytes += nbytes

    def _seal(self) -> None:
        if self._lsn:
            self._blocks.append((
                pa.array(self._lsn, pa.int64()), pa.array(self._oid, pa.int64()),
                pa.array(self._message, pa.large_binary()),
            ))  # fmt: skip
            self._lsn, self._oid, self._message = [], [], []

    def columns(self) -> tuple[pa.Array, pa.Array, pa.Array]:
        """lsn (int64), relation_oid (int64, null for logical messages), message (large_binary)."""
        self._seal()
        if not self._blocks:
            return tuple(pa.array([], t) for t in _COLUMN_TYPES)
        if len(self._blocks) > 1:
            lsn, oid, message = (pa.concat_arrays([b[i] for b in self._blocks]) for i in range(3))
            self._blocks = [(lsn, oid, message)]
        return self._blocks[0]

    # copies as Python lists, for tests and tools (changes are added with `add`)
    @property
    def lsn(self) -> list[int]:
        return self.columns()[0].to_pylist()  # type: ignore[no-any-return]

    @property
    def relation_oid(self) -> list[int | None]:
        return self.columns()[1].to_pylist()  # type: ignore[no-any-return]

    @property
    def message(self) -> list[bytes]:
        return self.columns()[2].to_pylist()  # type: ignore[no-any-return]
