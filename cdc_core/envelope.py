"""The bronze envelope: Debezium-shaped events, and the pure decoder from staged change rows.

Values are JSON text: `before`, `after` and `key` map column names to PostgreSQL's own text
output of each value (NULL as JSON null). That text is exact for every type, including values
no Spark type can hold (numeric NaN, BC dates, 'infinity'), readable by any Delta client, and
independent of Spark; silver types it per the type mapping. An unchanged TOASTed value was not
sent by the server: `after` carries Debezium's placeholder, as the text of a value of the
column's type (`cdc_core.unavailable`), and `unchanged` names the columns.
A primary-key change becomes Debezium's pair of events: `d` for the old key, `c` for the new
one, with `__debezium.newkey` / `__debezium.oldkey` headers.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_core import __version__
from cdc_core.events import ColumnDescriptor, RelationDescriptor
from cdc_core.pg import pgoutput as po
from cdc_core.unavailable import DEFAULT, Placeholder

UNAVAILABLE = DEFAULT  # Debezium's default unavailable.value.placeholder
DEFAULT_PLACEHOLDER = Placeholder()

MESSAGES_TABLE = "_messages"  # source_table of logical decoding messages (no schema or table)

SOURCE = T.StructType(
    [
        T.StructField("version", T.StringType()),
        T.StructField("connector", T.StringType()),
        T.StructField("name", T.StringType()),
        T.StructField("ts_ms", T.LongType()),
        T.StructField("ts_us", T.LongType()),
        T.StructField("ts_ns", T.LongType()),
        T.StructField("snapshot", T.StringType()),
        T.StructField("db", T.StringType()),
        T.StructField("sequence", T.StringType()),
        T.StructField("schema", T.StringType()),
        T.StructField("table", T.StringType()),
        T.StructField("txId", T.LongType()),
        T.StructField("lsn", T.LongType()),
        T.StructField("xmin", T.LongType()),
    ]
)
TRANSACTION = T.StructType(
    [
        T.StructField("id", T.StringType()),
        T.StructField("total_order", T.LongType()),
        T.StructField("data_collection_order", T.LongType()),
    ]
)
MESSAGE = T.StructType(
    [T.StructField("prefix", T.StringType()), T.StructField("content", T.BinaryType())]
)
READ_VIEW = T.StructType(  # the MVCC snapshot a snapshot read saw: 32-bit xids, as pgoutput sends
    [
        T.StructField("xmin", T.LongType()),
        T.StructField("xmax", T.LongType()),
        T.StructField("xip", T.ArrayType(T.LongType())),
        # where the changes it did not see begin in the stream (`snapshot_window.ReadView`)
        T.StructField("unseen_from", T.LongType()),
    ]
)
BRONZE = T.StructType(
    [
        T.StructField("op", T.StringType()),
        T.StructField("key", T.StringType()),
        T.StructField("before", T.StringType()),
        T.StructField("after", T.StringType()),
        T.StructField("unchanged", T.ArrayType(T.StringType())),
        T.StructField("source", SOURCE),
        T.StructField("ts_ms", T.LongType()),
        T.StructField("ts_us", T.LongType()),
        T.StructField("ts_ns", T.LongType()),
        T.StructField("transaction", TRANSACTION),
        T.StructField("message", MESSAGE),
        T.StructField("headers", T.MapType(T.StringType(), T.StringType())),
        # the product's own columns: order, partition, lineage
        T.StructField("commit_lsn", T.LongType()),
        T.StructField("seq", T.LongType()),
        T.StructField("source_table", T.StringType()),
        T.StructField("staged_file", T.StringType()),  # or the snapshot group that read the row
        T.StructField("read_view", READ_VIEW),  # snapshot rows only
    ]
)
ORDER_COLUMNS = ("commit_lsn", "seq")  # the total order of changes: (commit LSN, position)


def _arrow(t: T.DataType) -> pa.DataType:
    if isinstance(t, T.StructType):
        return pa.struct([pa.field(f.name, _arrow(f.dataType)) for f in t.fields])
    if isinstance(t, T.ArrayType):
        return pa.list_(_arrow(t.elementType))
    if isinstance(t, T.MapType):
        return pa.map_(_arrow(t.keyType), _arrow(t.valueType))
    simple: dict[type[T.DataType], pa.DataType] = {
        T.StringType: pa.string(), T.LongType: pa.int64(), T.BinaryType: pa.binary(),
    }  # fmt: skip
    return simple[type(t)]


ARROW = pa.schema([pa.field(f.name, _arrow(f.dataType)) for f in BRONZE.fields])


def conformed(schema: T.StructType, values: Mapping[str, Column]) -> list[Column]:
    """`schema`'s fields as columns, in its order and of its types: those in `values`, the rest
    null. Rows built this way keep bronze's shape whatever fields it gains."""
    return [
        (values[f.name] if f.name in values else F.lit(None)).cast(f.dataType).alias(f.name)
        for f in schema.fields
    ]


