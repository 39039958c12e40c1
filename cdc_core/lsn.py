"""Lsn: a WAL position as a value; PostgreSQL's `16/B374D848` form, ordered by value."""

from __future__ import annotations

import re
from dataclasses import dataclass

_TEXT = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")
_MAX = (1 << 64) - 1


@dataclass(frozen=True, order=True)
class Lsn:
    """A 64-bit WAL position. `str()` is PostgreSQL's form; `hex16` sorts as text."""

    value: int

    def __post_init__(self) -> None:
        if not 0 <= self.value <= _MAX:
            raise ValueError(f"LSN {self.value} is outside 0..2^64-1")

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """`16/B374D848` (PostgreSQL) or 16 hex digits (`hex16`, as in staged file names)."""
        m = _TEXT.fullmatch(text.strip())
        if m:
            return cls((int(m.group(1), 16) << 32) | int(m.group(2), 16))
        if re.fullmatch(r"[0-9A-Fa-f]{16}", text.strip()):
            return cls(int(text, 16))
        raise ValueError(f"{text!r} is not an LSN (expected the form 16/B374D848)")

    @property
    def hex16(self) -> str:
        """Fixed-width hex, so that names holding LSNs sort in LSN order."""
        return f"{self.value:016X}"

    def __str__(self) -> str:
        return f"{self.value >> 32:X}/{self.value & 0xFFFFFFFF:X}"

    def __add__(self, offset: int) -> Lsn:
        return Lsn(self.value + offset)

    def __sub__(self, other: Lsn) -> int:
        """Bytes of WAL between two positions."""
        return self.value - other.value


ZERO = Lsn(0)
