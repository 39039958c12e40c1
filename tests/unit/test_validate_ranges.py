"""validate's range narrowing, on sides held in memory (tokens and hashes as both engines make)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cdc_core.pgtypes.schema import LONG, STRING
from cdc_core.validate_encoding import HASH_BITS, hash60, token
from cdc_core.validate_ranges import (
    Bucket,
    Ranges,
    RowDigest,
    compare,
    diff_rows,
    first_depth,
    recheck,
)

NAMES = ("id", "name")
Row = tuple[int, str | None]


@dataclass
class Memory:
    """A side holding rows (id, name); keyed by id, or a multiset of whole rows."""

    data: list[Row]
    keyed: bool = True
    weights: list[int] | None = None  # silver's _cdc_count, without a key
    fetched: int = 0  # rows handed out row by row
    queries: list[str] = field(default_factory=list)

    def _digests(self) -> list[RowDigest]:
        out = []
        for n, (i, name) in enumerate(self.data):
            tokens = [token(i, LONG), token(name, STRING)]
            row = "".join(tokens)
            key = tokens[0] if self.keyed else row
            out.append(RowDigest(hash60(key), key if self.keyed else "", (str(i), name),
                                 hash60(row), tuple(hash60(t) for t in tokens),
                                 self.weights[n] if self.weights else 1))  # fmt: skip
        return out

    def count(self) -> int:
        self.queries.append("count")
        return sum(d.weight for d in self._digests())

    def buckets(self, depth: int, within: Ranges | None) -> dict[int, Bucket]:
        self.queries.append(f"buckets {depth}")
        out: dict[int, Bucket] = {}
        for d in self._digests():
            if within is not None and d.key_hash >> within.shift not in within.ids:
                continue
            b = d.key_hash >> (HASH_BITS - depth)
            old = out.get(b, Bucket(0, 0))
            out[b] = Bucket(old.rows + d.weight, old.total + d.row_hash * d.weight)
        return out

    def rows(self, within: Ranges) -> list[RowDigest]:
        found = [d for d in self._digests() if d.key_hash >> within.shift in within.ids]
        self.fetched += len(found)
        return found

    def rows_for(self, key_hashes: Sequence[int]) -> list[RowDigest]:
        return [d for d in self._digests() if d.key_hash in set(key_hashes)]


def table(n: int) -> list[Row]:
    return [(i, f"name {i}") for i in range(n)]


def test_equal_sides_take_counts_and_one_pass_of_range_hashes() -> None:
    source, silver = Memory(table(5000)), Memory(table(5000)[::-1])

    result = compare(source, silver, NAMES, keyed=True)

    assert (result.source_rows, result.silver_rows, result.diffs, result.mismatching) == (
        5000,
        5000,
        [],
        0,
    )
    assert result.ranges_checked == 2 ** first_depth(5000) == 32
    assert source.queries == ["count", "buckets 5"]
    assert source.fetched == silver.fetched == 0


def test_missing_extra_and_changed_keys_are_named_with_the_columns_that_differ() -> None:
    rows = table(3000)
    edits: dict[int, str | None] = {20: "other", 30: None}
    changed = [(i, edits.get(i, name)) for i, name in rows if i != 10] + [(5000, "new")]

    result = compare(Memory(rows), Memory(changed), NAMES, keyed=True)

    found = {(d.kind, d.shown[0], d.columns) for d in result.diffs}
    assert found == {("missing", "10", ()), ("extra", "5000", ()), ("differs", "20", ("name",)),
                     ("differs", "30", ("name",))}  # fmt: skip
    assert (result.mismatching, result.exact) == (4, True)


def test_mismatching_ranges_are_narrowed_before_rows_are_compared() -> None:
    rows = table(40_000)
    changed = list(rows)
    changed[123] = (123, "x")
    source, silver = Memory(rows), Memory(changed)

    result = compare(source, silver, NAMES, keyed=True, fetch_rows=50)

    assert [(d.kind, d.shown[0]) for d in result.diffs] == [("differs", "123")]
    assert source.queries == ["count", "buckets 8", "buckets 16"]  # 256 ranges, then 256 more
    assert result.ranges_checked == 256 + 256
    assert source.fetched <= 50  # only the one narrow range, row by row


def test_differences_everywhere_give_a_bounded_sample_and_a_lower_bound() -> None:
    rows = table(4000)
    changed = [(i, f"{name}!") for i, name in rows]
    source, silver = Memory(rows), Memory(changed)

    result = compare(source, silver, NAMES, keyed=True, fetch_rows=300)

    assert not result.exact
    assert 0 < len(result.diffs) <= 300
    assert len(result.diffs) < result.mismatching <= 4000
    assert source.fetched <= 300


def test_without_a_key_rows_compare_as_multisets_with_copies() -> None:
    source = Memory([(1, "a"), (1, "a"), (1, "a"), (2, "b")], keyed=False)
    silver = Memory([(1, "a"), (2, "b"), (3, None)], keyed=False, weights=[2, 1, 4])

    result = compare(source, silver, NAMES, keyed=False)

    assert (result.source_rows, result.silver_rows) == (4, 7)
    assert sorted((d.kind, d.shown, d.copies) for d in result.diffs) == [
        ("extra", ("3", None), 4), ("missing", ("1", "a"), 1)
    ]  # fmt: skip
    assert result.mismatching == 5


def test_a_recheck_keeps_only_the_keys_that_still_differ() -> None:
    rows = table(100)
    lagging = [r for r in rows if r[0] != 7]
    lagging[3] = (3, "late")
    diffs = compare(Memory(rows), Memory(lagging), NAMES, keyed=True).diffs
    assert len(diffs) == 2

    caught_up = list(rows)
    caught_up[3] = (3, "late")  # 7 arrived; 3 is still wrong

    still = recheck(Memory(rows), Memory(caught_up), diffs, NAMES, keyed=True)

    assert [(d.kind, d.shown[0]) for d in still] == [("differs", "3")]


def test_a_key_that_is_not_unique_in_the_source_is_a_difference() -> None:
    source = Memory([(1, "a"), (1, "b")])._digests()
    silver = Memory([(1, "b")])._digests()

    (diff,) = diff_rows(source, silver, NAMES, keyed=True)

    assert diff.kind == "differs"
    assert diff.columns == ("(key not unique: 2 source rows, 1 silver rows)",)


def test_the_first_pass_aims_at_a_few_hundred_rows_per_range() -> None:
    assert [first_depth(n) for n in (0, 256, 257, 10_000, 10**6, 10**9)] == [0, 0, 1, 6, 12, 16]


def test_the_postgresql_and_the_spark_side_do_not_import_each_other() -> None:
    import subprocess
    import sys

    checks = {
        "cdc_core.validate_pg": "pyspark", "cdc_core.validate_spark": "psycopg",
        "cdc_core.validate_ranges": "pyspark", "cdc_core.validate_encoding": "psycopg",
    }  # fmt: skip
    for module, foreign in checks.items():
        code = f"import sys, {module}; sys.exit({foreign!r} in sys.modules)"
        assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0, module
