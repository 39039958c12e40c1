"""The mapping itself: a catalog column type and the modes -> a silver type and its converter."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

from cdc_core.pgtypes import containers, scalars, temporal
from cdc_core.pgtypes.schema import (
    BINARY,
    BOOLEAN,
    DATE,
    DEFAULT_MODES,
    DOUBLE,
    FLOAT,
    INT,
    LONG,
    POINT,
    SHORT,
    STRING,
    STRING_MAP,
    TIMESTAMP,
    TIMESTAMP_NTZ,
    ColumnType,
    DecimalMode,
    SilverType,
    TimePrecisionMode,
    TypeModes,
    array_of,
    decimal_type,
)

Converter = Callable[[str], object]
_Mapped = tuple[SilverType, Converter]

_AS_TEXT: _Mapped = (STRING, scalars.identity)

# Base types whose mapping no mode changes. Everything absent here and not handled in
# `_base` (uuid, json, inet, tsvector, line, bit(n), citext, ...) is kept as its exact text.
_FIXED: dict[str, _Mapped] = {
    "bool": (BOOLEAN, scalars.boolean),
    "int2": (SHORT, int),
    "int4": (INT, int),
    "int8": (LONG, int),
    "oid": (LONG, int),
    "xid": (LONG, int),
    "cid": (LONG, int),
    "xid8": (decimal_type(20, 0), Decimal),
    "float4": (FLOAT, scalars.float4),
    "float8": (DOUBLE, float),
    "date": (DATE, temporal.date_days),
    "timestamp": (TIMESTAMP_NTZ, temporal.timestamp_ntz),
    "timestamptz": (TIMESTAMP, temporal.timestamptz),
    "point": (POINT, scalars.point),
}
# Base types `_mapped` handles by name, and those kept as text on purpose: the built-in ones
# (each domain over them too) and the extensions' types the mapping documents.
_HANDLED = frozenset({"numeric", "money", "time", "interval", "bytea", "hstore", "bit"})
_TEXT = frozenset({
    "text", "varchar", "bpchar", "name", "char", "citext", "uuid", "json", "jsonb", "jsonpath",
    "xml", "inet", "cidr", "macaddr", "macaddr8", "tsvector", "tsquery", "pg_lsn", "varbit",
    "line", "lseg", "box", "path", "polygon", "circle", "ltree", "timetz", "txid_snapshot",
    "pg_snapshot", "regclass", "regtype", "regproc", "regprocedure", "regoper", "regoperator",
    "regconfig", "regdictionary", "regnamespace", "regrole", "regcollation", "tid", "aclitem",
    "int2vector", "oidvector", "refcursor",
})  # fmt: skip
FIRST_NORMAL_OID = 16384
"""Types with lower OIDs are built in (PostgreSQL's FirstNormalObjectId); extensions' are not."""


def is_unknown(t: ColumnType, type_oid: int) -> bool:
    """Whether a column of type `t` (declared as `type_oid`: the type itself, its domain or its
    array) has a base type no one taught the mapping: an extension's, kept as its exact text,
    which a user may want to know."""
    known = t.kind != "b" or t.name in _FIXED or t.name in _HANDLED or t.name in _TEXT
    return not known and type_oid >= FIRST_NORMAL_OID


def silver_type(t: ColumnType, modes: TypeModes = DEFAULT_MODES) -> SilverType:
    """The silver (Spark) type of a column of type `t`."""
    element, _ = _mapped(t, modes)
    return array_of(element) if t.array else element


def converter(t: ColumnType, modes: TypeModes = DEFAULT_MODES) -> Converter:
    """Text -> Python value for `silver_type(t, modes)`; built once per column.

    Raises Unrepresentable for values the silver type cannot hold exactly, and ValueError
    for text that is not PostgreSQL's output of the type.
    """
    _, convert = _mapped(t, modes)
    if not t.array:
        return convert
    # box is the one built-in type whose array delimiter (pg_type.typdelim) is not a comma.
    return containers.one_dimensional(convert, ";" if t.name == "box" else ",")


def _mapped(t: ColumnType, modes: TypeModes) -> _Mapped:
    # Only base types are looked up by name: an enum, composite or domain may be called
    # `int4` in some schema; enums, composites, ranges and multiranges are kept as text.
    if t.kind != "b":
        return _AS_TEXT
    fixed = _FIXED.get(t.name)
    if fixed is not None:
        return fixed
    if t.name == "numeric":
        return _numeric(t.modifier, modes.decimal)
    if t.name == "money":
        return _money(modes.decimal, modes.money_fraction_digits)
    if t.name == "time":
        return _time(t.modifier, modes.time_precision)
    if t.name == "interval":
        return _AS_TEXT if modes.interval == "string" else (LONG, temporal.interval_us)
    if t.name == "bytea":
        return (BINARY if modes.binary == "bytes" else STRING), scalars.BYTEA[modes.binary]
    if t.name == "hstore":
        if modes.hstore == "json":
            return STRING, containers.hstore_json
        return STRING_MAP, containers.parse_hstore
    if t.name == "bit" and t.modifier == 1:
        return BOOLEAN, scalars.bit1
    return _AS_TEXT


def _numeric(modifier: int, mode: DecimalMode) -> _Mapped:
    if mode == "double":
        return DOUBLE, float
    typmod = scalars.numeric_typmod(modifier)
    if mode == "string" or typmod is None:
        return _AS_TEXT
    precision, scale = scalars.decimal_shape(*typmod)
    if precision > scalars.MAX_DECIMAL_PRECISION:
        return _AS_TEXT
    return decimal_type(precision, scale), scalars.numeric_decimal(precision, scale)


def _money(mode: DecimalMode, digits: int) -> _Mapped:
    if mode == "double":
        return DOUBLE, scalars.money_double
    if mode == "string":
        return STRING, scalars.money_string
    return decimal_type(scalars.MONEY_INTEGER_DIGITS + digits, digits), scalars.money_scaled(digits)


def _time(modifier: int, mode: TimePrecisionMode) -> _Mapped:
    if mode == "isostring":
        return _AS_TEXT
    if mode == "connect" or (mode == "adaptive" and 0 <= modifier <= 3):
        return INT, temporal.time_ms
    if mode == "nanoseconds":
        return LONG, temporal.time_ns
    return LONG, temporal.time_us
