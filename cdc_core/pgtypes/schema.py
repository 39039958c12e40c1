"""The values the type mapping works on: a catalog column type in, a silver type out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

DecimalMode = Literal["precise", "double", "string"]
TimePrecisionMode = Literal[
    "adaptive", "adaptive_time_microseconds", "microseconds", "nanoseconds", "isostring", "connect"
]
IntervalMode = Literal["string", "numeric"]
BinaryMode = Literal["bytes", "base64", "base64-url-safe", "hex"]
HstoreMode = Literal["json", "map"]
SilverName = Literal[
    "boolean",
    "short",
    "int",
    "long",
    "float",
    "double",
    "decimal",
    "string",
    "binary",
    "date",
    "timestamp",
    "timestamp_ntz",
    "array",
    "map",
    "struct",
]


class Unrepresentable(ValueError):  # noqa: N818 (the name is the API: a value, not a failure)
    """The value cannot be held exactly by the silver type.

    For example numeric NaN in a decimal, a date before year 1 or 'infinity' in a timestamp,
    an array with a lower bound other than 1. The caller keeps the exact text elsewhere and
    stores NULL. Nothing is ever rounded or truncated silently.
    """


@dataclass(frozen=True)
class ColumnType:
    """A column's type, resolved through domains: what the catalog says."""

    name: str
    """`pg_type.typname` of the resolved type; for arrays, of the element (int4, numeric, ...)."""
    kind: str
    """`pg_type.typtype` of that type: b base, e enum, c composite, r range, m multirange, p."""
    modifier: int
    """The typmod (-1 when none): numeric ((p << 16) | s) + 4, varchar(n) n + 4, time(p) p."""
    array: bool
    """The column is an array of `name`."""


@dataclass(frozen=True)
class TypeModes:
    """Debezium's representation options, with the same names and values."""

    decimal: DecimalMode = "precise"
    """`decimal.handling.mode`."""
    time_precision: TimePrecisionMode = "adaptive"
    """`time.precision.mode`; only `time` columns depend on it (see the mapping)."""
    interval: IntervalMode = "string"
    """`interval.handling.mode`; string (exact ISO 8601) by default, unlike Debezium."""
    binary: BinaryMode = "bytes"
    """`binary.handling.mode`."""
    hstore: HstoreMode = "json"
    """`hstore.handling.mode`."""
    money_fraction_digits: int = 2
    """`money.fraction.digits`: the scale of money in precise mode."""

    def __post_init__(self) -> None:
        hints = {
            "decimal": DecimalMode,
            "time_precision": TimePrecisionMode,
            "interval": IntervalMode,
            "binary": BinaryMode,
            "hstore": HstoreMode,
        }
        for name, hint in hints.items():
            allowed = get_args(hint)
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name}: {value!r} is not one of {', '.join(allowed)}")
        if not 0 <= self.money_fraction_digits <= 21:  # decimal(17 + n, n) within 38 digits
            raise ValueError(f"money_fraction_digits: {self.money_fraction_digits} is not 0..21")


DEFAULT_MODES = TypeModes()


@dataclass(frozen=True)
class SilverType:
    """A Spark-independent description of a silver column type."""

    name: SilverName
    precision: int | None = None
    """Decimal precision (1..38)."""
    scale: int | None = None
    """Decimal scale (0..precision)."""
    element: SilverType | None = None
    """Array element, or map value (map keys are always string)."""
    fields: tuple[tuple[str, SilverType], ...] = ()
    """Struct fields in order."""


BOOLEAN = SilverType("boolean")
SHORT = SilverType("short")
INT = SilverType("int")
LONG = SilverType("long")
FLOAT = SilverType("float")
DOUBLE = SilverType("double")
STRING = SilverType("string")
BINARY = SilverType("binary")
DATE = SilverType("date")
TIMESTAMP = SilverType("timestamp")
TIMESTAMP_NTZ = SilverType("timestamp_ntz")
POINT = SilverType("struct", fields=(("x", DOUBLE), ("y", DOUBLE)))
STRING_MAP = SilverType("map", element=STRING)


def decimal_type(precision: int, scale: int) -> SilverType:
    return SilverType("decimal", precision=precision, scale=scale)


def array_of(element: SilverType) -> SilverType:
    return SilverType("array", element=element)
