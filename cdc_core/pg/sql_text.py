"""Where literals, quoted names and comments begin and end in SQL text, as the PostgreSQL JDBC
driver's lexer decides it: what `for_jdbc` escapes for the driver, and what
`leaves_parentheses` looks for in a snapshot's condition before the product puts it in a
query."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator


def for_jdbc(query: str) -> str:
    """`query` as the PostgreSQL JDBC driver must get it: to the driver a `?` outside literals,
    quoted names and comments marks a parameter, so jsonb's `?`, `?|` and `?&` (in a snapshot's
    condition) are written `??` there, which it sends as `?`. Where a literal, a name or a
    comment ends is decided as the driver's own lexer decides it (`org.postgresql.core.Parser`,
    with standard_conforming_strings on), even where PostgreSQL's differs (`E'a''b'`, `/*/`):
    the text the server gets is then `query` exactly."""
    out: list[str] = []
    start = 0
    for i in _code(query):
        if query[i] == "?":
            out += [query[start:i], "??"]
            start = i + 1
    return "".join([*out, query[start:]])


def _code(query: str) -> Iterator[int]:
    """The positions of `query`'s characters outside literals, quoted names and comments, as
    the JDBC driver's lexer tells them (`for_jdbc`)."""
    i = 0
    while i < len(query):
        c = query[i]
        if c == "'":
            i = _single_quotes(query, i)
        elif c == '"':
            i = _through(query, i + 1, '"')
        elif c == "-" and query.startswith("--", i):
            i = min(_through(query, i + 2, "\r\n"), len(query) - 1)
        elif c == "/" and query.startswith("/*", i):
            i = _block_comment(query, i)
        elif c == "$":
            i = _dollar_quotes(query, i)
        else:
            yield i
        i += 1


def leaves_parentheses(condition: str) -> str | None:
    """What in `condition` (a snapshot's WHERE condition, or a blocking one's SELECT) would reach
    past the parentheses a read puts it in, or None: a `;` (the driver runs what follows as
    another statement) or a `)` that closes more than the condition opened (what follows it
    would no longer be the condition's: `true) OR (true` reads every row in every chunk)."""
    depth = 0
    for i in _code(condition):
        c = condition[i]
        if c == ";":
            return f"a ';' at character {i + 1}: one condition, not several statements"
        depth += (c == "(") - (c == ")")
        if depth < 0:
            return f"a ')' at character {i + 1} that closes more than the condition opened"
    return None


def _through(text: str, at: int, stops: str) -> int:
    """Where the first of `stops` is from `at` on (the end of `text` if none is)."""
    while at < len(text) and text[at] not in stops:
        at += 1
    return at


def _single_quotes(query: str, at: int) -> int:
    """Where the literal opened at `at` ends: the next quote (`''` is two literals in a row), or
    for E'...' the next quote no backslash escapes."""
    escapes = at >= 2 and query[at - 1] in "eE" and _ends_identifier(query[at - 2])
    at += 1
    while at < len(query) and query[at] != "'":
        at += 2 if escapes and query[at] == "\\" else 1
    return min(at, len(query))


def _ends_identifier(c: str) -> bool:
    return c == '"' or c in " \t\n\r\f" or c in ",()[].;:+-*/%^<>=~!@#&|`?"


def _block_comment(query: str, at: int) -> int:
    """Where the comment opened at `at` ends; comments nest, and each `*` or `/` is part of one
    pair at most (`/*/` opens and closes one)."""
    level, at = 1, at + 2
    while at < len(query):
        pair = query[at - 1 : at + 1]
        if pair in ("*/", "/*"):
            level += 1 if pair == "/*" else -1
            at += 1
        if level == 0:
            return at - 1
        at += 1
    return at


def _identifier(c: str, *, first: bool = False) -> bool:
    """A character of a name as the driver sees it: Java's `Character.isJavaIdentifierStart`
    (`first`) or `isJavaIdentifierPart`, on UTF-16 units, so a character outside the Basic
    Multilingual Plane (two surrogates to Java) is none."""
    if ord(c) > 0xFFFF:
        return False
    if unicodedata.category(c) in _JAVA_IDENTIFIER_START:
        return True
    return not first and (
        unicodedata.category(c) in _JAVA_IDENTIFIER_PART
        or ord(c) <= 0x08
        or 0x0E <= ord(c) <= 0x1B
        or 0x7F <= ord(c) <= 0x9F
    )  # the last three: Java's identifier-ignorable controls


_JAVA_IDENTIFIER_START = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nl", "Sc", "Pc"})
_JAVA_IDENTIFIER_PART = frozenset({"Nd", "Mn", "Mc", "Cf"})


def _dollar_quotes(query: str, at: int) -> int:
    """Where the dollar quote opened at `at` ends ($$...$$ or $tag$...$tag$), or `at` itself
    when none opens there (a $ inside a name, `$1`)."""
    if at + 1 >= len(query) or (at > 0 and _identifier(query[at - 1])):
        return at
    end = at + 1
    if query[end] != "$":
        if not _identifier(query[end], first=True):
            return at
        end += 1
        while end < len(query) and query[end] != "$":
            if not _identifier(query[end]):
                return at
            end += 1
        if end == len(query):
            return at
    tag = query[at : end + 1]
    close = query.find(tag, end + 1)
    return len(query) - 1 if close < 0 else close + len(tag) - 1
