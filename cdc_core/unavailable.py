"""Debezium's `unavailable.value.placeholder`: what bronze holds for an unchanged TOASTed value.

The setting is text, or, after the prefix `hex:`, hexadecimally encoded octets. Debezium turns
those octets into a value of each column's type (its `UnchangedToastedPlaceholder`): the octets
themselves for bytea, their text for text-like columns, a one-element list of that text for
text[], varchar[], bpchar[], json[] and jsonb[], the octets as (signed) numbers for int4[],
int8[] and date[] (days), the name-based UUID of the octets for uuid[], a one-entry map
text => text for hstore, and the text for any other type. Bronze holds PostgreSQL's text of
every value, so it holds PostgreSQL's text of that value: `\\x<hex>` for bytea, `{...}` for
arrays, `"k"=>"v"` for hstore. Types are matched after domains are resolved.
"""

from __future__ import annotations

import datetime
import hashlib
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the config loader checks the setting without the decoder's imports
    from cdc_core.events import ColumnDescriptor

DEFAULT = "__debezium_unavailable_value"
HEX_PREFIX = "hex:"

_TEXT_ARRAYS = frozenset({"text", "varchar", "bpchar", "json", "jsonb"})
_NEEDS_QUOTES = re.compile(r'[{},"\\\s]')
_EPOCH = datetime.date(1970, 1, 1)


def placeholder_octets(setting: str) -> bytes:
    """The placeholder's octets: the hex after `hex:`, else the setting in UTF-8.
    Raises ValueError when the text after `hex:` is not an even number of hex digits."""
    if not setting.startswith(HEX_PREFIX):
        return setting.encode()
    digits = setting[len(HEX_PREFIX) :]
    if not re.fullmatch(r"(?:[0-9a-fA-F]{2})*", digits):
        raise ValueError(
            f"{setting!r}: after hex: comes hexadecimally encoded octets, two hex digits each "
            "(0-9, a-f), e.g. hex:5f5f756e617661696c61626c65"
        )
    return bytes.fromhex(digits)


def _element(text: str) -> str:
    """An array element as PostgreSQL's array output writes it: quoted when it must be."""
    if text and text.upper() != "NULL" and not _NEEDS_QUOTES.search(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _array(elements: list[str]) -> str:
    return "{" + ",".join(_element(e) for e in elements) + "}"


@dataclass(frozen=True)
class Placeholder:
    """The placeholder's octets, and the bronze text they become for each column type."""

    octets: bytes = DEFAULT.encode()

    @classmethod
    def of(cls, setting: str) -> Placeholder:
        return cls(placeholder_octets(setting))

    @property
    def text(self) -> str:
        """The octets as text, as Debezium's `new String(octets)` (malformed UTF-8 replaced)."""
        return self.octets.decode("utf-8", errors="replace")

    def for_column(self, column: ColumnDescriptor) -> str:
        """PostgreSQL's text of the value Debezium puts for an unchanged `column`."""
        name, kind = column.base_type, column.base_kind
        if kind != "b":
            return self.text
        if not column.is_array:
            if name == "bytea":
                return "\\x" + self.octets.hex()
            if name == "hstore":
                quoted = '"' + self.text.replace("\\", "\\\\").replace('"', '\\"') + '"'
                return f"{quoted}=>{quoted}"
            return self.text
        signed = [b - 256 if b > 127 else b for b in self.octets]
        if name in _TEXT_ARRAYS:
            return _array([self.text])
        if name == "bytea":
            return _array(["\\x" + self.octets.hex()])
        if name in ("int4", "int8"):
            return _array([str(b) for b in signed])
        if name == "date":
            return _array([(_EPOCH + datetime.timedelta(days=b)).isoformat() for b in signed])
        if name == "uuid":  # Java's UUID.nameUUIDFromBytes: version 3, from the MD5
            return _array(
                [
                    str(
                        uuid.UUID(
                            bytes=hashlib.md5(self.octets, usedforsecurity=False).digest(),
                            version=3,
                        )
                    )
                ]
            )
        return self.text
