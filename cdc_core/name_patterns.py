"""Debezium's name lists: the regular expressions of the include and exclude lists, column
rules and key options, split and matched as Debezium does, so a name is chosen the same way.

Debezium splits a comma-separated list with `Strings.setOfRegex` (`RegExSplitterByComma`: a
comma after a backslash belongs to the expression) and matches with `Predicates.includes`:
each expression compiled with `Pattern.CASE_INSENSITIVE` and matched against the whole name.
Java folds case for ASCII letters only; Python's `re.IGNORECASE` folds other letters too, so a
list here matches every name Debezium's does (a rule that masks or drops a column in Debezium
masks or drops it here), and also names that differ from it only in the case of a non-ASCII
letter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


def split_patterns(text: str) -> list[str]:
    """The expressions of a comma-separated list, blank items dropped. A backslash escapes the
    character after it: `\\,` is a comma inside an expression (`public\\.t{1\\,3}` is one
    expression, `public\\.t{1,3}`); other escapes are kept for the expression to read."""
    items, current = [], ""
    chars = iter(text)
    for c in chars:
        if c == "\\":
            escaped = next(chars, "")
            current += "," if escaped == "," else c + escaped
        elif c == ",":
            items.append(current)
            current = ""
        else:
            current += c
    items.append(current)
    return [item.strip() for item in items if item.strip()]


def joined_patterns(patterns: Iterable[str]) -> str:
    """The expressions as one comma-separated list that `split_patterns` reads back."""
    return ",".join(p.replace(",", "\\,") for p in patterns)


def checked_pattern(pattern: str) -> str:
    """`pattern`, if it is a regular expression; a ValueError naming it otherwise."""
    try:
        re.compile(pattern, re.IGNORECASE)
    except re.error as e:
        raise ValueError(f"{pattern!r} is not a regular expression: {e}") from e
    return pattern


def matches(pattern: str, name: str) -> bool:
    """Whether `pattern` matches the whole of `name`, ignoring case (as Debezium matches)."""
    return re.fullmatch(pattern, name, re.IGNORECASE) is not None


def matches_any(patterns: Iterable[str], name: str) -> bool:
    """Whether any of `patterns` matches the whole of `name`, ignoring case."""
    return any(matches(p, name) for p in patterns)
