"""Parsers for PostgreSQL's array and hstore text output, elements converted as they are read."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from cdc_core.pgtypes.scalars import identity
from cdc_core.pgtypes.schema import Unrepresentable

Element = Callable[[str], object]

_QUOTED = r'"([^"\\]*(?:\\.[^"\\]*)*)"'
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
_HSTORE_PAIR = re.compile(rf"{_QUOTED}=>(?:{_QUOTED}|(NULL))(?:, |$)", re.DOTALL)


class _Grammar:
    """The regular expressions of arrays whose elements are separated by `delimiter`."""

    def __init__(self, delimiter: str) -> None:
        d = re.escape(delimiter)
        bare = rf'([^{d}{{}}"]+)'
        self.element = re.compile(rf"{_QUOTED}|{bare}", re.DOTALL)
        self.token = re.compile(rf"\{{|\}}|{d}|{_QUOTED}|{bare}", re.DOTALL)
        item = rf'(?:"[^"\\]*(?:\\.[^"\\]*)*"|[^{d}{{}}"]+)'
        self.flat = re.compile(rf"\{{(?:{item}(?:{d}{item})*)?\}}", re.DOTALL)


_GRAMMARS = {",": _Grammar(","), ";": _Grammar(";")}


def _unescape(quoted: str) -> str:
    return _ESCAPE.sub(r"\1", quoted) if "\\" in quoted else quoted


def parse_array(text: str, element: Element, delimiter: str = ",") -> list[object]:
    """'{1,NULL,"a b"}' -> [element('1'), None, element('a b')]; nested braces nest lists.

    Unquoted NULL is null, quoted "NULL" is the string. An explicit lower bound such as
    '[2:3]={1,2}' is Unrepresentable: Spark arrays always start at the first element.
    """
    if text[:1] != "{" or text[-1:] != "}":
        if text[:1] == "[":
            raise Unrepresentable(f"array {text[:40]!r} has a lower bound other than 1")
        raise ValueError(f"{text[:40]!r} is not a PostgreSQL array")
    if '"' not in text and text.find("{", 1) < 0 and text.find("}", 1, -1) < 0:
        # A flat array none of whose elements needed quotes (none is empty or holds a
        # delimiter, brace, quote, backslash or space): a split is exact.
        inner = text[1:-1]
        items: list[Any] = inner.split(delimiter) if inner else []
        if "" in items:
            raise ValueError(f"{text[:40]!r} is not a PostgreSQL array (empty unquoted element)")
        if "NULL" in items:
            return [None if t == "NULL" else element(t) for t in items]
        return items if element is identity else list(map(element, items))
    grammar = _GRAMMARS[delimiter]
    if grammar.flat.fullmatch(text):
        return [
            (None if bare == "NULL" else element(bare)) if bare else element(_unescape(quoted))
            for quoted, bare in grammar.element.findall(text)
        ]
    return _parse_nested(text, element, grammar.token)


def _parse_nested(text: str, element: Element, tokens: re.Pattern[str]) -> list[object]:
    holder: list[object] = []
    stack: list[list[object]] = [holder]
    pos, previous = 0, ","  # `previous` is the last token's kind: { } , or v (a value)
    for m in tokens.finditer(text):
        kind = "v" if m.lastindex else text[m.start()]
        if m.start() != pos or not stack or not _may_follow(previous, kind):
            raise ValueError(f"{text[:40]!r} is not a PostgreSQL array (at offset {pos})")
        pos, previous = m.end(), kind
        quoted, bare = m.group(1), m.group(2)
        if bare is not None:
            stack[-1].append(None if bare == "NULL" else element(bare))
        elif quoted is not None:
            stack[-1].append(element(_unescape(quoted)))
        elif kind == "{":
            nested: list[object] = []
            stack[-1].append(nested)
            stack.append(nested)
        elif kind == "}":
            stack.pop()
    result = holder[0] if len(holder) == 1 else None
    if pos != len(text) or len(stack) != 1 or not isinstance(result, list):
        raise ValueError(f"{text[:40]!r} is not a PostgreSQL array")
    return result


def _may_follow(previous: str, kind: str) -> bool:
    """Values and '{' come after '{' or a delimiter; '}' and delimiters after values or '}'."""
    return (previous in "v}") != (kind in "{v") or (previous == "{" and kind == "}")


def one_dimensional(element: Element, delimiter: str = ",") -> Callable[[str], list[object]]:
    """A converter for an array column: a multi-dimensional value is Unrepresentable.

    A PostgreSQL array column does not fix its number of dimensions, while the silver column
    is array<element>: a value with nested dimensions would not fit it.
    """

    def convert(text: str) -> list[object]:
        values = parse_array(text, element, delimiter)
        if values and isinstance(values[0], list):
            raise Unrepresentable(f"array {text[:40]!r} has more than one dimension")
        return values

    return convert


def parse_hstore(text: str) -> dict[str, str | None]:
    """'"a"=>"1", "b c"=>NULL' -> {'a': '1', 'b c': None}; backslash escapes inside quotes."""
    pairs: dict[str, str | None] = {}
    pos = 0
    for m in _HSTORE_PAIR.finditer(text):
        if m.start() != pos:
            break
        pos = m.end()
        key, value, null = m.groups()
        pairs[_unescape(key)] = None if null else _unescape(value)
    if pos != len(text) or text.endswith(", "):
        raise ValueError(f"{text[:40]!r} is not hstore text output (at offset {pos})")
    return pairs


def hstore_json(text: str) -> str:
    """The hstore as a compact JSON object in the hstore's own (sorted) key order."""
    return json.dumps(parse_hstore(text), ensure_ascii=False, separators=(",", ":"))