@dataclass(frozen=True)
class StagedContext:
    """What one staged file's rows need besides themselves: its footer."""

    staged_file: str
    relations: Mapping[tuple[int, int], RelationDescriptor]
    database: str
    pipeline: str
    staged_at_us: int
    first_lsn: int = 0  # the file's first commit LSN: when its table shapes were first seen


def _json(obj: Mapping[str, object] | None) -> str | None:
    return None if obj is None else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


class _Rows:
    """Envelope columns being built, as lists; events whose op is in `skipped` are dropped."""

    def __init__(self, skipped: Collection[str] = (), skip_unchanged: bool = False) -> None:
        self.columns: dict[str, list[object]] = {f.name: [] for f in BRONZE.fields}
        self.skipped = skipped
        self.skip_unchanged = skip_unchanged

    def add(self, **values: object) -> None:
        if values["op"] in self.skipped:  # per event, as Debezium: each half of a key change
            return
        if self._unchanged(values):
            return
        for name, column in self.columns.items():
            column.append(values.get(name))

    def _unchanged(self, values: Mapping[str, object]) -> bool:
        """An update whose old row's JSON is its new row's (columns in the same order): the
        same values in every kept column (skip.messages.without.change)."""
        before = values.get("before")
        return (
            self.skip_unchanged and values["op"] == "u" and before is not None
            and before == values.get("after")
        )  # fmt: skip

    def batch(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [pa.array(self.columns[f.name], f.type) for f in ARROW], schema=ARROW
        )


def _texts(
    raw: bytes, columns: Sequence[ColumnDescriptor], placeholder: Placeholder
) -> tuple[dict[str, str | None], list[str]]:
    values: dict[str, str | None] = {}
    unchanged: list[str] = []
    for column, value in zip(columns, po.tuple_values(raw), strict=True):
        if value is po.UNCHANGED:
            values[column.name] = placeholder.for_column(column)
            unchanged.append(column.name)
        else:
            values[column.name] = None if value is None else bytes(value).decode()  # type: ignore[call-overload]
    return values, unchanged


def _key(row: Mapping[str, str | None] | None, key: Sequence[str]) -> dict[str, str | None] | None:
    if row is None or not key or any(k not in row for k in key):
        return None
    return {k: row[k] for k in key}


def envelopes(
    rows: pa.RecordBatch, context: Mapping[str, StagedContext],
    placeholder: Placeholder = DEFAULT_PLACEHOLDER, skipped: Collection[str] = (),
    skip_unchanged: bool = False,
) -> pa.RecordBatch:  # fmt: skip
    """Staged change rows (with a `_file` column naming their staged file) -> envelope rows;
    `placeholder` stands in `after` for unchanged TOASTed values (`unchanged` names them).
    Events whose op is in `skipped` (skipped.operations) are left out, and with
    `skip_unchanged` (skip.messages.without.change) so are updates whose old row (REPLICA
    IDENTITY FULL) equals the new one."""
    out = _Rows(skipped, skip_unchanged)
    for row in rows.to_pylist():
        ctx = context[row["_file"]]
        common = _common(row, ctx)
        op = row["op"]
        if op == "m":
            _message(out, row, common)
            continue
        rel = ctx.relations[(row["relation_oid"], row["relation_version"])]
        source = dict(common["source"], schema=rel.schema, table=rel.table)  # type: ignore[call-overload]
        common = dict(common, source=source, source_table=f"{rel.schema}.{rel.table}")
        if op == "t":
            out.add(op="t", **common)
        else:
            _change(out, op, bytes(row["message"]), rel, common, placeholder=placeholder)
    return out.batch()


