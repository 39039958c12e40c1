"""PostgreSQL identifiers as values: table names parsed the way PostgreSQL parses them."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Unquoted identifiers: letters (non-ASCII ones too), digits, _ and $; only A-Z fold to lower case.
_PLAIN = re.compile(r"[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_CANONICAL = re.compile(r"[a-z_][a-z0-9_$]*")
MAX_IDENTIFIER_BYTES = 63


_NOT_IN_CATALOG_NAMES = re.compile(r"[^A-Za-z0-9_]")


def catalog_name(name: str) -> str:
    """`name` as Spark's catalog can hold it: it refuses names with anything but ASCII letters,
    digits and `_` (`INVALID_SCHEMA_OR_RELATION_NAME`), so each other character becomes `_`,
    as Debezium's `schema.name.adjustment.mode` avro does: `Order Items` is `Order_Items`."""
    return _NOT_IN_CATALOG_NAMES.sub("_", name)


def _not_a_name(text: str) -> str:
    return (
        f"{text!r} is not a valid name: quote parts with spaces, dots or capitals, "
        'for example public."Order Items"'
    )


def _split_identifiers(text: str) -> list[str]:
    """Split `a.b` / `"A"."b.c"` into parts; unquoted parts fold to lower case, as in SQL."""
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        if i < n and text[i] == '"':
            j, buf = i + 1, []
            while True:
                k = text.find('"', j)
                if k < 0:
                    raise ValueError(f"unterminated quoted identifier in {text!r}")
                buf.append(text[j:k])
                if k + 1 < n and text[k + 1] == '"':
                    buf.append('"')
                    j = k + 2
                    continue
                i = k + 1
                break
            part = "".join(buf)
            if not part:
                raise ValueError(f"empty quoted identifier in {text!r}")
        else:
            m = _PLAIN.match(text, i)
            if not m:
                raise ValueError(_not_a_name(text))
            part, i = m.group(0).translate(_ASCII_LOWER), m.end()
        if len(part.encode()) > MAX_IDENTIFIER_BYTES:
            raise ValueError(f"{part!r} is longer than PostgreSQL's {MAX_IDENTIFIER_BYTES} bytes")
        parts.append(part)
        if i == n:
            return parts
        if text[i] != ".":
            raise ValueError(_not_a_name(text))
        i += 1


def quote_if_needed(identifier: str) -> str:
    """The shortest form PostgreSQL reads back as exactly `identifier`."""
    if _CANONICAL.fullmatch(identifier):
        return identifier
    return '"' + identifier.replace('"', '""') + '"'


@dataclass(frozen=True, order=True)
class TableName:
    """A schema-qualified table name, exact as stored in PostgreSQL's catalog."""

    schema: str
    name: str

    @classmethod
    def parse(cls, text: str) -> TableName:
        """`orders`, `public.orders`, `"Sales"."a.b"`; a missing schema means `public`."""
        parts = _split_identifiers(text.strip())
        if len(parts) == 1:
            return cls("public", parts[0])
        if len(parts) == 2:
            return cls(parts[0], parts[1])
        raise ValueError(f"{text!r} has {len(parts)} parts: write schema.table")

    @property
    def qualified(self) -> str:
        """`schema.table` unquoted, as Debezium's include lists and `source.table` show it."""
        return f"{self.schema}.{self.name}"

    def __str__(self) -> str:
        return f"{quote_if_needed(self.schema)}.{quote_if_needed(self.name)}"
