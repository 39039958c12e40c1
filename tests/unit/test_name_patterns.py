"""Debezium's name lists: split on commas a backslash does not escape, matched whole in any case."""

from __future__ import annotations

import pytest

from cdc_core.name_patterns import joined_patterns, matches, matches_any, split_patterns


@pytest.mark.parametrize(
    ("text", "patterns"),
    [
        (r"a, b ,,c", ["a", "b", "c"]),
        (r"public\.t{1\,3},x", [r"public\.t{1,3}", "x"]),
        (r"a\\,b", [r"a\\", "b"]),  # an escaped backslash: the comma splits
        (r"a\\\,b", [r"a\\,b"]),  # an escaped backslash, then an escaped comma
        (r"\d+\.x", [r"\d+\.x"]),  # other escapes stay for the expression
    ],
)
def test_a_list_splits_on_commas_no_backslash_escapes(text: str, patterns: list[str]) -> None:
    assert split_patterns(text) == patterns
    assert split_patterns(joined_patterns(patterns)) == patterns


def test_a_pattern_matches_the_whole_name_in_any_case() -> None:
    assert matches(r"public\.customers\.email", "public.Customers.Email")
    assert not matches(r"public\.customers\.e", "public.customers.email")
    assert matches_any([r"x", r"PUBLIC\..*"], "public.orders")
    assert not matches_any([], "public.orders")