def _common(row: Mapping[str, object], ctx: StagedContext) -> dict[str, object]:
    commit_us = int(row["commit_time_us"])  # type: ignore[call-overload]
    lsn = int(row["lsn"])  # type: ignore[call-overload]
    xid = int(row["xid"])  # type: ignore[call-overload]
    source = {
        "version": __version__, "connector": "postgresql", "name": ctx.pipeline,
        "ts_ms": commit_us // 1000, "ts_us": commit_us, "ts_ns": commit_us * 1000,
        "snapshot": "false", "db": ctx.database,
        "sequence": json.dumps([str(row["commit_lsn"]), str(lsn)], separators=(",", ":")),
        "schema": "", "table": "", "txId": xid or None, "lsn": lsn, "xmin": None,
    }  # fmt: skip
    staged = ctx.staged_at_us
    return {
        "source": source, "ts_ms": staged // 1000, "ts_us": staged, "ts_ns": staged * 1000,
        "commit_lsn": row["commit_lsn"], "seq": row["seq"], "staged_file": ctx.staged_file,
        "source_table": MESSAGES_TABLE,
    }  # fmt: skip


def _message(out: _Rows, row: Mapping[str, object], common: Mapping[str, object]) -> None:
    raw = row["message"]
    assert isinstance(raw, bytes)
    msg = po.decode(raw)
    assert isinstance(msg, po.LogicalMessage)
    out.add(op="m", key=_json({"prefix": msg.prefix}),
            message={"prefix": msg.prefix, "content": msg.content}, **common)  # fmt: skip


def _change(
    out: _Rows, op: str, message: bytes, rel: RelationDescriptor, common: Mapping[str, object],
    *, placeholder: Placeholder,
) -> None:  # fmt: skip
    columns = rel.columns
    _, old_kind, old_raw, last = po.split_row_change(message)
    tail: bytes | None = last
    if op == "d":
        old_raw, tail = last, None
    after, unchanged = _texts(tail, columns, placeholder) if tail is not None else (None, [])
    before: dict[str, str | None] | None = None
    if old_raw is not None:
        before, _ = _texts(old_raw, columns, placeholder)
        if old_kind == "K":  # an old key: only the identity columns were sent
            identity = {c.name for c in rel.columns if c.in_identity}
            before = {k: v for k, v in before.items() if k in identity}
            if after is not None and unchanged:  # a key column stored out of line and not
                kept = [name for name in unchanged if name in before]  # changed: the server
                for name in kept:  # sends the old key (PostgreSQL 15), which holds its value
                    after[name] = before[name]
                unchanged = [name for name in unchanged if name not in before]
        elif after is not None and unchanged:  # an old row (FULL) holds what was not resent
            for name in unchanged:
                after[name] = before[name]
            unchanged = []
    key_after, key_before = _key(after, rel.primary_key), _key(before, rel.primary_key)
    if op == "u" and key_before is not None and key_after is not None and key_before != key_after:
        old, new = _json(key_before), _json(key_after)  # a primary-key change: Debezium's d + c
        out.add(op="d", key=old, before=_json(before), headers={"__debezium.newkey": new}, **common)
        out.add(op="c", key=new, after=_json(after), unchanged=unchanged,
                headers={"__debezium.oldkey": old}, **common)  # fmt: skip
        return
    key = key_after if op != "d" else key_before
    out.add(op=op, key=_json(key), before=_json(before), after=_json(after),
            unchanged=unchanged, **common)  # fmt: skip


def decode_partition(
    batches: Iterator[pa.RecordBatch], context: Mapping[str, StagedContext],
    placeholder: Placeholder = DEFAULT_PLACEHOLDER, skipped: Collection[str] = (),
    skip_unchanged: bool = False,
) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """The `mapInArrow` function of the bronze job."""
    for batch in batches:
        yield envelopes(batch, context, placeholder, skipped, skip_unchanged)
