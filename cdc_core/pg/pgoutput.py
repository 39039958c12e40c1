"""Pure pgoutput decoder: one logical replication message, `bytes -> frozen dataclass`. No I/O.

Protocol versions 1 and 2 (streamed transactions) as documented in PostgreSQL's "Logical
Replication Message Formats". Tuple data keeps its exact bytes (`TupleData.raw`) and decodes
columns on demand, so staging can pass values through losslessly without touching each one.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from cdc_core.errors import DecodeError
from cdc_core.lsn import Lsn

PG_EPOCH_OFFSET_US = 946_684_800_000_000  # 2000-01-01 minus 1970-01-01, in microseconds

_U8 = struct.Struct(">B")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")


class MessageType(Enum):
    """The first byte of a pgoutput message."""

    BEGIN = b"B"
    COMMIT = b"C"
    ORIGIN = b"O"
    RELATION = b"R"
    TYPE = b"Y"
    INSERT = b"I"
    UPDATE = b"U"
    DELETE = b"D"
    TRUNCATE = b"T"
    MESSAGE = b"M"
    STREAM_START = b"S"
    STREAM_STOP = b"E"
    STREAM_COMMIT = b"c"
    STREAM_ABORT = b"A"


class ColumnKind(Enum):
    """How one column of a tuple is sent."""

    NULL = b"n"
    UNCHANGED_TOAST = b"u"
    TEXT = b"t"
    BINARY = b"b"


class ReplicaIdentity(str, Enum):
    """`pg_class.relreplident`: which old values an UPDATE or DELETE carries in the WAL."""

    DEFAULT = "d"  # the primary key, if there is one
    NOTHING = "n"
    FULL = "f"  # the whole old row
    INDEX = "i"  # the columns of one unique index


@dataclass(frozen=True, slots=True)
class TupleColumn:
    """One column value: `data` is the text or binary form, None for NULL or unchanged TOAST."""

    kind: ColumnKind
    data: bytes | None


@dataclass(frozen=True, slots=True)
class TupleData:
    """A row as sent: the exact TupleData bytes; `columns()` decodes them."""

    raw: bytes

    def columns(self) -> tuple[TupleColumn, ...]:
        return _decode_tuple(self.raw)


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: Lsn  # the commit LSN of the transaction
    commit_time_us: int  # Unix epoch microseconds
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time_us: int


@dataclass(frozen=True, slots=True)
class Origin:
    origin_lsn: Lsn
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    name: str
    type_oid: int
    type_modifier: int
    is_key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    xid: int | None
    oid: int
    namespace: str
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class TypeInfo:
    xid: int | None
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    xid: int | None
    relation_oid: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    """`old_kind` is b"K" (old key: the key changed) or b"O" (old row: REPLICA IDENTITY FULL)."""

    xid: int | None
    relation_oid: int
    old_kind: bytes | None
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    xid: int | None
    relation_oid: int
    old_kind: bytes
    old: TupleData


@dataclass(frozen=True, slots=True)
class Truncate:
    xid: int | None
    relation_oids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """`pg_logical_emit_message`; `xid` is set only inside a streamed transaction."""

    xid: int | None
    transactional: bool
    lsn: Lsn
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time_us: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    xid: int
    subxid: int


Message = (
    Begin | Commit | Origin | Relation | TypeInfo | Insert | Update | Delete | Truncate
    | LogicalMessage | StreamStart | StreamStop | StreamCommit | StreamAbort
)  # fmt: skip


def decode(data: bytes, lsn: Lsn | int = 0, *, in_stream: bool = False) -> Message:
    """Decode one message. `in_stream`: inside Stream Start/Stop, where changes carry an xid.

    `lsn` is only used to name the position in a `DecodeError`.
    """
    try:
        kind = MessageType(data[:1])
    except ValueError:
        where = str(lsn if isinstance(lsn, Lsn) else Lsn(lsn))
        byte = data[:1].hex() or "nothing"
        raise DecodeError(f"unknown pgoutput message type 0x{byte} at LSN {where}") from None
    try:
        return _DECODERS[kind](data, in_stream)
    except (struct.error, IndexError, ValueError, UnicodeDecodeError) as e:
        where = str(lsn if isinstance(lsn, Lsn) else Lsn(lsn))
        raise DecodeError(f"malformed {kind.name} message at LSN {where}: {e}") from e


def split_row_change(data: bytes) -> tuple[int, str | None, bytes | None, bytes]:
    """The hot path for INSERT/UPDATE/DELETE outside streamed transactions, without objects.

    Returns (relation oid, old kind 'K'/'O' or None, old tuple bytes, new-or-old tuple bytes):
    for a DELETE the last item is the old tuple. Equivalent to `decode` (tested against it).
    """
    (oid,) = _U32.unpack_from(data, 1)
    kind = data[0]
    marker = data[5]
    if kind == 0x49:  # 'I': the rest of the message is the new tuple
        if marker != 0x4E:
            raise DecodeError("INSERT without a new tuple")
        return oid, None, None, data[6:]
    if kind == 0x44:  # 'D': the rest is the old key or row
        if marker not in (0x4B, 0x4F):
            raise DecodeError(f"DELETE with old tuple marker {bytes([marker])!r}")
        return oid, chr(marker), None, data[6:]
    if marker == 0x4E:  # 'U' with only a new tuple
        return oid, None, None, data[6:]
    if marker not in (0x4B, 0x4F):
        raise DecodeError(f"UPDATE with tuple marker {bytes([marker])!r}")
    end = _tuple_end(data, 6)
    if data[end] != 0x4E:
        raise DecodeError("UPDATE without a new tuple")
    return oid, chr(marker), data[6:end], data[end + 1 :]


def _cstring(data: bytes, pos: int) -> tuple[str, int]:
    end = data.index(b"\0", pos)
    return data[pos:end].decode("utf-8"), end + 1


def _xid(data: bytes, in_stream: bool) -> tuple[int | None, int]:
    return (_U32.unpack_from(data, 1)[0], 5) if in_stream else (None, 1)


def _tuple_end(data: bytes, pos: int) -> int:
    """Offset just past the TupleData starting at `pos` (walks lengths, copies nothing)."""
    (ncols,) = _I16.unpack_from(data, pos)
    pos += 2
    for _ in range(ncols):
        kind = data[pos]
        pos += 1
        if kind in (0x74, 0x62):  # 't', 'b'
            (length,) = _I32.unpack_from(data, pos)
            pos += 4 + length
        elif kind not in (0x6E, 0x75):  # 'n', 'u'
            raise ValueError(f"unknown tuple column kind {bytes([kind])!r}")
    if pos > len(data):
        raise ValueError("tuple data runs past the end of the message")
    return pos


UNCHANGED = object()  # an unchanged TOASTed value: the server did not send it


def tuple_values(raw: bytes) -> list[bytes | object | None]:
    """The values of a tuple, fast: bytes (text or binary form), None for NULL, `UNCHANGED`."""
    (ncols,) = _I16.unpack_from(raw, 0)
    pos = 2
    out: list[bytes | object | None] = []
    append, unpack = out.append, _I32.unpack_from
    for _ in range(ncols):
        kind = raw[pos]
        if kind in (0x74, 0x62):  # 't', 'b'
            (length,) = unpack(raw, pos + 1)
            append(raw[pos + 5 : pos + 5 + length])
            pos += 5 + length
        elif kind == 0x6E:  # 'n'
            append(None)
            pos += 1
        elif kind == 0x75:  # 'u'
            append(UNCHANGED)
            pos += 1
        else:
            raise DecodeError(f"unknown tuple column kind {bytes([kind])!r}")
    return out


def _decode_tuple(raw: bytes) -> tuple[TupleColumn, ...]:
    (ncols,) = _I16.unpack_from(raw, 0)
    pos, out = 2, []
    for _ in range(ncols):
        kind = ColumnKind(raw[pos : pos + 1])
        pos += 1
        if kind in (ColumnKind.TEXT, ColumnKind.BINARY):
            (length,) = _I32.unpack_from(raw, pos)
            out.append(TupleColumn(kind, raw[pos + 4 : pos + 4 + length]))
            pos += 4 + length
        else:
            out.append(TupleColumn(kind, None))
    return tuple(out)


def _begin(data: bytes, _: bool) -> Begin:
    lsn, ts, xid = struct.unpack_from(">QqI", data, 1)
    return Begin(Lsn(lsn), ts + PG_EPOCH_OFFSET_US, xid)


def _commit(data: bytes, _: bool) -> Commit:
    flags, commit_lsn, end_lsn, ts = struct.unpack_from(">BQQq", data, 1)
    return Commit(flags, Lsn(commit_lsn), Lsn(end_lsn), ts + PG_EPOCH_OFFSET_US)


def _origin(data: bytes, _: bool) -> Origin:
    (lsn,) = _U64.unpack_from(data, 1)
    name, _end = _cstring(data, 9)
    return Origin(Lsn(lsn), name)


def _relation(data: bytes, in_stream: bool) -> Relation:
    xid, pos = _xid(data, in_stream)
    (oid,) = _U32.unpack_from(data, pos)
    namespace, pos = _cstring(data, pos + 4)
    name, pos = _cstring(data, pos)
    identity = ReplicaIdentity(chr(data[pos]))
    (ncols,) = _I16.unpack_from(data, pos + 1)
    pos += 3
    columns = []
    for _ in range(ncols):
        flags: int = data[pos]
        col, pos = _cstring(data, pos + 1)
        type_oid, typmod = struct.unpack_from(">Ii", data, pos)
        pos += 8
        columns.append(RelationColumn(col, type_oid, typmod, bool(flags & 1)))
    return Relation(xid, oid, namespace, name, identity, tuple(columns))


def _type(data: bytes, in_stream: bool) -> TypeInfo:
    xid, pos = _xid(data, in_stream)
    (oid,) = _U32.unpack_from(data, pos)
    namespace, pos = _cstring(data, pos + 4)
    name, _end = _cstring(data, pos)
    return TypeInfo(xid, oid, namespace, name)


def _insert(data: bytes, in_stream: bool) -> Insert:
    xid, pos = _xid(data, in_stream)
    (oid,) = _U32.unpack_from(data, pos)
    if data[pos + 4 : pos + 5] != b"N":
        raise ValueError("INSERT without a new tuple")
    end = _tuple_end(data, pos + 5)
    return Insert(xid, oid, TupleData(data[pos + 5 : end]))


def _update(data: bytes, in_stream: bool) -> Update:
    xid, pos = _xid(data, in_stream)
    (oid,) = _U32.unpack_from(data, pos)
    pos += 4
    old_kind, old = None, None
    if data[pos : pos + 1] in (b"K", b"O"):
        old_kind = data[pos : pos + 1]
        end = _tuple_end(data, pos + 1)
        old = TupleData(data[pos + 1 : end])
        pos = end
    if data[pos : pos + 1] != b"N":
        raise ValueError("UPDATE without a new tuple")
    end = _tuple_end(data, pos + 1)
    return Update(xid, oid, old_kind, old, TupleData(data[pos + 1 : end]))


def _delete(data: bytes, in_stream: bool) -> Delete:
    xid, pos = _xid(data, in_stream)
    (oid,) = _U32.unpack_from(data, pos)
    old_kind = data[pos + 4 : pos + 5]
    if old_kind not in (b"K", b"O"):
        raise ValueError(f"DELETE with old tuple marker {old_kind!r}")
    end = _tuple_end(data, pos + 5)
    return Delete(xid, oid, old_kind, TupleData(data[pos + 5 : end]))


def _truncate(data: bytes, in_stream: bool) -> Truncate:
    xid, pos = _xid(data, in_stream)
    count, options = struct.unpack_from(">IB", data, pos)
    oids = struct.unpack_from(f">{count}I", data, pos + 5)
    return Truncate(xid, tuple(oids), bool(options & 1), bool(options & 2))


def _message(data: bytes, in_stream: bool) -> LogicalMessage:
    xid, pos = _xid(data, in_stream)
    flags, lsn = struct.unpack_from(">BQ", data, pos)
    prefix, pos = _cstring(data, pos + 9)
    (length,) = _I32.unpack_from(data, pos)
    content = data[pos + 4 : pos + 4 + length]
    if len(content) != length:
        raise ValueError("message content shorter than its length")
    return LogicalMessage(xid, bool(flags & 1), Lsn(lsn), prefix, content)


def _stream_start(data: bytes, _: bool) -> StreamStart:
    xid, first = struct.unpack_from(">IB", data, 1)
    return StreamStart(xid, first == 1)


def _stream_stop(data: bytes, _: bool) -> StreamStop:
    return StreamStop()


def _stream_commit(data: bytes, _: bool) -> StreamCommit:
    xid, flags, commit_lsn, end_lsn, ts = struct.unpack_from(">IBQQq", data, 1)
    return StreamCommit(xid, flags, Lsn(commit_lsn), Lsn(end_lsn), ts + PG_EPOCH_OFFSET_US)


def _stream_abort(data: bytes, _: bool) -> StreamAbort:
    xid, subxid = struct.unpack_from(">II", data, 1)
    return StreamAbort(xid, subxid)


_DECODERS: dict[MessageType, Callable[[bytes, bool], Message]] = {
    MessageType.BEGIN: _begin,
    MessageType.COMMIT: _commit,
    MessageType.ORIGIN: _origin,
    MessageType.RELATION: _relation,
    MessageType.TYPE: _type,
    MessageType.INSERT: _insert,
    MessageType.UPDATE: _update,
    MessageType.DELETE: _delete,
    MessageType.TRUNCATE: _truncate,
    MessageType.MESSAGE: _message,
    MessageType.STREAM_START: _stream_start,
    MessageType.STREAM_STOP: _stream_stop,
    MessageType.STREAM_COMMIT: _stream_commit,
    MessageType.STREAM_ABORT: _stream_abort,
}
