"""The shape of a silver table: its columns and types across a source table's schema history.

Logical decoding carries no DDL; each new shape of a table arrives as a Relation descriptor.
Silver keeps every column it has ever seen (a dropped column stays, NULL from then on), adds
new ones, widens a type where Delta can widen it in place (int -> bigint, float -> double,
decimal precision up; varchar(n) -> text is the same silver type), and refuses anything else
with an error naming the table, the column, both types and what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import types as T

from cdc_core.errors import TerminalError
from cdc_core.events import RelationDescriptor
from cdc_core.pg.pgoutput import ReplicaIdentity
from cdc_core.pgtypes import ColumnType, SilverType, TypeModes, is_unknown, silver_type
from cdc_core.pgtypes.scalars import numeric_typmod

CDC_COLUMNS = T.StructType(
    [
        T.StructField("_cdc_lsn", T.LongType()),  # commit LSN of the last change applied
        T.StructField("_cdc_seq", T.LongType()),  # its position in that transaction
        T.StructField("_cdc_op", T.StringType()),  # its operation: c u r d
        T.StructField("_cdc_commit_ts", T.TimestampType()),  # its commit time
        T.StructField("_cdc_deleted", T.BooleanType()),  # soft_delete: the row was deleted
        T.StructField("_cdc_raw", T.MapType(T.StringType(), T.StringType())),  # exact text of
        # values the typed column cannot hold (NULL there)
        T.StructField("_cdc_unavailable", T.ArrayType(T.StringType())),  # TOASTed, never seen
    ]
)
MULTISET_COLUMNS = T.StructType(
    [
        T.StructField("_cdc_row_hash", T.StringType()),  # identity of a row without a key
        T.StructField("_cdc_count", T.LongType()),  # how many identical rows the source has
    ]
)

SOURCE_TYPE_KEYS = tuple(f"__debezium.source.column.{k}" for k in ("type", "length", "scale"))
_TEMPORAL = {"time", "timetz", "timestamp", "timestamptz", "interval"}

_WIDER = {("short", "int"), ("short", "long"), ("int", "long"), ("float", "double")}


class SchemaChangeError(TerminalError):
    """A source table changed in a way its silver mirror cannot follow; other tables go on."""


@dataclass(frozen=True)
class SilverColumn:
    name: str
    pg: ColumnType
    silver: SilverType
    type_name: str  # the PostgreSQL type as users read it
    unknown: bool = False  # an extension's type the mapping does not know: kept as text


@dataclass(frozen=True)
class TableShape:
    """What silver needs to know about one source table."""

    schema: str
    table: str
    columns: tuple[SilverColumn, ...]
    key: tuple[str, ...]  # primary key; empty: rows are a multiset identified by content
    identity: ReplicaIdentity
    source_typed: frozenset[str] = frozenset()  # columns whose field metadata has their pg type
    keyed_by: tuple[str, ...] = ()  # the newest primary key any shape had (for errors)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    def spark_schema(self) -> T.StructType:
        fields = [
            T.StructField(c.name, spark_type(c.silver),
                          metadata=source_type(c.pg) if c.name in self.source_typed else None)
            for c in self.columns
        ]  # fmt: skip
        extra = CDC_COLUMNS.fields + (MULTISET_COLUMNS.fields if not self.key else [])
        return T.StructType(fields + list(extra))


def source_type(pg: ColumnType) -> dict[str, str]:
    """Debezium's `__debezium.source.column.{type,length,scale}` for a column's type: the
    upper-cased type name (`_` before an array's element), the length of varchar(n), char(n),
    bit(n), the precision and scale of numeric(p,s), the fractional digits of time types."""
    type_key, length_key, scale_key = SOURCE_TYPE_KEYS
    out = {type_key: (("_" if pg.array else "") + pg.name).upper()}
    m = pg.modifier
    if pg.name in ("varchar", "bpchar") and m >= 4:
        out |= {length_key: str(m - 4), scale_key: "0"}
    elif pg.name in ("bit", "varbit") and m >= 0:
        out |= {length_key: str(m), scale_key: "0"}
    elif pg.name == "numeric" and (ps := numeric_typmod(m)) is not None:
        out |= {length_key: str(ps[0]), scale_key: str(ps[1])}
    elif pg.name in _TEMPORAL and m >= 0 and (p := m & 0xFFFF) != 0xFFFF:  # interval: low bits
        out |= {scale_key: str(p)}
    return out


def column_type(c: object) -> ColumnType:
    return ColumnType(c.base_type, c.base_kind, c.base_modifier, c.is_array)  # type: ignore[attr-defined]


# The representation options (by their keys) a base type's silver values depend on
# (`pgtypes.mapping`): changed under a mirror, its old and new values would sit side by side.
_MODES_OF: dict[str, tuple[tuple[str, str], ...]] = {
    "numeric": (("decimal.handling.mode", "decimal"),),
    "money": (
        ("decimal.handling.mode", "decimal"),
        ("money.fraction.digits", "money_fraction_digits"),
    ),
    "time": (("time.precision.mode", "time_precision"),),
    "interval": (("interval.handling.mode", "interval"),),
    "bytea": (("binary.handling.mode", "binary"),),
    "hstore": (("hstore.handling.mode", "hstore"),),
}  # fmt: skip


def modes_used(shape: TableShape, modes: TypeModes) -> dict[str, object]:
    """The representation options the mirror's values depend on, by key, with `modes`' values:
    only those its columns' types use, so an option no column of it uses may change freely."""
    used: dict[str, object] = {}
    for c in shape.columns:
        if c.pg.kind == "b" and not c.unknown:
            for key, attribute in _MODES_OF.get(c.pg.name, ()):
                used[key] = getattr(modes, attribute)
    return used


def table_shape(
    history: Sequence[tuple[int, RelationDescriptor]], modes: TypeModes,
    propagates: Callable[[str, SilverColumn], bool] | None = None, *, since: int | None = None,
) -> TableShape:  # fmt: skip
    """The union of every shape in `history` (oldest first); the newest key and identity win.
    `propagates(schema.table, column)`: whether the column's field metadata has their type.
    `since`: the mirror starts over there (a TRUNCATE or a reset marker, in a staged file that
    starts at `since`): no row of a shape recorded before it is ever applied again, so a later
    shape's column type replaces such a shape's where it cannot widen it (a type changed
    incompatibly, or changed and reverted, before the mirror started over)."""
    if not history:
        raise TerminalError("no schema recorded for this table yet")
    columns: dict[str, SilverColumn] = {}
    seen_at: dict[str, int] = {}  # where each column's type was last recorded
    newest = history[-1][1]
    for lsn, descriptor in history:
        for c in descriptor.columns:
            pg = column_type(c)
            new = SilverColumn(c.name, pg, silver_type(pg, modes), c.type_name,
                               is_unknown(pg, c.type_oid))  # fmt: skip
            old = columns.get(c.name)
            applied = since is None or seen_at.get(c.name, 0) >= since  # its rows may be applied
            changed = old is not None and old.silver != new.silver
            if old is not None and changed and (applied or _follows(old, new)):
                new = _widened(f"{descriptor.schema}.{descriptor.table}", old, new)
            columns[c.name] = new
            seen_at[c.name] = lsn
    qualified = f"{newest.schema}.{newest.table}"
    _one_per_name(qualified, columns, seen_at, since)
    typed = frozenset(c.name for c in columns.values() if propagates and propagates(qualified, c))
    keyed_by = next((d.primary_key for _, d in reversed(history) if d.primary_key), ())
    return TableShape(newest.schema, newest.table, tuple(columns.values()), newest.primary_key,
                      newest.replica_identity, typed, keyed_by)  # fmt: skip


def _one_per_name(
    table: str, columns: dict[str, SilverColumn], seen_at: dict[str, int], since: int | None
) -> None:
    """Spark and Delta match column names without case: two columns of the history whose names
    differ only in case (a column renamed "A" from a) are one silver column. The one last seen
    before the mirror started over is gone from it; else the mirror stops, saying how to go on."""
    folded: dict[str, list[str]] = {}
    for name in columns:
        folded.setdefault(name.lower(), []).append(name)
    for names in folded.values():
        if len(names) < 2:
            continue
        names.sort(key=lambda n: seen_at[n])
        live = [n for n in names if since is None or seen_at[n] >= since] or names[-1:]
        for name in names:
            if name not in live:
                del columns[name]
        if len(live) > 1:
            first, *rest = live
            raise SchemaChangeError(
                f"table {table}: columns {first} and {', '.join(rest)} differ only in case (a "
                "column renamed that way), and Spark and Delta take them for one column. The "
                "mirror stops here; other tables go on. To move on, drop the "
                f"silver table and take a new snapshot of it (`cdc snapshot --table {table}`), "
                "which rebuilds the mirror from that snapshot on"
            )


def _follows(old: SilverColumn, new: SilverColumn) -> bool:
    """Whether the mirror's column can take `new`'s values in place, its rows kept as they are.
    A time(0..3) held as int milliseconds that becomes time(4..6) in long microseconds widens
    in Delta, but the rows already there would stay in milliseconds."""
    time_unit_changes = old.pg.name == new.pg.name == "time" and old.silver.name != new.silver.name
    return widens(old.silver, new.silver) and not time_unit_changes


def _widened(table: str, old: SilverColumn, new: SilverColumn) -> SilverColumn:
    if _follows(old, new):
        return new
    raise SchemaChangeError(
        f"table {table}: column {old.name} changed type from {old.type_name} to "
        f"{new.type_name} ({describe(old.silver)} -> {describe(new.silver)}), which its silver "
        "mirror cannot follow in place. The mirror stops here; other tables go on. To move on, "
        f"drop the silver table and take a new snapshot of it (`cdc snapshot --table {table}`), "
        "which rebuilds the mirror from that snapshot on"
    )


def widens(old: SilverType, new: SilverType) -> bool:
    """Whether Delta's type widening turns `old` into `new` without loss."""
    if (old.name, new.name) in _WIDER:
        return True
    if old.name == new.name == "decimal":
        assert old.precision is not None
        assert old.scale is not None
        assert new.precision is not None
        assert new.scale is not None
        return new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
    return False


def describe(t: SilverType) -> str:
    if t.name == "decimal":
        return f"decimal({t.precision},{t.scale})"
    if t.name == "array":
        assert t.element is not None
        return f"array<{describe(t.element)}>"
    return t.name


def spark_type(t: SilverType) -> T.DataType:
    simple: dict[str, T.DataType] = {
        "boolean": T.BooleanType(), "short": T.ShortType(), "int": T.IntegerType(),
        "long": T.LongType(), "float": T.FloatType(), "double": T.DoubleType(),
        "string": T.StringType(), "binary": T.BinaryType(), "date": T.DateType(),
        "timestamp": T.TimestampType(), "timestamp_ntz": T.TimestampNTZType(),
    }  # fmt: skip
    if t.name in simple:
        return simple[t.name]
    if t.name == "decimal":
        assert t.precision is not None
        assert t.scale is not None
        return T.DecimalType(t.precision, t.scale)
    if t.name == "array":
        assert t.element is not None
        return T.ArrayType(spark_type(t.element))
    if t.name == "map":
        assert t.element is not None
        return T.MapType(T.StringType(), spark_type(t.element))
    return T.StructType([T.StructField(n, spark_type(f)) for n, f in t.fields])


def arrow_type(t: T.DataType) -> pa.DataType:
    """The Arrow type Spark exchanges for `t` (session time zone UTC)."""
    simple: list[tuple[type[T.DataType], pa.DataType]] = [
        (T.BooleanType, pa.bool_()), (T.ShortType, pa.int16()), (T.IntegerType, pa.int32()),
        (T.LongType, pa.int64()), (T.FloatType, pa.float32()), (T.DoubleType, pa.float64()),
        (T.StringType, pa.string()), (T.BinaryType, pa.binary()), (T.DateType, pa.date32()),
        (T.TimestampType, pa.timestamp("us", tz="UTC")), (T.TimestampNTZType, pa.timestamp("us")),
    ]  # fmt: skip
    for spark, arrow in simple:
        if isinstance(t, spark):
            return arrow
    if isinstance(t, T.DecimalType):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, T.ArrayType):
        return pa.list_(arrow_type(t.elementType))
    if isinstance(t, T.MapType):
        return pa.map_(arrow_type(t.keyType), arrow_type(t.valueType))
    if isinstance(t, T.StructType):
        return pa.struct([pa.field(f.name, arrow_type(f.dataType)) for f in t.fields])
    raise TypeError(f"no Arrow type for {t}")
