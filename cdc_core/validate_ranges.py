"""`cdc validate`'s search for differing keys: hashes over ranges, narrowed down to rows.

Both sides give each row a 60-bit key hash (the row hash for a table without a key) and a row
hash (`cdc_core.validate_encoding`). Ranges are ranges of the key hash, not of key values:
PostgreSQL orders text by its collation and Spark by bytes, and uuid, numeric and composite
keys have no order both share, while hash ranges are the same on both sides, evenly filled,
and work for tables without a key. A range is `(depth, id)`: the key hashes whose top `depth`
bits are `id`.

The first pass counts rows and sums row hashes (times `_cdc_count` in silver) per range, on
both sides; ranges whose count or sum differ are cut into finer ranges until they hold few
enough rows to compare row by row (or until cutting stops helping, when differences are
everywhere: then a bounded part is compared and the count of differing keys is a lower
bound). Everything here is pure: the sides are passed in.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from cdc_core.validate_encoding import HASH_BITS

FETCH_ROWS = 100_000
"""Rows of mismatching ranges compared row by row at most (per side)."""
STEP_BITS = 8
"""A mismatching range is cut into 2^8 finer ranges."""
ROWS_PER_RANGE = 256
"""The first pass aims at about this many rows per range."""
MAX_FIRST_DEPTH = 16

DiffKind = Literal["missing", "extra", "differs"]


@dataclass(frozen=True)
class Bucket:
    """What one side holds in one range: rows (with their multiplicity) and their hash sum."""

    rows: int
    total: int


@dataclass(frozen=True)
class Ranges:
    """Ranges of one depth: the key hashes whose top `depth` bits are one of `ids`."""

    depth: int
    ids: tuple[int, ...]

    @property
    def shift(self) -> int:
        return HASH_BITS - self.depth


@dataclass(frozen=True)
class RowDigest:
    """One row (or, without a key, one distinct row and how many copies) as a side reports it."""

    key_hash: int
    key: str  # canonical key text; empty for a table without a key (the row hash identifies it)
    shown: tuple[str | None, ...]  # key values (all values, without a key) for people
    row_hash: int
    columns: tuple[int, ...]  # per compared column, the hash of its token
    weight: int = 1


class Side(Protocol):
    """PostgreSQL in one snapshot, or one version of a silver table."""

    def count(self) -> int: ...

    def buckets(self, depth: int, within: Ranges | None) -> dict[int, Bucket]: ...

    def rows(self, within: Ranges) -> list[RowDigest]: ...

    def rows_for(self, key_hashes: Sequence[int]) -> list[RowDigest]: ...


@dataclass(frozen=True)
class KeyDiff:
    """A key (or, without a key, a row) on which source and silver differ."""

    kind: DiffKind  # missing in silver, extra in silver, values differ
    key_hash: int
    shown: tuple[str | None, ...]
    columns: tuple[str, ...] = ()  # differs: the columns whose values differ
    copies: int = 1  # without a key: how many copies are missing or extra


@dataclass
class Comparison:
    """The outcome of comparing one table."""

    source_rows: int
    silver_rows: int
    ranges_checked: int = 0
    diffs: list[KeyDiff] = field(default_factory=list)
    mismatching: int = 0  # differing keys (rows, without a key)
    exact: bool = True  # False: `mismatching` is a lower bound (differences everywhere)


def first_depth(rows: int) -> int:
    """Bits of the first pass: about ROWS_PER_RANGE rows per range, at most 2^16 ranges."""
    if rows <= ROWS_PER_RANGE:
        return 0
    return min(MAX_FIRST_DEPTH, math.ceil(math.log2(rows / ROWS_PER_RANGE)))


def mismatched(a: dict[int, Bucket], b: dict[int, Bucket]) -> list[int]:
    return sorted(i for i in a.keys() | b.keys() if a.get(i) != b.get(i))


def _rows_in(ids: Iterable[int], a: dict[int, Bucket], b: dict[int, Bucket]) -> int:
    empty = Bucket(0, 0)
    return sum(max(a.get(i, empty).rows, b.get(i, empty).rows) for i in ids)


def compare(
    source: Side, silver: Side, names: Sequence[str], *, keyed: bool,
    fetch_rows: int = FETCH_ROWS,
) -> Comparison:  # fmt: skip
    """Counts, then range hashes, then the differing keys of the ranges that differ."""
    result = Comparison(source.count(), silver.count())
    depth = first_depth(max(result.source_rows, result.silver_rows))
    a, b = source.buckets(depth, None), silver.buckets(depth, None)
    result.ranges_checked = 1 << depth
    ids = mismatched(a, b)
    while ids and _rows_in(ids, a, b) > fetch_rows and depth < HASH_BITS:
        finer = min(HASH_BITS, depth + STEP_BITS)
        within = Ranges(depth, tuple(ids))
        a2, b2 = source.buckets(finer, within), silver.buckets(finer, within)
        result.ranges_checked += len(ids) << (finer - depth)
        ids2 = mismatched(a2, b2)
        selective = _rows_in(ids2, a2, b2) < 0.9 * _rows_in(ids, a, b)
        depth, a, b, ids = finer, a2, b2, ids2
        if not selective:  # differences everywhere: finer ranges do not isolate them
            break
    if not ids:
        return result
    chosen: list[int] = []
    rows = 0
    for i in ids:
        size = _rows_in([i], a, b)
        if chosen and rows + size > fetch_rows:
            break
        chosen.append(i)
        rows += size
    within = Ranges(depth, tuple(chosen))
    result.diffs = diff_rows(source.rows(within), silver.rows(within), names, keyed=keyed)
    result.mismatching = sum(d.copies for d in result.diffs)
    rest = ids[len(chosen) :]
    if rest:  # each range left out differs in at least one key, or in its count
        result.exact = False
        empty = Bucket(0, 0)
        result.mismatching += sum(
            max(1, abs(a.get(i, empty).rows - b.get(i, empty).rows)) for i in rest
        )
    return result


def recheck(
    source: Side, silver: Side, diffs: Sequence[KeyDiff], names: Sequence[str], *, keyed: bool
) -> list[KeyDiff]:
    """The keys among `diffs` that still differ, compared again row by row."""
    hashes = sorted({d.key_hash for d in diffs})
    if not hashes:
        return []
    return diff_rows(source.rows_for(hashes), silver.rows_for(hashes), names, keyed=keyed)


def diff_rows(
    source: Sequence[RowDigest], silver: Sequence[RowDigest], names: Sequence[str], *, keyed: bool
) -> list[KeyDiff]:
    """Keys missing in silver, extra in silver, or whose values differ (naming the columns);
    without a key, rows compared as multisets."""
    if not keyed:
        return _diff_multiset(source, silver)
    theirs: dict[str, list[RowDigest]] = defaultdict(list)
    for row in silver:
        theirs[row.key].append(row)
    ours: dict[str, list[RowDigest]] = defaultdict(list)
    for row in source:
        ours[row.key].append(row)
    out = []
    for key in sorted(ours.keys() | theirs.keys(), key=lambda k: _first(ours, theirs, k).key_hash):
        mine, other = ours.get(key, []), theirs.get(key, [])
        first = _first(ours, theirs, key)
        if not other:
            out.append(KeyDiff("missing", first.key_hash, first.shown, copies=len(mine)))
        elif not mine:
            out.append(KeyDiff("extra", first.key_hash, first.shown, copies=len(other)))
        elif len(mine) > 1 or len(other) > 1:  # a key (message.key.columns) that is not unique
            counts = f"(key not unique: {len(mine)} source rows, {len(other)} silver rows)"
            out.append(KeyDiff("differs", first.key_hash, mine[0].shown, (counts,)))
        elif mine[0].row_hash != other[0].row_hash:
            cols = tuple(
                n
                for n, x, y in zip(names, mine[0].columns, other[0].columns, strict=True)
                if x != y
            )
            out.append(KeyDiff("differs", first.key_hash, mine[0].shown, cols))
    return out


def _first(
    ours: dict[str, list[RowDigest]], theirs: dict[str, list[RowDigest]], key: str
) -> RowDigest:
    return (ours.get(key) or theirs[key])[0]


def _diff_multiset(source: Sequence[RowDigest], silver: Sequence[RowDigest]) -> list[KeyDiff]:
    want: Counter[int] = Counter()
    got: Counter[int] = Counter()
    shown: dict[int, tuple[str | None, ...]] = {}
    for rows, counter in ((source, want), (silver, got)):
        for row in rows:
            counter[row.row_hash] += row.weight
            shown.setdefault(row.row_hash, row.shown)
    out = []
    for h in sorted(want.keys() | got.keys()):
        delta = want[h] - got[h]
        if delta > 0:
            out.append(KeyDiff("missing", h, shown[h], copies=delta))
        elif delta < 0:
            out.append(KeyDiff("extra", h, shown[h], copies=-delta))
    return out
