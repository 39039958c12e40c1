"""The `validate:` section of a pipeline file: value constraints `cdc validate` checks on silver."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from cdc_core.config.loader import FieldError, meta
from cdc_core.identifiers import TableName

CHECKS = ("not_null", "unique", "min", "max", "in_set", "regex")


@dataclass(frozen=True)
class ColumnExpectation:
    """One constraint on a column of a silver mirror, checked by great-expectations."""

    table: TableName = field(
        metadata=meta("a captured table, schema.table", example="public.orders")
    )
    column: str = field(metadata=meta("a column of its silver mirror", example="status"))
    not_null: bool = field(default=False, metadata=meta("no value is NULL"))
    unique: bool = field(default=False, metadata=meta("no value appears twice"))
    min: str | None = field(
        default=None,
        metadata=meta("every value is at least this (a number, or an ISO date or timestamp in "
                      "quotes); with max: between"),
    )  # fmt: skip
    max: str | None = field(default=None, metadata=meta("every value is at most this"))
    in_set: tuple[str, ...] = field(
        default=(), metadata=meta("every value is one of these", example="[new, paid, shipped]")
    )
    regex: str | None = field(
        default=None,
        metadata=meta("every value of a string column matches this regular expression "
                      "(Java syntax, as Spark's rlike: it may match anywhere; anchor with ^ $)"),
    )  # fmt: skip
    mostly: float = field(
        default=1.0,
        metadata=meta("the share of non-NULL values that must satisfy the checks, 0 < mostly <= 1"),
    )

    def __post_init__(self) -> None:
        if not self.column.strip():
            raise FieldError("column", "the column name is empty")
        if not (self.not_null or self.unique or self.in_set or self.regex is not None
                or self.min is not None or self.max is not None):  # fmt: skip
            raise FieldError(
                "column", f"no check for {self.column}: add one of {', '.join(CHECKS)}"
            )
        if not 0 < self.mostly <= 1 or math.isnan(self.mostly):
            raise FieldError("mostly", f"{self.mostly} is not in (0, 1]: give e.g. 0.99")
        if self.regex is not None and not self.regex:  # its syntax is Java's: checked by Spark
            raise FieldError("regex", "the regular expression is empty")
        low, high = _number(self.min), _number(self.max)
        if low is not None and high is not None and low > high:
            raise FieldError("max", f"{self.max} is below min {self.min}")

    @property
    def checks(self) -> tuple[str, ...]:
        """The checks this entry asks for, in CHECKS order."""
        return tuple(c for c in CHECKS if getattr(self, c) not in (None, False, ()))


def _number(text: str | None) -> Decimal | None:
    if text is None:
        return None
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        return None  # a date or a timestamp: checked against the column's type when it runs
    return value if value.is_finite() else None


@dataclass(frozen=True)
class ValidateConfig:
    """`cdc validate`: silver equals source (counts, range hashes, differing keys), and a
    great-expectations suite per silver table (key unique and not NULL, column types, and
    the constraints below), reported as Data Docs under <root>/_state/quality/."""

    expectations: tuple[ColumnExpectation, ...] = field(
        default=(),
        metadata=meta("value constraints on silver columns: a list of entries with table, "
                      "column and one or more of not_null, unique, min, max, in_set, regex "
                      "(and mostly); a failed one makes validate exit 1",
                      example="[{table: public.orders, column: status, in_set: [new, paid]}]"),
    )  # fmt: skip
